"""Prepare a JSON schema for llama-cpp-python's schema-to-GBNF converter.

The converter turns some impossible schemas (an empty "enum", minimum above maximum, types "allOf"
cannot join) into broken or silently wrong grammars, fails with bare Python errors on others (`true`, a
root "$ref" into "$defs"), ignores the bounds of numbers, and nests lengths and item counts deeper than
llama.cpp takes. `prepare_schema` refuses the impossible ones with a message that names the place in
the schema, rewrites what the converter misreads, and swaps every bounded number, counted string and
counted array for a marker constant; `schema_splice.splice_markers` then puts GBNF for exactly the
allowed values (number_ranges.py) where the converter wrote each marker.

The checks themselves are in `schema_check`; what the converter makes of a node is in `schema_converter`.
"""

from __future__ import annotations

import copy
import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal

from .number_ranges import FRACTION_DIGITS, Limit, integer_range_gbnf, number_range_gbnf, repeat_gbnf
from .schema_check import (BOUND_KEYS, DEFS, Bound, Where, check_all_of, check_bounds, check_counts, check_keywords,
                           check_lists, escape, refuse_unenforced, show)
from .schema_converter import (CONVERTER_FIRST, FORMATS, NUMERIC, converter_sees_counted_array,
                               converter_sees_counted_string, converter_sees_number, converter_sees_object,
                               converter_sees_pattern, has_properties)
from .schema_splice import ItemCount

# Bounds longer than this are refused: the range grammar nests one group per digit.
MAX_BOUND_DIGITS = 100
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_VALUES = ("items", "additionalProperties", "additionalItems", "not", "if", "then", "else", "contains",
                  "propertyNames", "unevaluatedItems", "unevaluatedProperties")
# What `true` allows: the converter reads {} as "any object", so name every type.
_ANY_VALUE = {"type": ["object", "array", "string", "number", "boolean", "null"]}
# Keywords that say nothing about the value.
_ANNOTATIONS = {"title", "description", "$schema", "$id", "$comment", "examples", "default", "deprecated",
                "readOnly", "writeOnly", *DEFS}
# Keywords the converter acts on in a schema without a "type".
_USED_WITHOUT_TYPE = ("$ref", "oneOf", "anyOf", "const", "enum", "properties", "allOf", "items", "prefixItems",
                      "pattern")


@dataclass
class PreparedSchema:
    """A schema ready for the converter, and the GBNF to put in for the markers it holds."""

    schema: object  # what to hand the converter (the root may be new: `true` becomes "any value")
    markers: dict[str, str | ItemCount]  # each marker with the rule body that replaces it, see `schema_splice.splice_markers`


def prepare_schema(schema: object, source: str,
                   check_pattern: Callable[[str], str | None] | None = None) -> PreparedSchema:
    """Check `schema` (parsed JSON, changed in place), rewrite what the converter misreads, and swap each
    bounded number, counted string and counted array for a marker constant.

    Args:
        check_pattern: says why a "pattern" would not work as a grammar, or None when it would.

    Raises:
        SchemaError: a schema no value can match (an empty enum, conflicting bounds or types, false), a
            keyword of the wrong type, or one the converter cannot use (an outside "$ref", a bad "pattern").
    """
    if schema is False:
        raise Where(source, "").error("the schema is false, so no value can match", hint="use true to allow any value")
    root = copy.deepcopy(_ANY_VALUE) if schema is True else schema
    preparer = _Preparer(root, check_pattern or (lambda _pattern: None))
    todo: list[tuple[object, str]] = [(root, "")]
    while todo:  # iterative: a hostile schema may nest deeper than Python's recursion limit
        node, pointer = todo.pop()
        if isinstance(node, dict):
            todo.extend(preparer.visit(node, Where(source, pointer)))
    return PreparedSchema(root, preparer.markers)


class _Preparer:
    def __init__(self, root: object, check_pattern: Callable[[str], str | None]):
        self.root = root
        self.check_pattern = check_pattern
        self.markers: dict[str, str | ItemCount] = {}
        self.by_body: dict[str, str] = {}

    def visit(self, node: dict, where: Where) -> list[tuple[object, str]]:
        """Check and rewrite one subschema; returns the subschemas to visit next."""
        _split_ref_from_defs(node)
        check_keywords(node, where, self.root)
        refuse_unenforced(node, where)
        check_lists(node, where)
        check_counts(node, where)
        _replace_booleans(node, where)
        _drop_any_items(node)
        _check_required(node, where)
        _give_a_type(node, where)
        check_all_of(node, where, self.root)
        self.check_pattern_of(node, where)
        low, high = check_bounds(node, where)
        _split_numeric_type_list(node)
        kind = converter_sees_number(node)
        if kind is not None and (low is not None or high is not None):
            self.swap(node, f"({_range_gbnf(kind, low, high, where)}) space")
        elif converter_sees_counted_string(node):
            body = ['"\\""', repeat_gbnf("char", node.get("minLength", 0), node.get("maxLength")), '"\\""', "space"]
            self.swap(node, " ".join(part for part in body if part))
        elif converter_sees_counted_array(node):
            return self.swap_array(node, where)
        return _subschemas(node, where.pointer)

    def check_pattern_of(self, node: dict, where: Where) -> None:
        if "pattern" in node and converter_sees_pattern(node):
            problem = self.check_pattern(node["pattern"])
            if problem:
                raise where.error(f'cannot turn "pattern" {show(node["pattern"])} into a grammar: {problem}',
                                  hint="change the pattern, or leave it out")

    def swap(self, node: dict, body: str | ItemCount) -> str:
        """Make `node` a marker constant for `body`, keeping its "$defs" (references may point into them)."""
        marker = self.by_body.get(body) if isinstance(body, str) else None
        if marker is None:
            marker = f"pyllama-marker-{uuid.uuid4().hex}"
            self.markers[marker] = body
            if isinstance(body, str):
                self.by_body[body] = marker
        kept = {key: node[key] for key in DEFS if key in node}
        node.clear()
        node.update(const=marker, **kept)
        return marker

    def swap_array(self, node: dict, where: Where) -> list[tuple[object, str]]:
        """A counted array becomes a tuple of its marker and its item schema, so the items still get a rule."""
        items = node.get("items", copy.deepcopy(_ANY_VALUE))
        marker = self.swap(node, ItemCount(node.get("minItems", 0), node.get("maxItems")))
        del node["const"]
        node.update(type="array", prefixItems=[{"const": marker}, items])
        return _subschemas({key: node[key] for key in DEFS if key in node}, where.pointer) + [
            (items, where.at("items").pointer)]


# ---------------------------------------------------------------- walking


def _drop_any_items(node: dict) -> None:
    """`"items": {}`, `true` and `[]` (a tuple of no items, then anything) allow any item, as no "items"
    does; the converter fails on them (a KeyError on 'prefixItems', an AttributeError on the bool), so say
    it the way it understands."""
    items = node.get("items")
    if items is True or (isinstance(items, (dict, list)) and not items and "prefixItems" not in node):
        del node["items"]


def _subschemas(node: dict, pointer: str) -> list[tuple[object, str]]:
    found: list[tuple[object, str]] = []
    for key, value in node.items():
        path = f"{pointer}/{escape(key)}"
        if key in _SCHEMA_VALUES and isinstance(value, dict):
            found.append((value, path))
        elif key in _SCHEMA_LISTS + ("items",) and isinstance(value, list):
            found.extend((item, f"{path}/{i}") for i, item in enumerate(value))
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            found.extend((sub, f"{path}/{escape(name)}") for name, sub in value.items())
    return found


# ---------------------------------------------------------------- keywords the converter misreads


def _split_ref_from_defs(node: dict) -> None:
    """The converter resolves the references inside "$defs" only when their node has no "$ref" of its own
    (a root {"$ref": ..., "$defs": ...} failed with a bare KeyError); an "anyOf" of that one reference
    means the same to it."""
    if "$ref" in node and any(key in node for key in DEFS):
        node.pop("oneOf", None)  # ignored next to "$ref"; it would win over the "anyOf"
        node["anyOf"] = [{"$ref": node.pop("$ref")}]


def _replace_booleans(node: dict, where: Where) -> None:
    """`true` (any value) and `false` (none) as subschemas: the converter calls .get() on them."""
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        if isinstance(node.get(key), list):
            node[key] = _boolean_list(node[key], key, where)
    if "allOf" in node and not node["allOf"]:
        del node["allOf"]  # it held only true
    for key in ("properties", *DEFS):
        if isinstance(node.get(key), dict):
            for name, sub in node[key].items():
                if sub is True:
                    node[key][name] = copy.deepcopy(_ANY_VALUE)
    _drop_false_properties(node, where)
    if node.get("items") is False:
        if node.get("minItems", 0) > 0:
            raise where.error(f'"items" is false, so an array has no items, but "minItems" is {node["minItems"]}',
                              hint='remove "minItems", or allow items')
        del node["items"]
        node["maxItems"] = 0


def _boolean_list(schemas: list, key: str, where: Where) -> list:
    if key in ("anyOf", "oneOf"):  # false is an alternative nothing matches
        kept = [copy.deepcopy(_ANY_VALUE) if s is True else s for s in schemas if s is not False]
        if schemas and not kept:
            raise where.error(f'every schema in "{key}" is false, so no value can match',
                              hint=f'list a schema other than false in "{key}"')
        return kept
    for i, sub in enumerate(schemas):
        if sub is False:
            raise where.at(key, str(i)).error(f'this "{key}" schema is false, so no value can match',
                                              hint=f'remove false from "{key}"')
    return [s for s in schemas if s is not True] if key == "allOf" else [
        copy.deepcopy(_ANY_VALUE) if s is True else s for s in schemas]


def _drop_false_properties(node: dict, where: Where) -> None:
    properties = node.get("properties")
    if not isinstance(properties, dict):
        return
    for name in [name for name, sub in properties.items() if sub is False]:
        if name in node.get("required", []):
            raise where.at("properties", name).error(f'property "{name}" is required but false, so no value can '
                                                     'match', hint=f'remove "{name}" from "required"')
        del properties[name]  # false: the property must be absent, and the converter only writes listed ones


def _check_required(node: dict, where: Where) -> None:
    """The converter writes only the properties it finds in "properties", and drops other required ones."""
    missing = [name for name in node.get("required", []) if name not in node.get("properties", {})]
    if not missing or not converter_sees_object(node):
        return
    extra = node.get("additionalProperties")
    if extra is False:
        raise where.error(f'required property "{missing[0]}" is not in "properties", and "additionalProperties" is '
                          "false, so no object can match", hint=f'add "{missing[0]}" to "properties"')
    properties = node.setdefault("properties", {})
    for name in missing:
        properties[name] = copy.deepcopy(extra if isinstance(extra, dict) else _ANY_VALUE)


def _give_a_type(node: dict, where: Where) -> None:
    """The converter fails on a schema without a "type" or a keyword it acts on; it reads {} as any object,
    so annotations alone ("title", "$defs") are read the same way."""
    if "type" in node or any(key in node for key in _USED_WITHOUT_TYPE) or has_properties(node) or \
            FORMATS.fullmatch(node.get("format", "")):
        return
    unused = [key for key in node if key not in _ANNOTATIONS]
    if unused:
        raise where.error('cannot turn this schema into a grammar: it has no "type", and the converter uses none '
                          f"of its keywords ({', '.join(show(key) for key in unused)})", hint='add a "type"')
    node["type"] = "object"


# ---------------------------------------------------------------- ranges


def _split_numeric_type_list(node: dict) -> None:
    """{"type": ["integer", "null"], "minimum": 1}: the converter would drop the bounds; give it an anyOf that keeps them."""
    types = node.get("type")
    if (not isinstance(types, list) or not set(types) & set(NUMERIC)
            or any(key in node for key in CONVERTER_FIRST)):
        return
    bounds = {key: node[key] for key in BOUND_KEYS if key in node}
    if bounds:
        node.clear()  # the converter builds a type list from the bare type names, so nothing else is lost
        node["anyOf"] = [{"type": t, **(bounds if t in NUMERIC else {})} for t in types]


def _range_gbnf(kind: str, low: Bound | None, high: Bound | None, where: Where) -> str:
    if kind == "integer":
        key = (_integer_low(low, where), _integer_high(high, where))
        _check_integer_range(key, low, high, where)
        return integer_range_gbnf(*key)
    expression = number_range_gbnf(_limit(low, where), _limit(high, where))
    if expression is None:
        raise where.error(f"{low} and {high} leave no number with at most {FRACTION_DIGITS} digits after the point "
                          "between them", hint="widen the range")
    return expression


def _limit(bound: Bound | None, where: Where) -> Limit | None:
    if bound is None:
        return None
    _short_enough(math.floor(bound.value), bound, where)
    # repr gives the shortest text that reads back as the same float: 0.1 is 0.1, not 0.1000000000000000055...
    return Limit(Decimal(repr(bound.value)), bound.exclusive)


def _integer_low(bound: Bound | None, where: Where) -> int | None:
    if bound is None:
        return None
    return _short_enough(math.floor(bound.value) + 1 if bound.exclusive else math.ceil(bound.value), bound, where)


def _integer_high(bound: Bound | None, where: Where) -> int | None:
    if bound is None:
        return None
    return _short_enough(math.ceil(bound.value) - 1 if bound.exclusive else math.floor(bound.value), bound, where)


def _short_enough(value: int, bound: Bound, where: Where) -> int:
    if len(str(abs(value))) > MAX_BOUND_DIGITS:
        raise where.error(f'"{bound.key}" {show(bound.value)} has more than the {MAX_BOUND_DIGITS} digits a '
                          "grammar can spell out", hint=f'leave "{bound.key}" out for no limit')
    return value


def _check_integer_range(key: tuple[int | None, int | None], low: Bound | None, high: Bound | None,
                         where: Where) -> None:
    first, last = key
    if first is not None and last is not None and first > last:
        raise where.error(f"{low} and {high} leave no integer between them", hint="widen the range")
