"""Request bodies of llama-server's native endpoints (field names as llama-server reads them)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from ..schemas import ChatMessage, GenerationFields, _Lenient


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


class ExtraChunk(_Lenient):
    text: str
    filename: str = "tmp"


class InfillRequest(NativeFields):
    input_prefix: str | list[Any] = ""
    input_suffix: str | list[Any] = ""
    input_extra: list[ExtraChunk] = Field(default_factory=list, description="Other files: text and filename.")
    prompt: str | list[Any] = ""


class SlotFileRequest(_Lenient):
    filename: str = Field(min_length=1)


class TokenCountRequest(_Lenient):
    messages: list[ChatMessage] = Field(min_length=1)
