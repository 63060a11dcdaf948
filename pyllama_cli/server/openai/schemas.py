"""Request and response bodies of the OpenAI-compatible API (pydantic; they also make the /docs schema).

Requests ignore unknown fields, since OpenAI clients send fields this server has no use for.
Responses are built as plain dicts in bodies.py; the models here document their shape.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..job_rules import GenerationFields, Lenient

# ---------------------------------------------------------------- requests: pieces


class ContentPart(Lenient):
    type: str = "text"
    text: str | None = None
    image_url: dict[str, Any] | str | None = None  # {"url": "data:image/png;base64,..."} (server/openai/media.py)
    input_audio: dict[str, Any] | None = None  # {"data": BASE64, "format": "wav"}


class FunctionCall(Lenient):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCall(Lenient):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None  # an earlier answer's thinking, for templates that show it


class FunctionDefinition(Lenient):
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(Lenient):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(Lenient):
    name: str


class NamedToolChoice(Lenient):
    type: Literal["function"] = "function"
    function: NamedFunction


# ---------------------------------------------------------------- requests


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
    # llama-server's (and vLLM's) extras: see extras.py.
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


class EmbeddingRequest(Lenient):
    # A string, token ids, a list mixing both, {"prompt_string"} or {"content": [parts]}, or a list of
    # those: embedding_inputs.py reads every shape llama-server takes.
    input: str | list[Any] | dict[str, Any]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"


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
