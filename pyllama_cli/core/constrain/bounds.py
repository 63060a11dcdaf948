"""How much grammar one request may make a server build: its size, and the time its building takes.

A grammar's cost does not end when it is built: llama.cpp follows every alternative it allows at each
sampled token, so a 349 KB JSON-schema enum costs about 0.3 s per token at first, on the thread that
generates for every slot. Bounding the grammar's size bounds that; bounding the build time stops a
schema whose conversion grows far beyond its text. Both answer a request with a 400, never a stall.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ...errors import InputError

DEFAULT_MAX_GRAMMAR_SIZE = 128 * 1024  # bytes of GBNF: a 4,000-string enum, tool schemas of any usual size
DEFAULT_MAX_GRAMMAR_SECONDS = 2.0  # seconds to turn a schema into a grammar and parse it (0.1 s at the size cap)

_HINT = "send a smaller schema or grammar (a long enum: a plain string and a check of the answer), or restart the " \
        "server with a larger --max-grammar-size / --max-grammar-seconds"


@dataclass(frozen=True)
class GrammarBounds:
    max_size: int = DEFAULT_MAX_GRAMMAR_SIZE
    max_seconds: float = DEFAULT_MAX_GRAMMAR_SECONDS

    def check_size(self, text: str, what: str) -> None:
        """Refuse `what` (a grammar, or the schema it comes from) past the size cap; a schema is
        refused by its own size before it is converted, as its grammar is at least about as large."""
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > self.max_size:
            raise InputError(f"{what} is {size} bytes, more than the server's limit of {self.max_size} bytes "
                             "for a grammar", hint=_HINT)

    def check_time(self, started: float, what: str) -> None:
        took = time.perf_counter() - started
        if took > self.max_seconds:
            raise InputError(f"building the grammar of {what} took {took:.1f} s, more than the server's limit of "
                             f"{self.max_seconds:g} s", hint=_HINT)
