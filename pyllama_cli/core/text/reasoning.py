"""Reasoning kept apart: the text a model thinks between its template's markers, and a budget for it.

Reasoning models (Qwen3, DeepSeek-R1 and their kind) write `<think>…</think>` before the answer;
some templates open the block in the prompt, so the answer starts inside it. `ReasoningSplitter`
cuts streamed text into reasoning and answer at the markers, even when a marker arrives split over
several tokens. `ThinkBudget` is the token side: it counts the tokens generated inside the block and,
once the budget is spent, hands out the end marker's tokens to be forced in place of sampling, so
the block closes and the answer follows (llama-server's --reasoning-budget).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

FORMAT_NONE, FORMAT_DEEPSEEK = "none", "deepseek"
REASONING_FORMATS = (FORMAT_NONE, FORMAT_DEEPSEEK)
UNLIMITED = -1
# What a request's reasoning_effort means as a budget of thinking tokens (no standard exists: OpenAI's
# levels are relative). "none" and "minimal" skip the thinking; "high" and above leave it unlimited.
EFFORT_BUDGETS = {"none": 0, "minimal": 0, "low": 512, "medium": 2048, "high": UNLIMITED, "xhigh": UNLIMITED}


@dataclass(frozen=True)
class ThinkMarkers:
    start: str
    end: str


THINK = ThinkMarkers("<think>", "</think>")
# Markers other model families use; the first whose end marker a template names is the template's.
KNOWN_MARKERS = (THINK, ThinkMarkers("<seed:think>", "</seed:think>"), ThinkMarkers("[THINK]", "[/THINK]"),
                 ThinkMarkers("<|START_THINKING|>", "<|END_THINKING|>"))


def template_markers(template_text: str) -> ThinkMarkers:
    """The think markers a chat template uses; `<think>` when it names none (DeepSeek-R1's distills
    think in a template that never mentions it)."""
    return next((m for m in KNOWN_MARKERS if m.end in template_text), THINK)


@dataclass(frozen=True)
class Thinking:
    """How one answer's reasoning is cut out: the markers, and whether the prompt opened the block."""

    markers: ThinkMarkers = THINK
    inside: bool = False

    def splitter(self) -> ReasoningSplitter:
        return ReasoningSplitter(self.inside, self.markers)

    def split(self, text: str) -> tuple[str, str]:
        """(reasoning, answer) of a whole answer."""
        return split_reasoning(text, self.inside, self.markers)


def opens_reasoning(prompt: str, markers: ThinkMarkers = THINK) -> bool:
    """Whether the prompt ends inside a think block the template opened (the answer starts thinking)."""
    return prompt.rstrip().endswith(markers.start)


class ReasoningSplitter:
    """Splits streamed text into (is_reasoning, text) parts at the markers, even mid-marker.

    Text that might be the start of a marker is held back until the next feed decides it; `flush`
    gives it out at the end.
    """

    def __init__(self, inside: bool = False, markers: ThinkMarkers = THINK):
        self.inside = inside
        self.markers = markers
        self.pending = ""

    @property
    def _tag(self) -> str:
        return self.markers.end if self.inside else self.markers.start

    def feed(self, text: str) -> list[tuple[bool, str]]:
        self.pending += text
        parts: list[tuple[bool, str]] = []
        while (cut := self.pending.find(self._tag)) >= 0:
            parts.append((self.inside, self.pending[:cut]))
            self.pending = self.pending[cut + len(self._tag):]
            self.inside = not self.inside
        keep = _partial_tag(self.pending, self._tag)
        parts.append((self.inside, self.pending[: len(self.pending) - keep]))
        self.pending = self.pending[len(self.pending) - keep:]
        return [(r, t) for r, t in parts if t]

    def flush(self) -> list[tuple[bool, str]]:
        text, self.pending = self.pending, ""
        return [(self.inside, text)] if text else []


def split_reasoning(text: str, inside: bool = False, markers: ThinkMarkers = THINK) -> tuple[str, str]:
    """(reasoning, answer) of a whole answer: the reasoning without the white space around it, the answer
    without the blank lines that follow the block."""
    splitter = ReasoningSplitter(inside, markers)
    parts = splitter.feed(text) + splitter.flush()
    reasoning = "".join(t for r, t in parts if r)
    answer = "".join(t for r, t in parts if not r)
    return reasoning.strip(), answer.lstrip("\n") if reasoning or inside else answer


class AnswerOnly:
    """Streamed text less its thinking (and less the blank lines after the think block)."""

    def __init__(self, thinking: Thinking):
        self.splitter = thinking.splitter()
        self.started = False

    def feed(self, piece: str) -> str:
        return self._answer(self.splitter.feed(piece))

    def flush(self) -> str:
        return self._answer(self.splitter.flush())

    def _answer(self, parts: list[tuple[bool, str]]) -> str:
        text = "".join(t for is_reasoning, t in parts if not is_reasoning)
        if not self.started:
            text = text.lstrip("\n")
            self.started = bool(text)
        return text


def _partial_tag(text: str, tag: str) -> int:
    """Length of the longest end of `text` that could be the start of `tag`."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


@dataclass(frozen=True)
class BudgetSpec:
    """A job's thinking budget: `budget` tokens (0: close the block at once), the end marker's token
    ids to force, whether the prompt opened the block, and the markers."""

    budget: int
    end_tokens: tuple[int, ...]
    inside: bool
    markers: ThinkMarkers = THINK


class ThinkBudget:
    """Counts the tokens generated inside the think block; once the budget is spent there, `forced()`
    gives the end marker's tokens one by one, to be used instead of sampling.

    `piece` is a token's text, to see the model open or close the block itself.
    """

    def __init__(self, spec: BudgetSpec, piece: Callable[[int], str]):
        self.budget = spec.budget
        self.end_tokens = spec.end_tokens
        self.piece = piece
        self.splitter = ReasoningSplitter(spec.inside, spec.markers)
        self.spent = 0
        self.queue: list[int] = []
        self.closed = False  # the block has ended (forced or not): nothing more to count

    def forced(self) -> int | None:
        """The token to generate next instead of sampling, or None to sample."""
        if not self.queue and not self.closed and self.splitter.inside and self.spent >= self.budget:
            self.queue = list(self.end_tokens)
        return self.queue.pop(0) if self.queue else None

    def accepted(self, token: int) -> None:
        """Count a generated token (sampled or forced)."""
        if self.closed:
            return
        was_inside = self.splitter.inside
        self.splitter.feed(self.piece(token))
        if was_inside:
            self.spent += 1
        if was_inside and not self.splitter.inside and not self.queue:
            self.closed = True
