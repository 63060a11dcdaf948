"""llama-server's prompt cache for a memory that cannot be cut anywhere (sliding-window attention,
recurrent): whole sequence states kept with their context checkpoints (generate/context_checkpoints.py), and
swapped into a slot by llama-server's rules, so a conversation that comes back after another one
reuses what llama-server reuses. The other memories use --cache-ram's own routes (prompt_cache.py).

When a request comes to a slot that would lose at least half its context, or whose cached tokens share
at most a tenth of the new prompt, the slot's state is saved (unless an entry already holds all of it),
and the entry that keeps more of itself and covers more of the prompt than the slot does, and shares at
least a quarter of itself with the prompt, takes its place. The oldest entries go first past the limit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SLOT_SIMILARITY = 0.1  # llama-server's --slot-prompt-similarity default
KEEP_FRACTION = 0.5  # a slot about to keep less of its context than this is saved first
MIN_ENTRY_KEEP = 0.25  # an entry that would keep less of itself is never taken


@dataclass
class SavedState:
    tokens: list[int]
    data: Any  # the sequence's whole state (llama_state_seq_get_data)
    checkpoints: list[Any] = field(default_factory=list)

    @property
    def size(self) -> int:
        return len(self.data) + sum(len(c.data) for c in self.checkpoints)


class SequenceStates:
    """The saved states, oldest first, within `limit` bytes (None: no limit)."""

    def __init__(self, limit: int | None):
        self.limit = limit
        self.states: list[SavedState] = []

    def swap(self, ctx: Any, slot: Any, checkpoints: list[Any], prompt: list[int]) -> None:
        """Before `slot` serves `prompt`: save its state and take a better entry's, by llama-server's rules.
        `checkpoints` is the slot's list (replaced by the entry's when one is taken)."""
        from ...generate.decide import common_prefix

        common = common_prefix(slot.cached, prompt)
        if slot.cached and common / len(prompt) > SLOT_SIMILARITY and common / len(slot.cached) >= KEEP_FRACTION:
            return
        self._save(ctx, slot, checkpoints)
        best = self._best(slot.cached, common, prompt)
        if best is not None:
            from .native import write_sequence

            self.states.remove(best)
            if write_sequence(ctx, slot.id, best.data):
                slot.cached, checkpoints[:] = list(best.tokens), best.checkpoints
            else:  # the slot's sequence is empty now
                slot.cached = []
                checkpoints.clear()
        while self.limit is not None and self.states and self._size() > self.limit:
            self.states.pop(0)

    def _size(self) -> int:
        return sum(state.size for state in self.states)

    def _save(self, ctx: Any, slot: Any, checkpoints: list[Any]) -> None:
        from ...generate.decide import common_prefix
        from .native import read_sequence

        tokens = slot.cached
        if not tokens or any(common_prefix(s.tokens, tokens) == len(tokens) for s in self.states):
            return
        data = read_sequence(ctx, slot.id)
        entry = SavedState(list(tokens), data, list(checkpoints))
        if not data or (self.limit is not None and entry.size > self.limit):
            return
        self.states = [s for s in self.states if common_prefix(s.tokens, tokens) != len(s.tokens)]
        while self.limit is not None and self.states and self._size() + entry.size > self.limit:
            self.states.pop(0)
        self.states.append(entry)

    def _best(self, own: list[int], common: int, prompt: list[int]) -> SavedState | None:
        from ...generate.decide import common_prefix

        keep_best = common / len(own) if own else -1.0
        cover_best = common / len(prompt)
        best = None
        for state in self.states:
            shared = common_prefix(state.tokens, prompt)
            keep, cover = shared / len(state.tokens), shared / len(prompt)
            if keep >= MIN_ENTRY_KEEP and keep > keep_best and cover > cover_best:
                keep_best, cover_best, best = keep, cover, state
        return best
