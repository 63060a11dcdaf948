"""Put the GBNF that pyllama writes for marker constants into llama-cpp-python's converted grammar.

json_schema.prepare_schema swaps what the converter would get wrong (bounded numbers, counted strings and
arrays) for marker constants; the converter writes each as a quoted literal in a rule of its own, and
`splice_markers` replaces those rules' bodies (for an array, the tuple rule that holds the marker), and
gives strings a character rule that keeps them valid JSON.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .number_ranges import repeat_gbnf

_NAME = r"[A-Za-z0-9-]+"
# One character of a JSON string. The converter's own rule lets control characters through raw, which
# JSON forbids (json.loads fails on them): they must be written as escapes.
JSON_STRING_CHAR = r'[^"\\\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})'


@dataclass(frozen=True)
class ItemCount:
    """The item count of an array: its marker sits next to the items' rule in a tuple the converter writes."""

    low: int
    high: int | None


def splice_markers(grammar: str, markers: dict[str, str | ItemCount]) -> str:
    """Put each marker's GBNF where the converter wrote the marker; for an array, in place of the tuple rule.

    A marker may be missing: the converter skips subschemas it does not use (an unused "$defs" entry, "not").
    """
    rules = _Rules(grammar)
    for marker, body in markers.items():
        for holder in rules.with_body(f'"\\"{marker}\\""'):
            if isinstance(body, ItemCount):
                rules.splice_array(holder, body)
            else:
                rules.bodies[holder] = body
    if "char" in rules.bodies or any(_refers_to(body, "char") for body in rules.bodies.values()):
        rules.bodies["char"] = JSON_STRING_CHAR
    return rules.text()


class _Rules:
    """The converter's grammar as rule bodies by name (it writes one rule per line, as `name ::= body`)."""

    def __init__(self, grammar: str):
        self.bodies: dict[str, str] = {}
        last = None
        for line in grammar.split("\n"):
            match = re.match(rf"({_NAME}) ::= (.*)", line)
            if match:
                last = match.group(1)
                self.bodies[last] = match.group(2)
            elif last is not None:  # a raw newline the converter copied from a pattern
                self.bodies[last] += "\n" + line

    def text(self) -> str:
        return "\n".join(f"{name} ::= {body}" for name, body in self.bodies.items())

    def with_body(self, body: str) -> list[str]:
        return [name for name, text in self.bodies.items() if text == body]

    def splice_array(self, holder: str, count: ItemCount) -> None:
        """Rewrite each `"[" space HOLDER "," space ITEM "]" space` as ITEM repeated `count` times."""
        tuple_body = re.compile(rf'"\[" space {re.escape(holder)} "," space ({_NAME}) "\]" space')
        for name, body in list(self.bodies.items()):
            match = tuple_body.fullmatch(body)
            if match:
                item = match.group(1)
                more = self.add(f"{item}-next", f'"," space {item}') if count.high is None or count.high > 1 else ""
                self.bodies[name] = _array_body(item, more, count)
        if not any(_refers_to(body, holder) for name, body in self.bodies.items() if name != holder):
            del self.bodies[holder]

    def add(self, name: str, body: str) -> str:
        """A rule with `body`, named `name` unless that name is taken by another rule (then name0, name1...)."""
        candidate, n = name, 0
        while self.bodies.get(candidate, body) != body:
            candidate, n = f"{name}{n}", n + 1
        self.bodies[candidate] = body
        return candidate


def _array_body(item: str, next_item: str, count: ItemCount) -> str:
    """`count` items separated by commas: `item` first, then `next_item` (a comma and an item) repeated."""
    if count.high == 0:
        return '"[" space "]" space'
    more = repeat_gbnf(next_item, max(count.low - 1, 0), None if count.high is None else count.high - 1)
    items = f"{item} {more}".strip()
    # Not (...)?: llama.cpp counts the rules made inside a group against its limit on repeating it.
    return f'"[" space {items if count.low else f"({items} | )"} "]" space'


def _refers_to(body: str, name: str) -> bool:
    return re.search(rf"(?<![A-Za-z0-9-]){re.escape(name)}(?![A-Za-z0-9-])", body) is not None
