"""llama-server's CORS proxy for its web page (`--ui-mcp-proxy`): `GET|POST /cors-proxy?url=URL` fetches
URL for the browser, which could not reach an MCP server of another origin itself. Headers named
`X-Llama-Server-Proxy-Header-NAME` are sent on as `NAME`; the answer's status, type and body come back.

Off unless asked (then the route answers 403): with it on, anyone who can reach the server can make it
fetch any http(s) URL, the machine's own services included. Keep such a server on loopback.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from urllib.parse import urlsplit

from fastapi import Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from ..errors import APIError

HEADER_PREFIX = "x-llama-server-proxy-header-"
TIMEOUT_S = 600  # llama-server's read and write timeouts


def refused() -> None:
    raise APIError(403, "the CORS proxy is off: start the server with --ui-mcp-proxy to let it fetch URLs")


async def proxy(request: Request) -> Response:
    """Fetch ?url= with the request's method, body and X-Llama-Server-Proxy-Header-* headers."""
    target = request.query_params.get("url", "")
    parts = urlsplit(target)
    if parts.scheme not in ("http", "https"):
        raise APIError(400, f"url must be an http or https URL (got {target!r})", param="url")
    if not parts.hostname:
        raise APIError(400, "url has no host", param="url")
    if parts.password is not None:
        raise APIError(400, "url must not carry credentials", param="url")
    headers = {name[len(HEADER_PREFIX):]: value for name, value in request.headers.items()
               if name.lower().startswith(HEADER_PREFIX) and len(name) > len(HEADER_PREFIX)}
    body = await request.body()
    status, media_type, content = await run_in_threadpool(_fetch, request.method, target, headers, body)
    return Response(content, status_code=status, media_type=media_type)


def _fetch(method: str, url: str, headers: dict[str, str], body: bytes) -> tuple[int, str | None, bytes]:
    outgoing = urllib.request.Request(url, data=body if method != "GET" else None, headers=headers, method=method)
    try:
        with urllib.request.urlopen(outgoing, timeout=TIMEOUT_S) as answer:  # noqa: S310 - http(s) only, checked
            return answer.status, answer.headers.get("content-type"), answer.read()
    except urllib.error.HTTPError as exc:  # an error status is the target's answer, passed on as it is
        return exc.code, exc.headers.get("content-type"), exc.read()
    except (urllib.error.URLError, OSError) as exc:
        raise APIError(502, f"the CORS proxy could not fetch {url}: {getattr(exc, 'reason', exc)}") from None
