"""The FastAPI application: the guards around every route, and each API family's routes.

`create_app(models, settings)` holds everything a request needs in `app.state`; there is no module
state, so several apps can live in one process. Each API family is a package with one
`add_routes(app, models)`: openai/ (chat, completions, embeddings, models), llama_server/ (its native
API), anthropic/ (Messages), responses_api/ (OpenAI's Responses), tools/ (llama-server's built-in tools), ollama/ (ollama's API) and webui/
(the chat page). Their generation routes all take spine.py's path; the server's own routes (/health,
/metrics, /models/load and /models/unload, and the router's POST /models, DELETE /models and
/models/sse) are here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, StreamingResponse
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from .. import __version__
from . import spine
from .anthropic import routes as anthropic
from .errors import OPENAPI_ERRORS, APIError, install_error_handlers
from .http.access_log import AccessLogMiddleware
from .http.auth import ApiKeyMiddleware
from .http.leases import LeaseMiddleware
from .http.middleware import BodyLimitMiddleware, CorsMiddleware
from .job_rules import Lenient
from .llama_server import routes as llama_server
from .llama_server import cors_proxy as cors_proxy_route
from .llama_server import vertex
from .lora import routes as lora
from .metrics import CONTENT_TYPE, Metrics, MetricsMiddleware
from .model_set import ModelSet
from .ollama import routes as ollama
from .openai import routes as openai
from .rerank import routes as rerank
from .responses_api import routes as responses_api
from .http.hosts import AllowedHostsMiddleware
from .http.unicode import LoneSurrogateMiddleware
from .http.docs import docs_urls
from .settings import ServerSettings
from .streams.endpoints import add_stream_routes
from .streams.sessions import StreamSessions
from .tools import routes as tools
from .webui import routes as webui

# Every API family, in the order its routes are added, each by its `add_routes(app, models)`; the web
# page's too, unless --no-webui. ollama's GET / comes before the page's, so it answers first: "Ollama is
# running" to its clients, the page to a browser (Accept: text/html).
API_FAMILIES = (openai, anthropic, responses_api, llama_server, lora, rerank, tools, ollama)


class HealthResponse(BaseModel):
    status: Literal["ok"]


class ModelLoadRequest(Lenient):
    model: str = Field(description="A model id (see /v1/models).")


def create_app(models: ModelSet, settings: ServerSettings) -> FastAPI:
    """The server for `models`; it starts their loading on startup and closes them on shutdown.

    `settings` holds the server-wide options (key, CORS, body limit); each model has its own too.
    """

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        models.start()
        try:
            yield
        finally:
            await run_in_threadpool(models.close)

    app = FastAPI(title="pyllama serve", version=__version__, lifespan=lifespan, **docs_urls(settings.docs),
                  description="An OpenAI-compatible API over llama.cpp. Send `Authorization: Bearer KEY` when the "
                              "server was started with --api-key.")
    app.state.models = models
    app.state.settings = settings
    limits = settings.limits
    app.state.streams = StreamSessions(limits.stream_sessions, limits.stream_buffer_size, limits.stream_grace)
    install_error_handlers(app)
    _add_server_routes(app, models)
    add_stream_routes(app)  # the replay buffer (X-Conversation-Id): spine-level, not a family
    for family in API_FAMILIES:
        family.add_routes(app, models)
    if settings.webui:
        webui.add_routes(app, models)
    vertex.add_routes(app)  # AIP_MODE=PREDICTION only: Vertex AI's /predict over the routes above
    app.state.metrics = Metrics(route.path for route in app.routes)
    if settings.metrics:  # a sleeping server answers /metrics with what it showed when it fell asleep
        models.on_sleep(lambda: app.state.metrics.fall_asleep(models))
    # Added innermost first: metrics see every answer, CORS headers go on errors too.
    app.add_middleware(LeaseMiddleware)  # a model is held until its answer is sent (router mode)
    app.add_middleware(LoneSurrogateMiddleware)  # no route ever sees half a UTF-16 pair
    app.add_middleware(BodyLimitMiddleware, max_body_size=settings.max_body_size)
    if settings.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=settings.api_key, pages=webui.PAGE_PATHS)
    app.add_middleware(CorsMiddleware, origins=settings.cors_origins)
    app.add_middleware(AllowedHostsMiddleware, hosts=settings.allowed_hosts)
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)
    if settings.access_log:  # outermost: it sees every answer, the middlewares' own (401, 413) too
        app.add_middleware(AccessLogMiddleware, log_format=settings.access_log, verbose=settings.verbose)
    return app


def _add_server_routes(app: FastAPI, models: ModelSet) -> None:
    @app.get("/health", response_model=HealthResponse, responses={503: OPENAPI_ERRORS[503]}, tags=["Server"])
    @app.get("/v1/health", include_in_schema=False)  # llama-server's second name for it
    async def health(request: Request) -> Any:
        """200 once the model is loaded, 503 while it loads (router mode: 200 while the router runs)."""
        if models.router and "model" not in request.query_params:
            return {"status": "ok"}
        spine.ready((await models.named(request)).engine)
        return {"status": "ok"}

    @app.get("/metrics", response_class=PlainTextResponse, tags=["Server"])
    async def metrics() -> Any:
        """Prometheus text: requests, tokens, speeds, queue depth, errors; pyllama_* and llama-server's
        llamacpp:* series (501 when started with --no-metrics)."""
        if not app.state.settings.metrics:
            raise APIError(501, "This server does not support metrics endpoint. Start it with `--metrics`")
        return PlainTextResponse(app.state.metrics.render(models), media_type=CONTENT_TYPE,
                                 headers={"Process-Start-Time-Unix": str(app.state.metrics.started)})

    @app.api_route("/cors-proxy", methods=["GET", "POST"], include_in_schema=False)
    async def cors_proxy(request: Request) -> Any:
        """llama-server's web-page proxy: fetches ?url= with --ui-mcp-proxy, 403 without (its default)."""
        if not app.state.settings.cors_proxy:
            cors_proxy_route.refused()
        return await cors_proxy_route.proxy(request)

    @app.post("/models/load", responses=OPENAPI_ERRORS, tags=["Server"])
    async def load_model(body: ModelLoadRequest) -> Any:
        """Load a model now (router mode; waits until it is loaded)."""
        await models.load(body.model)
        return {"success": True}

    @app.post("/models", responses=OPENAPI_ERRORS, tags=["Server"])
    async def add_model(body: ModelLoadRequest) -> Any:
        """Download a model (`user/repo[:QUANT]`) from the Hugging Face Hub and serve it (router mode;
        answers at once, the download goes on: watch GET /models or /models/sse)."""
        await models.add(body.model)
        return {"success": True}

    @app.delete("/models", responses=OPENAPI_ERRORS, tags=["Server"])
    async def remove_model(model: str = "") -> Any:
        """Stop serving `?model=` and delete its files from the Hugging Face cache (router mode; only
        models from the cache)."""
        await models.remove(model)
        return {"success": True}

    @app.get("/models/sse", tags=["Server"])
    async def model_events() -> Any:
        """Server-sent events of models downloaded and removed (router mode)."""
        events = models.model_events()
        return StreamingResponse(events.stream(events.subscribe()), media_type="text/event-stream")

    @app.post("/models/unload", responses=OPENAPI_ERRORS, tags=["Server"])
    async def unload_model(body: ModelLoadRequest) -> Any:
        """Unload a model (router mode; once its running requests end)."""
        await models.unload(body.model)
        return {"success": True}
