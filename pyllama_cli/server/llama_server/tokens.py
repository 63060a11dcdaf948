"""llama-server's routes between text and tokens: /tokenize, /detokenize, /apply-template, and the
prompt's token count (/v1/chat/completions/input_tokens)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from starlette.concurrency import run_in_threadpool

from ...errors import InputError
from .. import spine
from ..errors import OPENAPI_ERRORS, APIError
from ..model_set import ModelSet
from ..openai.media import media_list, prompt_token_count
from ..openai.prepare import message_dicts, plan_request_tools, render_prompt
from .schemas import (
    ApplyTemplateRequest,
    ApplyTemplateResponse,
    DetokenizeRequest,
    DetokenizeResponse,
    TokenCountRequest,
    TokenizeRequest,
    TokenizeResponse,
)


def add_token_routes(app: FastAPI, models: ModelSet) -> None:
    @app.post("/tokenize", response_model=TokenizeResponse, responses=OPENAPI_ERRORS, tags=["Server"])
    async def tokenize(body: TokenizeRequest, request: Request) -> Any:
        """Token ids of `content` (with `with_pieces`, each id with its text)."""
        engine = spine.ready((await models.named(request, body.model)).engine)
        # What llama.cpp's tokenizer gives, as llama-server reports it: a BOS the text writes stays
        # after the one add_special adds.
        ids = await run_in_threadpool(engine.tokenize, body.content, add_special=body.add_special,
                                      parse_special=body.parse_special, dedupe_bos=False)
        if not body.with_pieces:
            return {"tokens": ids}
        return {"tokens": [{"id": t, "piece": piece_text(engine.piece(t))} for t in ids]}

    @app.post("/detokenize", response_model=DetokenizeResponse, responses=OPENAPI_ERRORS, tags=["Server"])
    async def detokenize(body: DetokenizeRequest, request: Request) -> Any:
        """The text of a list of token ids."""
        engine = spine.ready((await models.named(request, body.model)).engine)
        try:
            return {"content": engine.detokenize(body.tokens)}
        except InputError as exc:
            raise APIError(400, exc.message, param="tokens", code="invalid_value") from None

    @app.post("/apply-template", response_model=ApplyTemplateResponse, responses=OPENAPI_ERRORS, tags=["Server"])
    async def apply_template(body: ApplyTemplateRequest, request: Request) -> Any:
        """The prompt the chat template makes of `messages` (and `tools`), as /v1/chat/completions would;
        each image or audio part is its media marker there."""
        served = await models.named(request, body.model)
        spine.ready(served.engine)
        plan = plan_request_tools(body.tools, body.tool_choice)
        # on a worker thread: an image part's URL may be fetched (openai/media_fetch.py)
        messages = await run_in_threadpool(message_dicts, body.messages, served.settings, media_list(served.engine))
        prompt = await run_in_threadpool(render_prompt, served.engine, served.settings, messages, plan)
        return {"prompt": prompt}

    @app.post("/chat/completions/input_tokens", tags=["llama-server"])
    @app.post("/v1/chat/completions/input_tokens", include_in_schema=False)
    async def input_tokens(body: TokenCountRequest, request: Request) -> Any:
        """How many tokens the prompt of `messages` takes."""
        model = await models.named(request, body.model)
        engine = spine.generating(model.engine)
        media = media_list(engine)
        messages = await run_in_threadpool(message_dicts, body.messages, model.settings, media)
        prompt = await run_in_threadpool(render_prompt, model.engine, model.settings, messages, None)
        n = await run_in_threadpool(prompt_token_count, engine, prompt, media or [], model.settings)
        return {"input_tokens": n, "object": "response.input_tokens"}


def piece_text(data: bytes) -> str | list[int]:
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
