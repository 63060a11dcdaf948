"""Request guards: the body size limit (413 before parsing), and CORS for browser front ends.

It also reads curl's default `application/x-www-form-urlencoded` (what `curl -d '{...}'` sends)
as JSON, as llama-server does, so the common curl one-liner works.
"""

from __future__ import annotations

import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import APIError

_FORM = b"application/x-www-form-urlencoded"
# An oversized body is read and dropped (up to this much) before the 413 goes out: a client still
# uploading would otherwise see a reset connection instead of the answer.
_DRAIN_CAP = 256 * 1024 * 1024


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_body_size: int):
        self.app = app
        self.limit = max_body_size

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        headers = [(k, v) for k, v in scope["headers"]]
        declared = next((v for k, v in headers if k == b"content-length"), None)
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await _drain(receive, _DRAIN_CAP)
            await self._too_large(scope, receive, send, int(declared))
            return
        scope = {**scope, "headers": [(k, b"application/json" if k == b"content-type" and v.startswith(_FORM)
                                       else v) for k, v in headers]}
        if declared is not None:
            await self.app(scope, receive, send)
            return
        # Chunked upload: read it all (up to the limit) before the app sees any of it.
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.limit:
                if more:
                    await _drain(receive, _DRAIN_CAP)
                await self._too_large(scope, receive, send, None)
                return
        await self.app(scope, _replay(body, receive), send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send, size: int | None) -> None:
        got = f" ({size} bytes)" if size is not None else ""
        error = APIError(413, f"the request body{got} is larger than the server's limit of {self.limit} bytes",
                         code="request_too_large")
        await error.response(headers={"Connection": "close"}, path=scope["path"])(scope, receive, send)


async def _drain(receive: Receive, cap: int) -> None:
    seen = 0
    while seen <= cap:
        message = await receive()
        if message["type"] != "http.request":
            return
        seen += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


# ---------------------------------------------------------------- CORS

ANY_ORIGIN = "*"
_LOOPBACK_ORIGIN = re.compile(r"^https?://(localhost|127\.0\.0\.1|\[::1\])(:[0-9]{1,5})?$", re.IGNORECASE)
_PREFLIGHT_HEADERS = [(b"Access-Control-Allow-Methods", b"GET, POST, DELETE, OPTIONS"),
                      (b"Access-Control-Allow-Headers", b"*"), (b"Access-Control-Max-Age", b"600")]


def origin_allowed(origin: str, allowed: tuple[str, ...]) -> bool:
    """Loopback origins (a local web front end) always; others when --cors-origin names them, or '*'."""
    return ANY_ORIGIN in allowed or origin in allowed or bool(_LOOPBACK_ORIGIN.match(origin))


class CorsMiddleware:
    """Reflect an allowed request origin, with credentials, as llama-server does for every origin.

    A preflight (OPTIONS with Access-Control-Request-Method) is answered here with 200; for an
    origin that is not allowed the answer carries no CORS headers, so the browser refuses.
    """

    def __init__(self, app: ASGIApp, origins: tuple[str, ...]):
        self.app = app
        self.origins = origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        origin = headers.get(b"origin", b"").decode("latin-1")
        allowed = bool(origin) and origin_allowed(origin, self.origins)
        cors = [(b"Access-Control-Allow-Origin", origin.encode("latin-1")),
                (b"Access-Control-Allow-Credentials", b"true"), (b"Vary", b"Origin")] if allowed else []
        if scope["method"] == "OPTIONS" and b"access-control-request-method" in headers:
            extra = cors + _PREFLIGHT_HEADERS if allowed else []
            await send({"type": "http.response.start", "status": 200,
                        "headers": [*extra, (b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})
            return
        if not cors:
            await self.app(scope, receive, send)
            return

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *cors]}
            await send(message)

        await self.app(scope, receive, send_with_cors)
