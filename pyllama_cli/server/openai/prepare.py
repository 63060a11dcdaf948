"""Turn an OpenAI request into engine jobs: the prompt's tokens, and the rest by job_rules.py's rules.

Everything a request can get wrong is found here, before any response starts, so that it is
answered with a 400 naming the field rather than a broken stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from ...core.constrain.tools import ToolPlan, ToolsError, plan_tools, render_with_tools
from ...core.serving.engine import Engine
from ...core.serving.jobs import GenerationJob
from ..http.access_log import note_prompt_parts
from ...core.text.reasoning import (
    EFFORT_BUDGETS,
    FORMAT_NONE,
    UNLIMITED,
    BudgetSpec,
    Thinking,
    opens_reasoning,
    template_markers,
)
from ...errors import InputError
from .. import job_rules as rules
from ..errors import APIError, to_api_error
from ..settings import ServerSettings
from ...core.media.check import Media
from .extras import ChatExtras, chat_shape, extras_of
from .media import content_text, media_prompt_of
from .schemas import ChatCompletionRequest, ChatMessage, CompletionRequest

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
    media: list[Media] | None = [] if engine.projector is not None else None  # None: image parts refused
    shape = chat_shape(engine, req, message_dicts(req.messages, settings, media))
    plan = plan_request_tools(req.tools, req.tool_choice, req.parallel_tool_calls is not False, not agent)
    prompt = render_prompt(engine, settings, shape.messages, plan, add_generation_prompt=shape.add_generation_prompt,
                           template_kwargs=req.chat_template_kwargs) + shape.prefill
    media_prompt = media_prompt_of(engine, prompt, media, settings) if media else None
    ids = engine.tokenize(prompt, add_special=True, parse_special=True) if media_prompt is None else media_prompt.tokens
    grammar = rules.grammar(req, settings, plan)
    requested = rules.requested_tokens(req, req.max_completion_tokens)
    if think_budget is None and req.reasoning_effort:
        think_budget = EFFORT_BUDGETS[req.reasoning_effort]
    thinking, budget_spec = plan_reasoning(engine, settings, prompt, think_budget, grammar)
    job = GenerationJob(
        prompt=tuple(ids), sampling=rules.sampling(req, settings, grammar, engine),
        max_tokens=rules.budget(requested, len(ids) if media_prompt is None else media_prompt.n_cells, engine, settings,
                                "messages"), stop=rules.stops(req.stop, settings),
        n_probs=(req.top_logprobs or 0) if req.logprobs else -1, id_slot=req.id_slot, cache_prompt=req.cache_prompt,
        progress=req.return_progress, think_budget=budget_spec, lora=rules.job_lora(engine, req.lora),
        user_starts=engine.user_starts(ids, settings.chat_template),
        media=media_prompt,
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
    grammar = rules.grammar(req, settings, None)
    sampling = rules.sampling(req, settings, grammar, engine)
    stop = rules.stops(req.stop, settings)
    requested = rules.requested_tokens(req)
    jobs = []
    for ids in prompt_tokens(engine, req.prompt, "prompt"):
        jobs.append(GenerationJob(prompt=tuple(ids), sampling=sampling,
                                  max_tokens=rules.budget(requested, len(ids), engine, settings, "prompt"), stop=stop,
                                  n_probs=req.logprobs if req.logprobs is not None else -1,
                                  lora=rules.job_lora(engine, req.lora)))
    return jobs


def render_prompt(engine: Engine, settings: ServerSettings, messages: list[dict[str, Any]],
                  plan: ToolPlan | None, *, add_generation_prompt: bool = True,
                  template_kwargs: dict[str, Any] | None = None) -> str:
    template_text = engine.chat_template_text(settings.chat_template)

    def render(m: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        return engine.render_chat(m, tools=tools, template=settings.chat_template,
                                  add_generation_prompt=add_generation_prompt, template_kwargs=template_kwargs)

    prompt = render_with_tools(render, messages, plan, template_text)
    if settings.verbose:  # -v: the prompt's tokens by part, in the access log
        note_prompt_parts(lambda text, whole: len(engine.tokenize(text, add_special=whole)), prompt,
                          render_with_tools(render, messages, None, template_text), messages)
    return prompt


def message_dicts(messages: list[ChatMessage], settings: ServerSettings | None = None,
                  media: list[Media] | None = None) -> list[dict[str, Any]]:
    """Messages as plain dicts with text content (content parts joined). Image and audio parts become
    media markers, their bytes appended to `media`; without `media` they are refused."""
    out = []
    for i, m in enumerate(messages):
        content = m.content
        if isinstance(content, list):
            content = content_text(content, i, settings, media)
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
