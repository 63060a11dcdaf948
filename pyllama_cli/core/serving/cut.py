"""Cutting the engine's current step short: llama.cpp's abort callback, polled between graph nodes.

A server that shuts down (or a model being unloaded) cuts its requests; their streams must end
within the second uvicorn leaves for it, however long the step in flight is (a prefill of thousands
of tokens, a CPU shared with other work). `StepCut` makes llama_decode stop at the next graph node,
and `roll_back` puts the slots of that step back as they were before it, so a slot whose request was
not cut goes on at the next step as if the aborted one had never run.

The callback is polled once per graph node, so it must cost nothing: it is libc's `strlen` over a
two-byte buffer, 0 (go on) until `request()` sets the first byte (stop). No Python runs in it, and
no GIL is taken, which a Python callback would need once per node on llama.cpp's thread.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any

from .slots import GENERATING, PREFILL, Slot


def _strlen() -> Any:
    if sys.platform == "win32":
        return ctypes.cdll.msvcrt.strlen
    return ctypes.CDLL(None).strlen


class StepCut:
    """The abort flag of one context; `request()` from any thread, `clear()` on the engine's."""

    def __init__(self) -> None:
        self._flag = ctypes.create_string_buffer(2)
        self._callback: Any = None

    def install(self, ctx: Any) -> None:
        """Let the flag stop `ctx`'s llama_decode (once it is loaded)."""
        from ..model.native import lib

        # bool (*)(void *): strlen's size_t result read as a bool is 1 once the flag is set.
        self._callback = ctypes.cast(_strlen(), lib.ggml_abort_callback)
        lib.llama_set_abort_callback(ctx.handle, self._callback, ctypes.cast(self._flag, ctypes.c_void_p))

    def request(self) -> None:
        self._flag[0] = b"\x01"

    def clear(self) -> None:
        self._flag[0] = b"\x00"

    @property
    def requested(self) -> bool:
        return self._flag[0] != b"\x00"


def roll_back(ctx: Any, slots: list[Slot], marks: dict[int, int]) -> list[Slot]:
    """Undo an aborted step: each slot in it loses the tokens the step added (from its KV cache too,
    where the ubatches that ran put them), and a prefilling slot gets its chunk back to evaluate.
    Returns the slots of the step whose request was cut (to be ended by the caller)."""
    cut = []
    for slot in slots:
        if not slot.in_batch:
            continue
        start = marks.get(slot.id, len(slot.cached))
        added, slot.cached = slot.cached[start:], slot.cached[:start]
        ctx.remove_tokens(slot.id, start, -1)
        if slot.state == PREFILL:
            slot.pending = added + slot.pending
        elif slot.state == GENERATING:
            slot.drafts = []  # last_token goes into the next batch again
        slot.batch_index, slot.in_batch = -1, False
        if slot.stream is not None and slot.stream.cancelled:
            cut.append(slot)
    return cut
