"""A sequence's KV cells to bytes and back, and copies between sequences of one context.

`llama_state_seq_get_data` writes one sequence's cells (positions and K/V data) into host memory;
`llama_state_seq_set_data` puts them into any sequence of a context of the same model and settings.
`llama_memory_seq_cp` shares cells between sequences without a copy when the KV cache is unified.
"""

from __future__ import annotations

import ctypes
import mmap
from typing import Any

Buffer = bytes | bytearray | mmap.mmap


def host_buffer(size: int) -> mmap.mmap:
    """`size` writable bytes in their own anonymous mapping: freed, they go back to the system at once.
    (glibc's heap, which serves blocks under its mmap threshold, would keep the pages of evicted
    entries interleaved with live ones, and the process would grow past --cache-ram.) Every caller
    fills the whole buffer at once, so its pages are mapped in one pass (MAP_POPULATE, where the
    system has it): a 74 MB state took 32-42 ms to map and fill instead of 63 ms, page by page."""
    populate = getattr(mmap, "MAP_POPULATE", 0)
    if populate:
        return mmap.mmap(-1, max(size, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | populate)
    return mmap.mmap(-1, max(size, 1))


def read_sequence(ctx: Any, seq_id: int) -> Buffer:
    """The cells of sequence `seq_id`, as llama.cpp serializes them (empty when it holds none)."""
    from ...model.native import lib

    size = int(lib.llama_state_seq_get_size(ctx.handle, seq_id))
    if size == 0:
        return b""
    data = host_buffer(size)  # written in place: one copy of what may be hundreds of MiB
    view = (ctypes.c_uint8 * size).from_buffer(data)
    written = int(lib.llama_state_seq_get_data(ctx.handle, view, size, seq_id))
    del view
    return data if written == size else data[:written]


def write_sequence(ctx: Any, seq_id: int, data: Buffer) -> bool:
    """Replace sequence `seq_id`'s cells with `data`; False (and the sequence empty) when llama.cpp refuses."""
    from ...model.native import lib

    ctx.remove_tokens(seq_id, 0, -1)
    buffer = (ctypes.c_uint8 * len(data)).from_buffer_copy(data) if isinstance(data, bytes) \
        else (ctypes.c_uint8 * len(data)).from_buffer(data)
    ok = int(lib.llama_state_seq_set_data(ctx.handle, buffer, len(data), seq_id)) != 0
    del buffer
    if not ok:
        ctx.remove_tokens(seq_id, 0, -1)
        return False
    return True


def share_prefix(ctx: Any, src: int, dst: int, n_tokens: int) -> None:
    """Make `dst` hold `src`'s first `n_tokens` cells (a unified KV cache shares them: no copy)."""
    from ...model.native import lib

    ctx.remove_tokens(dst, 0, -1)
    lib.llama_memory_seq_cp(ctx.memory, src, dst, 0, n_tokens)
