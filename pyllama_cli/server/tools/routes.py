"""`GET /tools` and `POST /tools`, as llama-server answers them.

Off unless `serve --tools` names some (then 403 "this feature is disabled"). On, they answer loopback
clients only: a tool reads, writes and runs anything the server's user may, so a client elsewhere
(or a page of another origin) is refused with 403 even when the server listens on other addresses.
A tool's own failure is `{"error": ...}` with 200; an unknown tool is 404; a runtime refused is 500.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from ..errors import APIError, body_error
from ..model_set import ModelSet
from . import catalog, shell
from .place import Place, place_of


def add_routes(app: FastAPI, models: ModelSet) -> None:
    @app.get("/tools", tags=["llama-server"])
    async def list_tools(request: Request) -> Any:
        """The built-in tools `--tools` turned on, with their function definitions."""
        return [tool.listing() for tool in _guarded(request)]

    @app.post("/tools", tags=["llama-server"])
    async def call_tool(request: Request) -> Any:
        """Run `tool` with `params` (X-Tool-Cwd: the folder); `stream: true` streams a shell command."""
        tools = _guarded(request)
        name, params, stream = _read(await _body(request))
        params.pop("cwd", None)  # the folder is the header's to say, never the model's
        params.pop("runtime", None)
        tool = _find(tools, name, stream)
        place = place_of(request.headers.get("x-tool-cwd", ""), request.headers.get("x-tool-runtime", ""))
        if stream:
            return StreamingResponse(_events(params, place), media_type="text/event-stream")
        try:
            return JSONResponse(await run_in_threadpool(tool.run, params, place))
        except (KeyError, TypeError, ValueError) as exc:
            raise APIError(400, f"bad params for {name}: {_why(exc)}", param="params") from None


def _guarded(request: Request) -> tuple[catalog.Tool, ...]:
    tools = catalog.enabled(request.app.state.settings.tools)
    if not tools:
        raise APIError(403, "this feature is disabled", error_type="feature_disabled")
    if not _loopback(request.client.host if request.client else "") or not _local_origin(request):
        raise APIError(403, "the built-in tools answer loopback clients only", error_type="feature_disabled")
    return tools


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return host == "localhost"


def _local_origin(request: Request) -> bool:
    origin = request.headers.get("origin")
    return origin is None or _loopback((urlsplit(origin).hostname or "").strip("[]"))


async def _body(request: Request) -> Any:
    try:
        return await request.json()
    except (ValueError, RecursionError) as exc:
        raise body_error(exc) from None


def _read(body: Any) -> tuple[str, dict[str, Any], bool]:
    if not isinstance(body, dict) or not isinstance(body.get("tool"), str):
        raise APIError(400, 'the body must be {"tool": NAME, "params": {...}}', param="tool")
    params = body.get("params", {})
    if not isinstance(params, dict):
        raise APIError(400, '"params" must be an object', param="params")
    return body["tool"], dict(params), body.get("stream", False) is True


def _find(tools: tuple[catalog.Tool, ...], name: str, stream: bool) -> catalog.Tool:
    for tool in tools:
        if tool.name == name:
            if stream and not tool.streams:
                raise APIError(404, f'tool "{name}" does not support stream = true', error_type="invalid_request_error")
            return tool
    raise APIError(404, f'unknown tool "{name}"', error_type="invalid_request_error")


async def _events(params: dict[str, Any], place: Place) -> AsyncIterator[str]:
    """llama-server's stream: `{"chunk": TEXT}` events, then `{"done": true}` (with "error" on failure)."""
    done: dict[str, Any] = {"done": True}
    try:
        async for chunk in shell.stream_shell_command(params, place):
            yield _event({"chunk": chunk})
    except Exception as exc:  # noqa: BLE001 - the stream has begun: the failure goes in its last event
        done["error"] = _why(exc)
    yield _event(done)


def _event(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def _why(exc: Exception) -> str:
    return f"missing {exc.args[0]!r}" if isinstance(exc, KeyError) else str(exc)
