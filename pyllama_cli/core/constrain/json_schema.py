"""Check a JSON schema, and prepare it for llama-cpp-python's schema-to-GBNF converter.

The converter turns some impossible schemas (an empty "enum", minimum above maximum, types "allOf"
cannot join) into broken or silently wrong grammars, fails with bare Python errors on others (`true`, a
root "$ref" into "$defs"), ignores the bounds of numbers, and nests lengths and item counts deeper than
llama.cpp takes. `prepare_schema` refuses the impossible ones with a message that names the place in
the schema, rewrites what the converter misreads, and swaps every bounded number, counted string and
counted array for a marker constant; `schema_splice.splice_markers` then puts GBNF for exactly the
allowed values (number_ranges.py) where the converter wrote each marker.
"""

from __future__ import annotations

import copy
import json
import math
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal

from ...errors import InputError, UsageError
from .number_ranges import FRACTION_DIGITS, Limit, integer_range_gbnf, number_range_gbnf, repeat_gbnf
from .schema_splice import ItemCount

# Bounds longer than this are refused: the range grammar nests one group per digit.
MAX_BOUND_DIGITS = 100
_BOUND_KEYS = ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum")
# Schema counts the converter may expand into one grammar element each (minLength 10**8 makes 500 MB).
MAX_SCHEMA_COUNT = 10_000
_COUNT_PAIRS = (("minLength", "maxLength"), ("minItems", "maxItems"), ("minProperties", "maxProperties"))
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_VALUES = ("items", "additionalProperties", "additionalItems", "not", "if", "then", "else", "contains",
                  "propertyNames", "unevaluatedItems", "unevaluatedProperties")
_DEFS = ("$defs", "definitions")
# Keys the converter looks at before it treats a schema as a plain type.
_CONVERTER_FIRST = ("$ref", "oneOf", "anyOf", "const", "enum")
_NUMERIC = ("integer", "number")
# Keywords that restrict values but that the converter ignores.
_UNENFORCED = frozenset({"multipleOf", "minProperties", "maxProperties", "uniqueItems", "contains", "minContains",
                         "maxContains", "dependentRequired", "dependentSchemas", "dependencies", "propertyNames",
                         "patternProperties", "unevaluatedProperties", "unevaluatedItems", "additionalItems", "not",
                         "if", "then", "else"})
_JSON_TYPES = ("string", "number", "integer", "boolean", "null", "object", "array")
# What `true` allows: the converter reads {} as "any object", so name every type.
_ANY_VALUE = {"type": ["object", "array", "string", "number", "boolean", "null"]}
# String formats the converter writes its own rule for, ignoring the lengths.
_FORMATS = re.compile(r"uuid[1-5]?|date|time|date-time")
# Keywords that say nothing about the value.
_ANNOTATIONS = {"title", "description", "$schema", "$id", "$comment", "examples", "default", "deprecated",
                "readOnly", "writeOnly", *_DEFS}
# Keywords the converter acts on in a schema without a "type".
_USED_WITHOUT_TYPE = ("$ref", "oneOf", "anyOf", "const", "enum", "properties", "allOf", "items", "prefixItems",
                      "pattern")


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

    def at(self, *keys: str) -> _Where:
        return _Where(self.source, self.pointer + "".join(f"/{_escape(key)}" for key in keys))


@dataclass(frozen=True)
class _Bound:
    key: str
    value: int | float
    exclusive: bool

    def __str__(self) -> str:
        # Draft 4 marks "minimum"/"maximum" exclusive with a separate true; say so.
        draft4 = self.exclusive and not self.key.startswith("exclusive")
        return f'"{self.key}" {_show(self.value)}' + (" (exclusive)" if draft4 else "")


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
        raise _Where(source, "").error("the schema is false, so no value can match", hint="use true to allow any value")
    root = copy.deepcopy(_ANY_VALUE) if schema is True else schema
    preparer = _Preparer(root, check_pattern or (lambda _pattern: None))
    todo: list[tuple[object, str]] = [(root, "")]
    while todo:  # iterative: a hostile schema may nest deeper than Python's recursion limit
        node, pointer = todo.pop()
        if isinstance(node, dict):
            todo.extend(preparer.visit(node, _Where(source, pointer)))
    return PreparedSchema(root, preparer.markers)


class _Preparer:
    def __init__(self, root: object, check_pattern: Callable[[str], str | None]):
        self.root = root
        self.check_pattern = check_pattern
        self.markers: dict[str, str | ItemCount] = {}
        self.by_body: dict[str, str] = {}

    def visit(self, node: dict, where: _Where) -> list[tuple[object, str]]:
        """Check and rewrite one subschema; returns the subschemas to visit next."""
        _split_ref_from_defs(node)
        _check_keywords(node, where, self.root)
        _refuse_unenforced(node, where)
        _check_lists(node, where)
        _check_counts(node, where)
        _replace_booleans(node, where)
        _drop_any_items(node)
        _check_required(node, where)
        _give_a_type(node, where)
        _check_all_of(node, where, self.root)
        self.check_pattern_of(node, where)
        low, high = _check_bounds(node, where)
        _split_numeric_type_list(node)
        kind = _converter_sees_number(node)
        if kind is not None and (low is not None or high is not None):
            self.swap(node, f"({_range_gbnf(kind, low, high, where)}) space")
        elif _converter_sees_counted_string(node):
            body = ['"\\""', repeat_gbnf("char", node.get("minLength", 0), node.get("maxLength")), '"\\""', "space"]
            self.swap(node, " ".join(part for part in body if part))
        elif _converter_sees_counted_array(node):
            return self.swap_array(node, where)
        return _subschemas(node, where.pointer)

    def check_pattern_of(self, node: dict, where: _Where) -> None:
        if "pattern" in node and _converter_sees_pattern(node):
            problem = self.check_pattern(node["pattern"])
            if problem:
                raise where.error(f'cannot turn "pattern" {_show(node["pattern"])} into a grammar: {problem}',
                                  hint="change the pattern, or leave it out")

    def swap(self, node: dict, body: str | ItemCount) -> str:
        """Make `node` a marker constant for `body`, keeping its "$defs" (references may point into them)."""
        marker = self.by_body.get(body) if isinstance(body, str) else None
        if marker is None:
            marker = f"pyllama-marker-{uuid.uuid4().hex}"
            self.markers[marker] = body
            if isinstance(body, str):
                self.by_body[body] = marker
        kept = {key: node[key] for key in _DEFS if key in node}
        node.clear()
        node.update(const=marker, **kept)
        return marker

    def swap_array(self, node: dict, where: _Where) -> list[tuple[object, str]]:
        """A counted array becomes a tuple of its marker and its item schema, so the items still get a rule."""
        items = node.get("items", copy.deepcopy(_ANY_VALUE))
        marker = self.swap(node, ItemCount(node.get("minItems", 0), node.get("maxItems")))
        del node["const"]
        node.update(type="array", prefixItems=[{"const": marker}, items])
        return _subschemas({key: node[key] for key in _DEFS if key in node}, where.pointer) + [
            (items, where.at("items").pointer)]


# ---------------------------------------------------------------- walking and checking


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
    if not _is_number(value) or value < 0 or value != math.floor(value):
        raise where.error(f'"{key}" must be a whole number of at least 0, not {_show(value)}',
                          hint=f'e.g. "{key}": 1')
    if value > MAX_SCHEMA_COUNT:  # the converter spells some repeats out one by one (time and memory)
        raise where.error(f"{key} {int(value)} is more than the {MAX_SCHEMA_COUNT} a grammar can spell out",
                          hint=f"use a {key} of at most {MAX_SCHEMA_COUNT}, or leave it out")
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


# ---------------------------------------------------------------- keywords the converter misreads


def _split_ref_from_defs(node: dict) -> None:
    """The converter resolves the references inside "$defs" only when their node has no "$ref" of its own
    (a root {"$ref": ..., "$defs": ...} failed with a bare KeyError); an "anyOf" of that one reference
    means the same to it."""
    if "$ref" in node and any(key in node for key in _DEFS):
        node.pop("oneOf", None)  # ignored next to "$ref"; it would win over the "anyOf"
        node["anyOf"] = [{"$ref": node.pop("$ref")}]


def _check_keywords(node: dict, where: _Where, root: object) -> None:
    """Keywords whose value the converter uses without looking: each must have the right type."""
    types = node.get("type")
    for name in types if isinstance(types, list) else [] if types is None else [types]:
        if name not in _JSON_TYPES:
            raise where.error(f"cannot turn this schema into a grammar: {_show(name)} is not a JSON type",
                              hint='use "string", "number", "integer", "boolean", "null", "object" or "array"')
    for key, example in (("pattern", '"^[a-z]+$"'), ("format", '"date"')):
        if key in node and not isinstance(node[key], str):
            raise where.error(f'"{key}" must be a string, not {_show(node[key])}', hint=f'e.g. "{key}": {example}')
    for key in ("properties", *_DEFS):
        if key in node and not isinstance(node[key], dict):
            raise where.error(f'"{key}" must be an object of schemas, not {_show(node[key])}',
                              hint=f'e.g. "{key}": {{"name": {{"type": "string"}}}}')
    required = node.get("required", [])
    if not isinstance(required, list) or not all(isinstance(name, str) for name in required):
        raise where.error('"required" must be a list of property names', hint='e.g. "required": ["name"]')
    if "$ref" in node:
        _check_ref(node["$ref"], where, root)


def _refuse_unenforced(node: dict, where: _Where) -> None:
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


def _check_ref(ref: object, where: _Where, root: object) -> None:
    if not isinstance(ref, str):
        raise where.error(f'"$ref" must be a string, not {_show(ref)}', hint='e.g. "$ref": "#/$defs/item"')
    if not ref.startswith("#/"):
        raise where.error(f'cannot turn this schema into a grammar: "$ref" {_show(ref)} is not a reference within '
                          'the schema', hint='copy what it refers to into "$defs" and use "$ref": "#/$defs/NAME"')
    target = _resolve(root, ref)
    if target is None:
        raise where.error(f'"$ref" {_show(ref)} refers to nothing in the schema',
                          hint='references look like "#/$defs/NAME"')
    if target is False:
        raise where.error(f'"$ref" {_show(ref)} refers to false, so no value can match',
                          hint="refer to a schema other than false")


def _resolve(root: object, ref: str) -> object:
    """The subschema a "#/..." reference names, read as the converter reads it (object keys, no escapes)."""
    target = root
    for key in ref[2:].split("/"):
        if not isinstance(target, dict) or key not in target:
            return None
        target = target[key]
    return target if isinstance(target, (dict, bool)) else None


def _replace_booleans(node: dict, where: _Where) -> None:
    """`true` (any value) and `false` (none) as subschemas: the converter calls .get() on them."""
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        if isinstance(node.get(key), list):
            node[key] = _boolean_list(node[key], key, where)
    if "allOf" in node and not node["allOf"]:
        del node["allOf"]  # it held only true
    for key in ("properties", *_DEFS):
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


def _boolean_list(schemas: list, key: str, where: _Where) -> list:
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


def _drop_false_properties(node: dict, where: _Where) -> None:
    properties = node.get("properties")
    if not isinstance(properties, dict):
        return
    for name in [name for name, sub in properties.items() if sub is False]:
        if name in node.get("required", []):
            raise where.at("properties", name).error(f'property "{name}" is required but false, so no value can '
                                                     'match', hint=f'remove "{name}" from "required"')
        del properties[name]  # false: the property must be absent, and the converter only writes listed ones


def _check_required(node: dict, where: _Where) -> None:
    """The converter writes only the properties it finds in "properties", and drops other required ones."""
    missing = [name for name in node.get("required", []) if name not in node.get("properties", {})]
    if not missing or not _converter_sees_object(node):
        return
    extra = node.get("additionalProperties")
    if extra is False:
        raise where.error(f'required property "{missing[0]}" is not in "properties", and "additionalProperties" is '
                          "false, so no object can match", hint=f'add "{missing[0]}" to "properties"')
    properties = node.setdefault("properties", {})
    for name in missing:
        properties[name] = copy.deepcopy(extra if isinstance(extra, dict) else _ANY_VALUE)


def _give_a_type(node: dict, where: _Where) -> None:
    """The converter fails on a schema without a "type" or a keyword it acts on; it reads {} as any object,
    so annotations alone ("title", "$defs") are read the same way."""
    if "type" in node or any(key in node for key in _USED_WITHOUT_TYPE) or _has_properties(node) or \
            _FORMATS.fullmatch(node.get("format", "")):
        return
    unused = [key for key in node if key not in _ANNOTATIONS]
    if unused:
        raise where.error('cannot turn this schema into a grammar: it has no "type", and the converter uses none '
                          f"of its keywords ({', '.join(_show(key) for key in unused)})", hint='add a "type"')
    node["type"] = "object"


def _check_all_of(node: dict, where: _Where, root: object) -> None:
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
        raise where.error(f'no value has all the types "allOf" asks for ({", ".join(_show(t) for t in typed)})',
                          hint='remove the schema whose "type" does not fit')
    if "object" not in common and _converter_merges_all_of(node):
        raise where.error('cannot turn this schema into a grammar: "allOf" is supported for objects only',
                          hint="merge the schemas into one")


def _type_set(types: object) -> set[str]:
    """The types a "type" value allows (an integer is a number too); empty when it is missing or unknown."""
    names = types if isinstance(types, list) else [types]
    if not names or not all(isinstance(name, str) and name in _JSON_TYPES for name in names):
        return set()
    return set(names) | ({"integer"} if "number" in names else set())


# ---------------------------------------------------------------- what the converter sees


def _plain(node: dict) -> bool:
    """No keyword the converter acts on before it looks at "type", and a single type (or none)."""
    return not any(key in node for key in _CONVERTER_FIRST) and not isinstance(node.get("type"), list)


def _has_properties(node: dict) -> bool:
    """What sends a node down the converter's object branch (before "allOf" and "items")."""
    return "properties" in node or node.get("additionalProperties", True) is not True


def _converter_sees_object(node: dict) -> bool:
    """Whether the converter writes this node from its "properties" (or would, once it has some)."""
    kind = node.get("type")
    return _plain(node) and (kind == "object" and "allOf" not in node or kind in (None, "object")
                             and _has_properties(node))


def _converter_merges_all_of(node: dict) -> bool:
    """Whether the converter writes this node as one object with the properties of all "allOf" schemas."""
    return _plain(node) and node.get("type") in (None, "object") and not _has_properties(node) and "allOf" in node


def _converter_sees_pattern(node: dict) -> bool:
    kind = node.get("type")
    shaped = _has_properties(node) or any(key in node for key in ("allOf", "items", "prefixItems"))
    return _plain(node) and (kind == "string" or (kind is None and not shaped))


def _converter_sees_counted_string(node: dict) -> bool:
    """A string with a length that the converter would spell out (one nested group per character)."""
    counted = "minLength" in node or "maxLength" in node
    return (_plain(node) and node.get("type") == "string" and counted and "pattern" not in node
            and not _FORMATS.fullmatch(node.get("format", "")))


def _converter_sees_counted_array(node: dict) -> bool:
    """An array of one item schema with an item count (the converter nests one group per item)."""
    counted = "minItems" in node or "maxItems" in node
    one_schema = isinstance(node.get("items"), dict) or ("items" not in node and "prefixItems" not in node)
    return _plain(node) and node.get("type") == "array" and counted and one_schema


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
