"""`--prompt-cache FILE`: keep an evaluated prompt's KV state on disk and reuse its longest matching prefix.

File layout (pyllama's own): a magic line, a little-endian u32 header length, a JSON header (format
version, the model's identity, the cached token ids), then llama.cpp's sequence-state bytes for
sequence 0 (`llama_state_seq_get_data`). A file made with another model is ignored with a warning
and replaced after the next prefill.
"""

from __future__ import annotations

import ctypes
import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import InputError
from .decide import common_prefix
from ..model.native import Context, Model, lib
from ..paths import atomic_write, output_target

MAGIC = b"pyllama-prompt-cache\n"
VERSION = 1


@dataclass
class CacheLoad:
    """What loading a prompt cache did: tokens in the file, tokens reused, and any warning for the user."""

    saved_tokens: list[int]
    reused: int = 0
    warning: str | None = None


def model_identity(model: Model) -> dict[str, Any]:
    """What must match for a saved state to be reused: the model file (path and size) and its shape."""
    path = model.path.resolve()
    try:
        file_size = path.stat().st_size
    except OSError:
        file_size = -1
    return {"path": str(path), "file_size": file_size, "n_params": model.n_params, "n_embd": model.n_embd,
            "n_vocab": model.n_vocab}


def read_header(path: Path) -> tuple[dict[str, Any], int]:
    """The JSON header of a prompt-cache file and the offset where the state bytes start.

    Raises:
        InputError: not a pyllama prompt-cache file, or a damaged one.
    """
    try:
        return _read_header(path)
    except OSError as exc:
        raise InputError(f"cannot read prompt cache {path}: {exc.strerror or exc}") from None


def _read_header(path: Path) -> tuple[dict[str, Any], int]:
    with open(path, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise InputError(f"{path} is not a pyllama prompt-cache file",
                             hint="give --prompt-cache a new file name; it is created after the first run")
        raw_len = f.read(4)
        if len(raw_len) != 4:
            raise InputError(f"prompt cache {path} is truncated")
        (n,) = struct.unpack("<I", raw_len)
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise InputError(f"prompt cache {path} has a damaged header") from None
    if not isinstance(header, dict) or not isinstance(header.get("tokens"), list):
        raise InputError(f"prompt cache {path} has a damaged header")
    return header, len(MAGIC) + 4 + n


def load_prompt_cache(path: Path, model: Model, ctx: Context, prompt: list[int]) -> CacheLoad:
    """Restore the longest prefix of `prompt` saved in `path` into sequence 0 of `ctx` (fresh context).

    A missing file reuses nothing; a file from another model, or one llama.cpp cannot restore into
    this context, is ignored with a warning (the caller overwrites it after the prefill).
    """
    output_target(path)  # reading a FIFO would block: refuse what cannot be replaced after the prefill
    if not path.exists():
        return CacheLoad(saved_tokens=[])
    header, offset = read_header(path)
    saved = [int(t) for t in header["tokens"]]
    if header.get("version") != VERSION or header.get("model") != model_identity(model):
        made_with = (header.get("model") or {}).get("path", "another model")
        return CacheLoad(saved_tokens=[], warning=f"ignoring prompt cache {path}: it was saved for {made_with}; "
                                                  "it will be replaced")
    reuse = common_prefix(saved, prompt)
    if reuse == 0:
        return CacheLoad(saved_tokens=saved)
    data = path.read_bytes()[offset:]
    buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
    if lib.llama_state_seq_set_data(ctx.handle, buf, len(data), 0) == 0:
        ctx.clear_memory()
        return CacheLoad(saved_tokens=[], warning=f"ignoring prompt cache {path}: llama.cpp could not restore it "
                                                  "into this context (different -c or cache type?)")
    ctx.remove_tokens(0, reuse, -1)  # keep only the part that matches this prompt
    return CacheLoad(saved_tokens=saved, reused=reuse)


def save_prompt_cache(path: Path, model: Model, ctx: Context, tokens: list[int]) -> int:
    """Write sequence 0's state (which holds exactly `tokens`) to `path` atomically; return the bytes written.

    Raises:
        InputError: the file cannot be written (the old one, if any, is left as it was).
    """
    size = int(lib.llama_state_seq_get_size(ctx.handle, 0))
    buf = (ctypes.c_uint8 * size)()
    n = int(lib.llama_state_seq_get_data(ctx.handle, buf, size, 0))
    header = json.dumps({"version": VERSION, "model": model_identity(model),
                         "tokens": [int(t) for t in tokens]}).encode()
    with atomic_write(path, "prompt cache") as temp, open(temp, "wb") as f:
        f.write(MAGIC + struct.pack("<I", len(header)) + header)
        f.write(memoryview(buf)[:n])
    return n
