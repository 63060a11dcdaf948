"""The disk tier (--cache-disk DIR): entries that survive a restart and a router's unload.

One file per entry, `<key digest>-<tokens digest>.pcache`:

    magic (8 bytes) | header length (4 bytes, little-endian) | header (JSON) | tokens (int32) | state

The header holds the engine's key (key.py), the LoRA adapter set (scales) the cells were computed
with, the token count, the state's size and a CRC-32 of tokens and state; an entry serves only a
request with the same adapter set. An engine reads only files with its key digest in the name, and loads an entry
only when the header's key equals its own and the CRC matches; anything else is skipped with one
log line and never handed to llama.cpp. Files are written whole or not at all (paths.atomic_write),
in a background thread, and the folder is kept under --cache-disk-max by removing the least
recently used entries (a hit refreshes an entry's modification time).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...paths import atomic_write
from .key import key_digest
from .native import Buffer, host_buffer
from .ram import Scales, shared_prefix

MAGIC = b"PYLPCACH"
SUFFIX = ".pcache"
log = logging.getLogger("uvicorn.error")  # the server's log: one line on stderr


@dataclass
class DiskCounts:
    hits: int = 0
    writes: int = 0
    evictions: int = 0
    skipped: int = 0  # mismatched or corrupt entries


class DiskStore:
    """One engine's view of a cache folder shared by any number of engines and processes."""

    def __init__(self, folder: Path, key: dict[str, Any], max_bytes: int, min_tokens: int):
        self.folder, self.key, self.max_bytes, self.min_tokens = folder, key, max_bytes, min_tokens
        self.digest = key_digest(key)
        self.counts = DiskCounts()
        self._index: dict[Path, tuple[np.ndarray, Scales]] = {}  # this engine's entries: tokens, adapter set
        self._lock = threading.Lock()
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pyllama-cache-disk")
        folder.mkdir(parents=True, exist_ok=True)
        self._scan()

    # ---- lookups (scheduler thread)

    def best(self, prompt: np.ndarray, lora: Scales = ()) -> tuple[Path | None, int]:
        with self._lock:
            found, length = None, 0
            for path, (tokens, made_with) in self._index.items():
                if made_with == lora and (n := shared_prefix(tokens, prompt)) > length:
                    found, length = path, n
            return found, length

    def covers(self, tokens: np.ndarray, lora: Scales = ()) -> bool:
        """Whether an entry of adapter set `lora` starts with all of `tokens`."""
        with self._lock:
            return any(made_with == lora and len(t) >= len(tokens) and shared_prefix(t, tokens) == len(tokens)
                       for t, made_with in self._index.values())

    def load(self, path: Path, lora: Scales = ()) -> tuple[np.ndarray, Buffer] | None:
        """The entry's tokens and state, or None (logged, and forgotten) when it is not a sound entry of
        this key and adapter set."""
        try:
            entry = _read(path, with_state=True)
        except (OSError, ValueError) as exc:
            return self._skip(path, str(exc))
        header, tokens, state = entry
        if header.get("key") != self.key or _scales(header) != lora:
            return self._skip(path, "it was made for another model or other settings")
        try:
            os.utime(path)  # recently used: the last to go
        except OSError:
            pass
        self.counts.hits += 1
        return tokens, state

    # ---- writes (a background thread)

    def save(self, tokens: np.ndarray, state: Buffer, lora: Scales = ()) -> None:
        if len(tokens) >= self.min_tokens:
            self._writer.submit(self._write, tokens.copy(), state, lora)

    def flush(self, timeout: float = 30.0) -> None:
        """Wait for the writes queued so far."""
        self._writer.submit(lambda: None).result(timeout)

    def close(self) -> None:
        self._writer.shutdown(wait=True)

    def _write(self, tokens: np.ndarray, state: Buffer, lora: Scales) -> None:
        named = hashlib.sha256(tokens.tobytes() + (repr(lora).encode() if lora else b"")).hexdigest()[:24]
        path = self.folder / f"{self.digest}-{named}{SUFFIX}"
        header = json.dumps({"key": self.key, "lora": list(lora), "n_tokens": len(tokens), "n_bytes": len(state),
                             "crc32": zlib.crc32(state, zlib.crc32(tokens.tobytes()))}).encode()
        try:
            with atomic_write(path, "a prompt cache entry") as temp, open(temp, "wb") as f:
                f.write(MAGIC + struct.pack("<I", len(header)) + header)
                f.write(tokens.tobytes())
                f.write(state)
        except Exception as exc:  # noqa: BLE001 - a full disk costs the entry, never the request
            log.warning("prompt cache: could not write %s: %s", path, exc)
            return
        self.counts.writes += 1
        with self._lock:
            for old in [p for p, (t, made_with) in self._index.items() if made_with == lora and len(t) <= len(tokens)
                        and shared_prefix(t, tokens) == len(t) and p != path]:
                del self._index[old]  # dominated by the new entry
                old.unlink(missing_ok=True)
            self._index[path] = (tokens, lora)
        self._bound()

    def _bound(self) -> None:
        """Remove the least recently used entries (of any engine) until the folder fits max_bytes."""
        files = []
        for path in self.folder.glob(f"*{SUFFIX}"):
            try:
                stat = path.stat()
            except OSError:
                continue
            files.append((stat.st_mtime_ns, stat.st_size, path))
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if total <= self.max_bytes:
                break
            path.unlink(missing_ok=True)
            total -= size
            self.counts.evictions += 1
            with self._lock:
                self._index.pop(path, None)

    # ---- the folder at start

    def _scan(self) -> None:
        foreign = 0
        for path in sorted(self.folder.glob(f"*{SUFFIX}")):
            if not path.name.startswith(self.digest + "-"):
                foreign += 1
                continue
            try:
                header, tokens, _ = _read(path, with_state=False)
            except (OSError, ValueError) as exc:
                self._skip(path, str(exc))
                continue
            if header.get("key") != self.key:
                self._skip(path, "it was made for another model or other settings")
                continue
            self._index[path] = (tokens, _scales(header))
        if foreign:
            log.warning("prompt cache: %d entries in %s belong to other models or settings", foreign, self.folder)

    def _skip(self, path: Path, why: str) -> None:
        log.warning("prompt cache: skipped %s: %s", path.name, why)
        self.counts.skipped += 1
        with self._lock:
            self._index.pop(path, None)
        return None

    @property
    def bytes_held(self) -> int:
        total = 0
        with self._lock:
            paths = list(self._index)
        for path in paths:
            try:
                total += path.stat().st_size
            except OSError:
                pass
        return total

    @property
    def entries(self) -> int:
        with self._lock:
            return len(self._index)


def _scales(header: dict[str, Any]) -> Scales:
    """The adapter set an entry's header names (an entry without one was made without adapters)."""
    return tuple(float(scale) for scale in header.get("lora", ()))


def _read(path: Path, *, with_state: bool) -> tuple[dict[str, Any], np.ndarray, Buffer]:
    """(header, tokens, state) of an entry file; ValueError when it is not one, or is damaged."""
    with open(path, "rb") as f:
        head = f.read(12)
        if len(head) != 12 or head[:8] != MAGIC:
            raise ValueError("not a prompt cache entry")
        (n_header,) = struct.unpack("<I", head[8:])
        try:
            header = json.loads(f.read(n_header))
            n_tokens, n_bytes = int(header["n_tokens"]), int(header["n_bytes"])
        except (ValueError, KeyError, TypeError):
            raise ValueError("its header is damaged") from None
        raw_tokens = f.read(4 * n_tokens)
        if len(raw_tokens) != 4 * n_tokens:
            raise ValueError("it is cut short")
        tokens = np.frombuffer(raw_tokens, dtype=np.int32)
        if not with_state:
            if os.fstat(f.fileno()).st_size != 12 + n_header + 4 * n_tokens + n_bytes:
                raise ValueError("it is cut short or too long")
            return header, tokens, b""
        state = host_buffer(n_bytes)
        complete = f.readinto(state) == n_bytes and not f.read(1)
    if not complete or zlib.crc32(state, zlib.crc32(raw_tokens)) != header.get("crc32"):
        raise ValueError("its checksum does not match: the file is damaged")
    return header, tokens, state
