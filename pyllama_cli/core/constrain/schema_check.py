"""Check a JSON schema: refuse one no value can match, or a keyword of the wrong type, naming the place.

Each check looks at one subschema (`json_schema.prepare_schema` walks them) and raises a SchemaError
with the JSON pointer of the faulty part.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from ...errors import InputError, UsageError
from .schema_converter import converter_merges_all_of

BOUND_KEYS = ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum")
# Schema counts the converter may expand into one grammar element each (minLength 10**8 makes 500 MB).
MAX_SCHEMA_COUNT = 10_000
_COUNT_PAIRS = (("minLength", "maxLength"), ("minItems", "maxItems"), ("minProperties", "maxProperties"))
DEFS = ("$defs", "definitions")
# Keywords that restrict values but that the converter ignores.
_UNENFORCED = frozenset({"multipleOf", "minProperties", "maxProperties", "uniqueItems", "contains", "minContains",
                         "maxContains", "dependentRequired", "dependentSchemas", "dependencies", "propertyNames",
                         "patternProperties", "unevaluatedProperties", "unevaluatedItems", "additionalItems", "not",
                         "if", "then", "else"})
_JSON_TYPES = ("string", "number", "integer", "boolean", "null", "object", "array")


class SchemaError(UsageError, InputError):
    """A schema no value can match, or one that misuses a keyword.

    A usage error on the command line; also an InputError, so the server answers it as a bad request.
    """


@dataclass(frozen=True)
class Where:
    source: str  # the flag or file the schema came from
    pointer: str  # JSON pointer of the subschema, "" for the whole schema

    def error(self, message: str, hint: str | None = None) -> SchemaError:
        place = f"{self.source} at {self.pointer}" if self.pointer else self.source
        return SchemaError(f"{place}: {message}", hint=hint)

    def at(self, *keys: str) -> Where:
        return Where(self.source, self.pointer + "".join(f"/{escape(key)}" for key in keys))


@dataclass(frozen=True)
class Bound:
    key: str
    value: int | float
    exclusive: bool

    def __str__(self) -> str:
        # Draft 4 marks "minimum"/"maximum" exclusive with a separate true; say so.
        draft4 = self.exclusive and not self.key.startswith("exclusive")
        return f'"{self.key}" {show(self.value)}' + (" (exclusive)" if draft4 else "")


# ---------------------------------------------------------------- checks


def check_lists(node: dict, where: Where) -> None:
    """Lists the converter joins into alternatives: an empty one becomes a rule with nothing in it."""
    if "enum" in node:
        if not isinstance(node["enum"], list):
            raise where.error('"enum" must be a list of values', hint='e.g. "enum": ["a", "b"]')
        if not node["enum"]:
            raise where.error('"enum" must list at least one value', hint='list the allowed values, e.g. "enum": ["a", "b"]')
    for key in ("anyOf", "oneOf", "allOf"):
        if key in node:
            if not isinstance(node[key], list):
                raise where.error(f'"{key}" must be a list of schemas', hint=f'e.g. "{key}": [{{"type": "string"}}]')
            if not node[key]:
                raise where.error(f'"{key}" must list at least one schema', hint=f'list the schemas, or leave "{key}" out')
    if node.get("type") == []:
        raise where.error('"type" must name at least one type', hint='e.g. "type": "string", or leave "type" out')


def check_counts(node: dict, where: Where) -> None:
    for pair in _COUNT_PAIRS:
        for key in pair:
            if key in node:
                node[key] = _count(node[key], key, where)
        low, high = (node.get(key) for key in pair)
        if low is not None and high is not None and low > high:
            raise where.error(f'"{pair[0]}" {low} is greater than "{pair[1]}" {high}',
                              hint=f'make "{pair[0]}" at most "{pair[1]}"')


def _count(value: object, key: str, where: Where) -> int:
    """A length or item count as a whole number (2.0 is allowed, and becomes 2 for the converter)."""
    if not _is_number(value) or value < 0 or value != math.floor(value):
        raise where.error(f'"{key}" must be a whole number of at least 0, not {show(value)}',
                          hint=f'e.g. "{key}": 1')
    if value > MAX_SCHEMA_COUNT:  # the converter spells some repeats out one by one (time and memory)
        raise where.error(f"{key} {int(value)} is more than the {MAX_SCHEMA_COUNT} a grammar can spell out",
                          hint=f"use a {key} of at most {MAX_SCHEMA_COUNT}, or leave it out")
    return int(value)


def check_bounds(node: dict, where: Where) -> tuple[Bound | None, Bound | None]:
    """The tightest lower and upper bound of a number, refusing a pair that leaves no number between them."""
    for key in BOUND_KEYS:
        value = node.get(key)
        if key in node and not (_is_number(value) or (key.startswith("exclusive") and isinstance(value, bool))):
            raise where.error(f'"{key}" must be a number, not {show(value)}', hint=f'e.g. "{key}": 0')
    low = _tightest(node, "minimum", "exclusiveMinimum", max)
    high = _tightest(node, "maximum", "exclusiveMaximum", min)
    if low is not None and high is not None:
        if low.value > high.value and not (low.exclusive or high.exclusive):
            raise where.error(f"{low} is greater than {high}", hint=f'make "{low.key}" at most "{high.key}"')
        if low.value > high.value or (low.value == high.value and (low.exclusive or high.exclusive)):
            kind = "integer" if node.get("type") == "integer" else "number"
            raise where.error(f"{low} and {high} leave no {kind} between them", hint="widen the range")
    return low, high


def _tightest(node: dict, inclusive_key: str, exclusive_key: str, pick) -> Bound | None:
    bounds = []
    exclusive = node.get(exclusive_key)
    if _is_number(node.get(inclusive_key)):
        # Draft 4 writes an exclusive bound as "minimum": 5 with "exclusiveMinimum": true.
        bounds.append(Bound(inclusive_key, node[inclusive_key], exclusive is True))
    if _is_number(exclusive):
        bounds.append(Bound(exclusive_key, exclusive, True))
    if not bounds:
        return None
    # Equal values: the exclusive bound is the tighter one.
    return pick(bounds, key=lambda b: (b.value, b.exclusive if pick is max else not b.exclusive))


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_keywords(node: dict, where: Where, root: object) -> None:
    """Keywords whose value the converter uses without looking: each must have the right type."""
    types = node.get("type")
    for name in types if isinstance(types, list) else [] if types is None else [types]:
        if name not in _JSON_TYPES:
            raise where.error(f"cannot turn this schema into a grammar: {show(name)} is not a JSON type",
                              hint='use "string", "number", "integer", "boolean", "null", "object" or "array"')
    for key, example in (("pattern", '"^[a-z]+$"'), ("format", '"date"')):
        if key in node and not isinstance(node[key], str):
            raise where.error(f'"{key}" must be a string, not {show(node[key])}', hint=f'e.g. "{key}": {example}')
    for key in ("properties", *DEFS):
        if key in node and not isinstance(node[key], dict):
            raise where.error(f'"{key}" must be an object of schemas, not {show(node[key])}',
                              hint=f'e.g. "{key}": {{"name": {{"type": "string"}}}}')
    required = node.get("required", [])
    if not isinstance(required, list) or not all(isinstance(name, str) for name in required):
        raise where.error('"required" must be a list of property names', hint='e.g. "required": ["name"]')
    if "$ref" in node:
        _check_ref(node["$ref"], where, root)


def refuse_unenforced(node: dict, where: Where) -> None:
    """Keywords the converter ignores: the output would not follow them, so they are refused, not dropped.

    Values that constrain nothing ("uniqueItems": false, "minProperties": 0, "multipleOf": 1 on an
    integer) pass.
    """
    for key in node:
        if key in _UNENFORCED and not _constrains_nothing(node, key):
            raise where.error(f'"{key}" is not supported: a grammar cannot enforce it',
                              hint=f'leave "{key}" out, and check that part of the output yourself')


def _constrains_nothing(node: dict, key: str) -> bool:
    value = node[key]
    return ((key == "uniqueItems" and value is False) or (key == "minProperties" and value == 0)
            or (key == "multipleOf" and value == 1 and node.get("type") == "integer"))


def _check_ref(ref: object, where: Where, root: object) -> None:
    if not isinstance(ref, str):
        raise where.error(f'"$ref" must be a string, not {show(ref)}', hint='e.g. "$ref": "#/$defs/item"')
    if not ref.startswith("#/"):
        raise where.error(f'cannot turn this schema into a grammar: "$ref" {show(ref)} is not a reference within '
                          'the schema', hint='copy what it refers to into "$defs" and use "$ref": "#/$defs/NAME"')
    target = _resolve(root, ref)
    if target is None:
        raise where.error(f'"$ref" {show(ref)} refers to nothing in the schema',
                          hint='references look like "#/$defs/NAME"')
    if target is False:
        raise where.error(f'"$ref" {show(ref)} refers to false, so no value can match',
                          hint="refer to a schema other than false")


def _resolve(root: object, ref: str) -> object:
    """The subschema a "#/..." reference names, read as the converter reads it (object keys, no escapes)."""
    target = root
    for key in ref[2:].split("/"):
        if not isinstance(target, dict) or key not in target:
            return None
        target = target[key]
    return target if isinstance(target, (dict, bool)) else None


def check_all_of(node: dict, where: Where, root: object) -> None:
    """Refuse types "allOf" cannot join; the converter would write an object for them (and drops the
    node's own type)."""
    if not isinstance(node.get("allOf"), list):
        return
    members = [_resolve(root, m["$ref"]) if isinstance(m, dict) and isinstance(m.get("$ref"), str) else m
               for m in node["allOf"]]
    typed = [m["type"] for m in [node, *members] if isinstance(m, dict) and _type_set(m.get("type"))]
    if not typed:
        return
    common = set.intersection(*(_type_set(t) for t in typed))
    if not common:
        raise where.error(f'no value has all the types "allOf" asks for ({", ".join(show(t) for t in typed)})',
                          hint='remove the schema whose "type" does not fit')
    if "object" not in common and converter_merges_all_of(node):
        raise where.error('cannot turn this schema into a grammar: "allOf" is supported for objects only',
                          hint="merge the schemas into one")


def _type_set(types: object) -> set[str]:
    """The types a "type" value allows (an integer is a number too); empty when it is missing or unknown."""
    names = types if isinstance(types, list) else [types]
    if not names or not all(isinstance(name, str) and name in _JSON_TYPES for name in names):
        return set()
    return set(names) | ({"integer"} if "number" in names else set())


def show(value: object) -> str:
    """A value as the schema writes it."""
    return json.dumps(value)


def escape(key: str) -> str:
    """A key as a JSON pointer writes it."""
    return key.replace("~", "~0").replace("/", "~1")
