"""Which LoRA adapter set runs in the scheduler's next step.

llama.cpp sets LoRA adapters on a whole context, not per sequence, so two requests with different
adapter sets cannot share a decode. Each step runs the busy slots of one set; the sets take turns
(in a fixed order, the one after the set of the last step first), so every request advances at
least once every few steps and none ever runs with another request's adapters. Slots of the same
set still share their steps, as without adapters.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..model.adapters import ModelAdapters, set_loras
from .slots import IDLE

Scales = tuple[float, ...]


class LoraTurns:
    """The model's LoRA adapters, the scales its context has now, and whose turn is next."""

    def __init__(self, adapters: ModelAdapters | None = None):
        self.adapters = adapters
        self._applied: Scales | None = None  # what the context holds (None: unknown)
        self._last: Scales | None = None

    @property
    def active(self) -> bool:
        return self.adapters is not None and bool(self.adapters.loras)

    def scales_of(self, job: Any) -> Scales:
        """The scales a job runs with: its own, else the global ones at the time it starts (() without adapters)."""
        if not self.active:
            return ()
        return tuple(job.lora) if job.lora is not None else tuple(self.adapters.scales())  # type: ignore[union-attr]

    def next_turn(self, ctx: Any, slots: Sequence[Any]) -> Scales | None:
        """The set whose slots run this step, set on `ctx`; None when the model has no adapters."""
        if not self.active:
            return None
        sets = sorted({slot.lora for slot in slots if slot.state != IDLE})
        if not sets:
            return None
        later = [s for s in sets if self._last is not None and s > self._last]
        turn = later[0] if later else sets[0]
        self._last = turn
        if turn != self._applied:
            set_loras(ctx.handle, self.adapters.loras, list(turn))  # type: ignore[union-attr]
            self._applied = turn
        return turn
