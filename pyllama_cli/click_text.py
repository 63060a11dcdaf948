"""Click's wording replaced by pyllama's: the help layout, and one-line usage errors.

Help: click's plain formatter (names never cut, help text wrapped), options grouped under their
panel titles, `<int>` rather than `<int range>`, ranges in words ("at least 1"), and examples kept
as written. Errors: a flag click could not read becomes `-n/--n-predict takes a whole number, not
'abc'` with a hint, instead of click's "'abc' is not a valid int range.". Only click's public
attributes are read (an error's param, option_name, possibilities; a range's min and max).
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from typer.core import TyperCommand, TyperGroup

from .command_table import HIDDEN_ALIASES, SUMMARIES

_METAVARS = {"<int range>": "<int>", "<float range>": "<float>"}


class _ExamplesAsWritten:
    def format_epilog(self, ctx: Any, formatter: Any) -> None:
        # Examples are laid out by hand: click would join their lines into one paragraph.
        if self.epilog:  # type: ignore[attr-defined]
            formatter.write_paragraph()
            for line in self.epilog.rstrip().splitlines():  # type: ignore[attr-defined]
                formatter.write(f"  {line}\n" if line else "\n")


class PyllamaCommand(_ExamplesAsWritten, TyperCommand):
    """A command whose help groups options by panel and reads in pyllama's words."""

    def format_options(self, ctx: Any, formatter: Any) -> None:
        sections: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            title = "Arguments" if param.param_type_name == "argument" else (
                getattr(param, "rich_help_panel", None) or "Options")
            sections.setdefault(title, []).append((_metavar_in_words(record[0]), _range_in_words(record[1])))
        for title in sorted(sections, key=lambda t: (t != "Arguments", t != "Options")):  # stable otherwise
            with formatter.section(title):
                formatter.write_dl(sections[title])


class PyllamaGroup(_ExamplesAsWritten, TyperGroup):
    """A command group; `pyllama`'s own help lists every command from command_table.SUMMARIES, loaded or not."""

    def format_commands(self, ctx: Any, formatter: Any) -> None:

        if ctx.parent is not None:  # `pyllama completion`: its commands are loaded
            super().format_commands(ctx, formatter)
            return

        with formatter.section("Commands"):
            formatter.write_dl([(name, f"{summary}.") for name, summary in SUMMARIES.items()
                                if name not in HIDDEN_ALIASES])


def _metavar_in_words(names: str) -> str:
    for click_name, ours in _METAVARS.items():
        names = names.replace(click_name, ours)
    return names


_RANGE = re.compile(r"(?P<lo>-?[\d.]+)?(?P<lop><=?)?x(?P<hop>[<>]=?)(?P<hi>-?[\d.]+)")


def _range_in_words(help_text: str) -> str:
    """`[default: 1; x>=1]` → `[default: 1; at least 1]`, as the rest of pyllama words a range."""
    return _RANGE.sub(lambda m: _describe(m.group("lo"), m.group("lop"), m.group("hop"), m.group("hi")), help_text)


def _describe(lo: str | None, lop: str | None, hop: str, hi: str) -> str:
    if lo is not None:
        return f"from {lo} to {hi}"
    return {">=": f"at least {hi}", ">": f"more than {hi}", "<=": f"at most {hi}", "<": f"less than {hi}"}[hop]


def range_words(param_type: Any) -> str | None:
    """A number range type's bounds in words ("at least 1", "0 to 65535"); None if unbounded."""
    low, high = getattr(param_type, "min", None), getattr(param_type, "max", None)
    if low is not None and high is not None:
        return f"from {low} to {high}"
    if low is not None:
        return f"{'more than' if param_type.min_open else 'at least'} {low}"
    if high is not None:
        return f"{'less than' if param_type.max_open else 'at most'} {high}"
    return None


def usage_error(exc: Any, args: list[str], command_names: frozenset[str]) -> tuple[str, str | None]:
    """pyllama's message and hint for a click usage error, or click's own message where no better one
    is known (the hint is then None: the caller's fallback)."""
    kinds = {cls.__name__ for cls in type(exc).__mro__}
    if "NoSuchOption" in kinds:
        return _unknown_option(exc)
    if "BadOptionUsage" in kinds and getattr(exc, "option_name", None):
        return f"{exc.option_name} needs a value", None
    if "MissingParameter" in kinds and getattr(exc, "param", None) is not None:
        return _missing(exc.param)
    if "BadParameter" in kinds and getattr(exc, "param", None) is not None:
        return _bad_value(exc, args)
    if "BadParameter" in kinds and getattr(exc, "param_hint", None):  # raised by a command, not a type
        names = exc.param_hint if isinstance(exc.param_hint, str) else "/".join(exc.param_hint)
        return f"{names.replace(chr(39), '').replace(' / ', '/')}: {exc.message}", None
    if args and not args[0].startswith("-") and args[0] not in command_names:
        close = difflib.get_close_matches(args[0], sorted(command_names), n=1, cutoff=0.7)
        return f"unknown command {args[0]!r}", (f"did you mean `pyllama {close[0]}`?" if close else None)
    return " ".join(exc.format_message().split()), None  # click wraps long lists


def _unknown_option(exc: Any) -> tuple[str, str | None]:
    # Click suggests the nearest name however far it is (--bogus → --verbose); only a near one helps.
    close = difflib.get_close_matches(exc.option_name, list(exc.possibilities or ()), n=1, cutoff=0.75)
    return f"unknown option {exc.option_name}", (f"did you mean {close[0]}?" if close else None)


def _missing(param: Any) -> tuple[str, str | None]:
    what = f"the {_flag(param)} argument" if param.param_type_name == "argument" else _flag(param)
    choices = getattr(param.type, "choices", None)
    return f"missing {what}", (f"choose one of: {', '.join(map(str, choices))}" if choices else None)


def _bad_value(exc: Any, args: list[str]) -> tuple[str, str | None]:
    param = exc.param
    flag, value = _flag(param), _value_given(args, param.opts) or _value_in(exc.message)
    type_name = getattr(param.type, "name", "")
    bounds = range_words(param.type)
    choices = getattr(param.type, "choices", None)
    if choices is not None and value is not None:  # worded as pyllama's own choice errors are
        return f"{flag} {value!r} is not one of {', '.join(map(str, choices))}", None
    if type_name in ("int", "integer", "int range", "integer range", "float", "float range") and value is not None:
        whole = type_name.startswith("int")
        if _parses(value, int if whole else float):  # a number, out of range
            return f"{flag} must be {bounds} (got {value})", None
        kind = "a whole number" if whole else "a number"
        return f"{flag} takes {kind}, not {value!r}", (f"{flag} takes {kind}, {bounds}" if bounds else None)
    return f"{flag}: {exc.message.rstrip('.')}", None


def _flag(param: Any) -> str:
    if param.param_type_name == "argument":
        return (param.human_readable_name or "").upper()
    return "/".join(param.opts)


def _value_in(message: str) -> str | None:
    """The value at the start of click's conversion message ("'warm' is not a valid float range.")."""
    match = re.match(r"'(.*)' is not ", message)
    return match.group(1) if match else None


def _value_given(args: list[str], names: list[str]) -> str | None:
    """The value the command line gave one of `names` last (`-n 5`, `--n-predict=5`)."""
    found = None
    for i, arg in enumerate(args):
        for name in names:
            if arg == name and i + 1 < len(args):
                found = args[i + 1]
            elif arg.startswith(f"{name}="):
                found = arg[len(name) + 1:]
    return found


def _parses(text: str, kind: type) -> bool:
    try:
        kind(text)
    except ValueError:
        return False
    return True
