"""A sequence state's bytes cut at a position and put back together, so that the RAM tier holds a
prefix that several conversations share once (llama-server keeps a whole state per prompt).

`llama_state_seq_get_data` writes a header (a magic number and the sequence id, u32 and i32) and a
KV cache's cells (llama-kv-cache.cpp, state_write):

    n_stream (u32), then per stream: cell_count (u32) and, when it is not 0,
      cell_count × [pos (i32), n_seq_id (u32) = 1, seq_id (i32)]
      v_trans (u32), n_layer (u32)
      per layer: k_type (i32), k_row (u64), cell_count × k_row bytes
      v_trans 0: per layer: v_type (i32), v_row (u64), cell_count × v_row bytes
      v_trans 1: per layer: v_type (i32), v_el (u32), n_embd_v (u32), n_embd_v × cell_count × v_el bytes

A state is split into the cells at positions below a cut and the others, each a state of the same
layout (restoring the two parts joined gives the cells the whole held). Cells with a per-cell
extension (M-RoPE positions, token ids for n-gram embeddings) or a layer without V cells make a
layout this parser does not take: `parse` returns None, and such states are kept whole.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from .native import Buffer, host_buffer

HEAD = 8  # bytes of the magic number and sequence id
_META = np.dtype([("pos", "<i4"), ("n_seq", "<u4"), ("seq", "<i4")])


@dataclass
class Stream:
    """One stream's cells: their positions, the raw meta records, and each layer's K and V arrays
    (K and non-transposed V: cells × row bytes; transposed V: embedding rows × cells × element)."""

    meta: np.ndarray  # _META records
    v_trans: int
    k: list[tuple[bytes, np.ndarray]]  # (type and row size as written, data)
    v: list[tuple[bytes, np.ndarray]]

    @property
    def n_cells(self) -> int:
        return len(self.meta)


@dataclass
class State:
    head: bytes  # the magic number and sequence id
    streams: list[Stream | None]  # None: a stream without cells of the sequence


def parse(data: Buffer) -> State | None:
    """The state's cells, or None when its layout is not the plain one above."""
    try:
        view, off = memoryview(data), HEAD
        (n_stream,), off = struct.unpack_from("<I", view, off), off + 4
        streams: list[Stream | None] = []
        for _ in range(n_stream):
            (n,), off = struct.unpack_from("<I", view, off), off + 4
            if n == 0:
                streams.append(None)
                continue
            stream, off = _parse_stream(view, off, n)
            if stream is None:
                return None
            streams.append(stream)
        return State(bytes(view[:HEAD]), streams) if off == len(view) else None
    except (struct.error, ValueError):
        return None


def _parse_stream(view: memoryview, off: int, n: int) -> tuple[Stream | None, int]:
    meta = np.frombuffer(view, _META, n, off).copy()
    off += meta.nbytes
    if not (meta["n_seq"] == 1).all():  # extended cells: another record size
        return None, off
    v_trans, n_layer = struct.unpack_from("<II", view, off)
    off += 8
    k = []
    for _ in range(n_layer):
        head, (row,) = bytes(view[off:off + 12]), struct.unpack_from("<Q", view, off + 4)
        k.append((head, np.frombuffer(view, np.uint8, n * row, off + 12).reshape(n, row)))
        off += 12 + n * row
    v = []
    for _ in range(n_layer):
        if v_trans:
            head = bytes(view[off:off + 12])
            el, n_embd = struct.unpack_from("<II", view, off + 4)
            v.append((head, np.frombuffer(view, np.uint8, n_embd * n * el, off + 12).reshape(n_embd, n, el)))
            off += 12 + n_embd * n * el
        else:
            head, (row,) = bytes(view[off:off + 12]), struct.unpack_from("<Q", view, off + 4)
            v.append((head, np.frombuffer(view, np.uint8, n * row, off + 12).reshape(n, row)))
            off += 12 + n * row
    return Stream(meta, v_trans, k, v), off


def split(state: State, cut: int) -> tuple[State, State]:
    """(the cells at positions below `cut`, the others)."""
    below, above = [], []
    for stream in state.streams:
        if stream is None:
            below.append(None)
            above.append(None)
            continue
        low = stream.meta["pos"] < cut
        below.append(_select(stream, low))
        above.append(_select(stream, ~low))
    return State(state.head, below), State(state.head, above)


def above(state: State, cut: int) -> State:
    """The cells at positions from `cut` on (split's second part, without copying the first)."""
    return State(state.head, [None if s is None else _select(s, s.meta["pos"] >= cut) for s in state.streams])


def _select(stream: Stream, mask: np.ndarray) -> Stream | None:
    if not mask.any():
        return None
    cells = np.flatnonzero(mask)
    axis = 1 if stream.v_trans else 0
    return Stream(stream.meta[cells], stream.v_trans, [(h, a[cells].copy()) for h, a in stream.k],
                  [(h, np.take(a, cells, axis=axis)) for h, a in stream.v])


def same_cells(a: State, b: State, n: int) -> int:
    """How many of positions 0..n-1 both states hold with byte-identical cells, from position 0 on.
    Cells of the same tokens computed in another batch split differ in their last bits: an entry may
    hold another entry's cells only where they are the very bytes it computed."""
    first, second = _in_order(a, n), _in_order(b, n)
    if first is None or second is None or len(first[0][0].k) != len(second[0][0].k):
        return 0
    m = min(len(first[1]), len(second[1]))
    if m == 0:
        return 0
    same = (first[1][:m] == np.arange(m)) & (second[1][:m] == np.arange(m))
    for layer in range(len(first[0][0].k)):  # one layer at a time: a prefix's copy of one layer at most
        for cells in ("k", "v"):
            x, y = _layer_cells(*first, layer, cells, m), _layer_cells(*second, layer, cells, m)
            if x.shape != y.shape:
                return 0
            same &= (x == y).reshape(m, -1).all(axis=1)
    differ = np.flatnonzero(~same)
    return int(differ[0]) if len(differ) else m


def _in_order(state: State, n: int) -> tuple[list[Stream], np.ndarray, np.ndarray] | None:
    """(the state's streams, the positions below `n` in order, the indices of their cells in that
    order across the streams)."""
    streams = [s for s in state.streams if s is not None]
    if not streams or len({(s.v_trans, len(s.k)) for s in streams}) != 1:
        return None
    pos = np.concatenate([s.meta["pos"] for s in streams])
    order = np.argsort(pos, kind="stable")
    order = order[pos[order] < n]
    return streams, pos[order], order


def _layer_cells(streams: list[Stream], _: np.ndarray, order: np.ndarray, layer: int, cells: str,
                 m: int) -> np.ndarray:
    """One layer's K or V cells of the first `m` positions, a cell per row."""
    arrays = [getattr(s, cells)[layer][1] for s in streams]
    if cells == "v" and streams[0].v_trans:
        arrays = [np.moveaxis(a, 1, 0) for a in arrays]
    return (arrays[0] if len(arrays) == 1 else np.concatenate(arrays))[order[:m]]


def nbytes(state: State) -> int:
    return sum(s.meta.nbytes + sum(a.nbytes for _, a in s.k) + sum(a.nbytes for _, a in s.v)
               for s in state.streams if s is not None)


def join(first: State, second: State) -> Buffer:
    """The bytes of a state holding the cells of both, in one stream: a restore reads every stream of
    a state into the destination sequence's, clearing that sequence first at each, so the cells of two
    slots' states (two streams without --kv-unified) must come as one."""
    both = [s for s in (*first.streams, *second.streams) if s is not None]
    at = next((i for i, s in enumerate(first.streams) if s is not None),
              next((i for i, s in enumerate(second.streams) if s is not None), 0))
    parts: list[bytes | np.ndarray] = [first.head, struct.pack("<I", len(first.streams))]
    parts += [struct.pack("<I", 0)] * at
    if both:
        meta = np.concatenate([s.meta for s in both])
        parts += [struct.pack("<I", len(meta)), meta, struct.pack("<II", both[0].v_trans, len(both[0].k))]
        for layer, (head, _) in enumerate(both[0].k):
            parts += [head, *(s.k[layer][1] for s in both)]
        for layer, (head, _) in enumerate(both[0].v):
            if both[0].v_trans:
                parts += [head, np.concatenate([s.v[layer][1] for s in both], axis=1)]
            else:
                parts += [head, *(s.v[layer][1] for s in both)]
    parts += [struct.pack("<I", 0)] * (len(first.streams) - at - (1 if both else 0))
    out = host_buffer(sum(len(p) if isinstance(p, bytes) else p.nbytes for p in parts))
    at = 0
    for part in parts:
        raw = part if isinstance(part, bytes) else memoryview(np.ascontiguousarray(part).view(np.uint8).reshape(-1))
        out[at:at + len(raw)] = raw
        at += len(raw)
    return out
