"""The HTTP limits uvicorn's httptools protocol lacks, answered with the status codes HTTP defines.

uvicorn serves with httptools here (installed, and faster than h11). h11's
`h11_max_incomplete_event_size` does not apply to that protocol, and httptools has no limit of its
own: a 64 MiB header was read whole and answered 200. So `guarded_protocol(limits)` is uvicorn's
httptools protocol with these checks added at the parser's callbacks:

- the header fields' total size and their count (431), the request target's length (414);
- the time to send a request head, from the connect or its first byte: then the socket is closed
  (after a 408 if part of a head had come);
- the time to send a request body, from the end of its head (408);
- the open connections: a request on one beyond `max_connections` gets 503 with Retry-After. This
  is uvicorn's `limit_concurrency` check, moved here so that the answer has the API's error shape.

Keep-alive idle time is uvicorn's own `timeout_keep_alive`. Every refusal is the API's error JSON
with `Connection: close`; a refused head never reaches the app.
"""

from __future__ import annotations

import asyncio
import http
import json
from collections.abc import Iterable
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ..errors import ERROR_TYPES
from ..settings import ServerLimits

# A head still arriving is refused once it is longer than the URL and header limits together plus
# this much (the request line and the separators): it can no longer fit. Counting raw bytes bounds
# what httptools buffers of one huge header value, which no callback sees until it is complete.
HEAD_SLACK = 4096
OVER_CAPACITY_RETRY_S = 1
# After a refusal the connection is half-closed and what the client still sends is read and dropped, for
# at most this long and this much: closing at once, with its data unread, would make the kernel send a
# reset that can destroy the answer before the client reads it (a "lingering close", as nginx does).
LINGER_S = 1.0
LINGER_BYTES = 4 * 1024 * 1024


class Refused(Exception):
    """A request the limits refuse: its status, message and error code."""

    def __init__(self, status: int, message: str, code: str):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


def error_bytes(status: int, message: str, code: str, headers: Iterable[tuple[bytes, bytes]] = ()) -> bytes:
    """A whole HTTP/1.1 response carrying the API's error JSON, closing the connection."""
    body = json.dumps({"error": {"message": message, "type": ERROR_TYPES.get(status, "invalid_request_error"),
                                 "param": None, "code": code}}).encode()
    lines = [f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}".encode(), *(k + b": " + v for k, v in headers),
             b"content-type: application/json", b"content-length: " + str(len(body)).encode(),
             b"connection: close"]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


async def over_capacity(scope: Any, receive: Any, send: Any) -> None:
    """The answer to a request on a connection beyond the cap (instead of the app)."""
    body = json.dumps({"error": {"message": "the server has too many open connections; retry shortly",
                                 "type": ERROR_TYPES[503], "param": None, "code": "too_many_connections"}}).encode()
    await send({"type": "http.response.start", "status": 503, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(OVER_CAPACITY_RETRY_S).encode()), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def guarded_protocol(limits: ServerLimits) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol class with `limits` enforced (pass it as uvicorn.Config's `http`)."""
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,), {"limits": limits})


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    limits = ServerLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.in_head = True  # between the end of a request (or the connect) and the end of the next head
        self.head_bytes = 0  # raw bytes received of the head in progress
        self.header_bytes = 0  # bytes of its complete header fields
        self.head_timer: asyncio.TimerHandle | None = None
        self.body_timer: asyncio.TimerHandle | None = None
        self.lingering: int | None = None  # bytes dropped since a refusal (None: not refused)

    # ---- connection

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.head_timer = self.loop.call_later(self.limits.header_timeout, self.head_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self.stop_timers()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.lingering is not None:
            self.lingering += len(data)
            if self.lingering > LINGER_BYTES:
                self.transport.close()
            return
        if self.in_head:
            self.head_bytes += len(data)
            if self.head_timer is None:  # the first byte of a request on a kept-alive connection
                self.head_timer = self.loop.call_later(self.limits.header_timeout, self.head_timed_out)
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if isinstance(exc.__context__, Refused):  # raised by a callback below
                self.refuse(exc.__context__)
                return
            self.logger.warning("Invalid HTTP request received.")
            self.send_400_response("Invalid HTTP request received.")
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        if self.in_head and self.head_bytes > self.head_cap and not self.transport.is_closing():
            self.refuse(Refused(431, f"the request head is larger than the server's limit of "
                                     f"{self.limits.max_header_size} bytes of header fields",
                                "request_header_fields_too_large"))

    @property
    def head_cap(self) -> int:
        return self.limits.max_url_length + self.limits.max_header_size + HEAD_SLACK

    # ---- parser callbacks

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        if len(self.url) > self.limits.max_url_length:
            raise Refused(414, f"the URL is longer than the server's limit of {self.limits.max_url_length} bytes",
                          "uri_too_long")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.header_bytes = 0

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_bytes += len(name) + len(value) + 4  # "name: value\r\n"
        if len(self.headers) >= self.limits.max_headers:
            raise Refused(431, f"the request has more than the server's limit of {self.limits.max_headers} "
                               "header fields", "request_header_fields_too_large")
        if self.header_bytes > self.limits.max_header_size:
            raise Refused(431, f"the request's header fields are larger than the server's limit of "
                               f"{self.limits.max_header_size} bytes", "request_header_fields_too_large")
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self.in_head, self.head_bytes = False, 0
        self.cancel_head_timer()
        # uvicorn's limit_concurrency check, with the API's error shape; self.app is read only here.
        self.app = over_capacity if len(self.connections) > self.limits.max_connections else self.config.loaded_app
        super().on_headers_complete()
        if self.has_body():
            self.body_timer = self.loop.call_later(self.limits.body_timeout, self.body_timed_out)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        if self.body_timer is not None:
            self.body_timer.cancel()
            self.body_timer = None
        self.in_head, self.head_bytes = True, 0

    def has_body(self) -> bool:
        for name, value in self.headers:
            if name == b"transfer-encoding" or (name == b"content-length" and value.strip() not in (b"0", b"")):
                return True
        return False

    # ---- timers and refusals

    def head_timed_out(self) -> None:
        self.head_timer = None
        if not self.in_head or self.transport.is_closing():
            return
        if self.head_bytes:  # part of a head came: say why the connection ends
            self.refuse(Refused(408, f"the request head did not arrive within {self.limits.header_timeout:g} s",
                                "request_timeout"))
        else:  # an idle connection that never sent a request
            self.transport.close()

    def body_timed_out(self) -> None:
        self.body_timer = None
        if self.transport.is_closing() or self.cycle is None or not self.cycle.more_body:
            return
        if self.flow.read_paused:  # the server is not reading (the app is busy): not the client's fault
            self.body_timer = self.loop.call_later(self.limits.body_timeout, self.body_timed_out)
            return
        if self.cycle.response_started:  # answered already (a 401, a 413): no second answer, just close
            self.stop_timers()
            self.transport.close()
            return
        self.refuse(Refused(408, f"the request body did not arrive within {self.limits.body_timeout:g} s",
                            "request_timeout"))

    def refuse(self, refusal: Refused) -> None:
        """Answer `refusal` and close, unless a response is already going out on this connection
        (a pipelined request): then only close."""
        self.stop_timers()
        cycle = self.cycle
        if cycle is None or cycle.response_complete or not cycle.response_started:
            self.transport.write(error_bytes(refusal.status, refusal.message, refusal.code,
                                             self.server_state.default_headers))
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the app, if it is reading the body, sees the client gone
            cycle.message_event.set()
        self.logger.info("%s - refused: %d %s", _client(self.client), refusal.status, refusal.message)
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()
        self.lingering = 0
        self.flow.resume_reading()
        self.loop.call_later(LINGER_S, self.transport.close)

    def cancel_head_timer(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def stop_timers(self) -> None:
        self.cancel_head_timer()
        if self.body_timer is not None:
            self.body_timer.cancel()
            self.body_timer = None


def _client(address: tuple[str, int] | None) -> str:
    return f"{address[0]}:{address[1]}" if address else "-"
