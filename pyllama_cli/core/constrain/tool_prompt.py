"""The system text that shows tools to a model whose chat template ignores them, written compactly.

Each function is one signature line, `name(city: string, unit?: "c" | "f")`, its description, and
one line per described parameter: the types of its JSON schema in a TypeScript-like shorthand
instead of the schema itself. Agents send ten or more tools with long schemas; written as JSON they
made a prompt three times llama-server's (25,844 tokens against 7,923 for the same opencode
request). A forced call is still held to the full schema by the grammar (tools.call_grammar).
"""

from __future__ import annotations

import json
from typing import Any

_PRIMITIVES = frozenset({"string", "number", "integer", "boolean", "null", "object", "array"})


def describe_functions(functions: list[dict[str, Any]]) -> str:
    """Every function as its signature, description and parameters' descriptions."""
    return "\n".join(_function(f) for f in functions)


def _function(function: dict[str, Any]) -> str:
    schema = function.get("parameters") or {}
    properties = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    params = ", ".join(f"{name}{'' if name in required else '?'}: {type_text(sub)}" for name, sub in properties.items())
    lines = [f"{function['name']}({params})"]
    if (function.get("description") or "").strip():
        lines.append(_indent(function["description"].strip()))
    for name, sub in properties.items():
        if isinstance(sub, dict) and str(sub.get("description") or "").strip():
            lines.append(_indent(f"{name}: {sub['description'].strip()}"))
    return "\n".join(lines)


def _indent(text: str) -> str:
    return "\n".join(f"  {line}" if line else "" for line in text.splitlines())


def type_text(schema: Any) -> str:
    """A JSON schema's type in shorthand: `string`, `"a" | "b"`, `number[]`, `{path: string, line?: integer}`."""
    if not isinstance(schema, dict):
        return "any"
    if "const" in schema:
        return json.dumps(schema["const"], ensure_ascii=False)
    if isinstance(schema.get("enum"), list):
        return " | ".join(json.dumps(v, ensure_ascii=False) for v in schema["enum"]) or "never"
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            return " | ".join(type_text(s) for s in schema[key]) or "any"
    if isinstance(schema.get("allOf"), list) and len(schema["allOf"]) == 1:
        return type_text(schema["allOf"][0])
    if isinstance(schema.get("$ref"), str):
        return schema["$ref"].rsplit("/", 1)[-1]
    kind = schema.get("type")
    if isinstance(kind, list):
        return " | ".join(type_text({**schema, "type": k}) for k in kind)
    if kind == "array" or "items" in schema:
        item = type_text(schema.get("items", {})) if "items" in schema else "any"
        return f"({item})[]" if " | " in item else f"{item}[]"
    if kind == "object" or "properties" in schema:
        return _object(schema)
    return kind if kind in _PRIMITIVES else "any"


def _object(schema: dict[str, Any]) -> str:
    properties = schema.get("properties")
    if not isinstance(properties, dict) or not properties:
        extra = schema.get("additionalProperties")
        return f"{{[key: string]: {type_text(extra)}}}" if isinstance(extra, dict) else "object"
    required = set(schema.get("required") or ())
    fields = ", ".join(f"{name}{'' if name in required else '?'}: {type_text(sub)}" for name, sub in properties.items())
    return f"{{{fields}}}"
