"""The routes of ollama's API: generation (/api/chat, /api/generate), embeddings, and what tells a
client an ollama is here (GET /, HEAD /, /api/version). The model routes are in models.py.

Errors on /api/ paths take ollama's shape, `{"error": "..."}` (errors.py chooses by path); the key
rules, body limit and CORS are the server's, as on every other route.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.concurrency import run_in_threadpool

from ...core.serving.engine import Engine
from ...core.serving.jobs import EmbeddingJob
from .. import spine
from ..errors import APIError
from ..model_set import ModelSet, ServedModel
from ..openai.prepare import PreparedChat
from . import answers
from .answers import CHAT, GENERATE, Clock
from .models import add_model_routes
from .names import Names
from .prepare import prepare_generate, prepare_ollama_chat
from .schemas import ChatRequest, EmbeddingsRequest, EmbedRequest, GenerateRequest

OLLAMA_VERSION = "0.12.6"  # the ollama release whose API this one follows (clients check for a minimum)
RUNNING = "Ollama is running"


def add_routes(app: FastAPI, models: ModelSet) -> None:
    """Add ollama's routes to `app`, over the same models as the other APIs."""
    names = Names(models)
    _add_generation_routes(app, models, names)
    _add_embedding_routes(app, names)
    add_model_routes(app, models, names)
    _add_presence_routes(app)


def _add_generation_routes(app: FastAPI, models: ModelSet, names: Names) -> None:
    @app.post("/api/chat", tags=["ollama"])
    async def chat(body: ChatRequest, request: Request) -> Any:
        """ollama's chat; answers stream as NDJSON unless `stream: false`."""
        return await _generate(models, names, body, request, CHAT, prepare_ollama_chat, not body.messages)

    @app.post("/api/generate", tags=["ollama"])
    async def generate(body: GenerateRequest, request: Request) -> Any:
        """ollama's completion of a prompt (templated unless `raw`), with `context` to continue."""
        empty = not body.prompt and not body.suffix and not body.context
        return await _generate(models, names, body, request, GENERATE, prepare_generate, empty)


async def _generate(models: ModelSet, names: Names, body: Any, request: Request, kind: str,
                    prepare: spine.Prepare[PreparedChat], only_load: bool) -> Response:
    clock = Clock()
    if only_load:  # ollama's way to load a model, or with keep_alive 0 to unload it (after this request)
        served = await names.get(body.model, body.keep_alive)
        unloads = body.keep_alive == 0 and models.router
        return JSONResponse(answers.status_line(served.id, kind, "unload" if unloads else "load"))

    async def find() -> ServedModel:
        served = await names.get(body.model, body.keep_alive)
        clock.loaded()
        return served

    def stream(engine: Engine, prepared: PreparedChat, model: str) -> Response:
        return answers.stream(engine, prepared, model, clock, kind)

    async def whole(engine: Engine, prepared: PreparedChat, model: str, request: Request) -> dict[str, Any]:
        return await answers.whole_body(engine, prepared, model, request, clock, kind)

    return await spine.generate(find(), request, body, prepare, stream, whole)


def _add_embedding_routes(app: FastAPI, names: Names) -> None:
    @app.post("/api/embed", tags=["ollama"])
    async def embed(body: EmbedRequest) -> Any:
        """Embeddings of `input` (a text or a list), L2-normalised (needs a server started with --embeddings)."""
        clock = Clock()
        served = await names.get(body.model, body.keep_alive)
        clock.loaded()
        texts = [body.input] if isinstance(body.input, str) else list(body.input)
        vectors, n_tokens = await _embed(served.engine, texts, body.truncate, "input")
        if body.dimensions is not None:
            vectors = [_shorten(v, body.dimensions) for v in vectors]
        return JSONResponse({"model": served.id, "embeddings": [v.tolist() for v in vectors],
                             "total_duration": clock.total(), "load_duration": clock.load_ns,
                             "prompt_eval_count": n_tokens})

    @app.post("/api/embeddings", tags=["ollama"])
    async def embeddings(body: EmbeddingsRequest) -> Any:
        """ollama's older embedding route: one `prompt`, one `embedding`."""
        served = await names.get(body.model, body.keep_alive)
        if not body.prompt:
            _embedder(served.engine)
            return JSONResponse({"embedding": []})
        [vector], _ = await _embed(served.engine, [body.prompt], True, "prompt")
        return JSONResponse({"embedding": vector.tolist()})


def _embedder(engine: Engine) -> Engine:
    if not spine.ready(engine).embeddings:
        raise APIError(400, "this server does not compute embeddings: start it with --embeddings")
    if getattr(engine, "pooling", -1) in (0, 4):  # none: a vector per token; rank: scores (POST /rerank)
        raise APIError(400, "this server's pooling gives no vector per input: restart it with --pooling mean, "
                       "cls or last")
    return engine


async def _embed(engine: Engine, texts: list[str], truncate: bool, param: str) -> tuple[list[np.ndarray], int]:
    _embedder(engine)
    if not texts:
        return [], 0
    limit = min(engine.n_ctx - 1, engine.summary.n_batch)
    inputs = []
    for text in texts:
        ids = await run_in_threadpool(engine.tokenize, text, add_special=True, parse_special=True)
        if len(ids) > limit:
            if not truncate:
                raise APIError(400, f"{param}: the input has {len(ids)} tokens, more than the {limit} that fit "
                               "(send truncate: true to cut it)", param=param)
            ids = ids[:limit]
        if not ids:
            raise APIError(400, f"{param}: an input has no tokens", param=param)
        inputs.append(tuple(ids))
    vectors: list[np.ndarray] = []
    # ollama's embeddings are always L2-normalised, whatever the server's --embd-normalize.
    async for ev in engine.submit(EmbeddingJob(tuple(inputs), normalize=2)):
        vectors = ev.embeddings or vectors
    return vectors, sum(len(ids) for ids in inputs)


def _shorten(vector: np.ndarray, dimensions: int) -> np.ndarray:
    """The first `dimensions` values, normalised again (what ollama's `dimensions` does)."""
    cut = vector[:dimensions]
    norm = float(np.linalg.norm(cut))
    return cut / norm if norm > 0 else cut


def _add_presence_routes(app: FastAPI) -> None:
    @app.get("/api/version", tags=["ollama"])
    async def version() -> Any:
        """The ollama version whose API this server speaks."""
        return {"version": OLLAMA_VERSION}

    @app.head("/", include_in_schema=False)
    async def head_root() -> Any:
        return Response(media_type="text/plain; charset=utf-8")

    @app.get("/", include_in_schema=False)
    async def root(request: Request) -> Any:
        """"Ollama is running" for API clients; a browser gets the chat page (unless --no-webui)."""
        if app.state.settings.webui and "text/html" in request.headers.get("accept", ""):
            from ..webui.routes import HEADERS, asset

            return Response(asset("index.html"), media_type="text/html; charset=utf-8", headers=HEADERS)
        return PlainTextResponse(RUNNING)

    for path in ("/api/create", "/api/push", "/api/blobs/{digest}"):
        app.add_api_route(path, _not_supported, methods=["POST"], include_in_schema=False)
    app.add_api_route("/api/blobs/{digest}", _not_supported, methods=["HEAD"], include_in_schema=False)


async def _not_supported(request: Request) -> Any:
    what = request.url.path.removeprefix("/api/").split("/")[0]
    raise APIError(501, f"/api/{what} is not supported by pyllama: it serves GGUF files as they are; pull "
                   "hf.co/user/repo:QUANT names, or start serve with -m FILE or --models-dir")
