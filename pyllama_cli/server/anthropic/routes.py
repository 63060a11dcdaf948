"""The routes of Anthropic's Messages API: POST /v1/messages and /v1/messages/count_tokens.

Errors on these paths are answered in Anthropic's shape (errors.py chooses by path), the key may come
as `x-api-key` (auth.py), and the `anthropic-version` header is accepted and needs no particular value.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request

from .. import spine
from ..model_set import ModelSet
from . import answers
from .prepare import count_prompt_tokens, prepare_messages
from .schemas import CountTokensRequest, MessagesRequest


def add_routes(app: FastAPI, models: ModelSet) -> None:
    @app.post("/v1/messages", tags=["Anthropic"])
    async def messages(body: MessagesRequest, request: Request) -> Any:
        """Anthropic's Messages API; `stream: true` sends its named server-sent events."""
        return await spine.generate(models.get(body.model), request, body, prepare_messages,
                                    answers.message_stream, answers.message_body)

    @app.post("/v1/messages/count_tokens", tags=["Anthropic"])
    async def count_tokens(body: CountTokensRequest, request: Request) -> Any:
        """The tokens of the prompt the chat template renders for these messages and tools."""
        served = await models.get(body.model)
        spine.generating(served.engine)
        n = await spine.off_loop(request, count_prompt_tokens, served.engine, served.settings, body,
                                 fetches=bool(served.settings.media.domains))
        return {"input_tokens": n}
