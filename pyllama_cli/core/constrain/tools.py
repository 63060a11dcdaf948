"""Tool (function) calling: show the tools to the model, force a call with a grammar, read calls back.

The tools go to the chat template's `tools` variable. A template that ignores them (the rendered
prompt does not change) gets a system message that lists them and asks for calls written as
`{"name": ..., "arguments": {...}}`. A forced call (tool_choice "required" or a named function)
is constrained by a grammar for exactly that object, built from the functions' parameter
schemas. The model's answer is read back into OpenAI-style `tool_calls`.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...errors import InputError

AUTO, REQUIRED = "auto", "required"
# What an answer that is a tool call can start with: a call object, a list of them, Hermes-style
# tags, or a fenced block.
_CALL_STARTS = ("{", "[", "<tool_call>", "```")

Render = Callable[[list[dict[str, Any]], "list[dict[str, Any]] | None"], str]


class ToolsError(InputError):
    """The tools themselves are unusable (two share a name), whatever the tool choice."""


@dataclass(frozen=True)
class ToolPlan:
    """The tools offered to the model and how it must use them."""

    tools: tuple[dict[str, Any], ...]  # OpenAI tool objects: {"type": "function", "function": {...}}
    choice: str  # "auto", "required", or the name of the function that must be called
    parallel: bool = True  # whether one answer may hold several calls (OpenAI's parallel_tool_calls)

    @property
    def functions(self) -> list[dict[str, Any]]:
        return [t["function"] for t in self.tools]

    @property
    def names(self) -> list[str]:
        return [f["name"] for f in self.functions]

    @property
    def forced(self) -> bool:
        return self.choice != AUTO


def plan_tools(tools: list[dict[str, Any]] | None, tool_choice: str | dict[str, Any] | None,
               parallel: bool = True, check_schemas: bool = True) -> ToolPlan | None:
    """The plan for a request's `tools` and `tool_choice`; None when no tool may be called.

    With `check_schemas` off, a tool whose parameters no grammar can enforce is still offered (agents
    send dozens of tools with such schemas); only forcing a call to it fails.

    Raises:
        ToolsError: two tools share a name, or a tool's parameters are not a usable JSON schema.
        InputError: a choice that names no offered function, or needs tools that were not given.
    """
    if not tools:
        if tool_choice in (None, AUTO, "none"):
            return None
        raise InputError("tool_choice asks for a tool call but the request has no tools")
    names = [t["function"]["name"] for t in tools]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate:
        raise ToolsError(f"two tools are named {duplicate!r}")
    if check_schemas:  # whatever the choice: the same tools sent with "required" would be refused
        _check_parameters(tools)
    if tool_choice == "none":
        return None
    if isinstance(tool_choice, dict):
        name = tool_choice["function"]["name"]
        if name not in names:
            raise InputError(f"tool_choice names the function {name!r}, which is not among the tools "
                             f"({', '.join(names)})")
        return ToolPlan(tuple(tools), name, parallel)
    return ToolPlan(tuple(tools), REQUIRED if tool_choice == REQUIRED else AUTO, parallel)


def _check_parameters(tools: list[dict[str, Any]]) -> None:
    """Refuse a tool whose parameters no call could be checked against, even when no call is forced:
    the same request with tool_choice "required" would fail, and the model is shown the schema."""
    for tool in tools:
        function = tool["function"]
        try:
            _grammar_for(json.dumps(_parameters(function)), f"the parameters of tool {function['name']!r}")
        except InputError as exc:
            raise ToolsError(exc.message, hint=exc.hint) from None


# ---------------------------------------------------------------- prompting


def render_with_tools(render: Render, messages: list[dict[str, Any]], plan: ToolPlan | None,
                      template_text: str) -> str:
    """Render the conversation, with the tools shown to the model when `plan` offers any.

    Args:
        render: renders (messages, tools) with the model's chat template.
        messages: validated messages; assistant `tool_calls` and `tool` results included.
        plan: the tools, or None.
        template_text: the template's source, to tell whether it renders past tool calls itself.
    """
    messages = template_messages(messages, "tool_calls" in template_text)
    if plan is None:
        return render(messages, None)
    with_tools = render(messages, list(plan.tools))
    if with_tools != render(messages, None):
        return with_tools
    return render(_with_tool_prompt(messages, plan), None)


def template_messages(messages: list[dict[str, Any]], template_knows_calls: bool) -> list[dict[str, Any]]:
    """Messages as templates expect them: past calls as objects, or as text for a template without tools."""
    out = []
    for m in messages:
        m = {**m, "role": {"developer": "system", "function": "tool"}.get(m["role"], m["role"])}
        calls = [_call_object(c) for c in m.pop("tool_calls", None) or ()]
        if calls and template_knows_calls:
            m["tool_calls"] = [{"type": "function", "id": c["id"],
                                "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls]
        elif calls:
            text = "\n".join(json.dumps({"name": c["name"], "arguments": c["arguments"]}, ensure_ascii=False)
                             for c in calls)
            m["content"] = f"{m['content']}\n{text}" if m.get("content") else text
        out.append(m)
    return out


def _call_object(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function", call)
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            pass  # kept as text: the template shows what the client sent
    return {"name": function.get("name", ""), "arguments": arguments, "id": call.get("id")}


def tool_prompt(plan: ToolPlan) -> str:
    """The system text that describes the tools to a model whose template does not (tool_prompt.py)."""
    from .tool_prompt import describe_functions

    lines = [
        "You can call these functions, each given as name(parameters: types) with what it does; "
        "? marks an optional parameter:",
        describe_functions(plan.functions),
        ('To call a function, reply with only a JSON object of the form {"name": "<function name>", '
         '"arguments": {<argument values>}} and nothing else.'),
    ]
    if plan.choice == REQUIRED:
        lines.append("You must call one of these functions now.")
    elif plan.forced:
        lines.append(f"You must call the function {plan.choice!r} now.")
    else:
        lines.append("If no function is needed, answer normally.")
    return "\n".join(lines)


def _with_tool_prompt(messages: list[dict[str, Any]], plan: ToolPlan) -> list[dict[str, Any]]:
    text = tool_prompt(plan)
    if messages and messages[0]["role"] == "system":
        first = messages[0]
        return [{**first, "content": f"{first['content']}\n\n{text}" if first["content"] else text}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


# ---------------------------------------------------------------- forcing a call


def call_schema(plan: ToolPlan) -> dict[str, Any]:
    """JSON schema of the call(s) `plan` forces: {"name": <const>, "arguments": <the parameters>}."""
    functions = plan.functions if plan.choice == REQUIRED else [f for f in plan.functions if f["name"] == plan.choice]
    calls = [_call_schema(f) for f in functions]
    return calls[0] if len(calls) == 1 else {"anyOf": calls}


def _call_schema(function: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"const": function["name"]}, "arguments": _parameters(function)},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def _parameters(function: dict[str, Any]) -> dict[str, Any]:
    return function.get("parameters") or {"type": "object"}


def call_grammar(plan: ToolPlan) -> str:
    """GBNF that admits only a call `plan` allows.

    Raises:
        InputError: a parameter schema the converter cannot turn into a grammar.
    """
    return _grammar_for(json.dumps(call_schema(plan)), "the tools' parameter schemas")


@functools.lru_cache(maxsize=64)
def _grammar_for(schema: str, source: str) -> str:
    """GBNF for a JSON schema (JSON text); cached, as clients send the same tools with every request."""
    from .grammar import check_grammar, schema_to_grammar

    grammar = schema_to_grammar(schema, source)
    check_grammar(grammar, source)
    return grammar


# ---------------------------------------------------------------- reading calls back


def may_be_call(text: str) -> bool:
    """Whether generated text so far could still turn out to be a tool call (streaming holds it back)."""
    start = text.lstrip()
    return not start or any(start.startswith(s) or s.startswith(start) for s in _CALL_STARTS)


def parse_tool_calls(text: str, plan: ToolPlan) -> list[dict[str, Any]] | None:
    """The OpenAI `tool_calls` in a model's answer, or None when the answer is not (only) tool calls.

    Without parallel calls the answer holds the first: the client asked for at most one.
    """
    values = _json_values(_unwrap(text))
    if not values:
        return None
    calls = []
    for value in values:
        for item in value if isinstance(value, list) else [value]:
            call = _as_call(item, plan)
            if call is None:
                return None
            calls.append(call)
    return (calls if plan.parallel else calls[:1]) or None


def _unwrap(text: str) -> str:
    """Drop Hermes-style <tool_call> tags and Markdown fences around the JSON."""
    text = text.strip().replace("<tool_call>", " ").replace("</tool_call>", " ")
    if text.startswith("```"):
        text = text[3:]
        text = text.removeprefix("json")
        text = text.rsplit("```", 1)[0]
    return text.strip()


def _json_values(text: str) -> list[Any]:
    """Consecutive JSON values in `text`, or [] when anything else is in it."""
    decoder, values, pos = json.JSONDecoder(), [], 0
    while pos < len(text):
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos == len(text):
            break
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return []
        values.append(value)
    return values


def _as_call(item: Any, plan: ToolPlan) -> dict[str, Any] | None:
    if not isinstance(item, dict):
        return None
    item = item.get("function", item) if isinstance(item.get("function"), dict) else item
    name = item.get("name")
    arguments = item.get("arguments", item.get("parameters"))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if name not in plan.names or not isinstance(arguments, dict):
        return None
    return {"id": new_call_id(), "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"
