"""JSON schemas for `-j`: impossible schemas are one-line usage errors, the bounds of numbers hold exactly."""

from __future__ import annotations

import json
import random
import re
from decimal import Decimal
from pathlib import Path

import pytest

from pyllama_cli.core.constrain.grammar import check_grammar, schema_to_grammar
from pyllama_cli.core.constrain.number_ranges import UNBOUNDED_DIGITS, Limit, integer_range_gbnf, number_range_gbnf
from pyllama_cli.errors import InputError, UsageError
from tests.helpers import run_cli

FAST = ("-t", "1", "-c", "512")

# ---------------------------------------------------------------- a GBNF reader for tests

# The pieces of the GBNF the converter writes: literals, classes, rule names, repetitions, operators.
_TOKEN = re.compile(r'\s*("(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|[A-Za-z0-9-]+|\{[0-9,]+\}|[()|?*+])')


def gbnf_regex(grammar: str) -> re.Pattern:
    """The language of a non-recursive GBNF grammar as a Python regex (GBNF classes and repeats read the same)."""
    rules = dict(line.split(" ::= ", 1) for line in grammar.splitlines())

    def translate(name: str, depth: int) -> str:
        assert depth < 50, "recursive grammar"
        body, out, pos = rules[name].rstrip(), [], 0
        while pos < len(body):
            match = _TOKEN.match(body, pos)
            assert match, body[pos:]
            token, pos = match.group(1), match.end()
            if token.startswith('"'):
                out.append(re.escape(json.loads(token)))
            elif re.fullmatch(r"[A-Za-z0-9-]+", token):
                out.append(f"(?:{translate(token, depth + 1)})")
            else:
                out.append("(?:" if token == "(" else token)
        return "".join(out)

    return re.compile(translate("root", 0))


def accepts(pattern: re.Pattern, text: str) -> bool:
    return pattern.fullmatch(text) is not None


def llama_cpp_parses(model: Path, grammars: list[str]) -> list[bool]:
    """Whether llama.cpp's own grammar parser takes each grammar (it makes a grammar sampler or none)."""
    from pyllama_cli.core.model.native import Model, lib
    from pyllama_cli.core.model.settings import LoadSettings

    verdicts = []
    with Model.load(model, LoadSettings(), vocab_only=True) as loaded:
        for grammar in grammars:
            sampler = lib.llama_sampler_init_grammar(loaded.vocab, grammar.encode(), b"root")
            if sampler:
                lib.llama_sampler_free(sampler)
            verdicts.append(bool(sampler))
    return verdicts


# ---------------------------------------------------------------- impossible schemas


@pytest.mark.parametrize(("schema", "message"), [
    ({"enum": []}, ': "enum" must list at least one value'),
    ({"anyOf": []}, ': "anyOf" must list at least one schema'),
    ({"oneOf": []}, ': "oneOf" must list at least one schema'),
    ({"type": []}, ': "type" must name at least one type'),
    ({"type": "object", "properties": {"color": {"enum": []}}},
     ' at /properties/color: "enum" must list at least one value'),
    ({"type": "integer", "minimum": 5, "maximum": 1}, ': "minimum" 5 is greater than "maximum" 1'),
    ({"type": "number", "exclusiveMinimum": 2, "exclusiveMaximum": 2},
     ': "exclusiveMinimum" 2 and "exclusiveMaximum" 2 leave no number between them'),
    ({"type": "integer", "minimum": 1.2, "maximum": 1.8}, ': "minimum" 1.2 and "maximum" 1.8 leave no integer between them'),
    ({"type": "integer", "minimum": 3, "exclusiveMinimum": True, "maximum": 3},
     ': "minimum" 3 (exclusive) and "maximum" 3 leave no integer between them'),
    ({"type": "string", "minLength": 5, "maxLength": 2}, ': "minLength" 5 is greater than "maxLength" 2'),
    ({"type": "array", "items": {"type": "string"}, "minItems": 3, "maxItems": 1},
     ': "minItems" 3 is greater than "maxItems" 1'),
    ({"type": "array", "items": {"type": "object", "properties": {"a/b": {"type": "string", "minLength": 2,
                                                                          "maxLength": 1}}}},
     ' at /items/properties/a~1b: "minLength" 2 is greater than "maxLength" 1'),
    ({"type": "string", "minLength": -1}, ': "minLength" must be a whole number of at least 0, not -1'),
    ({"type": "integer", "maximum": "5"}, ': "maximum" must be a number, not "5"'),
    ({"type": "integer", "maximum": 1e300}, ': "maximum" 1e+300 has more than the 100 digits a grammar can spell out'),
    ({"type": "object", "properties": {"s": {"type": "string", "minLength": 10**8}}},
     " at /properties/s: minLength 100000000 is more than the 10000 a grammar can spell out"),
])
def test_impossible_schema_is_a_usage_error_naming_the_problem(schema: dict, message: str) -> None:
    with pytest.raises(UsageError) as exc:
        schema_to_grammar(json.dumps(schema), "-j/--json-schema")
    assert exc.value.message == f"-j/--json-schema{message}"
    assert exc.value.hint
    assert isinstance(exc.value, InputError)  # the server answers InputError from a schema with a 400


@pytest.mark.parametrize(("text", "name"), [
    ('{"const": NaN}', "NaN"), ('{"type": "string", "maxLength": Infinity}', "Infinity"),
    ('{"enum": [1, -Infinity]}', "-Infinity"),
])
def test_nan_and_infinity_are_not_json(text: str, name: str) -> None:
    # Python reads them; a grammar built from them would produce text no JSON reader takes.
    with pytest.raises(InputError) as exc:
        schema_to_grammar(text, "-j")
    assert exc.value.message == f"-j is not JSON: {name} is not a JSON number"


def test_a_schema_that_is_not_json_gets_a_hint_for_where_it_came_from() -> None:
    with pytest.raises(InputError) as typed:
        schema_to_grammar("{bad", "-j/--json-schema")
    assert typed.value.hint == "quote the schema for the shell, e.g. -j '{\"type\": \"object\"}'"
    with pytest.raises(InputError) as from_file:
        schema_to_grammar("not json", "notes.txt")
    assert from_file.value.message == "notes.txt: not valid JSON: Expecting value at line 1, column 1"
    assert from_file.value.hint == 'a schema file holds one JSON object, e.g. {"type": "object"}'


def test_counts_in_values_that_are_not_schemas_are_left_alone() -> None:
    # "default" holds a value, not a schema: its "maxLength" key limits nothing.
    grammar = schema_to_grammar(json.dumps({"type": "string", "default": {"maxLength": 20000}}), "-j")
    assert r'root ::= "\"" char* "\"" space' in grammar.splitlines()  # any string, no length limit


def test_empty_enum_is_one_line_error_before_the_model_loads(tmp_path: Path) -> None:
    result = run_cli("complete", "-m", str(tmp_path / "missing.gguf"), "-p", "x", "-j", '{"enum":[]}')
    assert result.exit_code == 1
    assert result.first_stderr_line == 'Error: -j/--json-schema: "enum" must list at least one value'
    assert "Traceback" not in result.stderr and "line 2" not in result.stderr


def test_conflicting_bounds_from_the_command_line(tmp_path: Path) -> None:
    schema = '{"type":"object","properties":{"n":{"type":"integer","minimum":5,"maximum":1}}}'
    result = run_cli("complete", "-m", str(tmp_path / "missing.gguf"), "-p", "x", "-j", schema)
    assert result.exit_code == 1
    assert result.first_stderr_line == 'Error: -j/--json-schema at /properties/n: "minimum" 5 is greater than "maximum" 1'


@pytest.mark.parametrize("text", ["1" * 5000, "[" * 100_000], ids=["5000-digit number", "deep nesting"])
def test_unreadable_schema_text_is_an_input_error(text: str) -> None:
    with pytest.raises(InputError):
        schema_to_grammar(text, "-j/--json-schema")


# ---------------------------------------------------------------- integer ranges, exactly


def _candidates(low: int | None, high: int | None) -> set[str]:
    """Integers around each bound and each power of ten, and texts that are not JSON integers."""
    centres = [0] + [b for b in (low, high) if b is not None]
    centres += [sign * 10 ** k for k in range(UNBOUNDED_DIGITS + 2) for sign in (1, -1)]
    numbers = {str(c + d) for c in centres for d in range(-12, 13)}
    return numbers | {"-0", "01", "+1", "1.0", "", "-", "1e3", " 1", "00"}


def _allowed(text: str, low: int | None, high: int | None) -> bool:
    if not re.fullmatch(r"-?(0|[1-9][0-9]*)", text) or text == "-0":
        return False
    value = int(text)
    # A side without a bound stops at the converter's digit count for plain integers.
    digits_ok = len(text.lstrip("-")) <= UNBOUNDED_DIGITS or (low is not None and high is not None)
    return (low is None or value >= low) and (high is None or value <= high) and digits_ok


RANGES = [(1, 5), (0, None), (None, 0), (None, None), (-1_000_000, 1_000_000), (17, 2345), (-37, -5), (100, 100),
          (0, 0), (-5, -5), (123_456_789, None), (None, -10), (-99, 99), (1, 10 ** 20), (-(10 ** 18) - 7, 3)]


@pytest.mark.parametrize(("low", "high"), RANGES)
def test_integer_range_grammar_accepts_exactly_the_range(low: int | None, high: int | None) -> None:
    pattern = gbnf_regex(f"root ::= {integer_range_gbnf(low, high)}")
    for text in _candidates(low, high):
        assert accepts(pattern, text) == _allowed(text, low, high), (low, high, text)


def test_integer_range_grammar_on_random_ranges() -> None:
    rng = random.Random(5)
    for _ in range(300):
        width = rng.choice([10, 1000, 10 ** 6, 10 ** 12])
        low, high = sorted(rng.randint(-width, width) for _ in range(2))
        low, high = rng.choice([(low, high), (low, None), (None, high)])
        pattern = gbnf_regex(f"root ::= {integer_range_gbnf(low, high)}")
        probes = _candidates(low, high) | {str(rng.randint(-2 * width, 2 * width)) for _ in range(50)}
        for text in probes:
            assert accepts(pattern, text) == _allowed(text, low, high), (low, high, text)


@pytest.mark.parametrize(("bounds", "low", "high"), [
    ({"minimum": 1, "maximum": 5}, 1, 5),
    ({"exclusiveMinimum": 1, "exclusiveMaximum": 5}, 2, 4),
    ({"minimum": 1.5, "maximum": 4.5}, 2, 4),
    ({"exclusiveMinimum": 1.5, "exclusiveMaximum": 4.5}, 2, 4),
    ({"minimum": 0}, 0, None),
    ({"maximum": -3}, None, -3),
    ({"minimum": 2, "exclusiveMinimum": True, "maximum": 9, "exclusiveMaximum": True}, 3, 8),
    ({"minimum": -1_000_000, "maximum": 1_000_000}, -1_000_000, 1_000_000),
])
def test_schema_grammar_enforces_integer_bounds(bounds: dict, low: int | None, high: int | None) -> None:
    grammar = schema_to_grammar(json.dumps({"type": "integer", **bounds}))
    check_grammar(grammar)
    pattern = gbnf_regex(grammar)
    for text in _candidates(low, high):
        assert accepts(pattern, text + " ") == _allowed(text, low, high), (bounds, text)


def test_integer_bounds_hold_in_properties_array_items_and_type_lists() -> None:
    schema = {"type": "object", "required": ["a", "b", "c"], "properties": {
        "a": {"type": "integer", "minimum": 1, "maximum": 3},
        "b": {"type": "array", "items": {"type": "integer", "exclusiveMinimum": 0, "maximum": 2}, "maxItems": 2},
        "c": {"type": ["integer", "null"], "minimum": 7, "maximum": 8},
        "d": {"$ref": "#/$defs/small"},
    }, "$defs": {"small": {"type": "integer", "minimum": -2, "maximum": -1}}}
    grammar = schema_to_grammar(json.dumps(schema))
    check_grammar(grammar)
    pattern = gbnf_regex(grammar)
    assert accepts(pattern, '{"a":3,"b":[1,2],"c":null,"d":-2}')
    assert accepts(pattern, '{"a":1,"b":[],"c":8}')
    for bad in ('{"a":4,"b":[],"c":8}', '{"a":1,"b":[0],"c":8}', '{"a":1,"b":[3],"c":8}', '{"a":1,"b":[],"c":6}',
                '{"a":1,"b":[],"c":8,"d":0}', '{"a":0,"b":[],"c":7}'):
        assert not accepts(pattern, bad), bad


def test_bounded_integers_the_converter_skips_leave_no_marker() -> None:
    schema = {"type": "integer", "minimum": 1, "maximum": 2, "$defs": {"unused": {"type": "integer", "maximum": 0}}}
    grammar = schema_to_grammar(json.dumps(schema))
    assert "pyllama-marker" not in grammar
    assert accepts(gbnf_regex(grammar), "2") and not accepts(gbnf_regex(grammar), "7")


def test_enum_and_const_values_are_left_alone() -> None:
    value = {"type": "integer", "minimum": 1}  # an allowed value that looks like a schema
    grammar = schema_to_grammar(json.dumps({"enum": [value], "type": "object"}))
    assert accepts(gbnf_regex(grammar), json.dumps(value))  # the converter writes values as json.dumps does


# ---------------------------------------------------------------- number ranges, exactly

_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]{1,16})?")


def _number_candidates(low: Limit | None, high: Limit | None) -> set[str]:
    """Numbers just around each bound and zero at several precisions, written several ways, and non-numbers."""
    centres = [Decimal(0)] + [b.value for b in (low, high) if b is not None]
    steps = [Decimal(10) ** -p for p in (0, 1, 2, 3, 15, 16, 17)]
    values = {c + k * step for c in centres for step in steps for k in range(-3, 4)}
    texts = {format(v, "f") for v in values} | {format(v, ".16f") for v in values if abs(v) < 10 ** 15}
    texts |= {t + "0" for t in texts if "." in t} | {t + ".0" for t in texts if "." not in t}
    texts |= {f"{sign}{'9' * k}" for k in (15, 16, 17) for sign in ("", "-")}
    return texts | {"-0", "-0.0", "0.0", "01", "+1", "1e3", ".5", "1.", "-", "", " 1", "00.5"}


def _number_allowed(text: str, low: Limit | None, high: Limit | None) -> bool:
    if not _NUMBER.fullmatch(text) or (text.startswith("-") and Decimal(text) == 0):
        return False
    value = Decimal(text)
    above = low is None or value > low.value or (value == low.value and not low.exclusive)
    below = high is None or value < high.value or (value == high.value and not high.exclusive)
    # A side without a bound stops at the converter's digit count for integer parts.
    digits_ok = len(text.lstrip("-").split(".")[0]) <= UNBOUNDED_DIGITS or (low is not None and high is not None)
    return above and below and digits_ok


def _limit(value: str | None, exclusive: bool = False) -> Limit | None:
    return None if value is None else Limit(Decimal(value), exclusive)


NUMBER_RANGES = [
    (_limit("0"), _limit("1")), (_limit("0", True), _limit("1", True)), (_limit("-1.5"), _limit("2.25")),
    (_limit("0.1"), _limit("0.2")), (_limit("0.25"), _limit("0.25")), (_limit("-3.75"), _limit("-1.5", True)),
    (None, _limit("0.5")), (_limit("-0.001"), None), (None, None), (_limit("0.00001"), _limit("0.00002")),
    (_limit("12.5", True), _limit("1000.125")), (_limit("99.99"), _limit("100.01")), (_limit("5", True), None),
    (None, _limit("0", True)), (_limit("-100", True), _limit("100", True)), (_limit("0.0000000000000001"), None),
]


@pytest.mark.parametrize(("low", "high"), NUMBER_RANGES)
def test_number_range_grammar_accepts_exactly_the_range(low: Limit | None, high: Limit | None) -> None:
    pattern = gbnf_regex(f"root ::= {number_range_gbnf(low, high)}")
    for text in _number_candidates(low, high):
        assert accepts(pattern, text) == _number_allowed(text, low, high), (low, high, text)


def test_number_range_grammar_on_random_ranges() -> None:
    rng = random.Random(7)

    def draw() -> Decimal:
        return Decimal(rng.randint(-10 ** 6, 10 ** 6)) / 10 ** rng.choice([0, 1, 2, 3, 4])

    for _ in range(200):
        a, b = sorted((draw(), draw()))
        low, high = Limit(a, rng.random() < 0.5), Limit(b, rng.random() < 0.5)
        if a == b:
            low, high = Limit(a, False), Limit(b, False)
        low, high = rng.choice([(low, high), (low, None), (None, high)])
        pattern = gbnf_regex(f"root ::= {number_range_gbnf(low, high)}")
        probes = _number_candidates(low, high) | {format(draw(), "f") for _ in range(40)}
        for text in probes:
            assert accepts(pattern, text) == _number_allowed(text, low, high), (low, high, text)


def test_a_range_no_number_of_sixteen_decimals_fits_is_refused() -> None:
    assert number_range_gbnf(_limit("0.3", True), _limit("0.30000000000000004", True)) is None
    with pytest.raises(UsageError) as caught:
        schema_to_grammar(json.dumps({"type": "number", "exclusiveMinimum": 0.3,
                                      "exclusiveMaximum": 0.30000000000000004}), "-j/--json-schema")
    assert caught.value.message == ('-j/--json-schema: "exclusiveMinimum" 0.3 and "exclusiveMaximum" '
                                    "0.30000000000000004 leave no number with at most 16 digits after the point "
                                    "between them")


def test_number_bounds_hold_in_schemas() -> None:
    schema = {"type": "object", "required": ["p", "t"], "properties": {
        "p": {"type": "number", "minimum": 0, "maximum": 1},
        "t": {"type": ["number", "null"], "exclusiveMinimum": -273.15, "maximum": 1e3},
    }}
    grammar = schema_to_grammar(json.dumps(schema))
    check_grammar(grammar)
    pattern = gbnf_regex(grammar)
    for good in ('{"p":0.5,"t":null}', '{"p":1,"t":-273.14}', '{"p":0,"t":1000.000}', '{"p":0.999,"t":20}'):
        assert accepts(pattern, good), good
    for bad in ('{"p":1.5,"t":null}', '{"p":-0.1,"t":null}', '{"p":1e0,"t":null}', '{"p":0.5,"t":-273.15}',
                '{"p":0.5,"t":1000.01}'):
        assert not accepts(pattern, bad), bad


@pytest.mark.parametrize(("schema", "message"), [
    ({"type": "integer", "multipleOf": 7}, '-j/--json-schema: "multipleOf" is not supported: a grammar cannot enforce it'),
    ({"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}},
     '-j/--json-schema at /properties/a: "uniqueItems" is not supported: a grammar cannot enforce it'),
    ({"type": "object", "minProperties": 2}, '-j/--json-schema: "minProperties" is not supported: a grammar cannot '
                                             "enforce it"),
    ({"type": "array", "contains": {"type": "null"}}, '-j/--json-schema: "contains" is not supported: a grammar '
                                                      "cannot enforce it"),
    ({"type": "string", "not": {"const": "x"}}, '-j/--json-schema: "not" is not supported: a grammar cannot enforce it'),
])
def test_keywords_the_grammar_would_ignore_are_refused(schema: dict, message: str) -> None:
    # They were dropped: multipleOf 7 gave 31, minProperties 2 gave {}.
    with pytest.raises(UsageError) as caught:
        schema_to_grammar(json.dumps(schema), "-j/--json-schema")
    assert caught.value.message == message


def test_keywords_that_constrain_nothing_still_pass() -> None:
    # Accepted, and read as the no-ops they are: the grammar is that of the schema without them.
    schema = {"type": "object", "minProperties": 0, "properties": {
        "n": {"type": "integer", "multipleOf": 1}, "a": {"type": "array", "uniqueItems": False}}}
    without = {"type": "object", "properties": {"n": {"type": "integer"}, "a": {"type": "array"}}}
    grammar = schema_to_grammar(json.dumps(schema))
    assert grammar == schema_to_grammar(json.dumps(without))
    assert check_grammar(grammar) is None


def test_strings_hold_no_raw_control_characters() -> None:
    # The converter's character rule let them through, so 4 of 6 seeds gave text json.loads refused.
    for schema in ({"type": "string"}, {"type": "object", "properties": {"k": {"type": "string"}}, "required": ["k"]},
                   {"type": "string", "maxLength": 5}):
        pattern = gbnf_regex(schema_to_grammar(json.dumps(schema)))
        string = '"a\\n\\u00e9\\/b"' if schema.get("type") == "string" else '{"k": "a\\nb"}'
        assert accepts(pattern, string), schema
        for control in ("\n", "\x00", "\x1f", "\t"):
            bad = f'"a{control}b"' if schema.get("type") == "string" else f'{{"k": "a{control}b"}}'
            assert not accepts(pattern, bad), (schema, control)


def test_complete_with_a_string_schema_writes_escapes_not_control_characters(tiny_model: Path) -> None:
    # -n 200 lets every one of these seeds close its string (seed 3's takes more than 60 tokens): the output
    # is then one whole JSON string, which json.loads (strict: no raw control characters) takes.
    for seed in range(4):
        result = run_cli("complete", "-m", str(tiny_model), *FAST, "-p", "JSON:", "-n", "200", "-s", str(seed),
                         "-j", '{"type": "string"}')
        assert (result.exit_code, result.stderr) == (0, ""), (seed, result.stdout)
        assert not re.search("[\x00-\x1f]", result.stdout), (seed, result.stdout)
        assert isinstance(json.loads(result.stdout), str), (seed, result.stdout)


# ---------------------------------------------------------------- in llama.cpp


def test_complete_with_integer_bounds_stays_in_range(tiny_model: Path) -> None:
    schema = json.dumps({"type": "integer", "minimum": 1, "maximum": 5})
    for seed in range(5):
        result = run_cli("complete", "-m", str(tiny_model), *FAST, "-p", "hello", "-n", "12", "-s", str(seed),
                         "-j", schema)
        assert result.exit_code == 0, result.stderr
        assert 1 <= int(result.stdout) <= 5, (seed, result.stdout)


def test_complete_with_a_wide_integer_range_in_an_object(tiny_model: Path) -> None:
    schema = json.dumps({"type": "object", "required": ["n", "m"], "properties": {
        "n": {"type": "integer", "minimum": 1000, "maximum": 1_000_000},
        "m": {"type": "integer", "exclusiveMinimum": 0}}})
    for seed in range(8):  # without the bounds, seeds 2, 3, 5, 6 and 7 give 0, 7 or 4496193
        result = run_cli("complete", "-m", str(tiny_model), *FAST, "-p", "JSON:", "-n", "200", "-s", str(seed),
                         "-j", schema)
        value = json.loads(result.stdout)
        assert 1000 <= value["n"] <= 1_000_000 and value["m"] >= 1, (seed, result.stdout)


def test_complete_with_number_bounds_stays_in_range(tiny_model: Path) -> None:
    schema = json.dumps({"type": "object", "required": ["p"], "properties": {
        "p": {"type": "number", "exclusiveMinimum": 0.25, "maximum": 0.5}}})
    for seed in range(6):
        result = run_cli("complete", "-m", str(tiny_model), *FAST, "-p", "JSON:", "-n", "60", "-s", str(seed),
                         "-j", schema)
        assert result.exit_code == 0, result.stderr
        assert 0.25 < json.loads(result.stdout)["p"] <= 0.5, (seed, result.stdout)


@pytest.mark.parametrize("items", [{}, True])
def test_items_that_allow_anything_convert_like_no_items(items: object) -> None:
    # The converter failed on both ("'prefixItems'", "'bool' object has no attribute 'get'").
    assert schema_to_grammar(json.dumps({"type": "array", "items": items})) == schema_to_grammar('{"type": "array"}')


# ---------------------------------------------------------------- lengths and item counts


def _string(length: int) -> str:
    return json.dumps("ab\n" * (length // 3) + "x" * (length % 3))  # \n is two characters of JSON, one of the string


@pytest.mark.parametrize(("low", "high"), [(0, 0), (0, 1), (1, 1), (2, 5), (0, 1000), (0, 1001), (0, 2000), (0, 2001),
                                           (1999, 4001), (2500, None), (0, 10_000), (10_000, 10_000)])
def test_string_lengths_hold_exactly(low: int, high: int | None) -> None:
    schema = {"type": "string", "minLength": low, **({} if high is None else {"maxLength": high})}
    grammar = schema_to_grammar(json.dumps(schema))
    check_grammar(grammar)
    pattern = gbnf_regex(grammar)
    for length in {0, 1, low - 1, low, low + 1, high or 0, (high or 0) + 1, (high or low) + 7}:
        if length >= 0:
            allowed = length >= low and (high is None or length <= high)
            assert accepts(pattern, _string(length) + " ") == allowed, (low, high, length)


@pytest.mark.parametrize(("low", "high"), [(0, 0), (0, 1), (1, 1), (1, 2), (0, 5), (3, None), (0, 1001), (0, 3000),
                                           (2500, 4500)])
def test_array_item_counts_hold_exactly(low: int, high: int | None) -> None:
    schema = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": low,
              **({} if high is None else {"maxItems": high})}
    grammar = schema_to_grammar(json.dumps(schema))
    check_grammar(grammar)
    pattern = gbnf_regex(grammar)
    for count in {0, 1, 2, low - 1, low, low + 1, high or 0, (high or 0) + 1}:
        if count >= 0:
            allowed = count >= low and (high is None or count <= high)
            assert accepts(pattern, json.dumps([7] * count)) == allowed, (low, high, count)
    assert not accepts(pattern, json.dumps([10] * max(low, 1)))


def test_counts_hold_in_nested_schemas_and_arrays_without_items() -> None:
    schema = {"type": "object", "required": ["tags", "any"], "properties": {
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "minItems": 1, "maxItems": 2},
        "any": {"type": "array", "maxItems": 2}}}
    grammar = schema_to_grammar(json.dumps(schema))
    assert "pyllama-marker" not in grammar
    # The any-value rules are recursive: cut them down for the regex.
    pattern = gbnf_regex("\n".join(line for line in grammar.splitlines()
                                   if not line.startswith(("value ::=", "object ::=", "array ::="))) +
                         '\nobject ::= "{}"\narray ::= "[]"')
    assert accepts(pattern, '{"tags":["abc","d"],"any":[1,null]}')
    for bad in ('{"tags":[],"any":[]}', '{"tags":["abcd"],"any":[]}', '{"tags":["a","b","c"],"any":[]}',
                '{"tags":["a"],"any":[1,1,1]}'):
        assert not accepts(pattern, bad), bad


LONG_SCHEMAS = [{"type": "string", "maxLength": 2000}, {"type": "string", "maxLength": 3000},
                {"type": "string", "minLength": 2500, "maxLength": 10_000},
                {"type": "array", "items": {"type": "integer"}, "maxItems": 1001},
                {"type": "array", "items": {"type": "object", "properties": {"a": {"type": "string", "maxLength": 5000}}},
                 "minItems": 2001, "maxItems": 10_000}]


def test_long_strings_and_arrays_make_grammars_llama_cpp_takes(tiny_model: Path) -> None:
    # The converter nested one group per item: llama.cpp refused these from 1001 (or 2048 deep).
    grammars = [schema_to_grammar(json.dumps(schema)) for schema in LONG_SCHEMAS]
    assert llama_cpp_parses(tiny_model, grammars) == [True] * len(grammars)
    assert max(len(g) for g in grammars) < 2000


CUT_AT_8 = ("Warning: generation stopped at the -n limit of 8 tokens before the grammar said the output was done, "
            "so it may be unfinished; raise -n/--n-predict")


@pytest.mark.parametrize(("schema", "output"), [
    ({"type": "string", "maxLength": 3000}, '"bali pbali pbali pbali'),
    ({"type": "array", "items": {"type": "integer"}, "maxItems": 3000}, "[4000000"),
])
def test_complete_with_a_long_max_length_runs_without_llama_cpp_errors(tiny_model: Path, schema: dict,
                                                                       output: str) -> None:
    # Greedy, the tiny model repeats itself until -n 8 cuts it (a seed could close the value or not).
    result = run_cli("complete", "-m", str(tiny_model), *FAST, "-p", "JSON:", "-n", "8", "--temp", "0",
                     "-j", json.dumps(schema))
    # llama.cpp once printed its parse error and 16 KB of grammar here; now only -n's cut is mentioned.
    assert (result.exit_code, result.stdout, result.stderr) == (0, output, CUT_AT_8 + "\n")


# ---------------------------------------------------------------- what the converter misread


def test_root_ref_into_recursive_defs() -> None:
    # The converter failed with a bare KeyError: '#/$defs/t'.
    grammar = schema_to_grammar(json.dumps({"$defs": {"t": {"type": "array", "items": {"$ref": "#/$defs/t"}}},
                                            "$ref": "#/$defs/t"}))
    check_grammar(grammar)
    rules = dict(line.split(" ::= ", 1) for line in grammar.splitlines())
    assert rules["root"] == "alternative-0" and rules["alternative-0"] == "t"
    assert rules["t"] == '"[" space (t-item ("," space t-item)*)? "]" space' and rules["t-item"] == "t"


def test_root_ref_into_a_two_step_cycle(tiny_model: Path) -> None:
    schema = {"$defs": {"a": {"type": "array", "items": {"$ref": "#/$defs/b"}},
                        "b": {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}}}, "$ref": "#/$defs/a"}
    grammar = schema_to_grammar(json.dumps(schema))
    rules = dict(line.split(" ::= ", 1) for line in grammar.splitlines())
    assert rules["a-item"] == "b" and rules["b-x"] == "a"
    assert llama_cpp_parses(tiny_model, [grammar]) == [True]


def test_true_allows_any_value_and_false_none() -> None:
    any_value = schema_to_grammar("true")
    assert "root ::= alternative-0 | array | string | number | boolean | null" in any_value.splitlines()
    assert schema_to_grammar('{"type":"object","properties":{"a":true},"required":["a"]}') == schema_to_grammar(
        '{"type":"object","properties":{"a":{"type":["object","array","string","number","boolean","null"]}},'
        '"required":["a"]}')
    pattern = gbnf_regex(schema_to_grammar('{"type":"object","properties":{"a":false,"b":{"type":"null"}},'
                                           '"required":["b"]}'))
    assert accepts(pattern, '{"b":null}') and not accepts(pattern, '{"a":null,"b":null}')
    pattern = gbnf_regex(schema_to_grammar('{"anyOf":[false,{"type":"integer","maximum":3}]}'))
    assert accepts(pattern, "3") and not accepts(pattern, "4")
    assert accepts(gbnf_regex(schema_to_grammar('{"type":"array","items":false}')), "[]")


@pytest.mark.parametrize(("schema", "message"), [
    (False, ": the schema is false, so no value can match"),
    ({"type": "object", "properties": {"a": False}, "required": ["a"]},
     ' at /properties/a: property "a" is required but false, so no value can match'),
    ({"anyOf": [False, False]}, ': every schema in "anyOf" is false, so no value can match'),
    ({"allOf": [{"type": "object"}, False]}, ' at /allOf/1: this "allOf" schema is false, so no value can match'),
    ({"type": "array", "items": False, "minItems": 1},
     ': "items" is false, so an array has no items, but "minItems" is 1'),
    ({"type": "string", "pattern": 5}, ': "pattern" must be a string, not 5'),
    ({"type": "string", "format": ["date"]}, ': "format" must be a string, not ["date"]'),
    ({"type": "object", "required": "a"}, ': "required" must be a list of property names'),
    ({"type": "object", "properties": []}, ': "properties" must be an object of schemas, not []'),
    ({"type": "string", "pattern": "^[z-a]$"},
     ': cannot turn "pattern" "^[z-a]$" into a grammar: character range z-a runs backwards, so it matches nothing'),
    ({"type": "object", "properties": {"id": {"type": "string", "pattern": "^a{0,1500}$"}}},
     ' at /properties/id: cannot turn "pattern" "^a{0,1500}$" into a grammar: repetition ? repeats an item of 2001 '
     "rules, more than llama.cpp's limit of 2000"),
    ({"type": "string", "pattern": "^a{100000000}$"},
     ': cannot turn "pattern" "^a{100000000}$" into a grammar: it repeats something more than 10000 times'),
    ({"type": "string", "pattern": "[a-z]+"},
     ': cannot turn "pattern" "[a-z]+" into a grammar: Pattern must start with "^" and end with "$"'),
    ({"allOf": [{"type": "string"}, {"type": "integer"}]},
     ': no value has all the types "allOf" asks for ("string", "integer")'),
    ({"type": "string", "allOf": [{"$ref": "#/$defs/n"}], "$defs": {"n": {"type": ["integer", "null"]}}},
     ': no value has all the types "allOf" asks for ("string", ["integer", "null"])'),
    ({"allOf": [{"type": "number"}, {"type": "integer", "minimum": 1}]},
     ': cannot turn this schema into a grammar: "allOf" is supported for objects only'),
    ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a", "b"], "additionalProperties": False},
     ': required property "b" is not in "properties", and "additionalProperties" is false, so no object can match'),
    ({"type": "frob"}, ': cannot turn this schema into a grammar: "frob" is not a JSON type'),
    ({"type": "object", "properties": {"a": {"not": {"type": "string"}}}},
     ' at /properties/a: "not" is not supported: a grammar cannot enforce it'),
    ({"$ref": "https://example.com/s"},
     ': cannot turn this schema into a grammar: "$ref" "https://example.com/s" is not a reference within the schema'),
    ({"type": "array", "items": {"$ref": "#/$defs/missing"}}, ' at /items: "$ref" "#/$defs/missing" refers to nothing '
                                                              "in the schema"),
])
def test_schema_the_converter_misread_is_refused_naming_the_place(schema: object, message: str) -> None:
    with pytest.raises(InputError) as exc:
        schema_to_grammar(json.dumps(schema), "-j/--json-schema")
    assert exc.value.message == f"-j/--json-schema{message}"
    assert exc.value.hint


def test_required_property_missing_from_properties_is_written() -> None:
    # The converter dropped "b": the output could leave out a property the schema requires.
    grammar = schema_to_grammar('{"type":"object","properties":{"a":{"type":"string"}},"required":["a","b"],'
                                '"additionalProperties":{"type":"integer"}}')
    assert 'root ::= "{" space a-kv "," space b-kv ( "," space ( additional-kvs ) )? "}" space' in grammar.splitlines()
    assert 'b-kv ::= "\\"b\\"" space ":" space integer' in grammar.splitlines()


def test_a_ref_that_only_refers_to_itself_is_refused() -> None:
    with pytest.raises(InputError) as exc:
        schema_to_grammar('{"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}', "-j/--json-schema")
    assert exc.value.message == ("-j/--json-schema: cannot turn this schema into a grammar llama.cpp accepts: rule 'a' "
                                 "is left-recursive, which llama.cpp cannot run")


def test_converter_failures_are_one_readable_line() -> None:
    with pytest.raises(InputError) as exc:
        schema_to_grammar('{"enum": ["a", {"$ref": "elsewhere"}]}', "-j/--json-schema")
    assert exc.value.message == "-j/--json-schema: cannot turn this schema into a grammar: Unsupported ref elsewhere"


@pytest.mark.parametrize(("schema", "line"), [
    ("false", "Error: -j/--json-schema: the schema is false, so no value can match"),
    ('{"type":"string","pattern":5}', 'Error: -j/--json-schema: "pattern" must be a string, not 5'),
    ('{"type":"string","pattern":"^[z-a]$"}', 'Error: -j/--json-schema: cannot turn "pattern" "^[z-a]$" into a '
                                              "grammar: character range z-a runs backwards, so it matches nothing"),
    ('{"allOf":[{"type":"string"},{"type":"integer"}]}',
     'Error: -j/--json-schema: no value has all the types "allOf" asks for ("string", "integer")'),
    ('{"type":"object","properties":{"a":{"type":"string"}},"required":["a","b"],"additionalProperties":false}',
     'Error: -j/--json-schema: required property "b" is not in "properties", and "additionalProperties" is false, '
     "so no object can match"),
])
def test_impossible_schemas_are_refused_before_the_model_loads(tmp_path: Path, schema: str, line: str) -> None:
    result = run_cli("complete", "-m", str(tmp_path / "missing.gguf"), "-p", "x", "-j", schema)
    assert result.exit_code == 1
    assert result.first_stderr_line == line
    assert result.stdout == ""


@pytest.mark.parametrize(("schema", "output"), [
    ("true", "0e0 "),
    ('{"$defs":{"t":{"type":"array","items":{"$ref":"#/$defs/t"}}},"$ref":"#/$defs/t"}', "[ ] "),
])
def test_schemas_the_converter_failed_on_now_run(tiny_model: Path, schema: str, output: str) -> None:
    # Greedy, the value is whole within -n 8 (a seed could have been cut there or not); the space is the grammar's.
    result = run_cli("complete", "-m", str(tiny_model), *FAST, "-p", "JSON:", "-n", "8", "--temp", "0", "-j", schema)
    assert (result.exit_code, result.stdout, result.stderr) == (0, output, "")
