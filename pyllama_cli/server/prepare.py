"""Turn an OpenAI request into engine jobs: the prompt's tokens, sampling, constraints and token budget.

Everything a request can get wrong is found here, before any response starts, so that it is
answered with a 400 naming the field rather than a broken stream.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, replace
from typing import Any

from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from ..core.serving.engine import Engine
from ..core.serving.jobs import GenerationJob
from ..core.generate.sampling import SamplingSettings
from ..core.constrain.tools import ToolPlan, ToolsError, plan_tools, render_with_tools
from ..core.text.reasoning import (
    EFFORT_BUDGETS,
    FORMAT_NONE,
    UNLIMITED,
    BudgetSpec,
    Thinking,
    opens_reasoning,
    template_markers,
)
from ..errors import ContextOverflow, InputError
from .errors import APIError, to_api_error
from .lora.routes import job_lora
from .llama.chat import ChatExtras, chat_shape, extras_of
from .schemas import ChatCompletionRequest, ChatMessage, CompletionRequest, GenerationFields
from .settings import ServerSettings

SEED_MODULUS = 2**32 - 1  # llama.cpp's seeds are 32-bit; 0xFFFFFFFF itself means "random"


@dataclass(frozen=True)
class PreparedChat:
    job: GenerationJob
    tools: ToolPlan | None
    logprobs: bool
    extras: ChatExtras = ChatExtras()  # llama-server's n, timings, verbose
    thinking: Thinking | None = None  # how to cut the reasoning out of the answer (None: leave it whole)


def prepare_chat(engine: Engine, settings: ServerSettings, req: ChatCompletionRequest,
                 think_budget: int | None = None, agent: bool = False) -> PreparedChat:
    """The job of a chat request; `think_budget` (a Messages request's thinking.budget_tokens) wins over
    the request's reasoning_effort, which wins over --reasoning-budget. An `agent` API (Messages,
    Responses) offers tools whose schemas no grammar can enforce, unless a call to them is forced."""
    if req.top_logprobs is not None and not req.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs", code="invalid_value")
    shape = chat_shape(engine, req, message_dicts(req.messages))
    plan = plan_request_tools(req.tools, req.tool_choice, req.parallel_tool_calls is not False, not agent)
    prompt = render_prompt(engine, settings, shape.messages, plan, add_generation_prompt=shape.add_generation_prompt,
                           template_kwargs=req.chat_template_kwargs) + shape.prefill
    ids = engine.tokenize(prompt, add_special=True, parse_special=True)
    grammar = _grammar(req, settings, plan)
    requested = _requested_tokens(req, req.max_completion_tokens)
    if think_budget is None and req.reasoning_effort:
        think_budget = EFFORT_BUDGETS[req.reasoning_effort]
    thinking, budget_spec = plan_reasoning(engine, settings, prompt, think_budget, grammar)
    job = GenerationJob(
        prompt=tuple(ids), sampling=_sampling(req, settings, grammar, engine),
        max_tokens=_budget(requested, len(ids), engine, settings, "messages"), stop=_stops(req.stop, settings),
        n_probs=(req.top_logprobs or 0) if req.logprobs else -1, id_slot=req.id_slot, cache_prompt=req.cache_prompt,
        progress=req.return_progress, think_budget=budget_spec, lora=job_lora(engine, req.lora),
    )
    return PreparedChat(job, plan, bool(req.logprobs), extras_of(req, prompt), thinking)


def plan_reasoning(engine: Engine, settings: ServerSettings, prompt: str, budget: int | None,
                   grammar: str | None) -> tuple[Thinking | None, BudgetSpec | None]:
    """How a chat answer's thinking is cut out (None with --reasoning-format none), and the thinking
    budget its job enforces: the request's `budget`, else --reasoning-budget. A grammar already decides
    every token, so it gets no budget (forcing the end marker could break it)."""
    markers = template_markers(engine.chat_template_text(settings.chat_template))
    inside = opens_reasoning(prompt, markers)
    thinking = Thinking(markers, inside) if settings.reasoning_format != FORMAT_NONE else None
    budget = settings.reasoning_budget if budget is None else budget
    if budget == UNLIMITED or grammar is not None:
        return thinking, None
    end = engine.tokenize(markers.end + "\n\n", add_special=False, parse_special=True)
    return thinking, BudgetSpec(budget, tuple(end), inside, markers)


def chat_request(fields: dict[str, Any]) -> ChatCompletionRequest:
    """A chat request built from another API's request (Messages, Responses), checked as one.

    Raises:
        APIError: 400 naming the field the other API's request got wrong.
    """
    try:
        return ChatCompletionRequest.model_validate(fields)
    except ValidationError as exc:
        raise to_api_error(RequestValidationError(exc.errors())) from None


def prepare_completion(engine: Engine, settings: ServerSettings, req: CompletionRequest) -> list[GenerationJob]:
    """One job per prompt (a list of strings, or of token lists, is a batch)."""
    _check_n(req.n)
    _check_legacy_fields(req)
    grammar = _grammar(req, settings, None)
    sampling = _sampling(req, settings, grammar, engine)
    stop = _stops(req.stop, settings)
    requested = _requested_tokens(req)
    jobs = []
    for ids in prompt_tokens(engine, req.prompt, "prompt"):
        jobs.append(GenerationJob(prompt=tuple(ids), sampling=sampling,
                                  max_tokens=_budget(requested, len(ids), engine, settings, "prompt"), stop=stop,
                                  n_probs=req.logprobs if req.logprobs is not None else -1,
                                  lora=job_lora(engine, req.lora)))
    return jobs


def render_prompt(engine: Engine, settings: ServerSettings, messages: list[dict[str, Any]],
                  plan: ToolPlan | None, *, add_generation_prompt: bool = True,
                  template_kwargs: dict[str, Any] | None = None) -> str:
    template_text = engine.chat_template_text(settings.chat_template)
    return render_with_tools(lambda m, tools: engine.render_chat(
        m, tools=tools, template=settings.chat_template, add_generation_prompt=add_generation_prompt,
        template_kwargs=template_kwargs), messages, plan, template_text)


def message_dicts(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as plain dicts with text content (content parts joined; anything but text refused)."""
    out = []
    for i, m in enumerate(messages):
        content = m.content
        if isinstance(content, list):
            other = next((p.type for p in content if p.type != "text"), None)
            if other is not None:
                raise APIError(400, f"messages[{i}]: content parts of type {other!r} are not supported "
                               "(this server takes text only)", param=f"messages[{i}].content",
                               code="invalid_value")
            textless = next((j for j, p in enumerate(content) if p.text is None), None)
            if textless is not None:
                raise APIError(400, f"messages[{i}].content[{textless}]: a text part needs its \"text\"",
                               param=f"messages[{i}].content[{textless}]", code="invalid_value")
            content = "".join(p.text for p in content)
        d: dict[str, Any] = {"role": m.role, "content": content or ""}
        if m.name:
            d["name"] = m.name
        if m.tool_calls:
            d["tool_calls"] = [c.model_dump() for c in m.tool_calls]
        if m.tool_call_id:
            d["tool_call_id"] = m.tool_call_id
        if m.reasoning_content:
            d["reasoning_content"] = m.reasoning_content
        out.append(d)
    return out


def prompt_tokens(engine: Engine, prompt: str | list[Any], param: str) -> list[list[int]]:
    """Token ids of each prompt: text is tokenized (with BOS), token lists are taken as they are."""
    if isinstance(prompt, str):
        prompts: list[Any] = [prompt]
    elif not prompt:
        raise APIError(400, f"{param} is empty", param=param, code="invalid_value")
    elif isinstance(prompt[0], int):
        prompts = [prompt]
    else:
        prompts = list(prompt)
    out = []
    for p in prompts:
        if isinstance(p, str):
            ids = engine.tokenize(p, add_special=True, parse_special=True)
        else:
            try:
                engine.check_token_ids(p)
            except InputError as exc:
                raise APIError(400, exc.message, param=param, code="invalid_value") from None
            ids = list(p)
        if not ids:
            raise APIError(400, f"{param} is empty (no tokens)", param=param, code="invalid_value")
        out.append(ids)
    return out


def _check_n(n: int | None) -> None:
    if n is not None and n != 1:
        raise APIError(400, f"n must be 1: this server generates one choice per request (got n={n})",
                       param="n", code="unsupported_value")


def _check_legacy_fields(req: CompletionRequest) -> None:
    if req.echo:
        raise APIError(400, "echo is not supported: the answer holds the generated text only",
                       param="echo", code="unsupported_value")
    if req.suffix:
        raise APIError(400, "suffix (fill-in-the-middle) is not supported", param="suffix", code="unsupported_value")
    if req.best_of is not None and req.best_of != 1:
        raise APIError(400, f"best_of must be 1: this server generates one choice per request (got {req.best_of})",
                       param="best_of", code="unsupported_value")


def plan_request_tools(tools: list[Any] | None, tool_choice: Any, parallel: bool = True,
                       check_schemas: bool = True) -> ToolPlan | None:
    """The request's tools and tool_choice, checked; a mistake is a 400 naming the field."""
    choice = tool_choice.model_dump() if hasattr(tool_choice, "model_dump") else tool_choice
    try:
        return plan_tools([t.model_dump() for t in tools] if tools else None, choice, parallel, check_schemas)
    except ToolsError as exc:
        raise APIError(400, exc.message, param="tools", code="invalid_value") from None
    except InputError as exc:
        raise APIError(400, exc.message, param="tool_choice", code="invalid_value") from None


def _requested_tokens(req: GenerationFields, max_completion_tokens: int | None = None) -> int | None:
    """The token budget the request names, if any; -1 is llama-server's "the rest of the context".

    n_predict, llama-server's own field, wins over OpenAI's as it does there.
    """
    if req.n_predict == 0:
        raise APIError(400, "n_predict must be -1 (the rest of the context) or at least 1 (got 0)",
                       param="n_predict", code="invalid_value")
    for value in (req.n_predict, max_completion_tokens, req.max_tokens):
        if value is not None:
            return value
    return None


def _budget(requested: int | None, n_prompt: int, engine: Engine, settings: ServerSettings, param: str) -> int:
    """Tokens to generate: as asked, else the server's -n, else the rest of the context; never past it."""
    try:
        engine.check_fits(n_prompt)
    except ContextOverflow as exc:
        raise APIError(400, exc.message, param=param, code="context_length_exceeded",
                       error_type="exceed_context_size_error",  # llama-server's type, which its clients test for
                       extra={"n_prompt_tokens": n_prompt, "n_ctx": engine.n_ctx}) from None
    room = engine.n_ctx - n_prompt
    if requested is None:
        requested = settings.n_predict
    return room if requested < 0 else min(requested, room)


def _stops(stop: str | list[str] | None, settings: ServerSettings) -> tuple[str, ...]:
    given = [stop] if isinstance(stop, str) else list(stop or ())
    return tuple(s for s in (*given, *settings.stop) if s)


# ---------------------------------------------------------------- sampling and constraints


def _sampling(req: GenerationFields, settings: ServerSettings, grammar: str | None, engine: Engine) -> SamplingSettings:
    fields = ("temperature", "top_p", "top_k", "min_p", "typical_p", "presence_penalty", "frequency_penalty",
              "repeat_penalty", "repeat_last_n", "ignore_eos")
    changes: dict[str, Any] = {name: getattr(req, name) for name in fields if getattr(req, name) is not None}
    if req.seed is not None:
        changes["seed"] = req.seed % SEED_MODULUS if req.seed >= 0 else -1
    bias = _logit_bias(req.logit_bias, engine)
    if bias:
        changes["logit_bias"] = settings.sampling.logit_bias + bias
    return replace(settings.sampling, grammar=grammar, **changes)


def _logit_bias(value: dict[str, Any] | list[list[Any]] | None, engine: Engine) -> tuple[tuple[int, float], ...]:
    """OpenAI's {"id": bias} or llama-server's [[id, bias]]; a bias of false bans the token.

    In the pairs, as in llama-server, a text in place of an id biases each of its tokens. An object's
    keys must be ids: OpenAI's clients send nothing else, so a key that is none is a mistake.
    """
    if isinstance(value, dict):
        pairs = [(_key_id(key), bias) for key, bias in value.items()]
    else:
        pairs = [tuple(p) for p in value or ()]
    out = []
    for pair in pairs:
        if len(pair) != 2:
            raise APIError(400, "logit_bias entries must be [token_id, bias] pairs", param="logit_bias",
                           code="invalid_value")
        token, bias = pair
        if bias is True:
            continue
        bias = _bias_value(token, bias)
        out.extend((t, bias) for t in _biased_tokens(token, engine))
    return tuple(out)


def _bias_value(token: Any, bias: Any) -> float:
    # The [[id, bias]] form is not checked by pydantic, so NaN and infinities arrive here; false is the ban.
    if bias is False:
        return -math.inf
    if isinstance(bias, bool) or not isinstance(bias, (int, float)):
        raise APIError(400, f"logit_bias: the bias of token {token} is not a number", param="logit_bias",
                       code="invalid_value")
    if not math.isfinite(bias):
        raise APIError(400, f"logit_bias: the bias of token {token} must be a finite number or false "
                            f"(got {json.dumps(bias)})",
                       param="logit_bias", code="invalid_value")
    return float(bias)


def _key_id(key: str) -> int:
    if not re.fullmatch(r"-?[0-9]+", key):  # int() would also read " 1", "1_2" and non-ASCII digits
        raise APIError(400, f"logit_bias: {json.dumps(key)} is not a token id", param="logit_bias",
                       code="invalid_value")
    return int(key)


def _biased_tokens(token: Any, engine: Engine) -> list[int]:
    """The ids `token` names: an id, or the tokens of a text."""
    if isinstance(token, str) and token:
        return engine.tokenize(token, add_special=False, parse_special=False)
    if isinstance(token, bool) or not isinstance(token, int):  # 1.5 or true would be read as token 1
        raise APIError(400, f"logit_bias: {json.dumps(token)} is not a token id", param="logit_bias",
                       code="invalid_value")
    try:
        engine.check_token_ids([token], "logit_bias token")
    except InputError as exc:
        raise APIError(400, exc.message, param="logit_bias", code="invalid_value") from None
    return [token]


def _grammar(req: GenerationFields, settings: ServerSettings, plan: ToolPlan | None) -> str | None:
    """The GBNF the output must follow: the request's grammar, JSON schema or forced tool call."""
    from ..core.constrain.grammar import check_grammar, schema_to_grammar

    schema, schema_param = _json_schema(req)
    # llama-server reads an empty grammar as none, so clients written for it send "grammar": "" to mean none.
    grammar_text = req.grammar or None
    if grammar_text is not None and schema is not None:
        raise APIError(400, "give either grammar or a JSON schema (response_format, json_schema), not both",
                       param="grammar", code="invalid_value")
    if plan is not None and plan.forced and (grammar_text is not None or schema is not None):
        raise APIError(400, "a forced tool call cannot be combined with grammar or response_format",
                       param="tool_choice", code="invalid_value")
    try:
        if grammar_text is not None:
            check_grammar(grammar_text, "grammar")
            return grammar_text
        if schema is not None:
            grammar = schema_to_grammar(json.dumps(schema), schema_param)
            check_grammar(grammar, schema_param)  # limits llama.cpp's parser needs (nesting depth)
            return grammar
    except InputError as exc:
        param = "grammar" if grammar_text is not None else schema_param
        raise APIError(400, exc.message, param=param, code="invalid_grammar") from None
    if plan is not None and plan.forced:
        from ..core.constrain.tools import call_grammar

        try:
            return call_grammar(plan)
        except InputError as exc:
            raise APIError(400, exc.message, param="tools", code="invalid_value") from None
    return settings.sampling.grammar if plan is None else None


def _json_schema(req: GenerationFields) -> tuple[Any, str]:
    """The JSON schema a request constrains its output to, if any, and the field it came from."""
    fmt = req.response_format
    if fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None and fmt.schema_ is None:  # OpenAI requires the object (its schema is optional)
            raise APIError(400, "response_format of type json_schema needs a json_schema object",
                           param="response_format.json_schema", code="invalid_value")
        schema = fmt.json_schema.schema_ if fmt.json_schema is not None else fmt.schema_
        return (schema if schema is not None else {"type": "object"}), "response_format.json_schema.schema"
    if fmt is not None and fmt.type == "json_object":
        return (fmt.schema_ if fmt.schema_ is not None else {"type": "object"}), "response_format"
    if req.json_schema is not None:
        return req.json_schema, "json_schema"
    return None, ""
