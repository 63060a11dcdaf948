"""Check a JSON schema, and prepare it for llama-cpp-python's schema-to-GBNF converter.

The converter turns some impossible schemas (an empty "enum", minimum above maximum) into broken or
silently wrong grammars, and it ignores the bounds of numbers. `prepare_schema` refuses the impossible
ones with a message that names the place in the schema, and swaps every bounded integer or number for a
marker constant; `splice_number_ranges` then puts a GBNF expression for exactly the allowed numbers
(number_ranges.py) where each marker is.
"""

from __future__ import annotations

import json
import math
import uuid
from dataclasses import dataclass
from decimal import Decimal

from ..errors import InputError, UsageError
from .number_ranges import FRACTION_DIGITS, Limit, integer_range_gbnf, number_range_gbnf

# Bounds longer than this are refused: the range grammar nests one group per digit.
MAX_BOUND_DIGITS = 100
_BOUND_KEYS = ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum")
_COUNT_PAIRS = (("minLength", "maxLength"), ("minItems", "maxItems"), ("minProperties", "maxProperties"))
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_VALUES = ("items", "additionalProperties", "additionalItems", "not", "if", "then", "else", "contains",
                  "propertyNames", "unevaluatedItems", "unevaluatedProperties")
# Keys the converter looks at before it treats a schema as a plain type.
_CONVERTER_FIRST = ("$ref", "oneOf", "anyOf", "const", "enum")
_NUMERIC = ("integer", "number")


class SchemaError(UsageError, InputError):
    """A schema no value can match, or one that misuses a keyword.

    A usage error on the command line; also an InputError, so the server answers it as a bad request.
    """


@dataclass(frozen=True)
class _Where:
    source: str  # the flag or file the schema came from
    pointer: str  # JSON pointer of the subschema, "" for the whole schema

    def error(self, message: str, hint: str | None = None) -> SchemaError:
        place = f"{self.source} at {self.pointer}" if self.pointer else self.source
        return SchemaError(f"{place}: {message}", hint=hint)


@dataclass(frozen=True)
class _Bound:
    key: str
    value: int | float
    exclusive: bool

    def __str__(self) -> str:
        # Draft 4 marks "minimum"/"maximum" exclusive with a separate true; say so.
        draft4 = self.exclusive and not self.key.startswith("exclusive")
        return f'"{self.key}" {_show(self.value)}' + (" (exclusive)" if draft4 else "")


def prepare_schema(schema: object, source: str) -> dict[str, str]:
    """Check `schema` (parsed JSON, changed in place) and swap each bounded integer or number for a marker
    constant.

    Returns each marker with the GBNF expression that replaces it (see `splice_number_ranges`).

    Raises:
        SchemaError: an empty enum/anyOf/oneOf/allOf/type list, a bad count or bound, or bounds that conflict.
    """
    markers: dict[str, str] = {}
    by_expression: dict[str, str] = {}
    todo: list[tuple[object, str]] = [(schema, "")]
    while todo:  # iterative: a hostile schema may nest deeper than Python's recursion limit
        node, pointer = todo.pop()
        if not isinstance(node, dict):
            continue
        where = _Where(source, pointer)
        _drop_any_items(node)
        _check_lists(node, where)
        _check_counts(node, where)
        low, high = _check_bounds(node, where)
        _split_numeric_type_list(node)
        kind = _converter_sees_number(node)
        if kind is not None and (low is not None or high is not None):
            expression = _range_gbnf(kind, low, high, where)
            if expression not in by_expression:
                by_expression[expression] = f"pyllama-range-{uuid.uuid4().hex}"
                markers[by_expression[expression]] = expression
            node.clear()
            node["const"] = by_expression[expression]
            continue
        todo.extend(_subschemas(node, pointer))
    return markers


def splice_number_ranges(grammar: str, markers: dict[str, str]) -> str:
    """Put each marker's range expression (and the space after a JSON value) where the converter wrote it.

    A marker may be missing: the converter skips subschemas it does not use (an unused "$defs" entry, "not").
    """
    for marker, expression in markers.items():
        literal = f'"\\"{marker}\\""'  # how the converter writes the constant: a quoted JSON string
        grammar = grammar.replace(literal, f"({expression}) space")
    return grammar


# ---------------------------------------------------------------- walking and checking


def _drop_any_items(node: dict) -> None:
    """`"items": {}` and `"items": true` allow any item, as no "items" does; the converter fails on both
    (a KeyError on 'prefixItems', an AttributeError on the bool), so say it the way it understands."""
    items = node.get("items")
    if items is True or (isinstance(items, dict) and not items):
        del node["items"]


def _subschemas(node: dict, pointer: str) -> list[tuple[object, str]]:
    found: list[tuple[object, str]] = []
    for key, value in node.items():
        path = f"{pointer}/{_escape(key)}"
        if key in _SCHEMA_VALUES and isinstance(value, dict):
            found.append((value, path))
        elif key in _SCHEMA_LISTS + ("items",) and isinstance(value, list):
            found.extend((item, f"{path}/{i}") for i, item in enumerate(value))
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            found.extend((sub, f"{path}/{_escape(name)}") for name, sub in value.items())
    return found


def _escape(key: str) -> str:
    """A key as a JSON pointer writes it."""
    return key.replace("~", "~0").replace("/", "~1")


def _check_lists(node: dict, where: _Where) -> None:
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


def _check_counts(node: dict, where: _Where) -> None:
    for pair in _COUNT_PAIRS:
        for key in pair:
            if key in node:
                node[key] = _count(node[key], key, where)
        low, high = (node.get(key) for key in pair)
        if low is not None and high is not None and low > high:
            raise where.error(f'"{pair[0]}" {low} is greater than "{pair[1]}" {high}',
                              hint=f'make "{pair[0]}" at most "{pair[1]}"')


def _count(value: object, key: str, where: _Where) -> int:
    """A length or item count as a whole number (2.0 is allowed, and becomes 2 for the converter)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or value != math.floor(value):
        raise where.error(f'"{key}" must be a whole number of at least 0, not {_show(value)}',
                          hint=f'e.g. "{key}": 1')
    return int(value)


def _check_bounds(node: dict, where: _Where) -> tuple[_Bound | None, _Bound | None]:
    """The tightest lower and upper bound of a number, refusing a pair that leaves no number between them."""
    for key in _BOUND_KEYS:
        value = node.get(key)
        if key in node and not (_is_number(value) or (key.startswith("exclusive") and isinstance(value, bool))):
            raise where.error(f'"{key}" must be a number, not {_show(value)}', hint=f'e.g. "{key}": 0')
    low = _tightest(node, "minimum", "exclusiveMinimum", max)
    high = _tightest(node, "maximum", "exclusiveMaximum", min)
    if low is not None and high is not None:
        if low.value > high.value and not (low.exclusive or high.exclusive):
            raise where.error(f"{low} is greater than {high}", hint=f'make "{low.key}" at most "{high.key}"')
        if low.value > high.value or (low.value == high.value and (low.exclusive or high.exclusive)):
            kind = "integer" if node.get("type") == "integer" else "number"
            raise where.error(f"{low} and {high} leave no {kind} between them", hint="widen the range")
    return low, high


def _tightest(node: dict, inclusive_key: str, exclusive_key: str, pick) -> _Bound | None:
    bounds = []
    exclusive = node.get(exclusive_key)
    if _is_number(node.get(inclusive_key)):
        # Draft 4 writes an exclusive bound as "minimum": 5 with "exclusiveMinimum": true.
        bounds.append(_Bound(inclusive_key, node[inclusive_key], exclusive is True))
    if _is_number(exclusive):
        bounds.append(_Bound(exclusive_key, exclusive, True))
    if not bounds:
        return None
    # Equal values: the exclusive bound is the tighter one.
    return pick(bounds, key=lambda b: (b.value, b.exclusive if pick is max else not b.exclusive))


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _show(value: object) -> str:
    """A value as the schema writes it."""
    return json.dumps(value)


# ---------------------------------------------------------------- ranges


def _split_numeric_type_list(node: dict) -> None:
    """{"type": ["integer", "null"], "minimum": 1}: the converter would drop the bounds; give it an anyOf that keeps them."""
    types = node.get("type")
    if (not isinstance(types, list) or not set(types) & set(_NUMERIC)
            or any(key in node for key in _CONVERTER_FIRST)):
        return
    bounds = {key: node[key] for key in _BOUND_KEYS if key in node}
    if bounds:
        node.clear()  # the converter builds a type list from the bare type names, so nothing else is lost
        node["anyOf"] = [{"type": t, **(bounds if t in _NUMERIC else {})} for t in types]


def _converter_sees_number(node: dict) -> str | None:
    """"integer" or "number" when the converter would write the node as that plain type, else None."""
    kind = node.get("type")
    return kind if kind in _NUMERIC and not any(key in node for key in _CONVERTER_FIRST) else None


def _range_gbnf(kind: str, low: _Bound | None, high: _Bound | None, where: _Where) -> str:
    if kind == "integer":
        key = (_integer_low(low, where), _integer_high(high, where))
        _check_integer_range(key, low, high, where)
        return integer_range_gbnf(*key)
    expression = number_range_gbnf(_limit(low, where), _limit(high, where))
    if expression is None:
        raise where.error(f"{low} and {high} leave no number with at most {FRACTION_DIGITS} digits after the point "
                          "between them", hint="widen the range")
    return expression


def _limit(bound: _Bound | None, where: _Where) -> Limit | None:
    if bound is None:
        return None
    _short_enough(math.floor(bound.value), bound, where)
    # repr gives the shortest text that reads back as the same float: 0.1 is 0.1, not 0.1000000000000000055...
    return Limit(Decimal(repr(bound.value)), bound.exclusive)


def _integer_low(bound: _Bound | None, where: _Where) -> int | None:
    if bound is None:
        return None
    return _short_enough(math.floor(bound.value) + 1 if bound.exclusive else math.ceil(bound.value), bound, where)


def _integer_high(bound: _Bound | None, where: _Where) -> int | None:
    if bound is None:
        return None
    return _short_enough(math.ceil(bound.value) - 1 if bound.exclusive else math.floor(bound.value), bound, where)


def _short_enough(value: int, bound: _Bound, where: _Where) -> int:
    if len(str(abs(value))) > MAX_BOUND_DIGITS:
        raise where.error(f'"{bound.key}" {_show(bound.value)} has more than the {MAX_BOUND_DIGITS} digits a '
                          "grammar can spell out", hint=f'leave "{bound.key}" out for no limit')
    return value


def _check_integer_range(key: tuple[int | None, int | None], low: _Bound | None, high: _Bound | None,
                         where: _Where) -> None:
    first, last = key
    if first is not None and last is not None and first > last:
        raise where.error(f"{low} and {high} leave no integer between them", hint="widen the range")
