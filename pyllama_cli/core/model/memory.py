"""Whether a context's KV cache can fit in this machine's memory, checked before llama.cpp allocates it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol

from ...errors import ModelLoadError
from .library import gpu_device_present, lib
from .settings import LoadSettings


class LoadedModel(Protocol):
    """What the check reads of a loaded model (native.Model is one; native.py imports this module)."""

    @property
    def handle(self) -> Any: ...

    @property
    def path(self) -> Path: ...

    @property
    def n_ctx_train(self) -> int: ...


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
    from ..gguf.reader import GGML_TYPES

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
