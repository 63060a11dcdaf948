"""Request bodies of OpenAI's Responses API (pydantic; they also make the /docs schema).

Input items are kept as plain objects and read by prepare.py, which names the item a mistake is in.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# OpenAI's limits on `metadata`: key-value pairs, characters of a key, characters of a value.
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True, allow_inf_nan=False)


class NamedFunctionChoice(_Lenient):
    type: Literal["function"]
    name: str


class TextFormat(_Lenient):
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextConfig(_Lenient):
    format: TextFormat | None = None


class ReasoningConfig(_Lenient):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None


class ResponsesRequest(_Lenient):
    model: str | None = Field(default=None, description="Any name: a one-model server answers to all.")
    input: str | list[dict[str, Any]] = Field(description="Text, or items: messages, function_call, "
                                              "function_call_output.")
    instructions: str | None = None
    # Function tools, and namespaces of them; hosted tools (web_search, file_search...) are left out.
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, ge=0, le=1)
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    stream: bool | None = False
    return_progress: bool = False  # llama-server's: response.in_progress events as the prompt is read
    timings_per_token: bool = False  # llama-server's: `timings` on each delta and on the last event
    store: bool | None = True
    background: bool | None = False  # run on without the client: poll, resume, cancel (background.py)
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None

    @field_validator("metadata")
    @classmethod
    def _within_openai_limits(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is None:
            return value
        if len(value) > MAX_METADATA_PAIRS:
            raise ValueError(f"at most {MAX_METADATA_PAIRS} key-value pairs (got {len(value)})")
        for key, text in value.items():
            if len(key) > MAX_METADATA_KEY:
                raise ValueError(f"a key has at most {MAX_METADATA_KEY} characters (got {len(key)})")
            if len(text) > MAX_METADATA_VALUE:
                raise ValueError(f"the value of {key!r} has at most {MAX_METADATA_VALUE} characters (got {len(text)})")
        return value
