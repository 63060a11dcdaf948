"""OpenAI's routes: /v1/chat/completions, /v1/completions, /v1/embeddings and /v1/models.

Each also answers without /v1, as llama-server's do, for clients whose base URL lacks it; not
/completions, which in llama-server is the native API, with another shape (llama_server/).
"""

from __future__ import annotations

import base64
from functools import partial
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from ...core.serving.jobs import EmbeddingJob
from .. import spine
from ..errors import OPENAPI_ERRORS, APIError
from ..model_set import ModelSet
from . import answers
from .embedding_inputs import embedding_inputs
from .prepare import prepare_chat, prepare_completion
from .schemas import (
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    EmbeddingList,
    EmbeddingRequest,
    ModelCard,
    ModelList,
)


def add_routes(app: FastAPI, models: ModelSet) -> None:
    @app.post("/v1/chat/completions", response_model=ChatCompletion, responses=OPENAPI_ERRORS, tags=["OpenAI"])
    @app.post("/chat/completions", include_in_schema=False)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
        """Answer a conversation; `stream: true` sends server-sent events ending with `data: [DONE]`."""
        return await spine.generate(models.get(body.model, body.keep_alive), request, body, prepare_chat,
                                    partial(answers.chat_stream, include_usage=include_usage(body)),
                                    answers.chat_body)

    @app.post("/v1/completions", response_model=Completion, responses=OPENAPI_ERRORS, tags=["OpenAI"])
    async def text_completions(body: CompletionRequest, request: Request) -> Any:
        """Continue a prompt (a string, a list of strings, or token ids)."""
        return await spine.generate(models.get(body.model, body.keep_alive), request, body, prepare_completion,
                                    partial(answers.completion_stream, include_usage=include_usage(body)),
                                    answers.completion_body)

    @app.post("/v1/embeddings", response_model=EmbeddingList, responses=OPENAPI_ERRORS, tags=["OpenAI"])
    @app.post("/embeddings", include_in_schema=False)
    async def embeddings(body: EmbeddingRequest, request: Request) -> Any:
        """L2-normalised, pooled embeddings of each input (needs a server started with --embeddings)."""
        served = await models.get(body.model)
        engine = spine.ready(served.engine)
        if not engine.embeddings:
            raise APIError(400, "this server does not compute embeddings: start it with --embeddings",
                           code="not_supported")
        if getattr(engine, "pooling", -1) in (0, 4):  # none: a vector per token; rank: scores (POST /rerank)
            raise APIError(400, f"this server pools with {'none' if engine.pooling == 0 else 'rank'}: its "  # type: ignore[attr-defined]
                           "embeddings are not one vector per input; restart it with --pooling mean, cls or last",
                           code="not_supported")
        inputs = await run_in_threadpool(embedding_inputs, engine, body.input)
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
        return JSONResponse({"object": "list", "data": models.cards() + models.pending()})

    @app.get("/v1/models/{model_id:path}", response_model=ModelCard, responses=OPENAPI_ERRORS, tags=["OpenAI"])
    async def get_model(model_id: str) -> Any:
        cards = models.cards()
        for card in cards:
            if model_id == card["id"] or model_id in card["aliases"]:
                return JSONResponse(card)
        ids = ", ".join(repr(card["id"]) for card in cards)
        raise APIError(404, f"the model {model_id!r} is not served here; this server serves {ids}",
                       param="model", code="model_not_found")


def include_usage(body: Any) -> bool:
    """Whether a stream ends with a usage chunk (`stream_options.include_usage`)."""
    return bool(body.stream_options and body.stream_options.include_usage)


def _encode(vector: np.ndarray, encoding: str) -> Any:
    if encoding == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()
