"""Request bodies of Anthropic's Messages API (pydantic; they also make the /docs schema).

Unknown fields are ignored, as in the OpenAI routes: Anthropic's clients send fields (cache_control,
citations, service_tier) that change nothing here.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class ContentBlock(_Lenient):
    """One block of a message: text, image, tool_use, tool_result or thinking (others are refused by prepare)."""

    type: str
    text: str | None = None
    id: str | None = None  # tool_use
    name: str | None = None  # tool_use
    input: dict[str, Any] | None = None  # tool_use
    tool_use_id: str | None = None  # tool_result
    content: str | list[ContentBlock] | None = None  # tool_result
    is_error: bool | None = None  # tool_result
    thinking: str | None = None  # thinking
    signature: str | None = None  # thinking
    source: dict[str, Any] | None = None  # image: {"type": "base64", "media_type": ..., "data": ...} or {"type": "url"}


class MessageParam(_Lenient):
    # "system": context given mid-conversation (Claude Code sends it), shown to the model in a user turn.
    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]


class TextBlock(_Lenient):
    type: Literal["text"] = "text"
    text: str


class ToolDefinition(_Lenient):
    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    type: str | None = None  # "custom" or absent; Anthropic's server tools (web_search...) are refused


class ToolChoice(_Lenient):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class ThinkingConfig(_Lenient):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(default=None, ge=0)


class CountTokensRequest(_Lenient):
    model: str | None = Field(default=None, description="Any name: a one-model server answers to all.")
    # required, but an empty list is answered, as llama-server answers it (prepare gives an empty user turn)
    messages: list[MessageParam]
    system: str | list[TextBlock] | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    metadata: dict[str, Any] | None = None
    stream: bool | None = False
