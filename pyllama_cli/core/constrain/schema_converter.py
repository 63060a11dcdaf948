"""What llama-cpp-python's schema-to-GBNF converter makes of a schema node: which branch writes it."""

from __future__ import annotations

import re

# Keys the converter looks at before it treats a schema as a plain type.
CONVERTER_FIRST = ("$ref", "oneOf", "anyOf", "const", "enum")
NUMERIC = ("integer", "number")
# String formats the converter writes its own rule for, ignoring the lengths.
FORMATS = re.compile(r"uuid[1-5]?|date|time|date-time")


def _plain(node: dict) -> bool:
    """No keyword the converter acts on before it looks at "type", and a single type (or none)."""
    return not any(key in node for key in CONVERTER_FIRST) and not isinstance(node.get("type"), list)


def has_properties(node: dict) -> bool:
    """What sends a node down the converter's object branch (before "allOf" and "items")."""
    return "properties" in node or node.get("additionalProperties", True) is not True


def converter_sees_object(node: dict) -> bool:
    """Whether the converter writes this node from its "properties" (or would, once it has some)."""
    kind = node.get("type")
    return _plain(node) and (kind == "object" and "allOf" not in node or kind in (None, "object")
                             and has_properties(node))


def converter_merges_all_of(node: dict) -> bool:
    """Whether the converter writes this node as one object with the properties of all "allOf" schemas."""
    return _plain(node) and node.get("type") in (None, "object") and not has_properties(node) and "allOf" in node


def converter_sees_pattern(node: dict) -> bool:
    kind = node.get("type")
    shaped = has_properties(node) or any(key in node for key in ("allOf", "items", "prefixItems"))
    return _plain(node) and (kind == "string" or (kind is None and not shaped))


def converter_sees_counted_string(node: dict) -> bool:
    """A string with a length that the converter would spell out (one nested group per character)."""
    counted = "minLength" in node or "maxLength" in node
    return (_plain(node) and node.get("type") == "string" and counted and "pattern" not in node
            and not FORMATS.fullmatch(node.get("format", "")))


def converter_sees_counted_array(node: dict) -> bool:
    """An array of one item schema with an item count (the converter nests one group per item)."""
    counted = "minItems" in node or "maxItems" in node
    one_schema = isinstance(node.get("items"), dict) or ("items" not in node and "prefixItems" not in node)
    return _plain(node) and node.get("type") == "array" and counted and one_schema


def converter_sees_number(node: dict) -> str | None:
    """"integer" or "number" when the converter would write the node as that plain type, else None."""
    kind = node.get("type")
    return kind if kind in NUMERIC and not any(key in node for key in CONVERTER_FIRST) else None
