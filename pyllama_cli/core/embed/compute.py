"""The embeddings of token inputs, one input per decode, normalised as llama.cpp's --embd-normalize says.

With pooling, each input gives one vector (for rank pooling: the classification head's scores);
without (none), each token gives one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ...errors import InputError

DEFAULT_EMBD_NORMALIZE = 2  # llama.cpp's default: euclidean


def normalize(vector: np.ndarray, mode: int) -> np.ndarray:
    """llama.cpp's common_embd_normalize: -1 none, 0 max absolute scaled to int16, 1 taxicab,
    2 euclidean, p > 2 the p-norm (sums in double precision, as there)."""
    values = vector.astype(np.float64)
    if mode == -1:
        total = 1.0
    elif mode == 0:
        total = float(np.abs(values).max(initial=0.0)) / 32760.0
    elif mode == 2:
        total = float(np.sqrt(np.sum(values * values)))
    else:
        total = float(np.sum(np.abs(values) ** mode) ** (1.0 / mode))
    scale = np.float32(1.0 / total) if total > 0.0 else np.float32(0.0)
    return vector.astype(np.float32) * scale


def embed_inputs(ctx: Any, inputs: Sequence[Sequence[int]], mode: int = DEFAULT_EMBD_NORMALIZE,
                 cancelled: Callable[[], bool] = lambda: False, wipe: bool = True) -> list[np.ndarray]:
    """Each input's pooled vector (or, without pooling, each of its tokens' vectors, in order).

    As llama-embedding, inputs share a decode while they fit the batch and the context's sequences:
    many short inputs (a rerank's documents) cost a few passes over the model instead of one each.
    Between decodes the KV cache is emptied, and with `wipe` also zeroed, as llama-embedding does;
    llama-server only forgets its cells, which spares a memset of the whole cache per decode.
    """
    from ..model.native import Batch, lib

    pooling = int(lib.llama_pooling_type(ctx.handle))
    width = int(lib.llama_model_n_embd_out(ctx.model.handle))
    if pooling == lib.LLAMA_POOLING_TYPE_RANK:
        width = min(width, int(lib.llama_model_n_cls_out(ctx.model.handle)))
    vectors: list[np.ndarray] = []
    with Batch(ctx.n_batch, n_seq_max=1) as batch:
        for group in _groups(inputs, ctx.n_batch, int(lib.llama_n_seq_max(ctx.handle))):
            if cancelled():
                from ...errors import Interrupted

                raise Interrupted("embedding cancelled")
            ctx.clear_memory(data=wipe)
            batch.clear()
            for seq, ids in enumerate(group):
                for pos, token in enumerate(ids):
                    batch.add(token, pos, (seq,), True)
            ctx.decode(batch)
            if pooling == lib.LLAMA_POOLING_TYPE_NONE:
                rows = [lib.llama_get_embeddings_ith(ctx.handle, i) for i in range(batch.n_tokens)]
            else:
                rows = [lib.llama_get_embeddings_seq(ctx.handle, seq) for seq in range(len(group))]
            vectors += [normalize(np.ctypeslib.as_array(ptr, shape=(width,)).copy(), mode) for ptr in rows]
    return vectors


def decode_count(ctx: Any, inputs: Sequence[Sequence[int]]) -> int:
    """How many decodes embed_inputs makes of `inputs` (for /metrics' n_decode_total)."""
    from ..model.native import lib

    return len(_groups(inputs, ctx.n_batch, int(lib.llama_n_seq_max(ctx.handle))))


def _groups(inputs: Sequence[Sequence[int]], n_batch: int, n_seq: int) -> list[list[Sequence[int]]]:
    """The inputs in order, cut into groups of at most `n_seq` inputs and `n_batch` tokens."""
    groups: list[list[Sequence[int]]] = [[]]
    used = 0
    for ids in inputs:
        if len(ids) > n_batch:
            raise InputError(f"an input has {len(ids)} tokens but at most {n_batch} fit in one batch",
                             hint="use a larger -b/--batch-size (and -c/--ctx-size)")
        if groups[-1] and (used + len(ids) > n_batch or len(groups[-1]) >= n_seq):
            groups.append([])
            used = 0
        groups[-1].append(ids)
        used += len(ids)
    return [group for group in groups if group]
