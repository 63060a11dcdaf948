"""OpenAI response bodies and stream chunks, built from what the engine produced."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from ... import __version__
from ...core.generate.decide import (
    STOP_CONTEXT,
    STOP_EOS,
    STOP_GRAMMAR,
    STOP_INTERRUPTED,
    STOP_LENGTH,
    STOP_STOP,
)
from ...core.generate.stats import GenerationStats
from ...core.serving.jobs import TokenProb
from ..timings import summed_timings

FINGERPRINT = f"pyllama-{__version__}"
FINISH_REASONS = {STOP_EOS: "stop", STOP_STOP: "stop", STOP_GRAMMAR: "stop", STOP_INTERRUPTED: "stop",
                  STOP_LENGTH: "length", STOP_CONTEXT: "length"}


@dataclass
class Answer:
    """One finished generation: its text, per-token log-probabilities (if asked) and statistics."""

    text: str = ""
    probs: list[TokenProb] = field(default_factory=list)
    stats: GenerationStats = field(default_factory=GenerationStats)


@dataclass(frozen=True)
class Header:
    """The fields every body and chunk of one response repeats."""

    id: str
    model: str
    created: int

    @classmethod
    def new(cls, prefix: str, model: str) -> Header:
        return cls(f"{prefix}-{uuid.uuid4().hex[:24]}", model, int(time.time()))

    def fields(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": FINGERPRINT}


def finish_reason(stats: GenerationStats) -> str:
    return FINISH_REASONS.get(stats.stop_reason, "stop")


def usage(answers: list[Answer]) -> dict[str, Any]:
    prompt = sum(a.stats.n_prompt for a in answers)
    completion = sum(a.stats.n_generated for a in answers)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": sum(a.stats.n_cached for a in answers)}}


def timings(answers: list[Answer]) -> dict[str, Any]:
    """llama-server's `timings` object over the answers, with draft_n and draft_n_accepted when drafted."""
    return summed_timings([a.stats for a in answers])


def _text(piece: bytes) -> str:
    return piece.decode("utf-8", errors="replace")


# ---------------------------------------------------------------- chat


def chat_logprobs(probs: list[TokenProb]) -> dict[str, Any]:
    return {"content": [
        {"token": _text(p.piece), "logprob": p.logprob, "bytes": list(p.piece),
         "top_logprobs": [{"token": _text(piece), "logprob": lp, "bytes": list(piece)} for _, piece, lp in p.top]}
        for p in probs
    ], "refusal": None}


def chat_completion(header: Header, answer: Answer, tool_calls: list[dict[str, Any]] | None,
                    logprobs: bool, reasoning: str = "") -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": None if tool_calls else answer.text, "refusal": None}
    if reasoning:
        message["reasoning_content"] = reasoning
    if tool_calls:
        message["tool_calls"] = tool_calls
    choice = {"index": 0, "message": message, "logprobs": chat_logprobs(answer.probs) if logprobs else None,
              "finish_reason": "tool_calls" if tool_calls else finish_reason(answer.stats)}
    return {**header.fields("chat.completion"), "choices": [choice], "usage": usage([answer]),
            "timings": timings([answer])}


def chat_chunk(header: Header, delta: dict[str, Any], *, finish: str | None = None,
               logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
    return {**header.fields("chat.completion.chunk"), "choices": [choice]}


def tool_call_deltas(tool_calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Stream deltas that give each call whole: id, name and all of its arguments."""
    return [{"tool_calls": [{"index": i, **call}]} for i, call in enumerate(tool_calls)]


def usage_chunk(header: Header, obj: str, answers: list[Answer]) -> dict[str, Any]:
    return {**header.fields(obj), "choices": [], "usage": usage(answers), "timings": timings(answers)}


# ---------------------------------------------------------------- text completions


def completion_logprobs(probs: list[TokenProb], offset: int = 0) -> dict[str, Any]:
    """OpenAI's legacy layout; `offset` is where the first token's text starts in the choice's text."""
    offsets = []
    for p in probs:
        offsets.append(offset)
        offset += len(_text(p.piece))
    return {
        "tokens": [_text(p.piece) for p in probs],
        "token_logprobs": [p.logprob for p in probs],
        "top_logprobs": [{_text(piece): lp for _, piece, lp in p.top} for p in probs],
        "text_offset": offsets,
    }


def text_choice(index: int, answer: Answer, logprobs: bool) -> dict[str, Any]:
    return {"text": answer.text, "index": index,
            "logprobs": completion_logprobs(answer.probs) if logprobs else None,
            "finish_reason": finish_reason(answer.stats)}


def text_completion(header: Header, answers: list[Answer], logprobs: bool) -> dict[str, Any]:
    return {**header.fields("text_completion"), "choices": [text_choice(i, a, logprobs) for i, a in enumerate(answers)],
            "usage": usage(answers), "timings": timings(answers)}


def text_chunk(header: Header, index: int, text: str, *, finish: str | None = None,
               logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    return {**header.fields("text_completion"),
            "choices": [{"text": text, "index": index, "logprobs": logprobs, "finish_reason": finish}]}
