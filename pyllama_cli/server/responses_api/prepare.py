"""A Responses request as the chat request the server already knows how to run.

`input` (text, or items: messages, function calls and their outputs), `instructions` and the stored
conversation of `previous_response_id` become chat messages; function tools, tool_choice and
text.format become the chat request's tools, tool_choice and response_format. openai/prepare.py then
renders, tokenizes and constrains them exactly as it does for /v1/chat/completions.
"""

from __future__ import annotations

from typing import Any

from ...core.serving.engine import Engine
from ..errors import APIError
from ..openai.prepare import PreparedChat, chat_request, prepare_chat
from ..settings import ServerSettings
from .schemas import ResponsesRequest
from .store import ResponseStore

TEXT_PARTS = ("input_text", "output_text", "text")


def prepare_response(engine: Engine, settings: ServerSettings, req: ResponsesRequest,
                     store: ResponseStore) -> tuple[PreparedChat, list[dict[str, Any]]]:
    """The job, and the conversation it answers (without instructions, which a chained response does
    not inherit) to store with the answer."""
    earlier = store.get(req.previous_response_id, "previous_response_id").messages \
        if req.previous_response_id else []
    conversation = [*earlier, *input_messages(req.input)]
    messages = ([{"role": "system", "content": req.instructions}] if req.instructions else []) + conversation
    fields: dict[str, Any] = {"messages": messages, "max_tokens": req.max_output_tokens,
                              "temperature": req.temperature, "top_p": req.top_p,
                              "parallel_tool_calls": req.parallel_tool_calls}
    if req.tools:
        fields["tools"] = function_tools(req.tools)
    if req.tool_choice is not None:
        choice = req.tool_choice
        fields["tool_choice"] = choice if isinstance(choice, str) else {"type": "function",
                                                                          "function": {"name": choice.name}}
    if req.reasoning is not None and req.reasoning.effort:
        fields["reasoning_effort"] = req.reasoning.effort
    fmt = req.text.format if req.text is not None else None
    if fmt is not None and fmt.type == "json_schema":
        fields["response_format"] = {"type": "json_schema", "json_schema": {
            "name": fmt.name, "schema": fmt.schema_ if fmt.schema_ is not None else {"type": "object"},
            "strict": fmt.strict}}
    elif fmt is not None and fmt.type == "json_object":
        fields["response_format"] = {"type": "json_object"}
    fields.update(return_progress=req.return_progress, timings_per_token=req.timings_per_token)
    return prepare_chat(engine, settings, chat_request(fields), agent=True), conversation


def function_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The function tools as chat tools: a namespace's functions join the others (Codex groups its tools
    so), and tools this server cannot run (web_search and other hosted tools) are not offered."""
    out = []
    for tool in tools:
        if tool.get("type") == "namespace":
            out.extend(function_tools(tool.get("tools") or []))
        elif tool.get("type") == "function":
            out.append({"type": "function", "function": {
                "name": tool.get("name"), "description": tool.get("description"), "parameters": tool.get("parameters")}})
    return out


def input_messages(value: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages of a request's `input`: consecutive function calls join one assistant message."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    out: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        kind = item.get("type", "message")
        if kind == "message":
            out.append({"role": item.get("role", "user"), "content": _content(item.get("content"), i)})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name", ""), "arguments": item.get("arguments", "{}")}}
            if out and out[-1]["role"] == "assistant" and "tool_calls" in out[-1]:
                out[-1]["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": _text(item.get("output"), i)})
        elif kind == "reasoning":
            continue  # an earlier answer's thinking: templates drop it from the history anyway
        else:
            raise APIError(400, f"input[{i}]: items of type {kind!r} are not supported (this server takes "
                           "messages, function_call and function_call_output)", param=f"input[{i}].type",
                           code="invalid_value")
    return out


def _content(content: Any, index: int) -> Any:
    """A message's content: its text, or OpenAI chat parts when it holds an input_image (whose image_url
    is a data: URL, checked by server/openai/media.py)."""
    if not isinstance(content, list) or not any(isinstance(p, dict) and p.get("type") == "input_image"
                                                 for p in content):
        return _text(content, index)
    parts = []
    for j, part in enumerate(content):
        if isinstance(part, dict) and part.get("type") == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str):
                raise APIError(400, f"input[{index}].content[{j}]: an input_image needs its image_url (a data: URL; "
                               "file_id is not supported)", param=f"input[{index}].content[{j}]", code="invalid_value")
            parts.append({"type": "image_url", "image_url": {"url": url}})
        else:
            parts.append({"type": "text", "text": _text([part], index)})
    return parts


def _text(content: Any, index: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise APIError(400, f"input[{index}]: content must be text or a list of text parts",
                       param=f"input[{index}].content", code="invalid_value")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS:
            raise APIError(400, f"input[{index}].content[{j}]: parts of type {kind!r} are not supported (this "
                           "server takes text only)", param=f"input[{index}].content[{j}]", code="invalid_value")
        texts.append(str(part.get("text", "")))
    return "".join(texts)
