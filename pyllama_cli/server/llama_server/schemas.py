"""Request bodies of llama-server's native endpoints (field names as llama-server reads them)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from ..job_rules import GenerationFields, Lenient
from ..openai.schemas import ChatMessage, NamedToolChoice, Tool


class NativeFields(GenerationFields):
    """The fields /completion and /infill share: llama-server's own beside the OpenAI ones."""

    n_probs: int = Field(default=0, ge=0, le=100, description="Each token's probability and the n likeliest.")
    post_sampling_probs: bool = Field(default=False, description="Probabilities after the sampler chain's cuts.")
    cache_prompt: bool = Field(default=True, description="Reuse the slot's cached prefix of the prompt.")
    id_slot: int = Field(default=-1, ge=-1, description="Run on this slot (-1: any).")
    return_tokens: bool = Field(default=False, description="Put the generated token ids in `tokens`.")
    t_max_predict_ms: int | None = Field(default=None, ge=0, description="Stop generating after this long.")
    response_fields: list[str] | None = Field(default=None, description="Only these fields (paths a/b).")
    return_progress: bool = False
    timings_per_token: bool = False


class NativeCompletionRequest(NativeFields):
    # A string, token ids, a mix of both, {"prompt_string": ...}, or a list of those (one answer each).
    prompt: Any = Field(description="A string, token ids, a mix of both, or a list of prompts.")


class ExtraChunk(Lenient):
    text: str
    filename: str = "tmp"


class InfillRequest(NativeFields):
    input_prefix: str | list[Any] = ""
    input_suffix: str | list[Any] = ""
    input_extra: list[ExtraChunk] = Field(default_factory=list, description="Other files: text and filename.")
    prompt: str | list[Any] = ""


class SlotFileRequest(Lenient):
    filename: str = Field(min_length=1)


class TokenCountRequest(Lenient):
    model: str | None = None  # router mode: whose template and vocabulary (else ?model=)
    messages: list[ChatMessage] = Field(min_length=1)


class TokenizeRequest(Lenient):
    model: str | None = None  # router mode: the model whose vocabulary or template (else ?model=)
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(Lenient):
    model: str | None = None  # router mode: the model whose vocabulary or template (else ?model=)
    tokens: list[int]


class ApplyTemplateRequest(Lenient):
    model: str | None = None  # router mode: the model whose vocabulary or template (else ?model=)
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None


# ---------------------------------------------------------------- responses (documentation)


class TokenPiece(BaseModel):
    id: int
    piece: str | list[int] = Field(description="The text, or its bytes when they are not valid UTF-8.")


class TokenizeResponse(BaseModel):
    tokens: list[int] | list[TokenPiece]


class DetokenizeResponse(BaseModel):
    content: str


class ApplyTemplateResponse(BaseModel):
    prompt: str
