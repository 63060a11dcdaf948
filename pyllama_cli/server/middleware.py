"""Request-body guard: refuse bodies over the size limit with 413 before they are parsed.

It also reads curl's default `application/x-www-form-urlencoded` (what `curl -d '{...}'` sends)
as JSON, as llama-server does, so the common curl one-liner works.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import APIError

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
