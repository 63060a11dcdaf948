"""Context checkpoints for the server's slots: each slot's prompt batches end where llama-server's end,
checkpoints are saved before them, and a new request keeps what a slot's cells or a checkpoint cover
(the rules, and the saving and restoring: core/generate/context_checkpoints.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..generate.context_checkpoints import MAX_CHECKPOINTS, Checkpoint, memory_n_swa, next_batch, restore


@dataclass
class SlotCheckpoints:
    """One slot's checkpoints, oldest first."""

    saved: list[Checkpoint] = field(default_factory=list)


def open_checkpoints(model: Any, swa_full: bool, ctx: Any, n_slots: int, settings: Any = None) -> Checkpoints:
    """The context's checkpoints: active for a memory that needs them (memory_n_swa), else inactive."""
    return Checkpoints(ctx, memory_n_swa(model, swa_full), n_slots, settings)


class Checkpoints:
    """Every slot's checkpoints in a context whose memory needs them (see the module docstring); for any
    other memory (`n_swa` None: inactive) a prompt keeps the slot's common prefix and is cut by nothing."""

    def __init__(self, ctx: Any, n_swa: int | None, n_slots: int, settings: Any = None):
        """`settings`: the prompt cache's (CacheSettings): --ctx-checkpoints, and --cache-ram for the states
        kept across conversations (cache/sequence_states.py); None: llama-server's checkpoints, no cache."""
        from .cache.sequence_states import SequenceStates

        self.ctx, self.n_swa, self.active = ctx, n_swa or 0, n_swa is not None
        self.limit = settings.ctx_checkpoints if settings is not None else MAX_CHECKPOINTS  # 0: none, no cut batches
        self.states = SequenceStates(settings.ram_bytes) if settings is not None and settings.ram_mib != 0 else None
        self.slots = [SlotCheckpoints() for _ in range(n_slots)]

    @property
    def takes_checkpoints(self) -> bool:
        """Whether prompts are cut into batches and checkpoints saved before them (see plan)."""
        return self.active and self.limit > 0

    def kept_prefix(self, slot: Any, prompt: list[int], allowed: bool) -> int:
        """The prompt tokens slot `slot` keeps in its cache (`allowed`: the request may reuse any), at least
        one short of the whole prompt, as reusable_prefix."""
        from ..generate.decide import common_prefix, reusable_prefix

        if not self.active:
            return reusable_prefix(slot.cached, prompt) if allowed else 0
        if self.states is not None and allowed:  # llama-server swaps states in on its own slot choice
            self.states.swap(self.ctx, slot, self.slots[slot.id].saved, prompt)
        common = common_prefix(slot.cached, prompt) if allowed else 0
        kept = self.reuse(slot.id, len(slot.cached), common, len(prompt))
        return kept - 1 if kept == len(prompt) and kept > 0 else kept

    def plan(self, slots: list[Any], chunks: dict[int, int]) -> dict[int, int]:
        """This step's prompt chunks (plan_prefill's) cut at the checkpoint boundaries, and the checkpoints
        saved before they are evaluated."""
        if not self.takes_checkpoints:
            return chunks
        for slot in slots:
            if chunks.get(slot.id, 0) > 0:
                chunks[slot.id] = next_batch(self.ctx, slot.id, len(slot.cached), chunks[slot.id], _prompt_positions(slot),
                                             slot.job.user_starts, self.slots[slot.id].saved, self.limit)
        return chunks

    def reuse(self, slot_id: int, n_cached: int, n_common: int, n_prompt: int) -> int:
        """How many prompt tokens the slot keeps of the `n_common` its `n_cached` share with the new prompt
        (context_checkpoints.restore)."""
        return restore(self.ctx, slot_id, self.slots[slot_id].saved, self.n_swa, n_cached, n_common, n_prompt)

    def forget(self, slot_id: int) -> None:
        """The slot's sequence was emptied or replaced: its checkpoints no longer apply."""
        self.slots[slot_id].saved.clear()


def _prompt_positions(slot: Any) -> int:
    """A prefilling slot's prompt length in positions, the unit of its cached tokens and of the boundaries
    (its stats count cells: more than positions past an M-RoPE image)."""
    return len(slot.cached) + len(slot.pending)
