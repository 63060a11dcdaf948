"""The activations llama-imatrix collects, through llama.cpp's evaluation callback (`cb_eval`).

ggml's scheduler asks the callback about every graph node (`ask`), computes the graph up to each node
it said yes to, and calls it again with the result. For each matrix multiplication by a weight
(`blk.*`, and `output.weight` with --process-output) of a batch of at least 16 rows, the callback adds
the square of every input column to the weight's running sums, and counts the rows.

The sums are float32 and grow one row at a time, in row order, as llama-imatrix's loop does: numpy
squares a whole batch at once, then `add.reduce` along the rows adds them one after another (it does
not pair rows up along that axis), so the bytes equal llama.cpp's. Nothing is done per element in Python.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import PyllamaError
from ..model.library import ggml_base, lib

_F32 = 0  # GGML_TYPE_F32
_MIN_ROWS = 16  # llama-imatrix skips smaller batches
MAX_DIMS, MAX_SRC, MAX_NAME, MAX_OP_PARAMS = 4, 10, 64, 64


class GgmlTensor(ctypes.Structure):
    """ggml.h's struct ggml_tensor (the fields up to `name` are what the callback reads)."""

    _fields_ = [
        ("type", ctypes.c_int), ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * MAX_DIMS), ("nb", ctypes.c_size_t * MAX_DIMS),
        ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * (MAX_OP_PARAMS // 4)), ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * MAX_SRC), ("view_src", ctypes.c_void_p), ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p), ("name", ctypes.c_char * MAX_NAME), ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]


def weight_name(raw: bytes) -> str:
    """The weight's own name from a backend's copy name: `CUDA0#blk.0.attn_k.weight#0` -> blk.0.attn_k.weight."""
    _, sep, rest = raw.partition(b"#")
    if sep:
        raw = rest.partition(b"#")[0]
    return raw.decode("utf-8", errors="replace")


@dataclass
class Stats:
    """One weight's sums of squared activations (per matrix, for stacked experts) and row counts."""

    values: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    counts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def copy(self) -> Stats:
        return Stats(self.values.copy(), self.counts.copy())


def accumulate(acc: np.ndarray, rows: np.ndarray) -> None:
    """acc += rows[0]**2; acc += rows[1]**2; ... in float32, in that order (llama-imatrix's sums)."""
    squares = np.multiply(rows, rows)
    squares[0] += acc
    np.add.reduce(squares, axis=0, out=acc)


class Collector:
    """Collects per-weight statistics while llama.cpp evaluates; pass `callback` as the context's cb_eval.

    `on_save(n_chunk)` is called when llama-imatrix would save: every `out_freq` chunks with None (the
    output file), and every `save_freq` chunks with the chunk number (a numbered copy).
    An error inside the callback cannot cross into C: it is kept in `error`, and `failed()` tells the
    caller's abort check to stop the evaluation.
    """

    def __init__(self, chunk_size: int, *, process_output: bool = False, out_freq: int = 10, save_freq: int = 0,
                 on_save: Callable[[int | None], None] | None = None):
        self.chunk_size, self.process_output = chunk_size, process_output
        self.out_freq, self.save_freq, self.on_save = out_freq, save_freq, on_save
        self.stats: dict[str, Stats] = {}
        self.last_chunk = 0
        self.error: BaseException | None = None
        base = ggml_base()
        self._nbytes, self._is_host, self._get = (base.ggml_nbytes, base.ggml_backend_buffer_is_host,
                                                  base.ggml_backend_tensor_get)
        self._mul_mat, self._mul_mat_id = _op_codes(base)
        self.callback = lib.ggml_backend_sched_eval_callback(self._on_node)

    def failed(self) -> bool:
        return self.error is not None

    def snapshot(self) -> tuple[dict[str, Stats], int]:
        return {name: s.copy() for name, s in self.stats.items()}, self.last_chunk

    def restore(self, snap: tuple[dict[str, Stats], int]) -> None:
        self.stats, self.last_chunk = snap

    # ------------------------------------------------------------ the callback

    def _on_node(self, address: int, ask: bool, _user: Any) -> bool:
        try:
            node = GgmlTensor.from_address(address)
            if ask:
                return self._wants(node)
            if self.error is None:
                self._collect(node)
        except BaseException as exc:  # noqa: BLE001 - nothing may cross into C; the run raises it after
            self.error = self.error or exc
        return True

    def _wants(self, node: GgmlTensor) -> bool:
        if node.op == self._mul_mat_id:
            return True
        if node.op != self._mul_mat:
            return False
        src1 = GgmlTensor.from_address(node.src[1])
        if src1.ne[1] < _MIN_ROWS or src1.type != _F32:
            return False
        name = weight_name(GgmlTensor.from_address(node.src[0]).name)
        return name.startswith("blk.") or (self.process_output and name == "output.weight")

    def _collect(self, node: GgmlTensor) -> None:
        src0 = GgmlTensor.from_address(node.src[0])
        src1 = GgmlTensor.from_address(node.src[1])
        name = weight_name(src0.name)
        x = self._array(src1, np.float32)
        if node.op == self._mul_mat_id:
            self._collect_experts(name, src0, src1, x, GgmlTensor.from_address(node.src[2]))
        else:
            self._collect_dense(name, src0, src1, x)

    def _array(self, t: GgmlTensor, dtype: Any) -> np.ndarray:
        """The tensor's data as a (ne3, ne2, ne1, ne0) array: a view of host memory, else a copy."""
        nbytes = self._nbytes(ctypes.addressof(t))
        if self._is_host(t.buffer):
            buffer: Any = (ctypes.c_char * nbytes).from_address(t.data)
        else:
            buffer = np.empty(nbytes, np.uint8)
            self._get(ctypes.addressof(t), buffer.ctypes.data, 0, nbytes)
        shape = (t.ne[3], t.ne[2], t.ne[1], t.ne[0])
        return np.ndarray(shape, dtype, buffer=buffer, strides=(t.nb[3], t.nb[2], t.nb[1], t.nb[0]))

    def _collect_dense(self, name: str, src0: GgmlTensor, src1: GgmlTensor, x: np.ndarray) -> None:
        e = self.stats.setdefault(name, Stats())
        n_mat = src0.ne[2] * src0.ne[3]
        ne0 = src1.ne[0]
        if e.counts.size > 1 and (e.counts == e.counts[0]).all():
            e.counts = e.counts[:1].copy()  # one count per dense weight (older files had one per matrix)
        if e.values.size == 0:
            e.values, e.counts = np.zeros(ne0 * n_mat, np.float32), np.zeros(1, np.int64)
        elif e.values.size != ne0 * n_mat:
            raise PyllamaError(f"inconsistent size for {name} ({e.values.size} vs {ne0 * n_mat})")
        acc = e.values.reshape(n_mat, ne0)
        for i3 in range(src1.ne[3]):
            for i2 in range(src1.ne[2]):
                accumulate(acc[(i3 % src0.ne[3]) * src0.ne[2] + (i2 % src0.ne[2])], x[i3, i2])
        _check_finite(name, e.values)
        rows = src1.ne[1] * src1.ne[2] * src1.ne[3]
        for i in range(e.counts.size):
            e.counts[i] += rows // n_mat
            self._advance(int(e.counts[i]))

    def _collect_experts(self, name: str, src0: GgmlTensor, src1: GgmlTensor, x: np.ndarray,
                         ids_t: GgmlTensor) -> None:
        n_as, ne0, n_tokens = src0.ne[2], src1.ne[0], src1.ne[2]
        if src1.ne[3] != 1:
            raise PyllamaError(f"tensor has more than 3 dimensions: {name}")
        ids = self._array(ids_t, np.int32)[0, 0]  # (n_tokens, n_ids): the experts each token was routed to
        e = self.stats.setdefault(name, Stats())
        if e.counts.size == 1 and n_as > 1:
            e.counts = np.full(n_as, e.counts[0], np.int64)  # an older file's single count, for every expert
        if e.values.size == 0:
            e.values, e.counts = np.zeros(ne0 * n_as, np.float32), np.zeros(n_as, np.int64)
        elif e.values.size != ne0 * n_as:
            raise PyllamaError(f"inconsistent size for {name} ({e.values.size} vs {ne0 * n_as})")
        elif e.counts.size != n_as:
            raise PyllamaError(f"inconsistent expert count for {name} ({e.counts.size} vs {n_as})")
        # llama-imatrix visits (slot, token) pairs slot by slot; each expert sums its rows in that order.
        order = ids.T.reshape(-1)
        slots, tokens = np.divmod(np.arange(order.size), n_tokens)
        if order.size and (order.min() < 0 or order.max() >= n_as):
            raise PyllamaError(f"expert id out of range in {name}")
        acc = e.values.reshape(n_as, ne0)
        rows = x[0]  # (n_tokens, ne1, ne0)
        touched = np.unique(order)
        for ex in touched:
            picked = np.flatnonzero(order == ex)
            accumulate(acc[ex], rows[tokens[picked], slots[picked] % src1.ne[1]])
            e.counts[ex] += picked.size
        for ex in touched:
            _check_finite(name, acc[ex])
        for ex in range(n_as):
            self._advance(int(e.counts[ex]))

    def _advance(self, count: int) -> None:
        """llama-imatrix's chunk bookkeeping: save when a count passes a multiple of the save periods."""
        n_chunk = count // self.chunk_size
        if n_chunk <= self.last_chunk:
            return
        step = n_chunk - self.last_chunk
        self.last_chunk = n_chunk
        if self.on_save is None:
            return
        if (n_chunk % self.out_freq) // step == 0:
            self.on_save(None)
        if self.save_freq > 0 and (n_chunk % self.save_freq) // step == 0:
            self.on_save(n_chunk)


def _check_finite(name: str, values: np.ndarray) -> None:
    if not np.isfinite(values).all():
        raise PyllamaError(f"non-finite values detected in {name}",
                           hint="the model produced inf or NaN activations on this text")


def _op_codes(base: Any) -> tuple[int, int]:
    """GGML_OP_MUL_MAT and GGML_OP_MUL_MAT_ID, found by name (their numbers change between releases)."""
    codes: dict[bytes, int] = {}
    for i in range(1, 200):
        codes[base.ggml_op_name(i)] = i
        if b"MUL_MAT" in codes and b"MUL_MAT_ID" in codes:
            return codes[b"MUL_MAT"], codes[b"MUL_MAT_ID"]
    raise PyllamaError("this libggml has no MUL_MAT operation", hint="reinstall llama-cpp-python")
