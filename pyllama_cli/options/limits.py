"""The server's budgets as flags, for every command that serves (`serve`): its HTTP limits and
shutdown grace, the prompt cache's memory and disk (--cache-ram, --cache-disk...), and what requests'
media may be (--media-domains, --media-path, --media-max-image-size, --media-max-audio-size).

A command declares a `limits: ServerLimits` parameter and decorates itself with `@limit_options()`,
which adds the limit flags (defaults from ServerLimits, written once) and builds the object; likewise
a `prompt_cache: CacheSettings` parameter and `@cache_options()` (defaults from
core/serving/cache/settings.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from ..core.serving.cache.settings import (DEFAULT_CACHE_RAM_MIB, DEFAULT_CTX_CHECKPOINTS, DEFAULT_DISK_MAX,
                                           DEFAULT_DISK_MIN_TOKENS, CacheSettings)
from ..errors import UsageError
from ..server.settings import MediaPolicy, ServerLimits
from .load import option_param, with_flags
from .serve import parse_size

LIMITS_PANEL = "Server limits"
_D = ServerLimits()


def _opt(flag: str, help_text: str, minimum: float) -> Any:
    return typer.Option(flag, min=minimum, help=help_text, rich_help_panel=LIMITS_PANEL)


_LIMIT_PARAMS = [
    option_param("shutdown_grace", Annotated[float, _opt(
        "--shutdown-grace", "Seconds running requests get to finish after SIGTERM/Ctrl-C; then streams end with a "
        "server_shutdown error event and waiting requests get 503.", 0)], _D.shutdown_grace),
    option_param("max_header_size", Annotated[int, _opt(
        "--max-header-size", "Largest total size of a request's header fields in bytes (larger gets 431).", 256)],
        _D.max_header_size),
    option_param("max_headers", Annotated[int, _opt(
        "--max-headers", "Most header fields in one request (more gets 431).", 1)], _D.max_headers),
    option_param("max_url_length", Annotated[int, _opt(
        "--max-url-length", "Longest request URL in bytes (longer gets 414).", 64)], _D.max_url_length),
    option_param("header_timeout", Annotated[float, _opt(
        "--header-timeout", "Seconds a client has to send a request's head; then the connection is closed.", 0.1)],
        _D.header_timeout),
    option_param("body_timeout", Annotated[float, _opt(
        "--body-timeout", "Seconds a client has to send a request's body once its head is in (slower gets 408).",
        0.1)], _D.body_timeout),
    option_param("max_connections", Annotated[int, _opt(
        "--max-connections", "Open connections served at once; a request on one beyond gets 503.", 1)],
        _D.max_connections),
    option_param("keep_alive_timeout", Annotated[float, _opt(
        "--keep-alive-timeout", "Seconds an idle keep-alive connection stays open.", 0.1)], _D.keep_alive_timeout),
    option_param("max_grammar_size", Annotated[int, _opt(
        "--max-grammar-size", "Largest grammar a request's JSON schema or grammar may make, in bytes of GBNF (larger "
        "gets 400): a long enum slows every slot's sampling.", 1024)], _D.max_grammar_size),
    option_param("max_grammar_seconds", Annotated[float, _opt(
        "--max-grammar-seconds", "Longest a request's grammar may take to build (schema conversion and parse; "
        "longer gets 400).", 0.01)], _D.max_grammar_seconds),
    option_param("stream_buffer_size", Annotated[int, _opt(
        "--stream-buffer-size", "Bytes one X-Conversation-Id stream may buffer; past it the stream ends with an "
        "error event (docs/streams.md).", 1024)], _D.stream_buffer_size),
    option_param("stream_sessions", Annotated[int, _opt(
        "--stream-sessions", "X-Conversation-Id streams kept at once; when all are still generating a new one "
        "gets 503.", 1)], _D.stream_sessions),
    option_param("stream_grace", Annotated[float, _opt(
        "--stream-grace", "Seconds a finished X-Conversation-Id stream stays readable at /v1/stream.", 0)],
        _D.stream_grace),
]


def limit_options() -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command the limit flags; it declares a `limits: ServerLimits` parameter."""

    def build(kwargs: dict[str, Any]) -> None:
        kwargs["limits"] = ServerLimits(**{p.name: kwargs.pop(p.name) for p in _LIMIT_PARAMS})

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        return with_flags(fn, ("limits",), _LIMIT_PARAMS, build)

    return decorate


# ---- the prompt cache (core/serving/cache)

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
CacheReuseOpt = Annotated[int, typer.Option(
    "--cache-reuse", min=0, help="Shortest run of a slot's cached tokens that a prompt repeats later on to move "
    "into place by shifting its KV cells instead of evaluating it again (0 = off).",
    rich_help_panel=CACHE_PANEL)]

CtxCheckpointsOpt = Annotated[int, typer.Option(
    "-ctxcp", "--ctx-checkpoints", "--swa-checkpoints", min=0, help="Context checkpoints kept per slot for a "
    "sliding-window or recurrent model, whose cache cannot be cut anywhere: a repeated or continued prompt "
    "restores one instead of evaluating everything again (0 = none).", rich_help_panel=CACHE_PANEL)]

_CACHE_PARAMS = [
    option_param("cache_ram", CacheRamOpt, DEFAULT_CACHE_RAM_MIB),
    option_param("cache_idle_slots", CacheIdleSlotsOpt, True),
    option_param("cache_disk", CacheDiskOpt, None),
    option_param("cache_disk_max", CacheDiskMaxOpt, DEFAULT_DISK_MAX),
    option_param("cache_disk_min_tokens", CacheDiskMinTokensOpt, DEFAULT_DISK_MIN_TOKENS),
    option_param("cache_reuse", CacheReuseOpt, 0),
    option_param("ctx_checkpoints", CtxCheckpointsOpt, DEFAULT_CTX_CHECKPOINTS),
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
            parse_size(kwargs.pop("cache_disk_max"), "--cache-disk-max"), kwargs.pop("cache_disk_min_tokens"),
            kwargs.pop("cache_reuse"), ctx_checkpoints=kwargs.pop("ctx_checkpoints"))

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        return with_flags(fn, ("prompt_cache",), _CACHE_PARAMS, build)

    return decorate


# ---- media in requests (server/openai/media.py, docs/multimodal.md)

MEDIA_PANEL = "Media in requests"
_M = MediaPolicy()
_MEDIA_PARAMS = [
    option_param("media_domains", Annotated[list[str] | None, typer.Option(
        "--media-domains", metavar="HOST", help="Hosts whose http(s) media URLs the server fetches for a request "
        "(repeatable or comma-separated): HOST (on port 80/443), HOST:PORT, *.DOMAIN (names below it), [IPv6]:PORT; "
        "without it only data: URLs are taken, so the server fetches nothing for a client.",
        rich_help_panel=MEDIA_PANEL, show_default=False)], None),
    option_param("media_path", Annotated[Path | None, typer.Option(
        "--media-path", metavar="DIR", help="Folder whose files requests may name as file: URLs (off unless given).",
        rich_help_panel=MEDIA_PANEL, show_default=False, file_okay=False)], None),
    option_param("media_max_image_size", Annotated[str, typer.Option(
        "--media-max-image-size", metavar="SIZE", help="Most image bytes one request may send (bytes, or with "
        "K/M/G; --max-body-size bounds them too).", rich_help_panel=MEDIA_PANEL)], "20MiB"),
    option_param("media_max_audio_size", Annotated[str, typer.Option(
        "--media-max-audio-size", metavar="SIZE", help="Most audio bytes one request may send (bytes, or with "
        "K/M/G).", rich_help_panel=MEDIA_PANEL)], "100MiB"),
]


def _media_domains(values: list[str]) -> tuple[str, ...]:
    """--media-domains' entries, each checked as server/openai/media_fetch.py will match it.

    Raises:
        UsageError: an entry that is not a host, a host with a port, or *.DOMAIN.
    """
    from ..server.openai.media_fetch import host_rule

    entries = tuple(h.strip().lower() for v in values for h in v.split(",") if h.strip())
    for entry in entries:
        try:
            host_rule(entry)
        except ValueError:
            raise UsageError(f"--media-domains {entry}: not a host name or address",
                             hint="give HOST, HOST:PORT, *.DOMAIN or [IPv6]:PORT, e.g. images.example.com") from None
    return entries


def media_policy_options() -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command the flags of what requests' media may be; it declares a `media_policy: MediaPolicy`."""

    def build(kwargs: dict[str, Any]) -> None:
        domains = _media_domains(kwargs.pop("media_domains") or [])
        path = kwargs.pop("media_path")
        kwargs["media_policy"] = MediaPolicy(
            domains=domains, path=path.resolve() if path is not None else None,
            max_image_bytes=parse_size(kwargs.pop("media_max_image_size"), "--media-max-image-size"),
            max_audio_bytes=parse_size(kwargs.pop("media_max_audio_size"), "--media-max-audio-size"))

    return lambda fn: with_flags(fn, ("media_policy",), _MEDIA_PARAMS, build)
