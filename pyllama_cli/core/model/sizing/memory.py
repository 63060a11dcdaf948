"""The KV cache: its types and placement as context parameters (-ctk, -ctv, --swa-full, -kvo), and whether
it can fit in this machine's memory, checked before llama.cpp allocates it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol

from ....errors import ModelLoadError, UsageError
from ..library import gpu_device_present, lib
from ..settings import KV_CACHE_TYPES, QUANTIZED_CACHE_TYPES, ROPE_SCALING_TYPES, LoadSettings


class LoadedModel(Protocol):
    """What the check reads of a loaded model (native.Model is one; native.py imports this module)."""

    @property
    def handle(self) -> Any: ...

    @property
    def path(self) -> Path: ...

    @property
    def n_ctx_train(self) -> int: ...


def apply_kv_cache(params: Any, settings: LoadSettings) -> None:
    """-ctk, -ctv, --swa-full and -kvo/-nkvo as context parameters.

    A quantized V cache needs flash attention: llama.cpp turns -fa auto on for it and refuses -fa off
    (no context), so -fa off is refused here with the flags to change.
    """
    params.type_k = KV_CACHE_TYPES[settings.cache_type_k]
    params.type_v = KV_CACHE_TYPES[settings.cache_type_v]
    params.swa_full = settings.swa_full
    params.offload_kqv = settings.kv_offload
    if settings.cache_type_v in QUANTIZED_CACHE_TYPES and settings.flash_attn == "off":
        raise UsageError(f"a quantized V cache (-ctv {settings.cache_type_v}) needs flash attention, and -fa is off",
                         hint="use -fa on (or auto), or a V cache type of f32, f16 or bf16")


def apply_rope(params: Any, settings: LoadSettings) -> None:
    """--rope-scaling, --rope-freq-*, --yarn-* as context parameters (unset ones stay the model's)."""
    if settings.rope_scaling is not None:
        params.rope_scaling_type = ROPE_SCALING_TYPES[settings.rope_scaling]
    params.rope_freq_base = settings.rope_freq_base
    params.rope_freq_scale = settings.rope_freq_scale
    params.yarn_orig_ctx = settings.yarn_orig_ctx
    params.yarn_ext_factor = settings.yarn_ext_factor
    params.yarn_attn_factor = settings.yarn_attn_factor
    params.yarn_beta_slow = settings.yarn_beta_slow
    params.yarn_beta_fast = settings.yarn_beta_fast


def context_failure_hint(settings: LoadSettings) -> str:
    if {settings.cache_type_k, settings.cache_type_v} & QUANTIZED_CACHE_TYPES:
        return ("a quantized cache type needs flash attention and a head size its block size divides: try "
                "-ctk/-ctv f16, or run with --verbose for llama.cpp's reason")
    return "lower -c/--ctx-size, or run with --verbose for llama.cpp's reason (often: not enough memory)"


def check_kv_cache_fits(model: LoadedModel, params: Any, settings: LoadSettings) -> None:
    """Refuse a context whose KV cache alone is bigger than this machine's memory.

    llama.cpp would try anyway: with Linux's overcommit its buffers are granted, then filled, and the
    kernel kills the process (no message, exit 137) once RAM runs out. Only a cache in system memory
    is checked (a GPU's allocation fails cleanly), and only one that is surely that big: models with a
    sliding window or a recurrent state keep less per token than this estimate, so they are left alone.
    The cache is on a GPU only when a GPU device exists: a build with the RPC backend compiled in
    reports GPU offload support without any device to offload to.
    """
    on_gpu = settings.n_gpu_layers != 0 and params.offload_kqv and gpu_device_present()
    handle = model.handle
    if on_gpu or lib.llama_model_n_swa(handle) > 0 or lib.llama_model_is_recurrent(handle) \
            or lib.llama_model_is_hybrid(handle):
        return
    n_head = int(lib.llama_model_n_head(handle))
    memory = _memory_bytes() if n_head > 0 else None
    if memory is None:
        return
    head_dim = int(lib.llama_model_n_embd(handle)) // n_head
    per_layer = int(lib.llama_model_n_head_kv(handle)) * head_dim  # elements per token, for K and for V each
    per_token = int(lib.llama_model_n_layer(handle)) * per_layer * (
        _bytes_per_element(int(params.type_k)) + _bytes_per_element(int(params.type_v)))
    needed = int(params.n_ctx) * per_token
    if needed > memory:
        raise ModelLoadError(
            f"a context of {params.n_ctx} tokens needs a {needed / 2**30:.1f} GiB KV cache for {model.path.name}, "
            f"more than this machine's {memory / 2**30:.1f} GiB of memory",
            hint=f"lower -c/--ctx-size (the model was trained on {model.n_ctx_train} tokens)")


def _bytes_per_element(ggml_type: int) -> float:
    """Bytes per value of a cache type (-ctk/-ctv), from the GGUF reader's type table; a type it does
    not know counts as none, so it can never be the reason for a refusal."""
    from ...gguf.reader import GGML_TYPES

    _, block, size = GGML_TYPES.get(ggml_type, ("", 1, 0))
    return size / block


def _memory_bytes() -> int | None:
    """RAM plus swap: the most any allocation here can ever get (None when it cannot be read)."""
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        return sum(int(fields[key].split()[0]) * 1024 for key in ("MemTotal", "SwapTotal") if key in fields)
    except (OSError, ValueError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None
