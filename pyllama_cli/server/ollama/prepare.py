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

from ...core.serving.engine import Engine
from ...core.text.reasoning import EFFORT_BUDGETS
from ...errors import InputError
from ..errors import APIError, to_api_error
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
    fields["messages"] = [_message(m, i) for i, m in enumerate(req.messages)]
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
    if req.images:
        raise APIError(400, "images: this server takes text only")
    if req.template:
        log.info("ollama /api/generate: `template` is ignored (the model's chat template is used)")
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
    fields = _option_fields(req.options, req.format)
    fields["prompt"] = ids
    with _option_names():
        try:
            completion = CompletionRequest.model_validate(fields)
        except ValidationError as exc:
            raise to_api_error(RequestValidationError(exc.errors())) from None
        [job] = prepare_completion(engine, settings, completion)
    job = _with_mirostat(job, req.options)
    thinking, budget = (None, None)
    if opens_prompt:
        thinking, budget = plan_reasoning(engine, settings, text, _think_budget(req.think), job.sampling.grammar)
        job = replace(job, think_budget=budget)
    return PreparedChat(job, None, False, thinking=thinking)


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


def _generate_text(engine: Engine, settings: ServerSettings, req: GenerateRequest) -> tuple[str, bool]:
    """The prompt's text, and whether it went through the chat template (then thinking is cut out)."""
    if req.raw or req.suffix:
        return req.prompt, False
    messages = ([{"role": "system", "content": req.system}] if req.system else []) + \
        [{"role": "user", "content": req.prompt}]
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


def _message(message: Message, index: int) -> dict[str, Any]:
    if message.images:
        raise APIError(400, f"messages[{index}].images: this server takes text only")
    out: dict[str, Any] = {"role": message.role, "content": message.content or ""}
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
