"""The tools a template ignores reach the model as compact signatures, not as JSON schemas."""

from __future__ import annotations

import json
from pathlib import Path

from pyllama_cli.core.constrain.tool_prompt import describe_functions, type_text
from pyllama_cli.core.constrain.tools import plan_tools, tool_prompt

# An opencode-like agent's tools: eleven functions with their JSON schemas and descriptions.
AGENT_TOOLS = json.loads((Path(__file__).parent / "fixtures" / "agent_tools.json").read_text())


def test_a_function_is_a_signature_its_description_and_its_parameters() -> None:
    weather = {"name": "get_weather", "description": "The weather in a city.", "parameters": {
        "type": "object", "required": ["city"], "properties": {
            "city": {"enum": ["Paris", "London"], "description": "Where."}, "days": {"type": "integer"}}}}
    assert describe_functions([weather]) == ('get_weather(city: "Paris" | "London", days?: integer)\n'
                                             "  The weather in a city.\n  city: Where.")


def test_schema_types_in_shorthand() -> None:
    assert type_text({"type": "array", "items": {"type": "string"}}) == "string[]"
    assert type_text({"type": "array", "items": {"enum": [1, 2]}}) == "(1 | 2)[]"
    assert type_text({"anyOf": [{"type": "string"}, {"type": "null"}]}) == "string | null"
    assert type_text({"type": ["number", "null"]}) == "number | null"
    assert type_text({"type": "object", "properties": {"a": {"const": "x"}, "b": {}}, "required": ["a"]}) == (
        '{a: "x", b?: any}')
    assert type_text({"type": "object", "additionalProperties": {"type": "number"}}) == "{[key: string]: number}"
    assert type_text({"$ref": "#/$defs/Point"}) == "Point"


def test_an_agents_tools_take_far_fewer_characters_than_their_json() -> None:
    # Before, each function was its JSON schema on a line: 8,144 characters for these eleven (4,920
    # tokens of the tiny test model); now 5,052 (2,648 tokens).
    text = tool_prompt(plan_tools(AGENT_TOOLS, "auto", True, False))
    as_json = sum(len(json.dumps(t["function"], ensure_ascii=False)) for t in AGENT_TOOLS)
    assert len(text) < 0.65 * as_json
    for tool in AGENT_TOOLS:  # every function, parameter and description still reaches the model
        function = tool["function"]
        assert function["description"].splitlines()[0] in text
        assert all(f"{name}: {spec['description']}" in text
                   for name, spec in function["parameters"]["properties"].items())
