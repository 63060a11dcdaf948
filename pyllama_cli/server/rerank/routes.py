"""Reranking, as llama-server answers it (`serve --rerank`): each document is scored against the
query by the model's classification head, and the results come sorted by score, best first.

The request follows Jina's and Cohere's shape (`query`, `documents`, `top_n`, `return_text`), or
TEI's (`query`, `texts`): Jina's answer is `{model, object, usage, results: [{index,
relevance_score, document?}]}`, TEI's the bare list `[{index, score, text?}]`.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from ...core.embed.rerank import MAX_DOCUMENTS
from ...core.serving.jobs import EmbeddingJob
from .. import spine
from ..errors import APIError, body_error
from ..model_set import ModelSet

RANK_POOLING = 4  # llama.cpp's LLAMA_POOLING_TYPE_RANK


def add_routes(app: FastAPI, models: ModelSet) -> None:
    @app.post("/rerank", tags=["llama-server"])
    @app.post("/reranking", include_in_schema=False)
    @app.post("/v1/rerank", include_in_schema=False)
    @app.post("/v1/reranking", include_in_schema=False)
    async def rerank(request: Request) -> Any:
        """Score `documents` (or TEI's `texts`) against `query`; the `top_n` best, best first."""
        try:
            body = await request.json()
        except (ValueError, RecursionError) as exc:
            raise body_error(exc) from None
        if not isinstance(body, dict):
            raise APIError(400, "the request body must be a JSON object", code="invalid_value")
        served = await models.get(body.get("model") if isinstance(body.get("model"), str) else None)
        engine = _ranking_engine(served.engine)
        query, documents, tei = _read(body)
        top_n = body.get("top_n", len(documents))
        if not isinstance(top_n, int) or isinstance(top_n, bool):
            raise APIError(400, '"top_n" must be an integer', param="top_n", code="invalid_value")
        inputs = await run_in_threadpool(_tokens, engine, query, documents)
        scores: list[Any] = []
        async for event in engine.submit(EmbeddingJob(tuple(tuple(ids) for ids in inputs), normalize=-1)):
            scores = event.embeddings or scores
        return JSONResponse(_answer(body, served.id, documents, inputs, [float(s[0]) for s in scores], top_n, tei))


def _ranking_engine(engine: Any) -> Any:
    spine.ready(engine)
    if not engine.embeddings or getattr(engine, "pooling", -1) != RANK_POOLING:
        raise APIError(400, "this server does not rerank: start it with --rerank and a reranker model",
                       code="not_supported")
    return engine


def _read(body: dict[str, Any]) -> tuple[str, list[str], bool]:
    query = body.get("query")
    if query is None:
        raise APIError(400, '"query" must be provided', param="query", code="invalid_value")
    if not isinstance(query, str):
        raise APIError(400, '"query" must be a string', param="query", code="invalid_value")
    tei = "texts" in body and "documents" not in body
    field = "texts" if tei else "documents"
    documents = body.get(field)
    if not isinstance(documents, list) or not documents or not all(isinstance(d, str) for d in documents):
        raise APIError(400, f'"{field}" must be a non-empty string array', param=field, code="invalid_value")
    if len(documents) > MAX_DOCUMENTS:
        raise APIError(413, f'"{field}" has {len(documents)} documents: at most {MAX_DOCUMENTS} per request',
                       param=field, code="too_many_documents")
    return query, documents, tei


def _tokens(engine: Any, query: str, documents: list[str]) -> list[list[int]]:
    from ...core.embed.rerank import rerank_tokens

    inputs = [rerank_tokens(engine.model, query, doc) for doc in documents]
    limit = min(engine.n_ctx - 1, engine.summary.n_batch)
    for i, ids in enumerate(inputs):
        if len(ids) > limit:
            raise APIError(400, f"document {i} with the query has {len(ids)} tokens but at most {limit} fit",
                           param="documents", code="context_length_exceeded")
    return inputs


def _answer(body: dict[str, Any], model_id: str, documents: list[str], inputs: list[list[int]], scores: list[float],
            top_n: int, tei: bool) -> Any:
    label = "score" if tei else "relevance_score"
    results: list[dict[str, Any]] = [{"index": i, label: score} for i, score in enumerate(scores)]
    if body.get("return_text") is True:
        for item in results:
            if tei:
                item["text"] = documents[item["index"]]
            else:
                item["document"] = {"text": documents[item["index"]]}
    results.sort(key=lambda item: -item[label])
    results = results[:max(top_n, 0)]
    if tei:
        return results
    n_tokens = sum(len(ids) for ids in inputs)
    return {"model": body.get("model") if isinstance(body.get("model"), str) else model_id, "object": "list",
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}, "results": results}
