"""GBNF expressions for ranges: the JSON numbers within bounds, and an item repeated m to n times.

llama-cpp-python's schema converter ignores "minimum" and "maximum". Integers are spelled out digit by
digit (`integer_range_gbnf`); other numbers as an integer part and a fraction, where only the two end
integer parts need their fraction constrained, again digit by digit (`number_range_gbnf`). Bounded numbers
are written without an exponent, with the converter's digit counts: at most 16 before and after the point
on a side without a limit.

The converter writes lengths and item counts as optional groups nested one per item, which llama.cpp
refuses past about a thousand; `repeat_gbnf` writes them with `{m,n}` as llama.cpp's own converter does.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

# Digits of an integer (part) that has no upper (or lower) limit, as in the converter's integral-part rule.
UNBOUNDED_DIGITS = 16
# Digits after the point, as in the converter's decimal-part rule.
FRACTION_DIGITS = 16
# llama.cpp's MAX_REPETITION_THRESHOLD: its grammar parser refuses a repeat minimum above this, reads a
# larger maximum as "no maximum", and refuses a repeated item whose rules times the count pass it.
MAX_REPETITION = 2000
_ANY_FRACTION = f'("." [0-9]{{1,{FRACTION_DIGITS}}})?'


@dataclass(frozen=True)
class Limit:
    """One end of a range of numbers."""

    value: Decimal
    exclusive: bool


# A bound on a fraction: its digits after the point (no trailing zeros) and whether it is exclusive.
_FractionBound = tuple[str, bool]
_OUT = "out"  # a first digit that puts the fraction past its bound


# ---------------------------------------------------------------- integers


def integer_range_gbnf(low: int | None, high: int | None) -> str:
    """A GBNF expression for exactly the JSON integers from `low` to `high` (None: no limit on that side).

    A side without a limit stops at UNBOUNDED_DIGITS digits, as the converter's plain integers do.
    """
    alternatives = []
    if high is None or high >= 0:
        alternatives.append(_naturals(max(low, 0) if low is not None else 0, high))
    if low is None or low < 0:
        # A negative integer is "-" and a magnitude; "-0" is left out.
        alternatives.append(f'"-" {_group(_naturals(1 if high is None or high >= 0 else -high, None if low is None else -low))}')
    return " | ".join(alternatives)


def _naturals(low: int, high: int | None) -> str:
    """Decimal numbers without leading zeros from `low` to `high` (None: up to the unbounded digit count)."""
    if high is None:
        high = 10 ** max(UNBOUNDED_DIGITS, len(str(low))) - 1
    low_text, high_text = str(low), str(high)
    if len(low_text) == len(high_text):
        return _same_width(low_text, high_text)
    # Three parts: the rest of low's width, every number of the widths in between, the start of high's width
    # (all of that width when high is 99...9).
    high_is_full = high_text == "9" * len(high_text)
    widest_full = len(high_text) if high_is_full else len(high_text) - 1
    parts = [_same_width(low_text, "9" * len(low_text))]
    if widest_full > len(low_text):
        parts.append(f"[1-9] {_any_digits(len(low_text), widest_full - 1)}")
    if not high_is_full:
        parts.append(_same_width("1" + "0" * (len(high_text) - 1), high_text))
    return " | ".join(_group(part) for part in parts)


def _same_width(low: str, high: str) -> str:
    """Digit strings of one width (leading zeros allowed) from `low` to `high`, built digit by digit."""
    width = len(low)
    if low == high:
        return f'"{low}"'
    if low == "0" * width and high == "9" * width:
        return _any_digits(width, width)
    common = next(i for i in range(width) if low[i] != high[i])
    if common:
        return f'"{low[:common]}" {_group(_same_width(low[common:], high[common:]))}'
    if width == 1:
        return _digit_class(int(low), int(high))
    rest = width - 1
    first, last = int(low[0]), int(high[0])
    parts = []
    if low[1:] != "0" * rest:  # low's leading digit only reaches up from low
        parts.append(f'"{low[0]}" {_group(_same_width(low[1:], "9" * rest))}')
        first += 1
    if high[1:] != "9" * rest:  # and high's only reaches up to high
        last -= 1
    if first <= last:
        parts.append(f"{_digit_class(first, last)} {_any_digits(rest, rest)}")
    if high[1:] != "9" * rest:
        parts.append(f'"{high[0]}" {_group(_same_width("0" * rest, high[1:]))}')
    return " | ".join(parts)


# ---------------------------------------------------------------- numbers


def number_range_gbnf(low: Limit | None, high: Limit | None) -> str | None:
    """A GBNF expression for exactly the JSON numbers (no exponent) within `low` and `high`, or None when
    no number with at most FRACTION_DIGITS digits after the point is (1e-20 to 2e-20)."""
    alternatives = []
    if high is None or high.value > 0 or (high.value == 0 and not high.exclusive):
        start = low if low is not None and low.value >= 0 else Limit(Decimal(0), False)
        alternatives.append(_magnitudes(start, high))
    if low is None or low.value < 0:
        # -x for x from -high (or just above 0) up to -low: the two bounds change sides. "-0" is left out.
        start = Limit(-high.value, high.exclusive) if high is not None and high.value < 0 else Limit(Decimal(0), True)
        end = Limit(-low.value, low.exclusive) if low is not None else None
        magnitudes = _magnitudes(start, end)
        alternatives.append(f'"-" {_group(magnitudes)}' if magnitudes else None)
    found = [a for a in alternatives if a]
    return " | ".join(found) if found else None


def _magnitudes(low: Limit, high: Limit | None) -> str | None:
    """Numbers without sign or exponent from `low` (at least 0) to `high`: an integer part, maybe a fraction."""
    first, low_digits = _split(low.value)
    # A lower bound with no fraction that is not exclusive puts no constraint on the fraction.
    low_fraction = None if low_digits == "" and not low.exclusive else (low_digits, low.exclusive)
    if high is None:
        last, high_fraction = None, None
    else:
        last, high_digits = _split(high.value)
        high_fraction = (high_digits, high.exclusive)
    if first == last:
        parts = [_integer_and_fraction(first, low_fraction, high_fraction)]
    else:
        parts = [_integer_and_fraction(first, low_fraction, None)]
        if last is None or first + 1 <= last - 1:
            parts.append(f"{_group(_naturals(first + 1, None if last is None else last - 1))} {_ANY_FRACTION}")
        if last is not None:
            parts.append(_integer_and_fraction(last, None, high_fraction))
    found = [_group(p) for p in parts if p]
    return " | ".join(found) if found else None


def _split(value: Decimal) -> tuple[int, str]:
    """The integer part of `value` (at least 0) and the digits of its fraction, without trailing zeros."""
    whole = int(value)
    fraction = format(value - whole, "f")
    return whole, fraction.partition(".")[2].rstrip("0")


def _integer_and_fraction(whole: int, low: _FractionBound | None, high: _FractionBound | None) -> str | None:
    no_fraction_ok, fractions = _fractions(low, high, FRACTION_DIGITS)
    if fractions is None:
        return f'"{whole}"' if no_fraction_ok else None
    if no_fraction_ok:
        return f'"{whole}" ("." {_group(fractions)})?'
    return f'"{whole}" "." {_group(fractions)}'


def _fractions(low: _FractionBound | None, high: _FractionBound | None, room: int) -> tuple[bool, str | None]:
    """The digit strings D after a point, at most `room` long, with 0.D within the bounds.

    Returns whether D may be empty (the value 0, written without a fraction) and an expression for the
    non-empty ones (None: there are none). Each bound is followed digit by digit: a first digit past it
    leaves no D, one equal to it carries the rest of the bound to the next digit, one inside frees that side.
    """
    empty_ok = low is None and high != ("", True)
    if room == 0:
        return empty_ok, None
    branches: dict[tuple[_FractionBound | None, _FractionBound | None], list[int]] = {}
    for digit in range(10):
        low_rest, high_rest = _rest(low, digit, above=True), _rest(high, digit, above=False)
        if _OUT not in (low_rest, high_rest):
            branches.setdefault((low_rest, high_rest), []).append(digit)
    alternatives = []
    for (low_rest, high_rest), digits in branches.items():
        if low_rest is None and high_rest is None:
            rest: tuple[bool, str | None] = (True, _any_digits(1, room - 1) if room > 1 else None)
        else:
            rest = _fractions(low_rest, high_rest, room - 1)
        alternatives.append(_then(_digit_class(digits[0], digits[-1]), rest))
    found = [a for a in alternatives if a]
    return empty_ok, " | ".join(found) if found else None


def _rest(bound: _FractionBound | None, digit: int, *, above: bool) -> _FractionBound | str | None:
    """What is left of a fraction bound after `digit`: None (no constraint), _OUT, or the bound's next digits."""
    if bound is None:
        return None
    digits, exclusive = bound
    own = int(digits[0]) if digits else 0  # past its digits a bound continues with zeros
    if digit == own:
        rest = (digits[1:], exclusive)
        # "at least 0.000..." holds for every fraction; "at most" / "less than" 0 still constrain.
        return None if above and rest == ("", False) else rest
    return None if (digit > own) == above else _OUT


def _then(first: str, rest: tuple[bool, str | None]) -> str | None:
    may_end, more = rest
    if more is None:
        return first if may_end else None
    return f"{first} ({more})?" if may_end else f"{first} {_group(more)}"


# ---------------------------------------------------------------- counts


def repeat_gbnf(item: str, low: int, high: int | None) -> str:
    """`item`, a rule name, `low` to `high` times (None: no limit) in repeats llama.cpp accepts ("" for none).

    A rule reference counts as one rule for llama.cpp's limit, so `item{0,2000}` is fine; counts past
    MAX_REPETITION are split into runs of at most that many.
    """
    runs, rest = divmod(low, MAX_REPETITION)
    parts = [_exactly(item, MAX_REPETITION)] * runs + ([_exactly(item, rest)] if rest else [])
    if high is None:
        parts.append(f"{item}*")
    elif high > low:
        parts.append(_up_to(item, high - low))
    return " ".join(parts)


def _exactly(item: str, times: int) -> str:
    return item if times == 1 else f"{item}{{{times}}}"


def _up_to(item: str, most: int) -> str:
    """0 to `most` copies of `item`, with one way to match each count.

    Two runs side by side (item{0,2000} item{0,1000}) could split the same items many ways, and llama.cpp
    follows every split at once; so a full run and the rest is one alternative, a shorter run the other.
    """
    if most <= MAX_REPETITION:
        return f"{item}?" if most == 1 else f"{item}{{0,{most}}}"
    full = _exactly(item, MAX_REPETITION)
    return f"({full} {_up_to(item, most - MAX_REPETITION)} | {item}{{0,{MAX_REPETITION - 1}}})"


# ---------------------------------------------------------------- GBNF pieces


def _digit_class(first: int, last: int) -> str:
    return f'"{first}"' if first == last else f"[{first}-{last}]"


def _any_digits(least: int, most: int) -> str:
    if most == 1 and least == 1:
        return "[0-9]"
    return f"[0-9]{{{least}}}" if least == most else f"[0-9]{{{least},{most}}}"


def _group(expression: str) -> str:
    return f"({expression})" if "|" in expression else expression
