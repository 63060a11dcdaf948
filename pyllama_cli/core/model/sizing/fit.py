"""--fit: choose an unset context size (-c 0) that fits the memory, as llama.cpp's common fit does.

llama.cpp's fit lives in its common library, which the bindings' libllama does not export, so its
algorithm is followed here over pyllama's own estimate of the memory a model and a context take:
the weights (the GGUF's tensor bytes), the KV cache (per token, by cache type) and the compute buffer
(the attention mask or scores per token of context, plus a part per ubatch that does not grow with it).

The algorithm (llama.cpp's, for the case with no GPU device, where the budget is the host's total
memory less the -fitt margin):
1. project the use at the trained context; if it leaves the margin free, nothing changes;
2. otherwise, when -c is unset and the trained context is above -fitc, project the use at -fitc and
   interpolate linearly between the two for the largest context that keeps the margin, rounded down
   to a multiple of 256 and never under -fitc.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ...gguf.reader import GGUFFile, read_gguf
from ..library import LOG_INFO, gpu_device_present, lib, log_line
from ..settings import KV_CACHE_TYPES, QUANTIZED_CACHE_TYPES, LoadSettings

if TYPE_CHECKING:
    from .memory import LoadedModel

MIB = 1024 * 1024
CTX_ALIGN = 256  # llama.cpp rounds a fitted context down to this (the CUDA backend's granularity)
DEFAULT_FIT_TARGET_MIB = 1024
DEFAULT_FIT_CTX = 4096


@dataclass(frozen=True)
class ModelShape:
    """What the estimate reads of a model."""

    weight_bytes: int
    n_ctx_train: int
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_vocab: int

    @classmethod
    def from_gguf(cls, head: GGUFFile, parts: list[GGUFFile] | None = None) -> ModelShape:
        def key(suffix: str, default: int = 0) -> int:
            value = head.arch_key(suffix, default)
            return int(max(value) if isinstance(value, list) else value)

        tokens = head.get("tokenizer.ggml.tokens")
        n_vocab = key("vocab_size") or getattr(tokens, "count", None) or len(tokens or ())
        return cls(weight_bytes=sum(t.n_bytes for part in (parts or [head]) for t in part.tensors),
                   n_ctx_train=key("context_length"), n_layer=key("block_count"), n_embd=key("embedding_length"),
                   n_head=key("attention.head_count"), n_head_kv=key("attention.head_count_kv") or
                   key("attention.head_count"), n_ff=key("feed_forward_length"), n_vocab=n_vocab)


@dataclass(frozen=True)
class ContextShape:
    """The context parameters the estimate depends on."""

    n_ubatch: int = 512
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    flash_attn: bool = True  # -fa auto turns it on for the CPU


@dataclass(frozen=True)
class FitPlan:
    """What --fit chose, and why (one line a step, for --verbose and `info --fit`)."""

    n_ctx: int
    reasons: tuple[str, ...]


def projected_bytes(model: ModelShape, n_ctx: int, ctx: ContextShape) -> int:
    """Weights + KV cache + compute buffer for a context of n_ctx tokens."""
    from .memory import _bytes_per_element  # the cache types' sizes, from the GGUF type table

    head_dim = model.n_embd // max(model.n_head, 1)
    kv_per_token = model.n_layer * model.n_head_kv * head_dim * (
        _bytes_per_element(KV_CACHE_TYPES[ctx.cache_type_k]) + _bytes_per_element(KV_CACHE_TYPES[ctx.cache_type_v]))
    # flash attention keeps one f16 mask row a token of the ubatch; without it, f32 scores a head
    attention = ctx.n_ubatch * 2 if ctx.flash_attn else ctx.n_ubatch * model.n_head * 4
    fixed = ctx.n_ubatch * 4 * (model.n_vocab + 2 * model.n_embd + model.n_ff)  # logits and activations
    if {ctx.cache_type_k, ctx.cache_type_v} & QUANTIZED_CACHE_TYPES:
        fixed += ctx.n_ubatch * model.n_head * head_dim * 4  # the queries again, converted for a quantized cache
    return int(model.weight_bytes + n_ctx * (kv_per_token + attention) + fixed)


def plan_fit(model: ModelShape, ctx: ContextShape, *, total_bytes: int, margin_bytes: int,
             n_ctx_min: int, n_streams: int = 1) -> FitPlan:
    """The context size llama.cpp's fit chooses when -c is unset (see the module's docstring).

    With several sequences in separate caches (n_streams), each gets the trained context at most, so
    the bounds and the rounding are per stream times n_streams, as in llama.cpp."""
    n_max = model.n_ctx_train * n_streams
    n_ctx_min *= n_streams
    used_max = projected_bytes(model, n_max, ctx)
    reasons = [f"projected to use {used_max // MIB} MiB of host memory vs. {total_bytes // MIB} MiB of total "
               f"host memory at the trained context of {n_max}"]
    surplus = total_bytes - used_max - margin_bytes
    if surplus >= 0:
        reasons.append(f"will leave {(total_bytes - used_max) // MIB} >= {margin_bytes // MIB} MiB free, "
                       f"no changes needed")
        return FitPlan(n_max, tuple(reasons))
    reasons.append(f"cannot meet the free memory target of {margin_bytes // MIB} MiB, need "
                   f"{-surplus // MIB} MiB less")
    if n_max <= n_ctx_min:
        reasons.append(f"the trained context of {n_max} is <= the minimum of {n_ctx_min} (-fitc): no change")
        return FitPlan(n_max, tuple(reasons))
    used_min = projected_bytes(model, n_ctx_min, ctx)
    target = total_bytes - margin_bytes
    if target <= used_min:
        reasons.append(f"even the minimum context of {n_ctx_min} (-fitc) does not fit: using it")
        return FitPlan(n_ctx_min, tuple(reasons))
    n_ctx = n_ctx_min + (n_max - n_ctx_min) * (target - used_min) // (used_max - used_min)
    n_ctx = max(n_ctx - n_ctx % (CTX_ALIGN * n_streams), n_ctx_min)
    reasons.append(f"context size reduced from {n_max} to {n_ctx}")
    return FitPlan(n_ctx, tuple(reasons))


def context_shape(settings: LoadSettings) -> ContextShape:
    return ContextShape(n_ubatch=settings.n_ubatch, cache_type_k=settings.cache_type_k,
                        cache_type_v=settings.cache_type_v, flash_attn=settings.flash_attn != "off")


def choose_context(model: LoadedModel, settings: LoadSettings, n_streams: int = 1) -> int:
    """The context size for -c 0: the trained one, reduced by --fit when it would not leave the margin free.

    With a GPU, llama.cpp fits the layers and the context to the device's free memory through its
    common library, which the bindings do not export: the trained context is kept then, and the log says so.
    """
    if not settings.fit:
        return model.n_ctx_train
    if gpu_device_present():
        log_line(LOG_INFO, "fit: fitting to GPU memory needs llama.cpp's common library, which the bindings do "
                 "not export: keeping the trained context (set -c to choose one)\n")
        return model.n_ctx_train
    shape = replace(ModelShape.from_gguf(read_gguf(model.path, check_data=False, strings=False)),
                    weight_bytes=int(lib.llama_model_size(model.handle)), n_ctx_train=model.n_ctx_train)
    plan = plan_fit(shape, context_shape(settings), total_bytes=host_total_bytes(),
                    margin_bytes=settings.fit_margin, n_ctx_min=settings.fit_ctx, n_streams=n_streams)
    for reason in plan.reasons:
        log_line(LOG_INFO, f"fit: {reason}\n")
    return plan.n_ctx


def parse_fit_target(text: str) -> int:
    """-fitt MiB0,MiB1,...: the margin in bytes (with no GPU, only the first value counts, as in llama.cpp)."""
    from ....errors import UsageError

    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = [-1]
    if not values or min(values) < 0:
        raise UsageError(f"-fitt {text!r}: must be MiB values 0 or more, separated by commas", hint="e.g. -fitt 1024")
    return values[0] * MIB


def host_total_bytes() -> int:
    """The host's total memory, as llama.cpp's CPU device reports it (physical pages × page size)."""
    import os

    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def preview_fit(headers: list[GGUFFile], ctx: ContextShape, *, n_ctx: int, margin_bytes: int,
                n_ctx_min: int) -> dict[str, object]:
    """What --fit would choose for these GGUF parts, and why, without loading anything (`info --fit`)."""
    shape = ModelShape.from_gguf(headers[0], headers)
    total = host_total_bytes()
    if n_ctx > 0:
        plan = FitPlan(n_ctx, (f"context size set by -c to {n_ctx}: no change",))
    elif gpu_device_present():
        plan = FitPlan(shape.n_ctx_train, ("fitting to GPU memory needs llama.cpp's common library, which the "
                                           "bindings do not export: the trained context is kept",))
    else:
        plan = plan_fit(shape, ctx, total_bytes=total, margin_bytes=margin_bytes, n_ctx_min=n_ctx_min)
    return {"n_ctx": plan.n_ctx, "n_ctx_train": shape.n_ctx_train, "projected_bytes": projected_bytes(
        shape, plan.n_ctx, ctx), "host_total_bytes": total, "margin_bytes": margin_bytes, "reasons": list(plan.reasons)}
