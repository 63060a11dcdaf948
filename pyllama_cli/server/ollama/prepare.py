"""ollama's chat and generate requests as the jobs the server already knows how to run.

A chat becomes an OpenAI chat request and goes through the same `prepare_chat` (template, tools,
format grammar, thinking budget). A generate request becomes token ids (templated or raw, after
`context`, or fill-in-the-middle with `suffix`) and goes through `prepare_completion`, so both
APIs share every rule about budgets, sampling and constraints. `options` are mapped one by one:
what pyllama cannot honour per request is ignored, as ollama ignores what it does not know, and
logged with -v.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from ...core.media.settings import MEDIA_MARKER
from ...core.serving.engine import Engine
from ...core.text.reasoning import EFFORT_BUDGETS
from ...errors import InputError
from .. import job_rules as rules
from ..errors import APIError, to_api_error
from ..openai.media import NO_PROJECTOR, media_from_base64, media_prompt_of
from ..openai.prepare import PreparedChat, chat_request, plan_reasoning, prepare_chat, prepare_completion, render_prompt
from ..openai.schemas import CompletionRequest
from ..settings import ServerSettings
from .schemas import ChatRequest, GenerateRequest, Message

# the chat request's fields that ollama's request names otherwise
OLLAMA_NAMES = {"n_predict": "options.num_predict", "response_format": "format"}
log = logging.getLogger("uvicorn.error")  # shown with -v (serve's log level is info then)

# options with the same meaning and name as a chat request's field
SAMPLING_OPTIONS = ("temperature", "top_k", "top_p", "min_p", "typical_p", "repeat_penalty", "repeat_last_n",
                    "presence_penalty", "frequency_penalty", "seed", "stop",
                    "ignore_eos")  # a pyllama extension, as on the OpenAI routes (benchmarks use it)
# options that choose a mirostat sampler: ollama's name -> SamplingSettings' field
MIROSTAT_OPTIONS = {"mirostat": "mirostat", "mirostat_tau": "mirostat_ent", "mirostat_eta": "mirostat_lr"}
# options a running server cannot change per request (they are load settings) or has no sampler for
IGNORED_OPTIONS = ("num_ctx", "num_keep", "num_batch", "num_thread", "num_gpu", "main_gpu", "low_vram", "numa",
                   "use_mmap", "use_mlock", "vocab_only", "logits_all", "embedding_only", "f16_kv", "tfs_z",
                   "penalize_newline", "num_gqa", "rope_frequency_base", "rope_frequency_scale")


def prepare_ollama_chat(engine: Engine, settings: ServerSettings, req: ChatRequest) -> PreparedChat:
    """The job of a /api/chat request, and how its answer is cut (thinking, tool calls)."""
    if not req.messages:
        raise APIError(400, "messages: at least one message is required")
    fields = _option_fields(req.options, req.format)
    fields["messages"] = [_message(m, i, engine.projector is not None) for i, m in enumerate(req.messages)]
    if req.tools:
        fields["tools"] = req.tools
    choice = req.tool_choice if req.tool_choice is not None else (req.options or {}).get("tool_choice")
    if choice is not None:
        fields["tool_choice"] = choice
    if req.think is not None:
        fields["chat_template_kwargs"] = {"enable_thinking": bool(req.think)}
    with _option_names():
        prepared = prepare_chat(engine, settings, chat_request(fields), _think_budget(req.think), agent=True)
    return replace(prepared, job=_with_mirostat(prepared.job, req.options))


def prepare_generate(engine: Engine, settings: ServerSettings, req: GenerateRequest) -> PreparedChat:
    """The job of a /api/generate request with a prompt (an empty one loads or unloads: routes.py)."""
    if req.template:
        log.info("ollama /api/generate: `template` is ignored (the model's chat template is used)")
    if req.images:
        return _generate_with_images(engine, settings, req)
    text, opens_prompt = _generate_text(engine, settings, req)
    try:
        ids = list(req.context or ())
        if ids:
            engine.check_token_ids(ids, "context token")
        if req.suffix:
            ids += _infill_ids(engine, text, req.suffix)
        else:
            ids += engine.tokenize(text, add_special=not ids, parse_special=True)
    except InputError as exc:
        raise APIError(400, exc.message) from None
    if not ids:
        raise APIError(400, "prompt: the prompt has no tokens")
    job, _ = _completion_job(engine, settings, req, ids)
    return _with_thinking(engine, settings, req, job, text, opens_prompt)


def _completion_job(engine: Engine, settings: ServerSettings, req: GenerateRequest,
                    prompt: Any) -> tuple[Any, CompletionRequest]:
    fields = _option_fields(req.options, req.format)
    fields["prompt"] = prompt
    with _option_names():
        try:
            completion = CompletionRequest.model_validate(fields)
        except ValidationError as exc:
            raise to_api_error(RequestValidationError(exc.errors())) from None
        [job] = prepare_completion(engine, settings, completion)
    return _with_mirostat(job, req.options), completion


def _with_thinking(engine: Engine, settings: ServerSettings, req: GenerateRequest, job: Any, text: str,
                   opens_prompt: bool) -> PreparedChat:
    thinking, budget = (None, None)
    if opens_prompt:
        thinking, budget = plan_reasoning(engine, settings, text, _think_budget(req.think), job.sampling.grammar)
        job = replace(job, think_budget=budget)
    return PreparedChat(job, None, False, thinking=thinking)


def _generate_with_images(engine: Engine, settings: ServerSettings, req: GenerateRequest) -> PreparedChat:
    """A prompt with `images`, placed as ollama places them: before the prompt's text in the user's turn
    (or at the start of a raw prompt, unless it marks their places with libmtmd's media marker)."""
    from ...core.media.prompt import with_markers

    if engine.projector is None:
        raise APIError(400, f"images: {NO_PROJECTOR}")
    if req.suffix or req.context:
        raise APIError(400, "images: not with " + ("suffix" if req.suffix else "context") + " (send them in a new prompt)")
    media = [media_from_base64(image, f"images[{k}]") for k, image in enumerate(req.images or ())]
    if req.raw:
        try:
            text, opens_prompt = with_markers(req.prompt, len(media)), False
        except InputError as exc:
            raise APIError(400, exc.message) from None
    else:
        text, opens_prompt = _generate_text(engine, settings, req, MEDIA_MARKER * len(media))
    # the sampling, stops and limits of the text alone; the prompt and its budget are the media prompt's
    job, completion = _completion_job(engine, settings, req, text)
    prompt = media_prompt_of(engine, text, media, settings, param="images")
    try:
        budget = rules.budget(rules.requested_tokens(completion), prompt.n_cells, engine, settings, "prompt")
        job = replace(job, prompt=tuple(prompt.tokens), media=prompt, max_tokens=budget)
    except APIError:
        prompt.close()
        raise
    return _with_thinking(engine, settings, req, job, text, opens_prompt)


@contextmanager
def _option_names() -> Iterator[None]:
    """Errors about the fields that `options` and `format` became, named as the client wrote them."""
    try:
        yield
    except APIError as exc:
        field = re.split(r"[.\[]", exc.param or exc.message.split(":")[0])[0]
        ours = OLLAMA_NAMES.get(field, f"options.{field}" if field in SAMPLING_OPTIONS else None)
        if ours is None:
            raise
        exc.message = exc.message.replace(field, ours, 1)
        raise


def _generate_text(engine: Engine, settings: ServerSettings, req: GenerateRequest,
                   markers: str = "") -> tuple[str, bool]:
    """The prompt's text, and whether it went through the chat template (then thinking is cut out);
    `markers` (the images' places) go before the prompt in the user's turn."""
    if req.raw or req.suffix:
        return req.prompt, False
    messages = ([{"role": "system", "content": req.system}] if req.system else []) + \
        [{"role": "user", "content": markers + req.prompt}]
    kwargs = {"enable_thinking": bool(req.think)} if req.think is not None else None
    return render_prompt(engine, settings, messages, None, template_kwargs=kwargs), True


def _infill_ids(engine: Engine, prefix: str, suffix: str) -> list[int]:
    """[pre] prefix [suf] suffix [mid], as llama.cpp lays out fill-in-the-middle."""
    from ...core.text.tokenizer import fim_tokens

    fim = fim_tokens(engine.model)
    missing = [kind for kind in ("pre", "suf", "mid") if kind not in fim]
    if missing:
        raise APIError(400, "suffix: fill-in-the-middle needs a model with FIM tokens; this one lacks "
                       + ", ".join(f"the {kind} token" for kind in missing))
    head = [engine.model.bos] if engine.model.add_bos else []
    pre = engine.tokenize(prefix, add_special=False, parse_special=False)
    suf = engine.tokenize(suffix, add_special=False, parse_special=False)
    return [*head, fim["pre"], *pre, fim["suf"], *suf, fim["mid"]]


def _option_fields(options: dict[str, Any] | None, fmt: Any) -> dict[str, Any]:
    """The chat or completion request fields that `options` and `format` name."""
    fields: dict[str, Any] = {}
    for key, value in (options or {}).items():
        if key in SAMPLING_OPTIONS:
            fields[key] = value
        elif key == "num_predict":
            fields["n_predict"] = -1 if isinstance(value, int) and not isinstance(value, bool) and value < 0 \
                else value
        elif key not in MIROSTAT_OPTIONS and key != "tool_choice":
            what = "a load setting, fixed while the server runs" if key in IGNORED_OPTIONS else "not known here"
            log.info("ollama options.%s is ignored (%s)", key, what)
    if fmt == "json":
        fields["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, dict):
        fields["response_format"] = {"type": "json_schema", "json_schema": {"schema": fmt}}
    return fields


def _with_mirostat(job: Any, options: dict[str, Any] | None) -> Any:
    chosen = {field: (options or {})[key] for key, field in MIROSTAT_OPTIONS.items() if key in (options or {})}
    if not chosen:
        return job
    mode = chosen.get("mirostat", job.sampling.mirostat)
    if isinstance(mode, bool) or mode not in (0, 1, 2):
        raise APIError(400, f"options.mirostat must be 0, 1 or 2 (got {mode!r})")
    for field in ("mirostat_ent", "mirostat_lr"):
        value = chosen.get(field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not 0 <= value < 1e6):
            name = "mirostat_tau" if field == "mirostat_ent" else "mirostat_eta"
            raise APIError(400, f"options.{name} must be a number from 0 (got {value!r})")
    return replace(job, sampling=replace(job.sampling, **{k: (float(v) if k != "mirostat" else v)
                                                          for k, v in chosen.items()}))


def _think_budget(think: Any) -> int | None:
    """think: false is no thinking, a level is that level's budget, true (or unset) the server's."""
    if think is False:
        return 0
    if isinstance(think, str):
        return EFFORT_BUDGETS[think]
    return None


def _message(message: Message, index: int, vision: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.role, "content": message.content or ""}
    if message.images:
        out["content"] = [*_image_parts(message.images, index, vision), {"type": "text", "text": out["content"]}]
    if message.thinking:
        out["reasoning_content"] = message.thinking
    if message.tool_calls:
        out["tool_calls"] = [{"id": c.id or f"call_{index}_{j}", "type": "function",
                              "function": {"name": c.function.name, "arguments": c.function.arguments}}
                             for j, c in enumerate(message.tool_calls)]
    if message.role == "tool":
        if message.tool_name:
            out["name"] = message.tool_name
        if message.tool_call_id:
            out["tool_call_id"] = message.tool_call_id
    return out


def _image_parts(images: list[str], index: int, vision: bool) -> list[dict[str, Any]]:
    """ollama's base64 `images` as OpenAI image_url parts, before the message's text as ollama puts them;
    each is checked here so that an error names it as the client sent it."""
    if not vision:
        raise APIError(400, f"messages[{index}].images: {NO_PROJECTOR}")
    for k, image in enumerate(images):
        media_from_base64(image, f"messages[{index}].images[{k}]")
    return [{"type": "image_url", "image_url": {"url": "data:image/*;base64," + image}} for image in images]
