"""The prompt cache's flags (--cache-ram, --cache-idle-slots, --cache-disk...), for `serve`.

A command declares a `prompt_cache: CacheSettings` parameter and decorates itself with
`@cache_options()`, which adds the flags below (defaults from core/serving/cache/settings.py) and
builds the object.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from ..core.serving.cache.settings import (DEFAULT_CACHE_RAM_MIB, DEFAULT_DISK_MAX, DEFAULT_DISK_MIN_TOKENS,
                                           CacheSettings)
from ..errors import UsageError
from .limits import parse_size
from .load import option_param, replace_params

CACHE_PANEL = "Prompt cache"
CacheRamOpt = Annotated[int, typer.Option(
    "-cram", "--cache-ram", min=-1, help="Host memory (MiB) for slot states kept across requests: a prompt that starts "
    "like a cached one evaluates only the rest (0 = off, -1 = no limit; router mode: shared by all models).",
    rich_help_panel=CACHE_PANEL)]
CacheIdleSlotsOpt = Annotated[bool, typer.Option(
    "--cache-idle-slots/--no-cache-idle-slots", help="With --kv-unified: when a request starts, save the idle "
    "slots to the cache and clear them, freeing their cells (without it an idle slot is read in place, and saved "
    "when its cells are cut).",
    rich_help_panel=CACHE_PANEL)]
CacheDiskOpt = Annotated[Path | None, typer.Option(
    "--cache-disk", help="Folder for a disk tier of the prompt cache: states survive a restart and a model's "
    "unload (off unless given).", rich_help_panel=CACHE_PANEL, show_default=False, file_okay=False)]
CacheDiskMaxOpt = Annotated[str, typer.Option(
    "--cache-disk-max", help="Largest size of the --cache-disk folder (bytes, or with K/M/G); the least "
    "recently used entries go first.", rich_help_panel=CACHE_PANEL)]
CacheDiskMinTokensOpt = Annotated[int, typer.Option(
    "--cache-disk-min-tokens", min=1, help="Shortest prefix (tokens) written to --cache-disk.",
    rich_help_panel=CACHE_PANEL)]

_CACHE_PARAMS = [
    option_param("cache_ram", CacheRamOpt, DEFAULT_CACHE_RAM_MIB),
    option_param("cache_idle_slots", CacheIdleSlotsOpt, True),
    option_param("cache_disk", CacheDiskOpt, None),
    option_param("cache_disk_max", CacheDiskMaxOpt, DEFAULT_DISK_MAX),
    option_param("cache_disk_min_tokens", CacheDiskMinTokensOpt, DEFAULT_DISK_MIN_TOKENS),
]


def _cache_folder(path: Path | None) -> Path | None:
    """--cache-disk's folder, created when missing (a cache is the server's own to keep).

    Raises:
        UsageError: it cannot be created or written.
    """
    if path is None:
        return None
    folder = path.expanduser().resolve()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not os.access(folder, os.W_OK | os.X_OK):
            raise PermissionError("not writable")
    except OSError as exc:
        raise UsageError(f"--cache-disk {path}: cannot use it as the prompt cache folder ({exc.strerror or exc})",
                         hint="name a folder you can write, or drop --cache-disk") from None
    return folder


def cache_options() -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command the prompt cache flags; it declares a `prompt_cache: CacheSettings` parameter."""

    def build(kwargs: dict[str, Any]) -> None:
        disk = _cache_folder(kwargs.pop("cache_disk"))
        kwargs["prompt_cache"] = CacheSettings(
            kwargs.pop("cache_ram"), kwargs.pop("cache_idle_slots"), disk,
            parse_size(kwargs.pop("cache_disk_max"), "--cache-disk-max"), kwargs.pop("cache_disk_min_tokens"))

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        return replace_params(fn, ("prompt_cache",), _CACHE_PARAMS, build)

    return decorate
