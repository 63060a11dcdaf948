"""Request bodies of ollama's API (pydantic; they also make the /docs schema).

Field names are ollama's (docs/api.md of github.com/ollama/ollama). Unknown fields are ignored, as
ollama ignores them; `options` is a free object whose keys prepare.py maps or ignores one by one.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ...core.serving.pool import parse_keep_alive
from ...errors import InputError


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


def _keep_alive(value: float | str | None) -> float | None:
    try:
        return parse_keep_alive(value)
    except InputError as exc:
        raise ValueError(exc.message) from None


class _Timed(_Lenient):
    """Fields every model request has: which model, and how long it stays loaded after."""

    model: str = Field(default="", description="A model name: any name with one model served; an alias, a "
                       "router model id or hf.co/user/repo:QUANT in router mode.")
    keep_alive: float | str | None = Field(default=None, description="5m, 1h, seconds; 0 unloads after the request.")

    @field_validator("keep_alive")
    @classmethod
    def _duration(cls, value: float | str | None) -> float | None:
        return _keep_alive(value)


class ToolFunctionCall(_Lenient):
    name: str
    arguments: dict[str, Any] | str = Field(default_factory=dict)


class ToolCall(_Lenient):
    id: str | None = None
    function: ToolFunctionCall


class Message(_Lenient):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = ""
    thinking: str | None = None
    images: list[str] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None


class _Generation(_Timed):
    stream: bool = True
    format: Literal["", "json"] | dict[str, Any] | None = None
    options: dict[str, Any] | None = None
    think: bool | Literal["low", "medium", "high"] | None = None
    # A pyllama extension (ollama has none): "required" or {"type": "function", "function": {"name": ...}}
    # forces a tool call with a grammar; it may also come inside `options`.
    tool_choice: Any = None


class ChatRequest(_Generation):
    messages: list[Message] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None


class GenerateRequest(_Generation):
    prompt: str = ""
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None
    raw: bool = False
    images: list[str] | None = None


class EmbedRequest(_Timed):
    input: str | list[str] = Field(default_factory=list)
    truncate: bool = True
    dimensions: int | None = Field(default=None, ge=1)
    options: dict[str, Any] | None = None


class EmbeddingsRequest(_Timed):
    prompt: str = ""
    options: dict[str, Any] | None = None


class ModelRequest(_Lenient):
    model: str = Field(default="", description="The model's name (`name` is read too, as older clients send it).")
    name: str | None = None
    verbose: bool = False

    @property
    def wanted(self) -> str:
        return self.model or self.name or ""


class PullRequest(ModelRequest):
    stream: bool = True
    insecure: bool = False


class CopyRequest(_Lenient):
    source: str = Field(min_length=1)
    destination: str = Field(min_length=1)
