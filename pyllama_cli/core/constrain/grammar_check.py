"""The GBNF syntax checker: a reading of grammar text that mirrors llama.cpp's grammar parser.

It follows llama.cpp's parser closely enough that a grammar it accepts is one llama.cpp accepts,
and it reports the first problem with its position before any model loads (llama.cpp itself only
logs a message and returns no sampler). `grammar.check_grammar` turns that position into a line
and column.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field

from .number_ranges import MAX_REPETITION

_NAME_CHARS = re.compile(r"[A-Za-z0-9-]")
_ESCAPES = {"t": "\t", "r": "\r", "n": "\n", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-"}
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}
TOKEN_ID = re.compile(r"<\[([0-9]+)\]>")
# Past the last Unicode character: no token can hold it.
LAST_CODE_POINT = 0x10FFFF
# llama.cpp parses groups recursively and overflows its stack on very deep nesting (a segfault near
# 50,000 levels); real grammars nest a few levels, JSON-schema grammars up to a schema's maxLength.
MAX_GROUP_DEPTH = 2048


class GrammarSyntaxError(Exception):
    def __init__(self, message: str, pos: int, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.pos = pos
        self.hint = hint


def check_syntax(text: str) -> _Checker:
    """Raise GrammarSyntaxError for the first thing in GBNF `text` that llama.cpp would refuse or cannot run;
    return the checker, which has read the whole grammar."""
    # The checker recurses four frames per nested group; allow MAX_GROUP_DEPTH of them.
    # Only ever raised, never lowered, so checks running in other threads are not cut short.
    needed = 4 * MAX_GROUP_DEPTH + 1000
    if sys.getrecursionlimit() < needed:
        sys.setrecursionlimit(needed)
    checker = _Checker(text)
    checker.check()
    return checker


@dataclass
class _Rule:
    pos: int
    # Alternatives, each a list of elements: ("lit", nullable[, empty]) for terminals, ("ref", name, pos), ("group", alts, mod)
    alternatives: list[list[tuple]] = field(default_factory=list)


class _Checker:
    """A recursive-descent reading of GBNF with llama.cpp's rules for spaces, names, escapes and repeats."""

    def __init__(self, text: str):
        self.text = text
        self.rules: dict[str, _Rule] = {}
        self.depth = 0  # groups open around the current position
        self.unbounded: list[tuple[tuple, int]] = []  # (element, pos) under *, + or {n,}
        # llama.cpp's symbol table: rule names seen so far, plus the rules it makes for groups and repeats.
        self.names: set[str] = set()
        self.made = 0
        self.token_refs: list[tuple[int, str]] = []  # (pos, "<[1234]>" or "<|im_end|>"), checked once a model is loaded

    def check(self) -> None:
        self.check_encoding()
        pos = self.space(0, newlines=True)
        while pos < len(self.text):
            pos = self.rule(pos)
        if "root" not in self.rules:
            raise GrammarSyntaxError("the grammar has no 'root' rule", len(self.text))
        self.check_references()
        self.check_repeated_empty()
        self.check_left_recursion()

    def check_encoding(self) -> None:
        # Bytes that are not UTF-8 reach Python's argv as lone surrogates, which cannot be passed on to llama.cpp.
        bad = re.search("[\ud800-\udfff]", self.text)
        if bad:
            raise GrammarSyntaxError("the grammar is not valid UTF-8", bad.start())

    @property
    def symbols(self) -> int:
        return len(self.names) + self.made

    # ---- lexical helpers

    def peek(self, pos: int) -> str:
        return self.text[pos] if pos < len(self.text) else ""

    def space(self, pos: int, newlines: bool) -> int:
        while pos < len(self.text):
            c = self.text[pos]
            if c in " \t" or (newlines and c in "\r\n"):
                pos += 1
            elif c == "#":
                while pos < len(self.text) and self.text[pos] not in "\r\n":
                    pos += 1
            else:
                break
        return pos

    def name(self, pos: int) -> tuple[str, int]:
        end = pos
        while end < len(self.text) and _NAME_CHARS.match(self.text[end]):
            end += 1
        if end == pos:
            raise GrammarSyntaxError(f"expected a rule name, found {self.describe(pos)}", pos)
        self.names.add(self.text[pos:end])
        return self.text[pos:end], end

    def describe(self, pos: int) -> str:
        return "the end of the grammar" if pos >= len(self.text) else repr(self.text[pos])

    def char(self, pos: int) -> tuple[int, int]:
        """Read one (possibly escaped) character of a literal or class: the position after it, and its code point."""
        if pos >= len(self.text):
            raise GrammarSyntaxError("unexpected end of the grammar", pos)
        if self.text[pos] != "\\":
            return pos + 1, ord(self.text[pos])
        esc = self.peek(pos + 1)
        if esc in _ESCAPES:
            return pos + 2, ord(_ESCAPES[esc])
        if esc in _HEX_ESCAPES:
            digits = self.text[pos + 2:pos + 2 + _HEX_ESCAPES[esc]]
            if len(digits) != _HEX_ESCAPES[esc] or not all(c in "0123456789abcdefABCDEF" for c in digits):
                raise GrammarSyntaxError(f"expected {_HEX_ESCAPES[esc]} hex digits after \\{esc}", pos)
            if int(digits, 16) > LAST_CODE_POINT:
                raise GrammarSyntaxError(f"\\{esc}{digits} is past U+10FFFF, the last Unicode character", pos)
            return pos + 2 + len(digits), int(digits, 16)
        if not esc:
            raise GrammarSyntaxError("unexpected end of the grammar", pos)
        raise GrammarSyntaxError(f"unknown escape \\{esc}", pos)

    # ---- grammar structure

    def rule(self, pos: int) -> int:
        start = pos
        name, pos = self.name(pos)
        pos = self.space(pos, newlines=False)
        if not self.text.startswith("::=", pos):
            raise GrammarSyntaxError(f"expected '::=' after rule name {name!r}, found {self.describe(pos)}", pos)
        pos = self.space(pos + 3, newlines=True)
        rule = _Rule(start)
        pos = self.alternates(pos, rule.alternatives, nested=False)
        if name in self.rules:
            raise GrammarSyntaxError(f"rule {name!r} is defined twice", start)
        self.rules[name] = rule
        if pos < len(self.text) and self.text[pos] not in "\r\n":
            raise GrammarSyntaxError(f"expected the end of the line, found {self.describe(pos)}", pos)
        return self.space(pos, newlines=True)

    def alternates(self, pos: int, out: list[list[tuple]], nested: bool) -> int:
        seq: list[tuple] = []
        pos = self.sequence(pos, seq, nested)
        out.append(seq)
        while self.peek(pos) == "|":
            pos = self.space(pos + 1, newlines=True)
            seq = []
            pos = self.sequence(pos, seq, nested)
            out.append(seq)
        return pos

    def sequence(self, pos: int, seq: list[tuple], nested: bool) -> int:
        weight = 1  # how many rules llama.cpp counts the last item as, for its limit on repeats
        while pos < len(self.text):
            c = self.text[pos]
            if c in "*+?{":
                if not seq:
                    raise GrammarSyntaxError(f"{c!r} must follow something to repeat", pos)
                if seq[-1][0] == "lit" and seq[-1][2:] == (True,):
                    # llama.cpp emits nothing for "" or [] and then finds nothing to repeat.
                    raise GrammarSyntaxError(f"{c!r} follows an empty literal or class: nothing to repeat", pos)
                pos, seq[-1], weight = self.repetition(pos, seq[-1], weight, nested)
                pos = self.space(pos, nested)
                continue
            before = self.symbols
            pos, element = self.element(pos)
            if element is None:
                break
            # A group counts the rules made inside it (and names first seen there); anything else counts as one.
            weight = max(1, self.symbols - before)
            seq.append(element)
            pos = self.space(pos, nested)
        return pos

    def element(self, pos: int) -> tuple[int, tuple | None]:
        c = self.text[pos]
        if c == '"':
            return self.literal(pos)
        if c == "[":
            return self.char_class(pos)
        if c == "(":
            return self.group(pos)
        if c == ".":
            return pos + 1, ("lit", False)
        if c in "!<":
            return self.token(pos)
        if _NAME_CHARS.match(c):
            name, end = self.name(pos)
            return end, ("ref", name, pos)
        return pos, None

    def group(self, pos: int) -> tuple[int, tuple]:
        start = pos
        self.depth += 1
        if self.depth > MAX_GROUP_DEPTH:
            raise GrammarSyntaxError(f"groups are nested more than {MAX_GROUP_DEPTH} deep", start)
        self.made += 1
        alts: list[list[tuple]] = []
        pos = self.alternates(self.space(pos + 1, newlines=True), alts, nested=True)
        if self.peek(pos) != ")":
            raise GrammarSyntaxError(f"expected ')', found {self.describe(pos)}", pos)
        self.depth -= 1
        return pos + 1, ("group", alts, "")

    def literal(self, pos: int) -> tuple[int, tuple]:
        """A quoted string: ("lit", nullable, empty)."""
        start, pos = pos, pos + 1
        while self.peek(pos) != '"':
            if pos >= len(self.text):
                raise GrammarSyntaxError("unterminated string literal", start)
            char_pos = pos
            pos, code = self.char(pos)
            if code == 0:  # llama.cpp's token texts are C strings
                raise GrammarSyntaxError("a NUL character (\\x00) can never be generated: no token holds one",
                                         char_pos)
        empty = pos == start + 1
        return pos + 1, ("lit", empty, empty)

    def char_class(self, pos: int) -> tuple[int, tuple]:
        start, pos = pos, pos + 1
        negated = self.peek(pos) == "^"
        pos += negated
        first = pos
        ranges = []
        while self.peek(pos) != "]":
            if pos >= len(self.text):
                raise GrammarSyntaxError("unterminated character class", start)
            low_pos = pos
            pos, low = self.char(pos)
            high = low
            if self.peek(pos) == "-" and self.peek(pos + 1) not in ("]", ""):
                pos, high = self.char(pos + 1)
                if high < low:
                    raise GrammarSyntaxError(f"character range {self.text[low_pos:pos]} runs backwards, so it "
                                             "matches nothing", low_pos, hint="write the lower character first")
            ranges.append((low, high))
        if negated and ranges and _covers_all(ranges):
            raise GrammarSyntaxError(f"character class {self.text[start:pos + 1]} matches no character", start)
        only_nul = _covers_all([*ranges, (0, 0)]) if negated else all(high == 0 for _, high in ranges)
        if ranges and only_nul:
            raise GrammarSyntaxError(f"character class {self.text[start:pos + 1]} matches only NUL, which no token "
                                     "holds", start)
        return pos + 1, ("lit", False, pos == first)

    def token(self, pos: int) -> tuple[int, tuple]:
        """A token reference such as <[1234]> or <|im_end|>, optionally negated with '!'."""
        start = pos
        if self.peek(pos) == "!":
            pos += 1
        if self.peek(pos) != "<":
            raise GrammarSyntaxError(f"expected '<' after '!', found {self.describe(pos)}", pos)
        end = self.text.find(">", pos)
        if end < 0 or "\n" in self.text[pos:end]:
            raise GrammarSyntaxError("unterminated token reference", start)
        reference = self.text[pos:end + 1]
        if reference.startswith("<[") and not TOKEN_ID.fullmatch(reference):
            raise GrammarSyntaxError(f"{reference} is not a token id reference",
                                     pos, hint="a token id is written <[1234]>; a token by its text <|im_end|>")
        self.token_refs.append((pos, reference))
        return end + 1, ("lit", False)

    def repetition(self, pos: int, element: tuple, weight: int, nested: bool) -> tuple[int, tuple, int]:
        """Read *, +, ? or {m,n} after `element`: the position after it, the repeated element, and its new weight."""
        start = pos
        if self.text[pos] == "{":
            low, high, pos = self.counts(pos, nested)
        else:
            low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[self.text[pos]]
            pos += 1
        self.check_repeat_size(start, pos, weight, low, high)
        self.made += 1 if high is None else high - low  # the rules llama.cpp makes for the optional copies
        if high is None:
            self.unbounded.append((element, start))
        return pos, (element if low else ("group", [[element]], "optional")), weight * _repeat_total(low, high)

    def counts(self, brace: int, nested: bool) -> tuple[int, int | None, int]:
        """Read {m}, {m,} or {m,n}: m, n (None: no maximum, as llama.cpp reads one above its limit), the end."""
        pos = self.space(brace + 1, nested)
        low, pos = self.integer(pos, optional=True)
        if low is None:
            raise GrammarSyntaxError("a repetition needs its minimum count first, as in {2}, {0,3} or {2,}", brace)
        pos = self.space(pos, nested)
        high: int | None = low
        if self.peek(pos) == ",":
            high, pos = self.integer(self.space(pos + 1, nested), optional=True)
            pos = self.space(pos, nested)
        if self.peek(pos) != "}":
            raise GrammarSyntaxError(f"expected '}}' to close the repetition, found {self.describe(pos)}", pos)
        if high is not None and high < low:
            raise GrammarSyntaxError(f"repetition {{{low},{high}}} has a maximum below its minimum", brace)
        if low > MAX_REPETITION:
            raise GrammarSyntaxError(f"repetition {{{low}...}} repeats more than llama.cpp's limit of {MAX_REPETITION}",
                                     brace)
        return low, (None if high is None or high > MAX_REPETITION else high), pos + 1

    def check_repeat_size(self, start: int, end: int, weight: int, low: int, high: int | None) -> None:
        """llama.cpp refuses to repeat an item whose rule count times the repeat count passes its limit."""
        total = _repeat_total(low, high)
        if weight * total <= MAX_REPETITION:
            return
        op = self.text[start:end]
        size = f"{weight} rules {total} times: {weight * total} rules" if total > 1 else f"{weight} rules"
        raise GrammarSyntaxError(f"repetition {op} repeats an item of {size}, more than llama.cpp's limit of "
                                 f"{MAX_REPETITION}", start,
                                 hint="a rule reference counts as one rule: give the repeated item a rule of its "
                                      "own, e.g. row ::= \"a\"{100} and then row{100}")

    def integer(self, pos: int, optional: bool) -> tuple[int | None, int]:
        end = pos
        while self.peek(end).isdigit() and self.peek(end).isascii():
            end += 1
        if end == pos:
            if optional:
                return None, pos
            raise GrammarSyntaxError(f"expected a number, found {self.describe(pos)}", pos)
        return int(self.text[pos:end]), end

    # ---- whole-grammar checks

    def references(self, alts: list[list[tuple]]) -> Iterator[tuple]:
        for seq in alts:
            for element in seq:
                if element[0] == "ref":
                    yield element
                elif element[0] == "group":
                    yield from self.references(element[1])

    def check_references(self) -> None:
        for rule in self.rules.values():
            for _, name, pos in self.references(rule.alternatives):
                if name not in self.rules:
                    raise GrammarSyntaxError(f"rule {name!r} is used but never defined", pos)

    def nullable_rules(self) -> set[str]:
        """Rules that can match the empty string (fixed point)."""
        nullable: set[str] = set()
        changed = True
        while changed:
            changed = False
            for name, rule in self.rules.items():
                if name not in nullable and self._alts_nullable(rule.alternatives, nullable):
                    nullable.add(name)
                    changed = True
        return nullable

    def _alts_nullable(self, alts: list[list[tuple]], nullable: set[str]) -> bool:
        return any(all(self._nullable(e, nullable) for e in seq) for seq in alts)

    def _nullable(self, element: tuple, nullable: set[str]) -> bool:
        if element[0] == "lit":
            return element[1]
        if element[0] == "ref":
            return element[1] in nullable
        return element[2] == "optional" or self._alts_nullable(element[1], nullable)

    def _left_refs(self, alts: list[list[tuple]], nullable: set[str]) -> set[str]:
        """Rules that can be the first thing matched (llama.cpp cannot run left recursion)."""
        found: set[str] = set()
        for seq in alts:
            for element in seq:
                if element[0] == "ref":
                    found.add(element[1])
                elif element[0] == "group":
                    found |= self._left_refs(element[1], nullable)
                if not self._nullable(element, nullable):
                    break
        return found

    def check_repeated_empty(self) -> None:
        """llama.cpp turns S* into S' ::= S S' | , which it finds left-recursive when S has an empty alternative."""
        for element, pos in self.unbounded:
            if self._has_empty_alternative(element):
                raise GrammarSyntaxError("a repeated item can match the empty string, which makes the repetition "
                                         "left-recursive for llama.cpp", pos)

    def _has_empty_alternative(self, element: tuple) -> bool:
        # llama.cpp's own test is shallow: an alternative with nothing in it ("" emits nothing), not nullability.
        if element[0] == "group":
            return element[2] == "optional" or any(_all_empty(seq) for seq in element[1])
        if element[0] == "ref":
            return any(_all_empty(seq) for seq in self.rules[element[1]].alternatives)
        return False

    def check_left_recursion(self) -> None:
        nullable = self.nullable_rules()
        edges = {name: self._left_refs(rule.alternatives, nullable) for name, rule in self.rules.items()}
        for name in self.rules:
            seen: set[str] = set()
            todo = list(edges[name])
            while todo:
                current = todo.pop()
                if current == name:
                    raise GrammarSyntaxError(f"rule {name!r} is left-recursive, which llama.cpp cannot run",
                                             self.rules[name].pos)
                if current not in seen:
                    seen.add(current)
                    todo.extend(edges.get(current, ()))


def _all_empty(seq: list[tuple]) -> bool:
    return all(e[0] == "lit" and e[2:] == (True,) for e in seq)


def _repeat_total(low: int, high: int | None) -> int:
    """The count llama.cpp multiplies a repeated item's rules by: the maximum, else the minimum, else 1."""
    return high or low or 1


def _covers_all(ranges: list[tuple[int, int]]) -> bool:
    """Whether the code point ranges cover every character, 0 to U+10FFFF."""
    reach = 0  # every code point below this is covered
    for low, high in sorted(ranges):
        if low > reach:
            return False
        reach = max(reach, high + 1)
    return reach > LAST_CODE_POINT
