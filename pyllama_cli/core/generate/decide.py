"""The per-token decision every generator makes, written once: `complete`, `chat` and `serve`'s slots.

A `Turn` follows one generation from its prompt to its end. The generator that drives it (the
single-sequence `Generator`, or a slot of the parallel scheduler) samples a token and hands it to
`accept()`, which decides whether generation goes on and what text may be shown:

- end of generation: an end-of-generation token (unless ignore_eos), or a grammar that is finished;
- a stop string: text that might begin one is held back until it is decided, and it is never shown;
- the token budget (`max_tokens`);
- a full context: once the accepted token takes the last position, none is left for another;
- interrupted: checked before each sample (`stop_before_sampling`).

`reusable_prefix()` is the other half the generators share: how much of a sequence's cached tokens
a new prompt may keep.
"""

from __future__ import annotations

import codecs
import time
from collections.abc import Sequence
from dataclasses import dataclass

from .sampling import NO_TOKEN
from .stats import GenerationStats

STOP_EOS = "eos"
STOP_LENGTH = "length"
STOP_STOP = "stop"
STOP_GRAMMAR = "grammar"
STOP_INTERRUPTED = "interrupted"
STOP_CONTEXT = "context"


@dataclass(frozen=True)
class Accepted:
    """What `Turn.accept` decided for one sampled token."""

    counted: bool  # the token is part of the answer (False: it ended generation unseen)
    text: str  # text now safe to show
    stop: str | None  # the stop reason, if generation ends here


class Turn:
    """One generation's decisions and statistics, from the end of its prefill to its last token."""

    def __init__(self, model: object, *, max_tokens: int, stop: Sequence[str], n_ctx: int, ignore_eos: bool,
                 grammar: bool, stats: GenerationStats, started: float | None = None, show_cut_character: bool = False):
        self.model = model
        self.max_tokens = max_tokens
        self.n_ctx = n_ctx
        self.ignore_eos = ignore_eos
        self.grammar = grammar
        self.stats = stats
        self.started = time.perf_counter() if started is None else started
        self.generation_started = 0.0
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._matcher = StopMatcher(stop)
        self.show_cut_character = show_cut_character

    def prefilled(self) -> None:
        """The prompt is in the KV cache: its time is measured, generation's starts."""
        now = time.perf_counter()
        self.stats.prompt_ms = (now - self.started) * 1000
        self.generation_started = now

    def stop_before_sampling(self, interrupted: bool) -> str | None:
        """Whether to end before sampling another token: interrupted, or the budget is spent."""
        if interrupted:
            return STOP_INTERRUPTED
        if 0 <= self.max_tokens <= self.stats.n_generated:
            return STOP_LENGTH
        return None

    def accept(self, token: int, position: int) -> Accepted:
        """Decide on a sampled token; `position` is where it would be evaluated in its sequence."""
        stats = self.stats
        if stats.n_generated == 0:
            stats.ttft_ms = (time.perf_counter() - self.started) * 1000
        if token == NO_TOKEN or (self.model.is_eog(token) and not self.ignore_eos):  # type: ignore[attr-defined]
            stats.end_token = token
            return Accepted(False, "", STOP_GRAMMAR if self.grammar else STOP_EOS)
        stats.n_generated += 1
        stats.tokens.append(token)
        piece = self.model.token_to_piece(token, special=False)  # type: ignore[attr-defined]
        text, hit = self._matcher.feed(self._decoder.decode(piece))
        if hit:
            return Accepted(True, text, STOP_STOP)
        if 0 <= self.max_tokens <= stats.n_generated:
            return Accepted(True, text, STOP_LENGTH)  # evaluating this last token would be wasted work
        if position + 1 >= self.n_ctx:  # the next token would have no position left (llama.cpp's rule too)
            return Accepted(True, text, STOP_CONTEXT)
        return Accepted(True, text, None)

    def finish(self, reason: str) -> str:
        """End the generation; return the text still held back (none after a stop string). Bytes of a
        character cut short (the budget ran out inside it) are dropped, as llama-server drops them: the
        text ends at the last whole character. With `show_cut_character` (complete and chat) they end it
        as U+FFFD, where llama-completion prints their bytes."""
        held = self._decoder.decode(b"", final=self.show_cut_character)
        tail = "" if reason == STOP_STOP else self._matcher.flush(held)
        self._decoder.reset()
        if self.generation_started:
            self.stats.generation_ms = (time.perf_counter() - self.generation_started) * 1000
        self.stats.stop_reason = reason
        return tail


class StopMatcher:
    """Holds back text that could be the start of a stop string until it is decided."""

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """Add text; return (text safe to emit, whether a stop string was hit)."""
        if not self.stops:
            return text, False
        self.pending += text
        cut = min((i for i in (self.pending.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            out, self.pending = self.pending[:cut], ""
            return out, True
        keep = max((_overlap(self.pending, s) for s in self.stops), default=0)
        out = self.pending[: len(self.pending) - keep]
        self.pending = self.pending[len(self.pending) - keep:]
        return out, False

    def flush(self, text: str = "") -> str:
        out, self.pending = self.pending + text, ""
        return out


def _overlap(text: str, stop: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `stop`."""
    for n in range(min(len(text), len(stop) - 1), 0, -1):
        if text.endswith(stop[:n]):
            return n
    return 0


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def reusable_prefix(cached: Sequence[int], prompt: Sequence[int]) -> int:
    """How many of a sequence's cached tokens a new prompt keeps: the common prefix, less one when it
    is the whole prompt (the last prompt token is evaluated again, to get fresh logits)."""
    reuse = common_prefix(cached, prompt)
    return reuse - 1 if reuse == len(prompt) and reuse > 0 else reuse
