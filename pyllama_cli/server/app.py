"""The FastAPI application: OpenAI's routes plus llama-server's /health, /metrics, /tokenize and friends.

`create_app(models, settings)` holds everything a request needs in `app.state`; there is no module
state, so several apps can live in one process. Routes only translate: they ask the `ModelSet`
(models.py) for the model a request names, prepare.py turns the request into an engine job, and
openai_answers.py answers with what the engine yields.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.concurrency import run_in_threadpool

from .. import __version__
from ..core.serving.engine import BROKEN, Engine
from ..core.serving.jobs import EmbeddingJob
from ..errors import InputError
from . import openai_answers
from .anthropic import routes as anthropic
from .openai_responses import routes as openai_responses
from .http.auth import ApiKeyMiddleware
from .errors import ERROR_TYPES, APIError, install_error_handlers, loading_error
from .http.leases import LeaseMiddleware
from .metrics import CONTENT_TYPE, Metrics, MetricsMiddleware
from .llama import routes as llama_routes
from .lora import routes as lora_routes
from .rerank import routes as rerank_routes
from .http.middleware import BodyLimitMiddleware, CorsMiddleware
from .models import ModelSet
from .prepare import (
    message_dicts,
    plan_request_tools,
    prepare_chat,
    prepare_completion,
    prompt_tokens,
    render_prompt,
)
from .schemas import (
    ApplyTemplateRequest,
    ApplyTemplateResponse,
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    DetokenizeRequest,
    DetokenizeResponse,
    EmbeddingList,
    EmbeddingRequest,
    ErrorResponse,
    HealthResponse,
    ModelCard,
    ModelList,
    ModelLoadRequest,
    TokenizeRequest,
    TokenizeResponse,
)
from .settings import ServerSettings
from .webui.routes import add_webui_routes

ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": kind} for status, kind in ERROR_TYPES.items()
    if status in (400, 401, 404, 413, 503)
}
T = TypeVar("T")
# A request body this small is turned into a job on the event loop itself (~0.1 ms: a short prompt to
# tokenize, a small template or schema). Under load the thread pool's hand-off is what costs: its worker
# waits for a CPU that the decode threads hold (measured 2 ms at p50 with 4 streams on 2 cores), and
# that wait lands in every request's time to first token.
INLINE_PREPARE_BYTES = 8192


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

    app = FastAPI(title="pyllama serve", version=__version__, lifespan=lifespan,
                  description="An OpenAI-compatible API over llama.cpp. Send `Authorization: Bearer KEY` when the "
                              "server was started with --api-key.")
    app.state.models = models
    app.state.settings = settings
    install_error_handlers(app)
    _add_routes(app, models)
    llama_routes.add_routes(app)
    lora_routes.add_routes(app, models)
    rerank_routes.add_routes(app, models)
    add_webui_routes(app, settings)
    app.state.metrics = Metrics(route.path for route in app.routes)
    # Added innermost first: metrics see every answer, CORS headers go on errors too.
    app.add_middleware(LeaseMiddleware)  # a model is held until its answer is sent (router mode)
    app.add_middleware(BodyLimitMiddleware, max_body_size=settings.max_body_size)
    if settings.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=settings.api_key)
    app.add_middleware(CorsMiddleware, origins=settings.cors_origins)
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)
    return app


def _ready(engine: Engine) -> Engine:
    if engine.state == BROKEN:  # up, answering, but the model can no longer run: a balancer takes it out
        message = getattr(engine.error, "message", str(engine.error))
        raise APIError(503, f"the model can no longer run: {message}; restart the server", code="unavailable")
    if not engine.ready:
        raise loading_error()
    return engine


def _generation(engine: Engine) -> Engine:
    _ready(engine)
    if engine.embeddings:
        # 400, not llama-server's 501: clients (OpenAI's included) retry 5xx answers, and retrying cannot help.
        raise APIError(400, "this server was started with --embeddings: it serves /v1/embeddings only",
                       code="not_supported")
    return engine


def _add_routes(app: FastAPI, models: ModelSet) -> None:
    _add_openai_routes(app, models)
    _add_utility_routes(app, models)
    anthropic.add_routes(app, models, _generation, _prepare)
    openai_responses.add_routes(app, models, _generation, _prepare)


def _add_openai_routes(app: FastAPI, models: ModelSet) -> None:
    # Each OpenAI route also answers without /v1, as llama-server's do, for clients whose base URL lacks it.
    # Not /completions: in llama-server that is the native API, with another shape.
    @app.post("/v1/chat/completions", response_model=ChatCompletion, responses=ERRORS, tags=["OpenAI"])
    @app.post("/chat/completions", include_in_schema=False)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
        """Answer a conversation; `stream: true` sends server-sent events ending with `data: [DONE]`."""
        return await _generate(models, body, request, prepare_chat, openai_answers.chat_stream,
                               openai_answers.chat_body)

    @app.post("/v1/completions", response_model=Completion, responses=ERRORS, tags=["OpenAI"])
    async def text_completions(body: CompletionRequest, request: Request) -> Any:
        """Continue a prompt (a string, a list of strings, or token ids)."""
        return await _generate(models, body, request, prepare_completion, openai_answers.completion_stream,
                               openai_answers.completion_body)

    @app.post("/v1/embeddings", response_model=EmbeddingList, responses=ERRORS, tags=["OpenAI"])
    @app.post("/embeddings", include_in_schema=False)
    async def embeddings(body: EmbeddingRequest, request: Request) -> Any:
        """L2-normalised, pooled embeddings of each input (needs a server started with --embeddings)."""
        served = await models.get(body.model)
        engine = _ready(served.engine)
        if not engine.embeddings:
            raise APIError(400, "this server does not compute embeddings: start it with --embeddings",
                           code="not_supported")
        if getattr(engine, "pooling", -1) in (0, 4):  # none: a vector per token; rank: scores (POST /rerank)
            raise APIError(400, f"this server pools with {'none' if engine.pooling == 0 else 'rank'}: its "  # type: ignore[attr-defined]
                           "embeddings are not one vector per input; restart it with --pooling mean, cls or last",
                           code="not_supported")
        inputs = await run_in_threadpool(prompt_tokens, engine, body.input, "input")
        for ids in inputs:
            if len(ids) >= engine.n_ctx or len(ids) > engine.summary.n_batch:
                limit = min(engine.n_ctx - 1, engine.summary.n_batch)
                raise APIError(400, f"an input has {len(ids)} tokens but at most {limit} fit",
                               param="input", code="context_length_exceeded")
        vectors: list[np.ndarray] = []
        async for ev in engine.submit(EmbeddingJob(tuple(tuple(ids) for ids in inputs))):
            vectors = ev.embeddings or vectors
        n_tokens = sum(len(ids) for ids in inputs)
        data = [{"object": "embedding", "index": i, "embedding": _encode(v, body.encoding_format)}
                for i, v in enumerate(vectors)]
        return JSONResponse({"object": "list", "data": data, "model": served.id,
                             "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}})

    @app.get("/v1/models", response_model=ModelList, tags=["OpenAI"])
    @app.get("/models", include_in_schema=False)
    async def list_models() -> Any:
        """The models this server serves."""
        # As built, not through the response model: fields a model lacks (runtime, error) are left out, not null.
        return JSONResponse({"object": "list", "data": models.cards()})

    @app.get("/v1/models/{model_id:path}", response_model=ModelCard, responses=ERRORS, tags=["OpenAI"])
    async def get_model(model_id: str) -> Any:
        cards = models.cards()
        for card in cards:
            if model_id == card["id"] or model_id in card["aliases"]:
                return JSONResponse(card)
        ids = ", ".join(repr(card["id"]) for card in cards)
        raise APIError(404, f"the model {model_id!r} is not served here; this server serves {ids}",
                       param="model", code="model_not_found")


def _add_utility_routes(app: FastAPI, models: ModelSet) -> None:
    @app.get("/health", response_model=HealthResponse, responses={503: ERRORS[503]}, tags=["Server"])
    @app.get("/v1/health", include_in_schema=False)  # llama-server's second name for it
    async def health(request: Request) -> Any:
        """200 once the model is loaded, 503 while it loads (router mode: 200 while the router runs)."""
        if models.router and "model" not in request.query_params:
            return {"status": "ok"}
        _ready((await models.named(request)).engine)
        return {"status": "ok"}

    @app.get("/metrics", response_class=PlainTextResponse, tags=["Server"])
    async def metrics() -> Any:
        """Prometheus text: requests, tokens, speeds, queue depth, errors."""
        return PlainTextResponse(app.state.metrics.render(models), media_type=CONTENT_TYPE)

    @app.post("/models/load", responses=ERRORS, tags=["Server"])
    async def load_model(body: ModelLoadRequest) -> Any:
        """Load a model now (router mode; waits until it is loaded)."""
        await models.load(body.model)
        return {"success": True}

    @app.post("/models/unload", responses=ERRORS, tags=["Server"])
    async def unload_model(body: ModelLoadRequest) -> Any:
        """Unload a model (router mode; once its running requests end)."""
        await models.unload(body.model)
        return {"success": True}

    @app.post("/tokenize", response_model=TokenizeResponse, responses=ERRORS, tags=["Server"])
    async def tokenize(body: TokenizeRequest, request: Request) -> Any:
        """Token ids of `content` (with `with_pieces`, each id with its text)."""
        engine = _ready((await models.named(request)).engine)
        # What llama.cpp's tokenizer gives, as llama-server reports it: a BOS the text writes stays
        # after the one add_special adds.
        ids = await run_in_threadpool(engine.tokenize, body.content, add_special=body.add_special,
                                      parse_special=body.parse_special, dedupe_bos=False)
        if not body.with_pieces:
            return {"tokens": ids}
        return {"tokens": [{"id": t, "piece": _piece(engine.piece(t))} for t in ids]}

    @app.post("/detokenize", response_model=DetokenizeResponse, responses=ERRORS, tags=["Server"])
    async def detokenize(body: DetokenizeRequest, request: Request) -> Any:
        """The text of a list of token ids."""
        engine = _ready((await models.named(request)).engine)
        try:
            return {"content": engine.detokenize(body.tokens)}
        except InputError as exc:
            raise APIError(400, exc.message, param="tokens", code="invalid_value") from None

    @app.post("/apply-template", response_model=ApplyTemplateResponse, responses=ERRORS, tags=["Server"])
    async def apply_template(body: ApplyTemplateRequest, request: Request) -> Any:
        """The prompt the chat template makes of `messages` (and `tools`), as /v1/chat/completions would."""
        served = await models.named(request)
        _ready(served.engine)
        plan = plan_request_tools(body.tools, body.tool_choice)
        prompt = await run_in_threadpool(render_prompt, served.engine, served.settings, message_dicts(body.messages),
                                         plan)
        return {"prompt": prompt}


async def _generate(models: ModelSet, body: Any, request: Request, prepare: Callable[..., Any],
                    stream: Callable[..., Any], answer: Callable[..., Any]) -> Any:
    """The path both generation endpoints take: find the model, check, prepare, then stream or answer whole.

    Each endpoint keeps its own signature, so the OpenAPI schema names its request and response types.
    """
    served = await models.get(body.model, body.keep_alive)
    engine, settings = served.engine, served.settings
    with engine.arriving():
        _generation(engine)
        prepared = await _prepare(request, prepare, engine, settings, body)
        if body.stream:
            return stream(engine, prepared, served.id, _include_usage(body))
        return JSONResponse(await answer(engine, prepared, served.id, request))


async def _prepare(request: Request, prepare: Callable[..., T], *args: Any) -> T:
    """Run `prepare` inline for a small request body, in the thread pool for a large one (or one of
    unknown size), so that a long prompt or a big schema never holds up the other streams."""
    size = request.headers.get("content-length", "")
    if size.isdigit() and int(size) <= INLINE_PREPARE_BYTES:
        return prepare(*args)
    return await run_in_threadpool(prepare, *args)


def _include_usage(body: Any) -> bool:
    return bool(body.stream_options and body.stream_options.include_usage)


def _encode(vector: np.ndarray, encoding: str) -> Any:
    if encoding == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()


def _piece(data: bytes) -> str | list[int]:
    """A token's text as llama-server shapes it: a string when its bytes pass llama-server's UTF-8
    check, else the list of byte values. That check looks only at lead and continuation bytes, so it
    passes what Unicode forbids (a surrogate, an overlong form); its JSON writer then puts U+FFFD for
    what it cannot encode, as errors="replace" does."""
    return data.decode("utf-8", errors="replace") if _utf8_shaped(data) else list(data)


def _utf8_shaped(data: bytes) -> bool:
    """Whether every byte sequence in `data` has a lead byte and as many continuation bytes as it says."""
    i, n = 0, len(data)
    while i < n:
        lead = data[i]
        size = 1 if lead < 0x80 else 2 if lead & 0xE0 == 0xC0 else 3 if lead & 0xF0 == 0xE0 else \
            4 if lead & 0xF8 == 0xF0 else 0
        if size == 0 or i + size > n or any(b & 0xC0 != 0x80 for b in data[i + 1:i + size]):
            return False
        i += size
    return True


