"""The routes of OpenAI's Responses API: POST /v1/responses, GET and DELETE /v1/responses/{id},
POST /v1/responses/{id}/cancel and POST /v1/responses/input_tokens.

Responses made with `store` (the default) are kept in the app's `ResponseStore`, so a later request
can continue the conversation with `previous_response_id`. Those made with `background: true` run on
without their client (background.py): GET polls them or, with `stream=true&starting_after=N`, resumes
their events; cancel stops them.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from ...core.serving.engine import Engine
from .. import spine
from ..errors import APIError
from ..model_set import ModelSet
from ..openai.answers import Parts
from ..openai.prepare import PreparedChat
from . import answers
from .background import BackgroundRuns, follow
from .prepare import prepare_response
from .schemas import ResponsesRequest
from .store import ResponseStore

Prepared = tuple[PreparedChat, list[dict[str, Any]]]  # the job, and the conversation it answers


def add_routes(app: FastAPI, models: ModelSet) -> None:
    """Add the routes, with the app's store of responses (`app.state.responses`)."""
    store = app.state.responses = ResponseStore()
    runs = app.state.background_responses = BackgroundRuns(store)

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
            shape = answers.ResponseShape(body, model)
            events = answers.response_stream(engine, chat, shape, finished(conversation))
            if body.background:
                return follow(runs.start(shape.body("queued", [], None), events), -1)
            return events

        async def whole(engine: Engine, prepared: Prepared, model: str, request: Request) -> dict[str, Any]:
            chat, conversation = prepared
            if body.background:  # the events run on in the background; the answer is the queued response
                shape = answers.ResponseShape(body, model)
                run = runs.start(shape.body("queued", [], None),
                                 answers.response_stream(engine, chat, shape, finished(conversation)))
                return run.body
            return await answers.response_body(engine, chat, answers.ResponseShape(body, model), request,
                                               finished(conversation))

        if body.background and body.store is False:
            raise APIError(400, "background responses are stored: drop store: false, or background: true",
                           param="background")

        return await spine.generate(models.get(body.model), request, body, partial(prepare_response, store=store),
                                    stream, whole)

    @app.post("/v1/responses/input_tokens", tags=["OpenAI"])
    @app.post("/responses/input_tokens", include_in_schema=False)
    async def input_tokens(body: ResponsesRequest, request: Request) -> Any:
        """How many tokens the prompt of a Responses request takes (instructions, input, tools)."""
        model = await models.named(request, body.model)
        engine = spine.generating(model.engine)
        chat, _ = await run_in_threadpool(prepare_response, engine, model.settings, body, store)
        return {"object": "response.input_tokens", "input_tokens": len(chat.job.prompt)}

    @app.get("/v1/responses/{response_id}", tags=["OpenAI"])
    async def get_response(response_id: str, stream: bool = False, starting_after: int = -1) -> Any:
        """A stored response, or a background one as it stands; `stream=true` resumes a background response's
        events after sequence number `starting_after`."""
        run = runs.get(response_id)
        if stream:
            if run is None:
                store.get(response_id)  # 404 for an unknown id
                raise APIError(400, "only a background response can be streamed again: create it with "
                                    "background: true", param="stream")
            return follow(run, starting_after)
        return run.body if run is not None else store.get(response_id).body

    @app.post("/v1/responses/{response_id}/cancel", tags=["OpenAI"])
    async def cancel_response(response_id: str) -> Any:
        """Stop a background response: its status becomes `cancelled` (a finished one is left as it is)."""
        run = runs.get(response_id)
        if run is None:
            store.get(response_id)  # 404 for an unknown id
            raise APIError(400, "only a response created with background: true can be cancelled",
                           param="response_id")
        await runs.cancel(run)
        return run.body

    @app.delete("/v1/responses/{response_id}", tags=["OpenAI"])
    async def delete_response(response_id: str) -> Any:
        """Forget a stored response."""
        if runs.forget(response_id) is None:
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
