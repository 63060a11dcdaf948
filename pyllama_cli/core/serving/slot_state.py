"""A slot's KV cache to a file and back (llama-server's /slots/ID?action=save|restore|erase).

The file is llama.cpp's own sequence-state format (`llama_state_seq_save_file`): a header (magic,
version, token count), the slot's tokens, and its cells. These run on the scheduler thread, through
`ParallelEngine.on_idle_slot`.

A save goes to a hidden temporary file that replaces the target only once llama.cpp wrote all of it:
a full disk leaves the old file as it was (`SlotStorageFull`). A restore reads the file here and
checks its header and size before llama.cpp sees the cells, and hands them over as a buffer, whose
reader fails cleanly past its end (llama_state_seq_load_file asserts, which aborts the process).
"""

from __future__ import annotations

import ctypes
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import InputError, PyllamaError
from ..paths import hidden_temp_name
from .slots import Slot

_SEQ_MAGIC = 0x67677371  # 'ggsq', LLAMA_STATE_SEQ_MAGIC
_HEADER = struct.Struct("<III")  # magic, version, token count
# What llama_state_seq_get_data puts before the cells (and set_data expects): a magic and the sequence id.
_IO_MAGIC = struct.pack("<I", 0xAF143CD8)


class SlotStorageFull(PyllamaError):
    """The slot file could not be written whole (no space left); the old file, if any, is unchanged."""


@dataclass(frozen=True)
class SlotFileResult:
    """What a save or restore did: tokens and bytes."""

    n_tokens: int
    n_bytes: int


def refuse_links(path: Path) -> None:
    """A slot file that is a symlink would make a save overwrite, or a restore read, whatever it leads to."""
    if path.is_symlink():
        raise InputError(f"{path.name!r} is a symbolic link: slot files must be plain files in --slot-save-path")


def save_slot(ctx: Any, slot: Slot, path: Path) -> SlotFileResult:
    from ..model.native import lib

    refuse_links(path)
    tokens = (ctypes.c_int32 * max(len(slot.cached), 1))(*slot.cached)
    temp = path.with_name(hidden_temp_name(path.name))
    try:
        n = int(lib.llama_state_seq_save_file(ctx.handle, str(temp).encode(), slot.id, tokens, len(slot.cached)))
        # llama.cpp's writes are buffered and its close is unchecked: a full disk shows as a short file.
        written = temp.stat().st_size if temp.exists() else 0
        if n == 0 or written != n:
            raise SlotStorageFull(f"could not write the slot's state to {path.name!r}: {written} of {n} bytes "
                                  "written (no space left?)", hint="free some space in --slot-save-path")
        with open(temp, "rb") as written_file:
            os.fsync(written_file.fileno())
        os.replace(temp, path)
    except OSError as exc:
        raise SlotStorageFull(f"could not write the slot's state to {path.name!r}: {exc.strerror or exc}") from None
    finally:
        temp.unlink(missing_ok=True)
    return SlotFileResult(len(slot.cached), n)


def restore_slot(ctx: Any, slot: Slot, path: Path, capacity: int) -> SlotFileResult:
    from ..model.native import lib

    refuse_links(path)
    if not path.is_file():
        raise InputError(f"no saved slot named {path.name!r}")
    data = path.read_bytes()
    tokens = _checked_tokens(data, path.name, capacity)
    cells = data[_HEADER.size + 4 * len(tokens):]
    ctx.remove_tokens(slot.id, 0, -1)
    slot.cached = []
    state = _state_prefix(ctx, slot.id) + cells
    buf = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
    n = int(lib.llama_state_seq_set_data(ctx.handle, buf, len(state), slot.id))
    if n != len(state):
        ctx.remove_tokens(slot.id, 0, -1)
        raise InputError(f"could not restore the slot from {path.name!r}: the file is no slot state of this model, "
                         "or it does not fit the slot's context")
    slot.cached = tokens
    return SlotFileResult(len(tokens), len(data))


def _checked_tokens(data: bytes, name: str, capacity: int) -> list[int]:
    """The tokens a slot file's header holds, once its magic, token count and size are sound."""
    if len(data) < _HEADER.size or struct.unpack_from("<I", data)[0] != _SEQ_MAGIC:
        raise InputError(f"{name!r} is no slot file (no llama.cpp sequence-state header)")
    _, _, n_tokens = _HEADER.unpack_from(data)
    if n_tokens > capacity:
        raise InputError(f"{name!r} holds {n_tokens} tokens, more than the slot's context of {capacity}")
    end = _HEADER.size + 4 * n_tokens
    if len(data) <= end:
        raise InputError(f"{name!r} is cut short: {len(data)} bytes cannot hold its {n_tokens} tokens and their cells")
    return list(struct.unpack_from(f"<{n_tokens}i", data, _HEADER.size))


def _state_prefix(ctx: Any, seq_id: int) -> bytes:
    """What this llama.cpp puts before a sequence's cells in its state buffers (nothing in older ones)."""
    from ..model.native import lib

    size = int(lib.llama_state_seq_get_size(ctx.handle, seq_id))
    buf = (ctypes.c_uint8 * max(size, 1))()
    n = int(lib.llama_state_seq_get_data(ctx.handle, buf, size, seq_id))
    head = bytes(buf[:min(n, 4)])
    return _IO_MAGIC + struct.pack("<i", seq_id) if head == _IO_MAGIC else b""


def erase_slot(ctx: Any, slot: Slot) -> int:
    """Forget the slot's cache; the number of tokens it held."""
    n = len(slot.cached)
    ctx.remove_tokens(slot.id, 0, -1)
    slot.cached = []
    return n
