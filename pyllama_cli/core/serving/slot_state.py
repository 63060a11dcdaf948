"""A slot's KV cache to a file and back (llama-server's /slots/ID?action=save|restore|erase).

The file is llama.cpp's own sequence-state format (`llama_state_seq_save_file`): the slot's tokens
and its cells. These run on the scheduler thread, through `ParallelEngine.on_idle_slot`.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import InputError
from .slots import Slot


@dataclass(frozen=True)
class SlotFileResult:
    """What a save or restore did: tokens and bytes."""

    n_tokens: int
    n_bytes: int


def save_slot(ctx: Any, slot: Slot, path: Path) -> SlotFileResult:
    from ..model.native import lib

    tokens = (ctypes.c_int32 * max(len(slot.cached), 1))(*slot.cached)
    n = int(lib.llama_state_seq_save_file(ctx.handle, str(path).encode(), slot.id, tokens, len(slot.cached)))
    if n == 0:
        raise InputError(f"could not write the slot's state to {path}")
    return SlotFileResult(len(slot.cached), n)


def restore_slot(ctx: Any, slot: Slot, path: Path, capacity: int) -> SlotFileResult:
    from ..model.native import lib

    if not path.is_file():
        raise InputError(f"no saved slot named {path.name!r}")
    tokens = (ctypes.c_int32 * capacity)()
    count = ctypes.c_size_t(0)
    ctx.remove_tokens(slot.id, 0, -1)
    slot.cached = []
    n = int(lib.llama_state_seq_load_file(ctx.handle, str(path).encode(), slot.id, tokens, capacity,
                                          ctypes.byref(count)))
    if n == 0:
        ctx.remove_tokens(slot.id, 0, -1)
        raise InputError("could not restore the slot: the file is no slot state of this model, or it does not fit "
                         "the slot's context")
    slot.cached = list(tokens[:count.value])
    return SlotFileResult(count.value, n)


def erase_slot(ctx: Any, slot: Slot) -> int:
    """Forget the slot's cache; the number of tokens it held."""
    n = len(slot.cached)
    ctx.remove_tokens(slot.id, 0, -1)
    slot.cached = []
    return n
