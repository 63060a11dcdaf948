"""GBNF grammars: find them (shipped name, file, inline text), check them, make them from JSON schemas.

Checking reports the first problem with a line and column (the checker itself is `grammar_check`),
and token references against the loaded model's vocabulary.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any
from collections.abc import Callable
from pathlib import Path

from ...errors import InputError, UsageError
from ..text import json_text
from .grammar_check import TOKEN_ID, GrammarSyntaxError, check_syntax
from .json_schema import prepare_schema
from .schema_check import MAX_SCHEMA_COUNT
from .schema_splice import splice_markers

_SHIPPED_NAME = re.compile(r"^[A-Za-z0-9_-]+$")


# ---------------------------------------------------------------- finding grammars


def grammar_dir() -> Path:
    """Where the shipped grammars live: pyllama_cli/grammars (a link to the repo's grammars/ in a checkout)."""
    here = Path(__file__).resolve()  # pyllama_cli/core/constrain/grammar.py
    installed = here.parents[2] / "grammars"
    return installed if installed.is_dir() else here.parents[3] / "grammars"


def shipped_grammars() -> list[str]:
    """Names of the grammars that ship with pyllama (usable as `--grammar NAME`)."""
    return sorted(p.stem for p in grammar_dir().glob("*.gbnf"))


def load_shipped(name: str) -> str:
    path = grammar_dir() / f"{name}.gbnf"
    if not path.is_file():
        raise InputError(f"no shipped grammar named {name!r}",
                         hint=f"shipped grammars: {', '.join(shipped_grammars())}; or give GBNF text or --grammar-file")
    return path.read_text(encoding="utf-8")


def resolve_grammar(
    *,
    grammar: str | None = None,
    grammar_file: Path | None = None,
    json_schema: str | None = None,
    json_schema_file: Path | None = None,
) -> str | None:
    """The checked GBNF text the flags ask for, or None when no constraint was given.

    Raises:
        UsageError: more than one source given.
        InputError: an unreadable file, an unknown name, or a grammar/schema that does not parse.
    """
    given = [flag for flag, value in (("--grammar", grammar), ("--grammar-file", grammar_file),
                                      ("-j/--json-schema", json_schema), ("-jf/--json-schema-file", json_schema_file))
             if value is not None]
    if len(given) > 1:
        raise UsageError(f"{' and '.join(given)} cannot be used together", hint="give one output constraint")
    if grammar is not None:
        if "::=" not in grammar and _SHIPPED_NAME.match(grammar.strip()):
            text, source = load_shipped(grammar.strip()), f"grammar {grammar.strip()!r}"
        else:
            text, source = grammar, "--grammar"
    elif grammar_file is not None:
        text, source = _read(grammar_file, "grammar"), str(grammar_file)
    elif json_schema is not None:
        return schema_to_grammar(json_schema, "-j/--json-schema")  # checked as it is made
    elif json_schema_file is not None:
        return schema_to_grammar(_read(json_schema_file, "JSON schema"), str(json_schema_file))
    else:
        return None
    check_grammar(text, source)
    return text


def _read(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{what} file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {what} file {path}: {exc}") from None


# ---------------------------------------------------------------- JSON schema


def schema_to_grammar(schema: str, source: str = "the JSON schema") -> str:
    """Turn a JSON schema (JSON text) into GBNF, using llama-cpp-python's public converter.

    The schema is checked and rewritten first (json_schema.prepare_schema); the bounds of numbers, which
    the converter ignores, and lengths and item counts, which it nests deeper than llama.cpp takes, are
    put into the grammar afterwards. The result is checked as llama.cpp will read it.

    Raises:
        InputError: JSON that does not parse, a schema no value can match (a SchemaError, with the JSON
            pointer of the faulty part), or one the converter or llama.cpp cannot handle.
    """
    parsed = _parse_schema(schema, source)
    prepared = prepare_schema(parsed, source, check_pattern=_pattern_problem)
    json_schema_to_gbnf = _converter()

    try:
        grammar = json_schema_to_gbnf(json.dumps(prepared.schema))
    except Exception as exc:  # noqa: BLE001 - the converter raises bare exceptions for unsupported schemas
        raise InputError(f"{source}: cannot turn this schema into a grammar: {_converter_message(exc)}",
                         hint=_SCHEMA_HINT) from None
    grammar = splice_markers(grammar, prepared.markers)
    try:
        check_syntax(grammar)
    except GrammarSyntaxError as exc:  # e.g. a $ref that only refers to itself: a left-recursive rule
        raise InputError(f"{source}: cannot turn this schema into a grammar llama.cpp accepts: {exc.message}",
                         hint=_SCHEMA_HINT) from None
    return grammar


def _converter() -> Any:
    """llama-cpp-python's JSON-schema converter. Importing it runs the llama_cpp package's __init__,
    which installs a log callback printing all of llama.cpp's log to stderr: pyllama's is put back."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    from ..model.library import restore_log_callback

    restore_log_callback()
    return json_schema_to_gbnf


_SCHEMA_HINT = "simplify the schema, or write the grammar yourself with --grammar-file"


def _pattern_problem(pattern: str) -> str | None:
    """Why the converter's grammar for a "pattern" would fail in llama.cpp (None: it would not)."""
    counts = re.findall(r"\d+", " ".join(re.findall(r"\{[\d\s,]*\}", pattern)))
    if any(len(n) > 6 or int(n) > MAX_SCHEMA_COUNT for n in counts):  # the converter spells repeats out
        return f"it repeats something more than {MAX_SCHEMA_COUNT} times"
    json_schema_to_gbnf = _converter()

    try:
        check_syntax(json_schema_to_gbnf(json.dumps({"type": "string", "pattern": pattern})))
    except GrammarSyntaxError as exc:
        return exc.message
    except Exception as exc:  # noqa: BLE001 - the converter raises bare exceptions for unsupported patterns
        return _converter_message(exc)
    return None


def _converter_message(exc: Exception) -> str:
    """One readable line for an exception from the converter (a bare KeyError prints as just a quoted key)."""
    if isinstance(exc, RecursionError):
        return "the schema nests too deeply"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if isinstance(exc, KeyError):
        text = f"it found no {exc.args[0]!r}" if exc.args else ""
    text = text or f"the converter failed ({type(exc).__name__})"
    return text if len(text) <= 200 else text[:197] + "..."


def _parse_schema(schema: str, source: str) -> dict | bool:
    try:
        parsed = json_text.loads(schema, source)
    except json.JSONDecodeError as exc:
        typed = source.startswith("-")  # a flag's value, not a file's text
        raise InputError(f"{source}: not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}",
                         hint="quote the schema for the shell, e.g. -j '{\"type\": \"object\"}'" if typed
                         else "a schema file holds one JSON object, e.g. {\"type\": \"object\"}") from None
    if not isinstance(parsed, (dict, bool)):
        raise InputError(f"{source}: a JSON schema must be an object, not {type(parsed).__name__}")
    return parsed



# ---------------------------------------------------------------- syntax check


def check_grammar(text: str, source: str = "grammar") -> None:
    """Raise InputError naming the line and column of the first problem in GBNF `text`."""
    try:
        check_syntax(text)
    except GrammarSyntaxError as exc:
        line, col = line_col(text, exc.pos)
        raise InputError(f"{source}: {exc.message} at line {line}, column {col}",
                         hint=exc.hint or "GBNF rules look like: root ::= \"yes\" | \"no\"") from None


def check_grammar_tokens(text: str, n_vocab: int, token_of: Callable[[str], int | None]) -> None:
    """Raise InputError for a token reference the loaded model cannot produce.

    llama.cpp takes <[99999]> past the vocabulary without a word (the grammar then waits for a token
    that never comes), and a <name> that is not exactly one token only as "could not parse".
    `token_of` gives the one token a text is, or None.
    """
    for pos, reference in _token_refs(text) if "<" in text else ():
        number = TOKEN_ID.fullmatch(reference)
        if number and int(number.group(1)) >= n_vocab:
            problem = f"token {reference} is past the model's vocabulary (ids 0..{n_vocab - 1})"
        elif not number and token_of(reference) is None:
            problem = f"{reference} is not one token of the model's vocabulary"
        else:
            continue
        line, col = line_col(text, pos)
        raise InputError(f"grammar: {problem} at line {line}, column {col}",
                         hint="pyllama tokenize -m MODEL -p TEXT shows the tokens a text is made of")


@functools.lru_cache(maxsize=16)  # a server checks the same grammar on every request that sends it
def _token_refs(text: str) -> tuple[tuple[int, str], ...]:
    try:
        return tuple(check_syntax(text).token_refs)
    except GrammarSyntaxError:  # refused where the grammar was read, with its position
        return ()


def line_col(text: str, pos: int) -> tuple[int, int]:
    """1-based line and column of character offset `pos`."""
    line = text.count("\n", 0, pos) + 1
    return line, pos - (text.rfind("\n", 0, pos) + 1) + 1
