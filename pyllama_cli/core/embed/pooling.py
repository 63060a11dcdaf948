"""--pooling: llama.cpp's pooling types, and the check that the model can pool that way.

Rank pooling runs a classification head (a reranker's `cls` or `cls.output` tensors); without one
llama.cpp aborts the process, so it is refused here first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...errors import UsageError

# llama.cpp's enum llama_pooling_type; -1 (unspecified) = the model's own.
POOLING_TYPES = {"none": 0, "mean": 1, "cls": 2, "last": 3, "rank": 4}
POOLING_NAMES = tuple(POOLING_TYPES)
UNSPECIFIED = -1
RANK = POOLING_TYPES["rank"]
_HEAD_TENSORS = ("cls.weight", "cls.output.weight")
# Inputs that may share one decode (sequences of the context, whose KV cache they share): llama.cpp's
# limit, as llama-embedding uses it.
MAX_SEQUENCES = 256


def pooling_type(name: str | None) -> int:
    """The llama.cpp pooling type of a --pooling value (None: the model's own)."""
    if name is None:
        return UNSPECIFIED
    try:
        return POOLING_TYPES[name]
    except KeyError:
        raise UsageError(f"--pooling {name!r} is not a pooling type",
                         hint=f"use one of {', '.join(POOLING_NAMES)}") from None


def has_classification_head(path: Path) -> bool:
    from ..gguf.reader import read_gguf

    names = {tensor.name for tensor in read_gguf(path, check_data=False, strings=False).tensors}
    return any(name in names for name in _HEAD_TENSORS)


def check_pooling(path: Path, pooling: int) -> None:
    """Refuse rank pooling for a model without a classification head (llama.cpp would abort)."""
    if pooling == RANK and not has_classification_head(path):
        raise UsageError(f"--pooling rank needs a classification head, and {path.name} has none",
                         hint="rank pooling is for rerankers; use --pooling mean, cls, last or none")


def named_pooling(model: Any) -> int | None:
    """The pooling the model's metadata names (`<arch>.pooling_type`), as llama.cpp's context takes it:
    none when the key is absent. None when the value is not one of llama.cpp's types (the context decides).

    Read from the loaded model, so that a model without pooling costs one context, not a probe and then a
    second one (a probe's KV cache and compute buffers are the size of the real context's)."""
    arch = model.meta("general.architecture")
    value = model.meta(f"{arch}.pooling_type") if arch else None
    if value is None:
        return POOLING_TYPES["none"]
    try:
        named = int(value)
    except ValueError:
        return None
    return named if named in POOLING_TYPES.values() else None


def embedding_context(model: Any, settings: Any, pooling: int) -> Any:
    """A context that returns embeddings with `pooling` (-1: the model's own; mean when it has none).
    Pooling needs a whole input in one micro-batch, so the micro-batch is the batch."""
    from dataclasses import replace

    from ..model.native import Context, lib

    check_pooling(model.path, pooling)
    settings = replace(settings, n_ubatch=settings.n_batch)
    # No more sequences than the batch has tokens: llama.cpp sizes its output buffer for
    # max(outputs, sequences) but allows only n_batch outputs, and aborts (-b 128) if sequences exceed it.
    n_seq = min(MAX_SEQUENCES, settings.n_batch)
    shared = {"embeddings": True, "n_seq_max": n_seq, "kv_unified": True}
    if pooling == UNSPECIFIED and named_pooling(model) == lib.LLAMA_POOLING_TYPE_NONE:
        pooling = lib.LLAMA_POOLING_TYPE_MEAN
    if pooling != UNSPECIFIED:
        return Context(model, settings, pooling_type=pooling, **shared)
    ctx = Context(model, settings, **shared)
    # The model's own pooling; a value llama.cpp has no name for may still come out as none, pooled by mean too.
    if lib.llama_pooling_type(ctx.handle) == lib.LLAMA_POOLING_TYPE_NONE:
        ctx.close()
        ctx = Context(model, settings, pooling_type=lib.LLAMA_POOLING_TYPE_MEAN, **shared)
    return ctx
