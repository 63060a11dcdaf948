"""The rules that turn a request's generation fields into a job's parts, the same on every API's route.

`GenerationFields` are the fields OpenAI's and llama-server's requests share (sampling, stops,
grammar, JSON schema, token budget); each API family's prepare reads them through the functions
here, so a field means the same everywhere. A mistake is an `APIError` 400 naming the field.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from dataclasses import replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..core.constrain.bounds import GrammarBounds
from ..core.constrain.tools import ToolPlan
from ..core.generate.sampling import SamplingSettings
from ..core.model.settings import INT32_MAX
from ..core.serving.engine import Engine
from ..core.serving.pool import parse_keep_alive
from ..errors import ContextOverflow, InputError, UsageError
from .errors import APIError
from .settings import ServerSettings

SEED_MODULUS = 2**32 - 1  # llama.cpp's seeds are 32-bit; 0xFFFFFFFF itself means "random"


# ---------------------------------------------------------------- the fields


class Lenient(BaseModel):
    # allow_inf_nan: Python's JSON parser reads NaN and Infinity, which no sampling field may hold.
    model_config = ConfigDict(extra="ignore", populate_by_name=True, allow_inf_nan=False)


class JsonSchemaSpec(Lenient):
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(Lenient):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None
    # llama-server also takes a schema next to "type": "json_object".
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")


class StreamOptions(Lenient):
    include_usage: bool = False


class GenerationFields(Lenient):
    """Fields shared by /v1/chat/completions and /v1/completions (OpenAI's plus llama-server's)."""

    model: str | None = Field(default=None, description="The served model's id (see /v1/models).")
    max_tokens: int | None = Field(default=None, ge=1, description="Default: the rest of the context.")
    n_predict: int | None = Field(default=None, ge=-1, description="llama-server's max_tokens (it wins over "
                                  "max_tokens, as there); -1: the rest of the context.")
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: int | None = Field(default=None, ge=0, le=INT32_MAX)
    min_p: float | None = Field(default=None, ge=0, le=1)
    typical_p: float | None = Field(default=None, ge=0, le=1)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    repeat_penalty: float | None = Field(default=None, ge=0)
    repeat_last_n: int | None = Field(default=None, ge=-1, le=INT32_MAX)
    seed: int | None = None
    stop: str | list[str] | None = None
    logit_bias: dict[str, float | bool] | list[list[Any]] | None = Field(
        default=None, description="Token id -> bias added to its logit; false bans the token.")
    n: int | None = Field(default=1, description="Only 1 is supported.")
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    grammar: str | None = Field(default=None, description="A GBNF grammar the output must match.")
    json_schema: dict[str, Any] | None = Field(default=None, description="llama-server's schema constraint.")
    ignore_eos: bool | None = None
    lora: Any = Field(default=None, description="llama-server's per-request LoRA scales: [{\"id\": 0, \"scale\": 0.5}]; "
                      "adapters not listed run at 0 (default: the global scales of /lora-adapters).")
    # llama.cpp's newer samplers and the chain's order, under llama-server's names and limits.
    dynatemp_range: float | None = None
    dynatemp_exponent: float | None = None
    top_n_sigma: float | None = None
    xtc_probability: float | None = Field(default=None, ge=0, le=1)
    xtc_threshold: float | None = Field(default=None, ge=0, le=1)
    dry_multiplier: float | None = None
    dry_base: float | None = Field(default=None, description="Below 1: the server's default.")
    dry_allowed_length: int | None = Field(default=None, ge=0, le=INT32_MAX)
    dry_penalty_last_n: int | None = Field(default=None, ge=0, le=INT32_MAX)
    dry_sequence_breakers: list[str] | None = Field(default=None, min_length=1,
                                                    description="A non-empty JSON array of strings.")
    adaptive_target: float | None = Field(default=None, le=1)
    adaptive_decay: float | None = Field(default=None, ge=0, le=0.99)
    samplers: list[str] | str | None = Field(
        default=None, description="The chain's order: sampler names, or a string of their letters (e.g. \"kpt\").")
    keep_alive: float | str | None = Field(
        default=None, description="ollama's: how long the model stays loaded after this request, in seconds or "
        "as 5m, 1h; 0 = unload now, -1 = keep (router mode).")

    @field_validator("keep_alive")
    @classmethod
    def _duration(cls, value: float | str | None) -> float | None:
        try:
            return parse_keep_alive(value)
        except InputError as exc:
            raise ValueError(exc.message) from None


# ---------------------------------------------------------------- token budget, stops, slot


def requested_tokens(req: GenerationFields, max_completion_tokens: int | None = None) -> int | None:
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


def budget(requested: int | None, n_prompt: int, engine: Engine, settings: ServerSettings, param: str) -> int:
    """Tokens to generate: as asked, else the server's -n, else the rest of the context; never past it."""
    try:
        engine.check_fits(n_prompt)
    except ContextOverflow:
        # "exceeds the available context size": the words llama-server's clients look for in this error
        raise APIError(400, f"the request ({n_prompt} tokens) exceeds the available context size ({engine.n_ctx} "
                       "tokens): shorten the prompt, or restart the server with a larger -c", param=param,
                       code="context_length_exceeded",
                       error_type="exceed_context_size_error",  # llama-server's type, which its clients test for
                       extra={"n_prompt_tokens": n_prompt, "n_ctx": engine.n_ctx}) from None
    room = engine.n_ctx - n_prompt
    if requested is None:
        requested = settings.n_predict
    return room if requested < 0 else min(requested, room)


def stops(stop: str | list[str] | None, settings: ServerSettings) -> tuple[str, ...]:
    """The request's stop strings, then the server's (--reverse-prompt); empty ones dropped."""
    given = [stop] if isinstance(stop, str) else list(stop or ())
    return tuple(s for s in (*given, *settings.stop) if s)


def check_slot(engine: Engine, id_slot: int) -> None:
    """llama-server's `id_slot` (-1: any) must name one of the engine's slots."""
    n_slots = len(engine.slot_states())
    if id_slot >= n_slots:
        raise APIError(400, f"id_slot {id_slot} does not exist: this server has slots 0..{n_slots - 1}",
                       param="id_slot", code="invalid_value")


# ---------------------------------------------------------------- sampling and constraints


def sampling(req: GenerationFields, settings: ServerSettings, grammar: str | None, engine: Engine) -> SamplingSettings:
    """The server's sampling with what the request sets (seed, logit_bias included) and `grammar`."""
    fields = ("temperature", "top_p", "top_k", "min_p", "typical_p", "presence_penalty", "frequency_penalty",
              "repeat_penalty", "repeat_last_n", "ignore_eos")
    changes: dict[str, Any] = {name: getattr(req, name) for name in fields if getattr(req, name) is not None}
    if req.seed is not None:
        changes["seed"] = req.seed % SEED_MODULUS if req.seed >= 0 else -1
    changes.update(chain_fields(req))
    bias = _logit_bias(req.logit_bias, engine)
    if changes.get("ignore_eos", settings.sampling.ignore_eos) and engine.model is not None:
        # As llama-server does: the end-of-generation tokens are never sampled (not just not obeyed).
        bias += tuple((token, float("-inf")) for token in engine.model.eog_tokens)
    if bias:
        changes["logit_bias"] = settings.sampling.logit_bias + bias
    if grammar and grammar != settings.sampling.grammar and engine.model is not None and _on_a_worker_thread():
        _prebuild(engine, grammar, settings)
    return replace(settings.sampling, grammar=grammar, **changes)


def _prebuild(engine: Engine, grammar: str, settings: ServerSettings) -> None:
    """Parse the request's grammar here, off the engine's thread (core/generate/grammar_pool.py)."""
    from ..core.generate import grammar_pool

    started = time.perf_counter()
    try:
        grammar_pool.prebuild(engine.model, grammar)
        grammar_bounds(settings).check_time(started, "grammar")
    except InputError as exc:
        raise APIError(400, exc.message, param="grammar", code="invalid_grammar") from None


def _on_a_worker_thread() -> bool:
    """Whether this runs off the event loop (a large body is prepared on a worker thread, spine.off_loop):
    a small body's grammar (milliseconds to parse) is left to the engine rather than stall every connection."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return True
    return False


def grammar_bounds(settings: ServerSettings) -> GrammarBounds:
    return GrammarBounds(settings.limits.max_grammar_size, settings.limits.max_grammar_seconds)


_CHAIN_FIELDS = ("dynatemp_range", "dynatemp_exponent", "top_n_sigma", "xtc_probability", "xtc_threshold",
                 "dry_multiplier", "dry_allowed_length", "dry_penalty_last_n", "adaptive_target", "adaptive_decay")


def chain_fields(req: GenerationFields) -> dict[str, Any]:
    """The request's newer sampler fields and `samplers` order as SamplingSettings fields, read as llama-server
    reads them (a dry_base below 1 keeps the default; samplers as names or as a string of letters)."""
    from ..core.generate.sampler_names import samplers_from_letters, samplers_from_names

    changes: dict[str, Any] = {name: getattr(req, name) for name in _CHAIN_FIELDS if getattr(req, name) is not None}
    if req.dry_base is not None and req.dry_base >= 1:
        changes["dry_base"] = req.dry_base
    if req.dry_sequence_breakers is not None:
        changes["dry_sequence_breakers"] = tuple(req.dry_sequence_breakers)
    if req.samplers is not None:
        try:
            changes["samplers"] = samplers_from_letters(req.samplers, "samplers") if isinstance(req.samplers, str) \
                else samplers_from_names(req.samplers, "samplers")
        except UsageError as exc:
            raise APIError(400, f"{exc.message} ({exc.hint})", param="samplers", code="invalid_value") from None
    return changes


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


def grammar(req: GenerationFields, settings: ServerSettings, plan: ToolPlan | None) -> str | None:
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
    bounds, started = grammar_bounds(settings), time.perf_counter()
    try:
        if grammar_text is not None:
            bounds.check_size(grammar_text, "grammar")
            check_grammar(grammar_text, "grammar")
            return grammar_text
        if schema is not None:
            schema_text = json.dumps(schema)
            bounds.check_size(schema_text, schema_param)
            grammar = schema_to_grammar(schema_text, schema_param)
            bounds.check_size(grammar, f"the grammar of {schema_param}")
            check_grammar(grammar, schema_param)  # limits llama.cpp's parser needs (nesting depth)
            bounds.check_time(started, schema_param)
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


# ---------------------------------------------------------------- LoRA scales (server/lora/ sets the global ones)


def request_scales(n_adapters: int, entries: Any, field: str = "lora") -> tuple[float, ...]:
    """One scale per adapter from llama-server's [{"id", "scale"}] list (unlisted adapters: 0).

    Raises:
        APIError: 400 for a list that is not of {id, scale} objects, or an id out of range.
    """
    if not isinstance(entries, list):
        raise APIError(400, f"{field} must be an array of objects with 'id' and 'scale' fields", param=field,
                       code="invalid_value")
    scales = [0.0] * n_adapters
    for entry in entries:
        if not (isinstance(entry, dict) and _is_lora_id(entry.get("id"))
                and _is_finite_number(entry.get("scale", 0.0))):
            raise APIError(400, f"{field} must be an array of objects with 'id' and 'scale' fields", param=field,
                           code="invalid_value")
        lora_id = entry["id"]
        if not 0 <= lora_id < n_adapters:
            loaded = f"ids 0..{n_adapters - 1}" if n_adapters else "none"
            raise APIError(400, f"{field}: no LoRA adapter with id {lora_id} (loaded: {loaded})", param=field,
                           code="invalid_value")
        scales[lora_id] = float(entry.get("scale", 0.0))
    return tuple(scales)


def job_lora(engine: Any, entries: Any) -> tuple[float, ...] | None:
    """A request's `lora` field as the job's scales (None when the request has none, or an empty list, as
    llama-server reads it: the global scales)."""
    if entries is None or entries == []:
        return None
    turns = getattr(engine, "lora", None)
    loras = turns.adapters.loras if turns is not None and turns.adapters is not None else []
    return request_scales(len(loras), entries)


def _is_lora_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_finite_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
