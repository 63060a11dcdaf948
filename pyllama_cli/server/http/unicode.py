"""Lone UTF-16 surrogates: JSON's `\\ud800` escape can carry half a pair, which is no Unicode text.

Such a string cannot be tokenized, logged as UTF-8 or written back in a response (pydantic's
serializer raises), so every JSON body is checked once, before any route sees it: 400 in the API's
shape, whichever route it was sent to. Bodies without a `\\uD8..`-`\\uDF..` escape (nearly all) are
passed on after one byte search.
"""

from __future__ import annotations

import re

from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import APIError
from .middleware import _replay

_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
# Every escape in order (`\\` as one), so `\\ud800` (a backslash, then text) is not read as one.
_ESCAPE = re.compile(rb"\\(?:u([0-9a-fA-F]{4})|.)", re.DOTALL)


def lone_surrogate(body: bytes) -> int | None:
    """The first lone surrogate a JSON document's escapes hold (a high half not followed at once by a
    low half, or a low half alone), or None."""
    if not _SURROGATE_ESCAPE.search(body):
        return None
    pending: tuple[int, int] | None = None  # (where its low half must start, the high half)
    for match in _ESCAPE.finditer(body):
        code = int(match.group(1), 16) if match.group(1) else None
        if pending is not None:
            if code is not None and 0xDC00 <= code <= 0xDFFF and match.start() == pending[0]:
                pending = None
                continue
            return pending[1]
        if code is not None and 0xD800 <= code <= 0xDBFF:
            pending = (match.end(), code)
        elif code is not None and 0xDC00 <= code <= 0xDFFF:
            return code
    return pending[1] if pending is not None else None


class LoneSurrogateMiddleware:
    """400 for a request body whose JSON holds a lone surrogate, on every route."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        code = lone_surrogate(body)
        if code is None:
            await self.app(scope, _replay(body, receive), send)
            return
        error = APIError(400, f"the request holds a lone UTF-16 surrogate ('\\u{code:04x}'), which is not "
                         "valid Unicode", code="invalid_value")
        await error.response(path=scope["path"])(scope, receive, send)

