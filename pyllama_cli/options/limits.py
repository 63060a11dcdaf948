"""The server's HTTP limits and shutdown grace as flags, for every command that serves (`serve`).

A command declares a `limits: ServerLimits` parameter and decorates itself with `@limit_options()`,
which adds the flags below (defaults from ServerLimits, written once) and builds the object.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import typer

from ..server.settings import ServerLimits
from .load import option_param, with_flags

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
