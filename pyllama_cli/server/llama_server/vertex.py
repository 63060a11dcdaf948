"""Vertex AI's custom-container protocol, as llama-server speaks it when started with AIP_MODE=PREDICTION:
the server listens on AIP_HTTP_PORT, answers AIP_HEALTH_ROUTE as /health, and POST AIP_PREDICT_ROUTE
(default /predict) takes {"instances": [...]}: each instance names a route in `@requestFormat` (a path,
or its camelCase name: "chatCompletions" for /v1/chat/completions) and is that route's body. The answer
is {"predictions": [...]}, each the route's answer (or an {"error": ...} object), in order; instances
run at once, and none streams.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.routing import APIRoute

from ..errors import APIError
from ..settings import vertex_mode

MAX_INSTANCES = 128  # llama-server's bound on one request's instances
_HOP_HEADERS = {b"content-length", b"transfer-encoding", b"connection", b"content-type"}


def _route(name: str, default: str) -> str:
    value = os.environ.get(name) or default
    return value if not value or value.startswith("/") else "/" + value


def format_name(path: str) -> str:
    """A route's camelCase name: /v1/chat/completions -> chatCompletions, /apply-template -> applyTemplate."""
    path = path.removeprefix("/v1").lstrip("/").split("{")[0]
    words = [w for w in re.split(r"[/_-]", path) if w]
    return "".join([words[0], *(w[:1].upper() + w[1:] for w in words[1:])]) if words else ""


def add_routes(app: FastAPI) -> None:
    """The predict route (and the health alias) when AIP_MODE=PREDICTION; nothing otherwise."""
    if not vertex_mode():
        return
    health = _route("AIP_HEALTH_ROUTE", "")
    if health:
        app.add_api_route(health, _health_alias(app), methods=["GET"], include_in_schema=False)
    paths: dict[str, str] = {}
    for route in app.routes:
        if isinstance(route, APIRoute) and "POST" in route.methods:
            paths.setdefault(format_name(route.path), route.path)
            paths.setdefault(route.path, route.path)

    async def predict(request: Request) -> Any:
        """Vertex AI prediction: each instance run by the route its @requestFormat names."""
        try:
            body = await request.json()
        except ValueError as exc:
            raise APIError(400, f"the body is not JSON: {exc}") from None
        if not isinstance(body, dict) or not isinstance(body.get("instances"), list):
            raise APIError(400, "the body must be a JSON object with an array field named instances",
                           param="instances")
        if len(body["instances"]) > MAX_INSTANCES:
            raise APIError(400, f"instances holds {len(body['instances'])} items; at most {MAX_INSTANCES}",
                           param="instances")
        answers = await asyncio.gather(*(_run(app, request, paths, item) for item in body["instances"]))
        return {"predictions": answers}

    app.add_api_route(_route("AIP_PREDICT_ROUTE", "/predict"), predict, methods=["POST"], tags=["Server"])


async def _run(app: FastAPI, request: Request, paths: dict[str, str], instance: Any) -> Any:
    if not isinstance(instance, dict):
        return _error("each instance must be a JSON object")
    name = instance.get("@requestFormat")
    if not isinstance(name, str):
        return _error("each instance must include a string @requestFormat")
    if name not in paths:
        return _error(f"no route for @requestFormat {name!r}")
    payload = {k: v for k, v in instance.items() if k != "@requestFormat"}
    if "stream" in payload:
        payload["stream"] = False  # a prediction is one JSON answer
    status, data = await call(app, request, "POST", paths[name], json.dumps(payload).encode())
    try:
        return json.loads(data)
    except ValueError:
        return data.decode("utf-8", errors="replace")


async def call(app: FastAPI, request: Request, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
    """Run one request through the whole app (its middleware included) in this process, as the client of
    `request` (its address and headers, its key among them), and return the status and body."""
    headers = [(k, v) for k, v in request.scope["headers"] if k.lower() not in _HOP_HEADERS]
    headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    scope = {**request.scope, "method": method, "path": path, "raw_path": path.encode(), "query_string": b"",
             "headers": headers, "state": {}}
    scope.pop("route", None)
    scope.pop("endpoint", None)
    scope.pop("path_params", None)
    sent = asyncio.Event()
    chunks: list[bytes] = []
    status = 500

    async def receive() -> dict[str, Any]:
        if not sent.is_set():
            sent.set()
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client stays connected until the answer is whole
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return status, b"".join(chunks)


def _error(message: str) -> dict[str, Any]:
    return {"error": {"code": 400, "message": message, "type": "invalid_request_error"}}


def _health_alias(app: FastAPI) -> Any:
    async def health(request: Request) -> Any:
        from fastapi.responses import Response

        status, data = await call(app, request, "GET", "/health")
        return Response(data, status_code=status, media_type="application/json")

    return health
