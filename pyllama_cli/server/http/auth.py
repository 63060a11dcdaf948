"""API-key check: `Authorization: Bearer KEY` (or llama-server's `X-Api-Key: KEY`) on every route but /health.

A pure ASGI middleware, so a request without the key is refused before its body is read or parsed.
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import APIError

# Routes that answer without a key: liveness probes and the API's own documentation.
OPEN_PATHS = frozenset({"/health", "/v1/health", "/docs", "/docs/oauth2-redirect", "/openapi.json"})


class ApiKeyMiddleware:
    """`pages` answer without a key too: the chat page and its files (its API calls then carry the key)."""

    def __init__(self, app: ASGIApp, api_key: str, pages: frozenset[str] = frozenset()):
        self.app = app
        self.expected = api_key.encode()
        self.open_paths = OPEN_PATHS | pages

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths or scope["method"] == "OPTIONS":
            await self.app(scope, receive, send)
            return
        given = _presented_key(dict(scope["headers"]))
        if given is not None and hmac.compare_digest(given, self.expected):
            await self.app(scope, receive, send)
            return
        message = ("missing API key: send it as 'Authorization: Bearer KEY'" if given is None
                   else "invalid API key")
        response = APIError(401, message, code="invalid_api_key").response(headers={"WWW-Authenticate": "Bearer"},
                                                                         path=scope["path"])
        await response(scope, receive, send)


def _presented_key(headers: dict[bytes, bytes]) -> bytes | None:
    auth = headers.get(b"authorization")
    if auth is not None:
        scheme, _, token = auth.strip().partition(b" ")
        return token.strip() if scheme.lower() == b"bearer" else b""
    return headers.get(b"x-api-key")
