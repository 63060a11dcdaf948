"""The routes of OpenAI's Responses API: POST /v1/responses, GET and DELETE /v1/responses/{id}.

Responses made with `store` (the default) are kept in the app's `ResponseStore`, so a later request
can continue the conversation with `previous_response_id`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ...core.serving.engine import Engine
from ..models import ModelSet
from ..openai_answers import Parts
from . import answers
from .prepare import prepare_response
from .schemas import ResponsesRequest
from .store import ResponseStore

Check = Callable[[Engine], Engine]
Prepare = Callable[..., Awaitable[Any]]


def add_routes(app: FastAPI, models: ModelSet, check: Check, prepare: Prepare) -> None:
    """Add the routes; `check` refuses an engine that cannot generate now, `prepare` runs a preparation
    inline or in the thread pool (app.py's choices, shared with the chat routes)."""
    store = app.state.responses = ResponseStore()

    @app.post("/v1/responses", tags=["OpenAI"])
    @app.post("/responses", include_in_schema=False)
    async def create_response(body: ResponsesRequest, request: Request) -> Any:
        """Answer `input` (continuing `previous_response_id`); `stream: true` sends the Responses events."""
        served = await models.get(body.model)
        engine = served.engine
        with engine.arriving():
            check(engine)
            prepared, conversation = await prepare(request, prepare_response, engine, served.settings, body, store)
            shape = answers.ResponseShape(body, served.id)

            def finished(response: dict[str, Any], parts: Parts) -> None:
                if body.store is not False:
                    store.put(response, [*conversation, _assistant(parts)])

            if body.stream:
                return answers.response_stream(engine, prepared, shape, finished)
            return JSONResponse(await answers.response_body(engine, prepared, shape, request, finished))

    @app.get("/v1/responses/{response_id}", tags=["OpenAI"])
    async def get_response(response_id: str) -> Any:
        """A stored response."""
        return store.get(response_id).body

    @app.delete("/v1/responses/{response_id}", tags=["OpenAI"])
    async def delete_response(response_id: str) -> Any:
        """Forget a stored response."""
        store.get(response_id)
        store.remove(response_id)
        return {"id": response_id, "object": "response", "deleted": True}


def _assistant(parts: Parts) -> dict[str, Any]:
    """The answer as the assistant message a continued conversation shows the model."""
    message: dict[str, Any] = {"role": "assistant", "content": parts.text}
    if parts.calls:
        message["tool_calls"] = parts.calls
    if parts.reasoning:
        message["reasoning_content"] = parts.reasoning
    return message
