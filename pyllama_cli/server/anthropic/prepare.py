"""A Messages request as the chat request the server already knows how to run.

System text, turns of content blocks, tools with `input_schema` and Anthropic's tool choices become
OpenAI-style messages, tools and tool_choice; openai/prepare.py then renders, tokenizes and constrains
them exactly as it does for /v1/chat/completions (a forced tool goes through the same call grammar).
"""

from __future__ import annotations

import json
from typing import Any

from ...core.serving.engine import Engine
from ..errors import APIError
from ..openai.media import media_list, prompt_token_count
from ..openai.prepare import PreparedChat, chat_request, message_dicts, plan_request_tools, prepare_chat, render_prompt
from ..settings import ServerSettings
from .schemas import ContentBlock, CountTokensRequest, MessageParam, MessagesRequest


def prepare_messages(engine: Engine, settings: ServerSettings, req: MessagesRequest) -> PreparedChat:
    fields = _chat_fields(req)
    fields.update(max_tokens=req.max_tokens, temperature=req.temperature, top_p=req.top_p, top_k=req.top_k,
                  stop=req.stop_sequences)
    return prepare_chat(engine, settings, chat_request(fields), _think_budget(req), agent=True)


def count_prompt_tokens(engine: Engine, settings: ServerSettings, req: CountTokensRequest) -> int:
    """The tokens of the prompt /v1/messages would render for the same messages and tools."""
    chat = chat_request(_chat_fields(req))
    plan = plan_request_tools(chat.tools, chat.tool_choice, chat.parallel_tool_calls is not False, False)
    media = media_list(engine)
    prompt = render_prompt(engine, settings, message_dicts(chat.messages, settings, media), plan)
    return prompt_token_count(engine, prompt, media or [], settings)


def _think_budget(req: CountTokensRequest) -> int | None:
    """thinking.budget_tokens when thinking is enabled; 0 (no thinking) when it is disabled."""
    if req.thinking is None or req.thinking.type == "adaptive":
        return None
    if req.thinking.type == "disabled":
        return 0
    return req.thinking.budget_tokens


def _chat_fields(req: CountTokensRequest) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    system = req.system if isinstance(req.system, str) else "\n\n".join(b.text for b in req.system or ())
    if system:
        messages.append({"role": "system", "content": system})
    for i, message in enumerate(req.messages):
        messages.extend(_turn(message, i))
    if not req.messages:  # answered, as llama-server does: an empty user turn stands in (templates want one)
        messages.append({"role": "user", "content": ""})
    messages = _join_user_turns(messages)
    fields: dict[str, Any] = {"messages": messages}
    if req.tools:
        fields["tools"] = [_tool(t, i) for i, t in enumerate(req.tools)]
    if req.tool_choice is not None:
        fields["tool_choice"] = _tool_choice(req.tool_choice)
        if req.tool_choice.disable_parallel_tool_use:
            fields["parallel_tool_calls"] = False
    return fields


def _turn(message: MessageParam, index: int) -> list[dict[str, Any]]:
    """One Messages turn as chat messages: tool results become `tool` messages before the user's text."""
    blocks = [ContentBlock(type="text", text=message.content)] if isinstance(message.content, str) \
        else message.content
    texts, thinking, calls, results, parts = [], [], [], [], []
    for j, block in enumerate(blocks):
        where = f"messages[{index}].content[{j}]"
        if block.type == "text":
            texts.append(block.text or "")
            parts.append({"type": "text", "text": block.text or ""})
        elif block.type == "image" and message.role == "user":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block.source or {}, where)}})
        elif block.type in ("thinking", "redacted_thinking") and message.role == "assistant":
            thinking.append(block.thinking or "")
        elif block.type == "tool_use" and message.role == "assistant":
            calls.append({"id": block.id, "type": "function",
                          "function": {"name": block.name or "", "arguments": json.dumps(block.input or {})}})
        elif block.type == "tool_result" and message.role == "user":
            results.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": _result_content(block, where)})
        else:
            raise APIError(400, f"{where}: a {message.role} message cannot hold a block of type {block.type!r} "
                           "here (this server takes text, image, thinking, tool_use and tool_result)",
                           param=f"{where}.type")
    out = list(results)
    if texts or calls or thinking or not results:
        role = "user" if message.role == "system" else message.role
        images = len(parts) > len(texts)  # the OpenAI parts carry the images on (server/openai/media.py)
        turn: dict[str, Any] = {"role": role, "content": parts if images else "".join(texts)}
        if calls:
            turn["tool_calls"] = calls
        if thinking:
            turn["reasoning_content"] = "".join(thinking)
        out.append(turn)
    return out


def _join_user_turns(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive user turns as one (a mid-conversation system message becomes a user turn): many
    templates require user and assistant turns to alternate."""
    out: list[dict[str, Any]] = []
    for message in messages:
        if out and message["role"] == "user" and out[-1]["role"] == "user":
            out[-1] = {**out[-1], "content": _joined(out[-1]["content"], message["content"])}
        else:
            out.append(message)
    return out


def _joined(first: Any, second: Any) -> Any:
    if isinstance(first, str) and isinstance(second, str):
        return f"{first}\n\n{second}"
    return [*_as_parts(first), {"type": "text", "text": "\n\n"}, *_as_parts(second)]


def _as_parts(content: Any) -> list[dict[str, Any]]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


def _image_url(source: dict[str, Any], where: str) -> str:
    """An image block's source as the URL of an OpenAI image part: base64 data as a data: URL."""
    if source.get("type") == "base64":
        return f"data:{source.get('media_type') or 'image/png'};base64,{source.get('data') or ''}"
    if source.get("type") == "url" and isinstance(source.get("url"), str):
        return source["url"]
    raise APIError(400, f"{where}.source: an image's source must be base64 data or a url", param=f"{where}.source")


def _result_content(block: ContentBlock, where: str) -> str | list[dict[str, Any]]:
    """A tool result's content: its text, or text and image parts when it holds images (a text-only model
    refuses those later, as it refuses a user's image); a block of another kind is refused, never dropped."""
    if not isinstance(block.content, list):
        return block.content or ""
    parts: list[dict[str, Any]] = []
    for k, inner in enumerate(block.content):
        if inner.type == "text":
            parts.append({"type": "text", "text": inner.text or ""})
        elif inner.type == "image":
            url = _image_url(inner.source or {}, f"{where}.content[{k}]")
            parts.append({"type": "image_url", "image_url": {"url": url}})
        else:
            raise APIError(400, f"{where}.content[{k}]: a tool result cannot hold a block of type {inner.type!r} "
                           "here (this server takes text and image)", param=f"{where}.content[{k}].type")
    if all(part["type"] == "text" for part in parts):
        return "".join(part["text"] for part in parts)
    return parts


def _tool(tool: Any, index: int) -> dict[str, Any]:
    if tool.type not in (None, "custom"):
        raise APIError(400, f"tools[{index}]: tools of type {tool.type!r} are not supported (only your own "
                       "tools, with an input_schema)", param=f"tools[{index}].type")
    return {"type": "function", "function": {"name": tool.name, "description": tool.description,
                                             "parameters": tool.input_schema}}


def _tool_choice(choice: Any) -> Any:
    if choice.type == "tool":
        if not choice.name:
            raise APIError(400, "tool_choice of type 'tool' needs the tool's name", param="tool_choice.name")
        return {"type": "function", "function": {"name": choice.name}}
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type]

