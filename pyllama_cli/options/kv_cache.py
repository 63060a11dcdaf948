"""KV cache flags of every command that loads a model, with llama.cpp's names: `-ctk/--cache-type-k`,
`-ctv/--cache-type-v`, `--swa-full`, `-kvo/--kv-offload` and `-nkvo/--no-kv-offload`.

`KV_CACHE_PARAMS` joins the load flags (load.py); `kv_cache_settings(kwargs)` pops their values and
returns the `LoadSettings` fields they set.
"""

from __future__ import annotations

import inspect
from typing import Annotated, Any

import typer

from ..core.model.settings import DEFAULT_CACHE_TYPE, KV_CACHE_TYPES
from ..errors import UsageError

KV_PANEL = "KV cache"
_TYPES = ", ".join(KV_CACHE_TYPES)

CacheTypeKOpt = Annotated[str, typer.Option(
    "-ctk", "--cache-type-k", metavar="TYPE", help=f"KV cache data type for K: {_TYPES}.",
    rich_help_panel=KV_PANEL)]
CacheTypeVOpt = Annotated[str, typer.Option(
    "-ctv", "--cache-type-v", metavar="TYPE", help=f"KV cache data type for V: {_TYPES} (a quantized type "
    "needs flash attention).", rich_help_panel=KV_PANEL)]
SwaFullOpt = Annotated[bool, typer.Option(
    "--swa-full", help="Use a full-size cache for sliding-window attention layers.", rich_help_panel=KV_PANEL)]
KvOffloadOpt = Annotated[bool, typer.Option(
    "-kvo/-nkvo", "--kv-offload/--no-kv-offload", help="Keep the KV cache (and the attention) on the GPU.",
    rich_help_panel=KV_PANEL)]


def _param(name: str, annotation: Any, default: Any) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)


KV_CACHE_PARAMS = [
    _param("cache_type_k", CacheTypeKOpt, DEFAULT_CACHE_TYPE),
    _param("cache_type_v", CacheTypeVOpt, DEFAULT_CACHE_TYPE),
    _param("swa_full", SwaFullOpt, False),
    _param("kv_offload", KvOffloadOpt, True),
]


def cache_type(value: str, flag: str) -> str:
    """A cache type name as llama.cpp spells it (lower case), or a usage error listing the allowed ones."""
    name = value.strip().lower()
    if name not in KV_CACHE_TYPES:
        raise UsageError(f"{flag} {value!r} is not a KV cache type", hint=f"allowed values: {_TYPES}")
    return name


def kv_cache_settings(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Pop the KV cache flags out of a command's keyword arguments, as LoadSettings fields."""
    return {
        "cache_type_k": cache_type(kwargs.pop("cache_type_k"), "-ctk"),
        "cache_type_v": cache_type(kwargs.pop("cache_type_v"), "-ctv"),
        "swa_full": kwargs.pop("swa_full"),
        "kv_offload": kwargs.pop("kv_offload"),
    }
