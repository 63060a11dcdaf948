"""The host-memory tier: sequence states keyed by their tokens, least recently used out first.

One `RamStore` serves every engine of a process (a router's models share one --cache-ram budget).
Each entry belongs to an owner (one engine) and serves only that owner's lookups, and only a request
with the LoRA adapter set (the scales) that made it; an engine that unloads drops its entries. The budget counts the bytes of the states and of their token arrays.
An entry whose tokens are a prefix of a newer entry's is dropped when that one arrives: restoring
the newer one and cutting it serves every prompt the older one could.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

ENTRY_OVERHEAD = 256  # bytes of bookkeeping per entry, counted against the budget


def as_tokens(tokens: list[int] | np.ndarray) -> np.ndarray:
    return np.asarray(tokens, dtype=np.int32)


def shared_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens `a` and `b` have in common."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


Scales = tuple[float, ...]  # a LoRA adapter set: each adapter's scale (() without adapters)


@dataclass
class Entry:
    owner: str
    tokens: np.ndarray  # int32
    data: Any  # llama_state_seq_get_data's bytes (native.Buffer)
    lora: Scales = ()  # the adapter set its cells were computed with

    @property
    def size(self) -> int:
        return len(self.data) + self.tokens.nbytes + ENTRY_OVERHEAD


@dataclass
class OwnerCounts:
    """What the store did for one owner (for /metrics)."""

    evictions: int = 0
    bytes_held: int = 0
    entries: int = 0


@dataclass
class RamStore:
    """Entries of every owner within one budget (None: no limit); safe from any thread."""

    budget: int | None
    _entries: OrderedDict[int, Entry] = field(default_factory=OrderedDict)  # oldest use first
    _counts: dict[str, OwnerCounts] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _next_id: int = 0

    def best(self, owner: str, prompt: np.ndarray, lora: Scales = ()) -> tuple[Entry | None, int]:
        """The owner's entry of adapter set `lora` sharing the longest prefix with `prompt`, and that
        length (marked as used)."""
        with self._lock:
            found, length, found_id = None, 0, -1
            for entry_id, entry in self._entries.items():
                if entry.owner == owner and entry.lora == lora and (n := shared_prefix(entry.tokens, prompt)) > length:
                    found, length, found_id = entry, n, entry_id
            if found is not None:
                self._entries.move_to_end(found_id)
            return found, length

    def covers(self, owner: str, tokens: np.ndarray, lora: Scales = ()) -> bool:
        """Whether an entry of the owner and adapter set starts with all of `tokens` (saving them again
        adds nothing)."""
        with self._lock:
            return any(e.owner == owner and e.lora == lora and len(e.tokens) >= len(tokens)
                       and shared_prefix(e.tokens, tokens) == len(tokens) for e in self._entries.values())

    def put(self, entry: Entry) -> bool:
        """Keep `entry`, evicting the least recently used entries past the budget; False when it alone
        is over the budget (it is not kept)."""
        if self.budget is not None and entry.size > self.budget:
            return False
        with self._lock:
            for entry_id, old in list(self._entries.items()):
                if old.owner == entry.owner and old.lora == entry.lora and len(old.tokens) <= len(entry.tokens) \
                        and shared_prefix(old.tokens, entry.tokens) == len(old.tokens):
                    self._remove(entry_id)  # dominated: the new entry serves whatever it served
            self._entries[self._next_id] = entry
            self._next_id += 1
            counts = self._counts.setdefault(entry.owner, OwnerCounts())
            counts.bytes_held += entry.size
            counts.entries += 1
            while self.budget is not None and self._held() > self.budget:
                oldest = next(iter(self._entries))
                self._counts[self._entries[oldest].owner].evictions += 1
                self._remove(oldest)
            return True

    def drop_owner(self, owner: str) -> None:
        """Forget the owner's entries (its engine unloaded); its counters stay for /metrics."""
        with self._lock:
            for entry_id in [i for i, e in self._entries.items() if e.owner == owner]:
                self._remove(entry_id)

    def counts(self, owner: str) -> OwnerCounts:
        with self._lock:
            counts = self._counts.get(owner, OwnerCounts())
            return OwnerCounts(counts.evictions, counts.bytes_held, counts.entries)

    def bytes_held(self) -> int:
        with self._lock:
            return self._held()

    def _held(self) -> int:
        return sum(c.bytes_held for c in self._counts.values())

    def _remove(self, entry_id: int) -> None:
        entry = self._entries.pop(entry_id)
        counts = self._counts[entry.owner]
        counts.bytes_held -= entry.size
        counts.entries -= 1


_SHARED: dict[int | None, RamStore] = {}
_SHARED_LOCK = threading.Lock()


def shared_store(budget: int | None) -> RamStore:
    """The process's one store for this budget: every engine of a server shares it."""
    with _SHARED_LOCK:
        return _SHARED.setdefault(budget, RamStore(budget))
