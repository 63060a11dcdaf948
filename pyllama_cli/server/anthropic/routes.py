"""The routes of Anthropic's Messages API: POST /v1/messages and /v1/messages/count_tokens.

Errors on these paths are answered in Anthropic's shape (errors.py chooses by path), the key may come
as `x-api-key` (auth.py), and the `anthropic-version` header is accepted and needs no particular value.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ...core.serving.engine import Engine
from ..models import ModelSet
from . import answers
from .prepare import count_prompt_tokens, prepare_messages
from .schemas import CountTokensRequest, MessagesRequest

Check = Callable[[Engine], Engine]
Prepare = Callable[..., Awaitable[Any]]


def add_routes(app: FastAPI, models: ModelSet, check: Check, prepare: Prepare) -> None:
    """Add the routes; `check` refuses an engine that cannot generate now, `prepare` runs a preparation
    inline or in the thread pool (app.py's choices, shared with the OpenAI routes)."""

    @app.post("/v1/messages", tags=["Anthropic"])
    async def messages(body: MessagesRequest, request: Request) -> Any:
        """Anthropic's Messages API; `stream: true` sends its named server-sent events."""
        served = await models.get(body.model)
        engine = served.engine
        with engine.arriving():
            check(engine)
            prepared = await prepare(request, prepare_messages, engine, served.settings, body)
            if body.stream:
                return answers.message_stream(engine, prepared, served.id)
            return JSONResponse(await answers.message_body(engine, prepared, served.id, request))

    @app.post("/v1/messages/count_tokens", tags=["Anthropic"])
    async def count_tokens(body: CountTokensRequest, request: Request) -> Any:
        """The tokens of the prompt the chat template renders for these messages and tools."""
        served = await models.get(body.model)
        check(served.engine)
        n = await prepare(request, count_prompt_tokens, served.engine, served.settings, body)
        return {"input_tokens": n}
