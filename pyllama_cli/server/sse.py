"""Server-sent events as OpenAI streams them: `data: {json}` events, then `data: [DONE]`.

A stream that fails after its status line went out (the server shutting down cuts it, a job fails)
ends with an error event, never like a finished answer: `error_event` in OpenAI's shape (a chunk
with an `error` object, then `[DONE]`), `anthropic_error_event` in Anthropic's (`event: error`).

`EventStream` watches for the client going away while it streams and calls `on_disconnect` at
once, so the engine stops generating for a reader that is gone (rather than at the next write).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from .errors import to_api_error

DONE = b"data: [DONE]\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def event(data: dict[str, Any]) -> bytes:
    """One SSE event carrying `data` as compact JSON."""
    return b"data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def error_event(exc: BaseException) -> bytes:
    """The OpenAI chunk that ends a stream cut by `exc`: `{"error": {...}}`, of type `server_shutdown`
    for errors.ServerShutdown. `[DONE]` still follows it."""
    return event(to_api_error(exc).body())


def anthropic_error_event(exc: BaseException) -> bytes:
    """The `event: error` that ends an Anthropic stream cut by `exc` (a shutdown: `overloaded_error`)."""
    return b"event: error\n" + event(to_api_error(exc).anthropic_body())


class TextEvents:
    """The events of a stream's token chunks, which differ in one string only (the new text).

    The JSON around that string is serialised once; each token then costs one string encode
    instead of building and serialising the whole chunk (the bytes are the same as `event`'s).
    """

    MARK = "\ue000pyllama-text\ue000"  # a private-use character cannot occur in a chunk's other fields

    def __init__(self, body_with_mark: dict[str, Any]):
        whole = event(body_with_mark)
        head, found, tail = whole.partition(json.dumps(self.MARK, ensure_ascii=False).encode())
        if not found or self.MARK.encode() in tail:
            raise ValueError("the chunk template must hold MARK exactly once")
        self.head, self.tail = head, tail

    def event(self, text: str) -> bytes:
        return self.head + json.dumps(text, ensure_ascii=False).encode() + self.tail


class EventStream(StreamingResponse):
    """A text/event-stream response over `events` that reports a client disconnect."""

    def __init__(self, events: AsyncIterator[bytes], on_disconnect: Callable[[], None]):
        super().__init__(events, media_type="text/event-stream", headers=HEADERS)
        self.on_disconnect = on_disconnect

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as group:

            async def stream() -> None:
                try:
                    await self.stream_response(send)
                except OSError:  # the socket broke under a write: the same as a disconnect
                    self.on_disconnect()
                group.cancel_scope.cancel()

            group.start_soon(stream)
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    self.on_disconnect()
                    group.cancel_scope.cancel()
                    break
