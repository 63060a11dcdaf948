"""The host-memory tier: sequence states keyed by their tokens, least recently used out first.

One `RamStore` serves every engine of a process (a router's models share one --cache-ram budget).
Each entry belongs to an owner (one engine) and serves only that owner's lookups, and only a request
with the LoRA adapter set (the scales) that made it; an engine that unloads drops its entries. The budget counts the bytes of the states and of their token arrays.
An entry whose tokens are a prefix of a newer entry's is dropped when that one arrives: restoring
the newer one and cutting it serves every prompt the older one could. Entries that share a long
prefix (one system prompt, several conversations) hold its cells once, as a SharedPrefix cut from
their states (layout.py), and only their own cells after it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import layout

ENTRY_OVERHEAD = 256  # bytes of bookkeeping per entry, counted against the budget
SHARE_MIN_TOKENS = 256  # a shorter common prefix is not worth a split (nor the join at each restore)


def as_tokens(tokens: list[int] | np.ndarray) -> np.ndarray:
    return np.asarray(tokens, dtype=np.int32)


def shared_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens `a` and `b` have in common."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


Scales = tuple[float, ...]  # a LoRA adapter set: each adapter's scale (() without adapters)


@dataclass
class SharedPrefix:
    """The cells of the first `n` tokens of several entries, held once."""

    n: int
    state: layout.State
    refs: int = 0

    @property
    def size(self) -> int:
        return layout.nbytes(self.state) + ENTRY_OVERHEAD


@dataclass
class Entry:
    owner: str
    tokens: np.ndarray  # int32
    data: Any  # llama_state_seq_get_data's bytes (native.Buffer); None once split onto a shared prefix
    lora: Scales = ()  # the adapter set its cells were computed with
    base: SharedPrefix | None = None  # the shared cells of its first base.n tokens
    rest: layout.State | None = None  # with a base: the cells after them

    @property
    def size(self) -> int:
        cells = len(self.data) if self.base is None else layout.nbytes(self.rest)  # type: ignore[arg-type]
        return cells + self.tokens.nbytes + ENTRY_OVERHEAD

    def state(self) -> Any:
        """The bytes to restore (a shared prefix's cells joined with the entry's own)."""
        return self.data if self.base is None else layout.join(self.base.state, self.rest)  # type: ignore[arg-type]


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
            counts = self._counts.setdefault(entry.owner, OwnerCounts())
            self._share(entry, counts)
            self._entries[self._next_id] = entry
            self._next_id += 1
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

    def _share(self, entry: Entry, counts: OwnerCounts) -> None:
        """Hold the prefix that `entry` shares with a kept entry (at least SHARE_MIN_TOKENS) once: the
        newest such entry's shared prefix, or one cut from it now. Only byte-identical cells are
        shared (layout.same_cells): the same tokens evaluated in another split round differently, and
        a restore must give back the cells the slot computed. States whose layout cannot be cut
        (layout.parse) stay whole."""
        whole = None
        for old in reversed(self._entries.values()):
            if old.owner != entry.owner or old.lora != entry.lora:
                continue
            n = shared_prefix(old.tokens, entry.tokens)
            if n < SHARE_MIN_TOKENS or (old.base is not None and old.base.n > n):
                continue
            if whole is None and (whole := layout.parse(entry.data)) is None:
                return
            if old.base is not None:
                base = old.base if layout.same_cells(old.base.state, whole, old.base.n) == old.base.n else None
            else:
                base = self._cut(old, whole, n, counts)
            if base is not None:
                entry.rest = layout.above(whole, base.n)
                entry.base, entry.data = base, None
                base.refs += 1
                return

    def _cut(self, entry: Entry, cells: layout.State, n: int, counts: OwnerCounts) -> SharedPrefix | None:
        """Split a kept entry's cells into a new shared prefix (the first of its `n` tokens whose cells
        equal `cells`', at least SHARE_MIN_TOKENS) and its own rest."""
        whole = layout.parse(entry.data)
        if whole is None:
            return None
        n = layout.same_cells(whole, cells, n)
        if n < SHARE_MIN_TOKENS:
            return None
        low, high = layout.split(whole, n)
        counts.bytes_held -= entry.size
        entry.base, entry.rest, entry.data = SharedPrefix(n, low, refs=1), high, None
        counts.bytes_held += entry.size + entry.base.size
        return entry.base

    def _remove(self, entry_id: int) -> None:
        entry = self._entries.pop(entry_id)
        counts = self._counts[entry.owner]
        counts.bytes_held -= entry.size
        counts.entries -= 1
        if entry.base is not None:
            entry.base.refs -= 1
            if entry.base.refs == 0:
                counts.bytes_held -= entry.base.size


_SHARED: dict[int | None, RamStore] = {}
_SHARED_LOCK = threading.Lock()


def shared_store(budget: int | None) -> RamStore:
    """The process's one store for this budget: every engine of a server shares it."""
    with _SHARED_LOCK:
        return _SHARED.setdefault(budget, RamStore(budget))
