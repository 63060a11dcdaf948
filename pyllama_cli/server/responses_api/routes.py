"""The routes of OpenAI's Responses API: POST /v1/responses, GET and DELETE /v1/responses/{id}.

Responses made with `store` (the default) are kept in the app's `ResponseStore`, so a later request
can continue the conversation with `previous_response_id`.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from ...core.serving.engine import Engine
from .. import spine
from ..model_set import ModelSet
from ..openai.answers import Parts
from ..openai.prepare import PreparedChat
from . import answers
from .prepare import prepare_response
from .schemas import ResponsesRequest
from .store import ResponseStore

Prepared = tuple[PreparedChat, list[dict[str, Any]]]  # the job, and the conversation it answers


def add_routes(app: FastAPI, models: ModelSet) -> None:
    """Add the routes, with the app's store of responses (`app.state.responses`)."""
    store = app.state.responses = ResponseStore()

    @app.post("/v1/responses", tags=["OpenAI"])
    @app.post("/responses", include_in_schema=False)
    async def create_response(body: ResponsesRequest, request: Request) -> Any:
        """Answer `input` (continuing `previous_response_id`); `stream: true` sends the Responses events."""

        def finished(conversation: list[dict[str, Any]]) -> answers.Finished:
            def keep(response: dict[str, Any], parts: Parts) -> None:
                if body.store is not False:
                    store.put(response, [*conversation, _assistant(parts)])

            return keep

        def stream(engine: Engine, prepared: Prepared, model: str) -> Response:
            chat, conversation = prepared
            return answers.response_stream(engine, chat, answers.ResponseShape(body, model), finished(conversation))

        async def whole(engine: Engine, prepared: Prepared, model: str, request: Request) -> dict[str, Any]:
            chat, conversation = prepared
            return await answers.response_body(engine, chat, answers.ResponseShape(body, model), request,
                                               finished(conversation))

        return await spine.generate(models.get(body.model), request, body, partial(prepare_response, store=store),
                                    stream, whole)

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
