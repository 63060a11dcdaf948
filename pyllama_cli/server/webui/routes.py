"""The chat page's routes: GET / (the page), its script and style, and POST /render.

The page loads without an API key (it holds no data, and it is where a user types the key);
everything it fetches afterwards goes through the public API with the key. Its Content-Security-Policy
allows scripts and styles from this server only, with no inline script: model output that slipped
through the sanitizer still could not run.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import cache
from importlib.resources import files

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict
from starlette.concurrency import run_in_threadpool

from ..model_set import ModelSet
from .render import RenderLimiter, check_size, render_markdown

PAGE = "/"
MEDIA_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}
# /webui/NAME for each script module and style sheet of the page (app.js imports the other modules).
ASSETS = {f"/webui/{f.name}": (f.name, MEDIA_TYPES[ext]) for f in files(__package__).iterdir()
          if (ext := "." + f.name.rpartition(".")[2]) in MEDIA_TYPES}
# What the API-key check lets through: the page and its two files, never an API route.
PAGE_PATHS = frozenset({PAGE, *ASSETS})
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; media-src data:; "
       "form-action 'none'; frame-ancestors 'none'; base-uri 'none'")
# X-Frame-Options: what browsers that predate CSP's frame-ancestors read instead.
HEADERS = {"Content-Security-Policy": CSP, "X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff",
           "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"}


class RenderRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str


class RenderResponse(BaseModel):
    html: str


@cache
def asset(name: str) -> bytes:
    """One of the page's files, read once from the package."""
    return files(__package__).joinpath(name).read_bytes()


def add_routes(app: FastAPI, models: ModelSet) -> None:
    """Serve the chat page on `app` (create_app leaves this out with --no-webui). The page finds the
    models through the public API, as any client does, so `models` is not read here."""
    limiter = RenderLimiter()

    @app.get(PAGE, include_in_schema=False)
    async def page() -> Response:
        return Response(asset("index.html"), media_type="text/html; charset=utf-8", headers=HEADERS)

    for path, (name, media_type) in ASSETS.items():
        app.add_api_route(path, _asset_route(name, media_type), methods=["GET"], include_in_schema=False)

    @app.post("/render", response_model=RenderResponse, tags=["Web UI"])
    async def render(body: RenderRequest) -> JSONResponse:
        """Markdown (a model's answer) as sanitized HTML with highlighted code, as the chat page shows it."""
        check_size(body.text)
        async with limiter:
            html = await run_in_threadpool(render_markdown, body.text)
        return JSONResponse({"html": html})


def _asset_route(name: str, media_type: str) -> Callable[[], Awaitable[Response]]:
    async def serve_asset() -> Response:
        return Response(asset(name), media_type=media_type, headers=HEADERS)

    serve_asset.__name__ = f"webui_{name.replace('.', '_')}"
    return serve_asset
