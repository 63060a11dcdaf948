"""Request and response bodies of the OpenAI-compatible API (pydantic; they also make the /docs schema).

Requests ignore unknown fields, since OpenAI clients send fields this server has no use for.
Responses are built as plain dicts in responses.py; the models here document their shape.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..core.model.settings import INT32_MAX
from ..core.serving.pool import parse_keep_alive
from ..errors import InputError


class _Lenient(BaseModel):
    # allow_inf_nan: Python's JSON parser reads NaN and Infinity, which no sampling field may hold.
    model_config = ConfigDict(extra="ignore", populate_by_name=True, allow_inf_nan=False)


# ---------------------------------------------------------------- requests: pieces


class ContentPart(_Lenient):
    type: str = "text"
    text: str | None = None


class FunctionCall(_Lenient):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCall(_Lenient):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None  # an earlier answer's thinking, for templates that show it


class FunctionDefinition(_Lenient):
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(_Lenient):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(_Lenient):
    name: str


class NamedToolChoice(_Lenient):
    type: Literal["function"] = "function"
    function: NamedFunction


class JsonSchemaSpec(_Lenient):
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Lenient):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None
    # llama-server also takes a schema next to "type": "json_object".
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")


class StreamOptions(_Lenient):
    include_usage: bool = False


# ---------------------------------------------------------------- requests


class GenerationFields(_Lenient):
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


class ChatCompletionRequest(GenerationFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    # Declared so that a value of the wrong type is refused. Not enforced: an answer carries the calls the
    # model writes (the forced-call grammar writes one).
    parallel_tool_calls: bool | None = None
    # llama-server's (and vLLM's) extras: see server/llama/chat.py.
    n: int | None = Field(default=1, ge=1, le=16, description="Choices to generate (up to 16).")
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = Field(default=None, description="Continue the last (assistant) message.")
    chat_template_kwargs: dict[str, Any] | None = Field(default=None, description="Extra variables for the template.")
    timings_per_token: bool = False
    return_progress: bool = False
    verbose: bool = False
    id_slot: int = Field(default=-1, ge=-1)
    cache_prompt: bool = True
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = Field(
        default=None, description="Limits the thinking of a reasoning model (none, minimal: no thinking; low: "
        "512 tokens; medium: 2048; high, xhigh: unlimited).")


class CompletionRequest(GenerationFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=20)
    # OpenAI's legacy fields that change the answer: declared so that a request using them is refused,
    # not served as if they were absent.
    echo: bool | None = Field(default=None, description="Not supported (true is refused).")
    suffix: str | None = Field(default=None, description="Not supported (fill-in-the-middle is refused).")
    best_of: int | None = Field(default=None, description="Only 1 is supported.")


class EmbeddingRequest(_Lenient):
    input: str | list[str] | list[int] | list[list[int]]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"


class TokenizeRequest(_Lenient):
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(_Lenient):
    tokens: list[int]


class ApplyTemplateRequest(_Lenient):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None


# ---------------------------------------------------------------- responses (documentation)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict[str, int] | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob] | None
    refusal: list[TokenLogprob] | None = None


class ResponseFunctionCall(BaseModel):
    name: str
    arguments: str = Field(description="The arguments as a JSON text.")


class ResponseToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: ResponseFunctionCall


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    refusal: str | None = None
    tool_calls: list[ResponseToolCall] | None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: Literal["stop", "length", "tool_calls"]


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    system_fingerprint: str
    choices: list[ChatChoice]
    usage: Usage


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    text: str
    index: int
    logprobs: CompletionLogprobs | None
    finish_reason: Literal["stop", "length"]


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    system_fingerprint: str
    choices: list[CompletionChoice]
    usage: Usage


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str = Field(description="Floats, or base64 of little-endian float32.")


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage


class ModelLoadRequest(_Lenient):
    model: str = Field(description="A model id (see /v1/models).")


class ModelStatus(BaseModel):
    value: Literal["loaded", "loading", "unloaded", "failed"]
    failed: bool | None = None
    error: str | None = None


class ModelRuntime(BaseModel):
    n_ctx: int = Field(description="Tokens per slot.")
    slots_total: int
    slots_busy: int
    idle_s: float = Field(description="Seconds since its last request ended (0 while busy).")
    memory_bytes: int = Field(description="Weights plus KV cache (an estimate).")


class ModelCard(BaseModel):
    model_config = ConfigDict(json_schema_extra={"description": "A served model; `runtime` only while loaded."})

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    path: str
    size: int = Field(description="Bytes on disk, every part included.")
    aliases: list[str] = Field(default_factory=list)
    status: ModelStatus
    meta: dict[str, Any] | None = Field(default=None, description="Only while loaded.")
    runtime: ModelRuntime | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenPiece(BaseModel):
    id: int
    piece: str | list[int] = Field(description="The text, or its bytes when they are not valid UTF-8.")


class TokenizeResponse(BaseModel):
    tokens: list[int] | list[TokenPiece]


class DetokenizeResponse(BaseModel):
    content: str


class ApplyTemplateResponse(BaseModel):
    prompt: str


class HealthResponse(BaseModel):
    status: Literal["ok"]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    error: ErrorDetail
