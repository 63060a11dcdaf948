"""Parse llama-bench style multi-valued parameters: `1,2,4`, `1-8`, `1-8+2`, `1-16*2`.

Each flag may be repeated; the values of all its occurrences are concatenated in order.
Every malformed or empty value is a `UsageError` naming the flag, never an empty sweep.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ...errors import UsageError

# first[-last[(+|*)step]], as llama-bench's parse_int_range reads it.
_RANGE = re.compile(r"^(-?\d+)(?:-(\d+)(?:([+*])(\d+))?)?$")
_RANGE_HINT = "write values as 1,2,4 or ranges as first-last, first-last+step or first-last*factor"
# More values than any sweep can run: a range such as 1-100000000 is a typo, and expanding it would
# exhaust memory before the first test.
MAX_VALUES = 100_000
_TRUE = ("1", "on", "true", "yes", "enabled")
_FALSE = ("0", "off", "false", "no", "disabled")


def parse_int_range(text: str, *, flag: str = "", allow_negative: bool = False) -> list[int]:
    """Expand one comma-separated value list with ranges into integers.

    Raises:
        UsageError: a malformed item, a negative value where none is allowed, a range that is
            empty (first > last) or does not advance (a `*1` step, a `*` range from 0).
    """
    values: list[int] = []
    for item in _items(text, flag):
        values.extend(_expand(item, text, flag, allow_negative))
    return values


def _items(text: str, flag: str) -> list[str]:
    items = [item.strip() for item in text.split(",")]
    if items and items[-1] == "" and len(items) > 1:
        items.pop()  # llama-bench accepts a trailing comma
    if not items or any(item == "" for item in items):
        raise UsageError(f"{flag} {text!r}: empty value", hint=_RANGE_HINT)
    return items


def _expand(item: str, text: str, flag: str, allow_negative: bool) -> list[int]:
    match = _RANGE.match(item)
    if not match:
        raise UsageError(f"{flag} {text!r}: {item!r} is not a number or range", hint=_RANGE_HINT)
    first = int(match[1])
    last = int(match[2]) if match[2] is not None else first
    op, step = match[3] or "+", int(match[4]) if match[4] is not None else 1
    if not allow_negative and min(first, last) < 0:
        raise UsageError(f"{flag} {text!r}: negative values are not allowed", hint=_RANGE_HINT)
    if first > last:
        raise UsageError(f"{flag} {text!r}: the range {item} is empty (first > last)", hint=_RANGE_HINT)
    values, value = [], first
    while value <= last:
        if len(values) == MAX_VALUES:
            raise UsageError(f"{flag} {text!r}: the range {item} has more than {MAX_VALUES} values",
                             hint="use a step (first-last+step) or a factor (first-last*factor)")
        values.append(value)
        nxt = value + step if op == "+" else value * step
        if nxt <= value:
            raise UsageError(f"{flag} {text!r}: the range {item} never advances", hint=_RANGE_HINT)
        value = nxt
    return values


def parse_int_values(raw: Sequence[str] | None, default: Sequence[int], *, flag: str,
                     allow_negative: bool = False, minimum: int | None = None,
                     maximum: int | None = None) -> list[int]:
    """All values of a repeatable integer flag, or `default` when the flag was not given."""
    if not raw:
        return list(default)
    values = [v for text in raw for v in parse_int_range(text, flag=flag, allow_negative=allow_negative)]
    if minimum is not None and any(v < minimum for v in values):
        raise UsageError(f"{flag}: every value must be at least {minimum}, got {_listed(values)}",
                         hint=f"e.g. {flag} {max(minimum, 1)}")
    if maximum is not None and any(v > maximum for v in values):
        raise UsageError(f"{flag}: every value must be at most {maximum}, got {_listed(values)}",
                         hint="llama.cpp takes no more")
    return values


def _listed(values: list[int], shown: int = 8) -> str:
    """The values for a message; a range can expand to thousands, so a long list is cut short."""
    if len(values) <= shown:
        return ",".join(map(str, values))
    return f"{','.join(map(str, values[:shown - 1]))},...,{values[-1]} ({len(values)} values)"


def parse_bool_values(raw: Sequence[str] | None, default: Sequence[bool], *, flag: str) -> list[bool]:
    """Values of a repeatable 0|1 flag (on/off/true/false also accepted)."""
    if not raw:
        return list(default)
    values = []
    for text in raw:
        for item in _items(text, flag):
            low = item.lower()
            if low not in _TRUE + _FALSE:
                raise UsageError(f"{flag} {text!r}: {item!r} is not 0 or 1", hint=f"write {flag} 0, {flag} 1 or {flag} 0,1")
            values.append(low in _TRUE)
    return values


def parse_choice_values(raw: Sequence[str] | None, default: Sequence[str], *, flag: str,
                        choices: dict[str, str]) -> list[str]:
    """Values of a repeatable flag with named choices; `choices` maps each accepted spelling to its name."""
    if not raw:
        return list(default)
    values = []
    for text in raw:
        for item in _items(text, flag):
            name = choices.get(item.lower())
            if name is None:
                names = sorted(set(choices.values()))
                raise UsageError(f"{flag} {text!r}: {item!r} is not one of {', '.join(names)}",
                                 hint=f"e.g. {flag} {','.join(names[:2])}")
            values.append(name)
    return values


def parse_pairs(raw: Sequence[str] | None, *, flag: str) -> list[tuple[int, int]]:
    """Values of a repeatable `pp,tg` flag (llama-bench's -pg): one pair per occurrence."""
    pairs = []
    for text in raw or ():
        parts = [p.strip() for p in text.split(",")]
        if len(parts) != 2 or not all(re.fullmatch("[0-9]+", p) for p in parts):  # int() chokes on "²"
            raise UsageError(f"{flag} {text!r}: expected two numbers PROMPT,GEN", hint=f"e.g. {flag} 512,128")
        pairs.append((int(parts[0]), int(parts[1])))
    return pairs
