"""A slot of the parallel scheduler (one sequence of the shared context) and the step padding trial."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from ..generate.decide import Turn
from ..generate.stats import GenerationStats
from ..text.reasoning import ThinkBudget
from .jobs import GenerationJob, JobStream

IDLE, PREFILL, GENERATING = "idle", "prefill", "generating"


@dataclass
class Slot:
    """One sequence of the shared context and the request it is serving."""

    id: int
    cached: list[int] = field(default_factory=list)  # tokens in this sequence's KV cache
    state: str = IDLE
    stream: JobStream | None = None
    sampler: Any = None
    pending: list[int] = field(default_factory=list)  # prompt tokens still to evaluate
    last_token: int = -1  # sampled, not yet evaluated
    batch_index: int = -1  # where this slot's logits sit in the last batch (-1: none)
    in_batch: bool = False  # whether the last batch held any of this slot's tokens
    stats: GenerationStats = field(default_factory=GenerationStats)
    turn: Turn | None = None  # the per-token decisions of the current request
    budget: ThinkBudget | None = None  # the request's thinking budget, if it has one
    requests_served: int = 0

    @property
    def job(self) -> GenerationJob:
        assert self.stream is not None
        return self.stream.job  # type: ignore[return-value]

    def next_token(self, ctx: Any) -> int:
        """The sampled token, or the one a spent thinking budget forces (the sampler records it too)."""
        forced = self.budget.forced() if self.budget is not None else None
        if forced is None:
            token = self.sampler.sample(ctx, self.batch_index)
        else:
            token = forced
            self.sampler.accept(token)
        if self.budget is not None:
            self.budget.accepted(token)
        return token

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.id, "state": self.state, "n_cached": len(self.cached),
            "n_prompt": self.stats.n_prompt if self.state != IDLE else 0,
            "n_generated": self.stats.n_generated if self.state != IDLE else 0,
            "requests_served": self.requests_served,
        }


class PaddingTrial:
    """Whether a step of three tokens should get a fourth, throwaway one: decided by timing both.

    On a CPU, llama.cpp multiplies repacked weights (Q4_0, Q4_K, IQ4_NL, ...) by four tokens at
    a time and by leftover tokens one at a time, each reading the whole matrix again, so three
    tokens cost more than four (9.5 ms against 7.7 on the 246M Q4_0 benchmark model). Other
    weights, and GPUs, scale the other way. So the first steps that could be padded alternate
    between padded and not, and after TRIALS of each the faster choice is kept for good.
    """

    TRIALS = 8

    def __init__(self) -> None:
        self.seconds: dict[bool, list[float]] = {True: [], False: []}
        self.decision: bool | None = None

    def choose(self) -> bool:
        if self.decision is not None:
            return self.decision
        return len(self.seconds[True]) < len(self.seconds[False])  # alternate, unpadded first

    def record(self, padded: bool, seconds: float) -> None:
        if self.decision is not None:
            return
        self.seconds[padded].append(seconds)
        if all(len(times) >= self.TRIALS for times in self.seconds.values()):
            self.decision = statistics.median(self.seconds[True]) < statistics.median(self.seconds[False])
