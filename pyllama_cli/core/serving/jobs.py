"""What the server hands an engine and what it gets back: jobs in, streams of events out.

The server submits a job (a generation or an embedding) from its event loop and reads the answer
as a `JobStream` of `Event`s; `JobStream.cancel()` stops the job at the next token (or mid prompt
evaluation). A job the server cuts (`cancel(reason)`: shutdown, a model unloaded) ends by raising
`reason` from the stream instead of ending like a finished answer, so no client mistakes it for one. `EngineStats` and `ModelSummary` are what /metrics, /props and /v1/models report.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from ..generate.decide import STOP_INTERRUPTED
from ..generate.sampling import SamplingSettings
from ..generate.stats import GenerationStats
from ..text.reasoning import BudgetSpec
from ..interrupt import StopFlag


# ---------------------------------------------------------------- jobs and events


@dataclass(frozen=True)
class GenerationJob:
    """Generate from `prompt` (token ids); `n_probs` -1 = no logprobs, k >= 0 = the chosen token's and k others.

    llama-server's per-request choices: `id_slot` (>= 0) runs the job on that slot only; without
    `cache_prompt` no cached prefix is reused; `progress` sends prompt-evaluation progress events;
    `post_sampling` reports probabilities after the sampler chain's cuts, not raw ones.
    """

    prompt: tuple[int, ...]
    sampling: SamplingSettings
    max_tokens: int
    stop: tuple[str, ...] = ()
    n_probs: int = -1
    id_slot: int = -1
    cache_prompt: bool = True
    progress: bool = False
    post_sampling: bool = False
    think_budget: BudgetSpec | None = None  # close the think block after this many tokens
    lora: tuple[float, ...] | None = None  # the request's scale of each LoRA adapter (None: the global scales)
    # Where the prompt's user messages start (llama-server's message spans, chat requests only): a model
    # whose memory needs checkpoints evaluates the prompt in batches that end there (checkpoints.py).
    user_starts: tuple[int, ...] = ()
    # A prompt with images: core/media's MediaPrompt, whose chunks the slot evaluates (`prompt` is its tokens).
    media: Any = field(default=None, compare=False)


@dataclass(frozen=True)
class EmbeddingJob:
    """One pooled, L2-normalised embedding per input (token ids)."""

    inputs: tuple[tuple[int, ...], ...]
    normalize: int | None = None  # --embd-normalize's modes; None: the server's (a rerank's scores: -1, none)


@dataclass(frozen=True)
class TokenProb:
    """A generated token with its log-probability and the `top` most likely alternatives (id, piece, logprob)."""

    token: int
    piece: bytes
    logprob: float
    top: tuple[tuple[int, bytes, float], ...] = ()


@dataclass
class Event:
    """A piece of a job's answer. The last event of a job has `done` set (and `stats` or `embeddings`).

    `tokens` are the ids generated since the last event; `progress` is (prompt tokens, cached,
    evaluated so far) while the prompt is evaluated, for jobs that asked for it.
    """

    text: str = ""
    probs: list[TokenProb] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    progress: tuple[int, int, int] | None = None
    done: bool = False
    stats: GenerationStats | None = None
    embeddings: list[np.ndarray] | None = None
    error: BaseException | None = None


# A reader that wants the statistics of every generation it reads (serve's access log) sets a list
# here for its context; each job's last event adds its GenerationStats.
JOB_STATS: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar("pyllama_job_stats", default=None)


class JobStream:
    """The events of one job, read with `async for` on the event loop that submitted it.

    The worker side calls `put()` from its own thread; an error event is raised by the iterator.
    """

    def __init__(self, job: GenerationJob | EmbeddingJob, loop: asyncio.AbstractEventLoop):
        self.job = job
        self.stop_flag = StopFlag()
        self._loop = loop
        self._queue: asyncio.Queue[Event] = asyncio.Queue()
        self._finished = False
        self.cut: BaseException | None = None  # why the server ended this job early, if it did

    # ---- worker side

    def put(self, event: Event) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, event)
        except RuntimeError:  # the event loop is gone (server shut down): nobody is listening
            self.stop_flag.set()

    @property
    def cancelled(self) -> bool:
        return bool(self.stop_flag)

    @staticmethod
    def put_all(items: list[tuple[JobStream, Event]]) -> None:
        """Deliver many streams' events with one wake-up per event loop (one per step of the batch
        scheduler, instead of one per token per client)."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[JobStream, Event]]] = {}
        for stream, event in items:
            by_loop.setdefault(stream._loop, []).append((stream, event))
        for loop, batch in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver, batch)
            except RuntimeError:  # the event loop is gone (server shut down): nobody is listening
                for stream, _ in batch:
                    stream.stop_flag.set()

    # ---- consumer side

    def cancel(self, reason: BaseException | None = None) -> None:
        """Stop the job as soon as possible (it may still be queued).

        With `reason` (the server cuts the job: errors.ServerShutdown), a job that ends because of
        this cancel raises `reason` to its reader at the end; one that finished first ends normally.
        """
        if reason is not None and self.cut is None and not self._finished:
            self.cut = reason
        self.stop_flag.set()

    def __aiter__(self) -> AsyncIterator[Event]:
        return self

    async def __anext__(self) -> Event:
        if self._finished:
            raise StopAsyncIteration
        event = await self._queue.get()
        if event.error is not None:
            self._finished = True
            raise event.error
        self._finished = event.done
        if event.done and event.stats is not None and (collected := JOB_STATS.get()) is not None:
            collected.append(event.stats)
        if event.done and self.cut is not None and _interrupted(event):
            raise self.cut
        return event


def _interrupted(event: Event) -> bool:
    """Whether a job's last event says it was stopped rather than finished."""
    return event.embeddings is None and (event.stats is None or event.stats.stop_reason == STOP_INTERRUPTED)


def _deliver(batch: list[tuple[JobStream, Event]]) -> None:
    for stream, event in batch:
        stream._queue.put_nowait(event)


@dataclass
class EngineStats:
    """Totals since the engine started, and what it is doing now."""

    jobs_done: int = 0
    jobs_cancelled: int = 0
    jobs_failed: int = 0
    prompt_tokens: int = 0  # prompt tokens of finished generations (cached ones included)
    prompt_tokens_evaluated: int = 0
    prompt_seconds: float = 0.0
    generated_tokens: int = 0
    generation_seconds: float = 0.0
    embedding_inputs: int = 0
    draft_tokens: int = 0  # tokens speculative decoding drafted
    draft_tokens_accepted: int = 0  # of those, the ones the model agreed with
    draft_steps: int = 0  # steps that verified a draft
    queue_depth: int = 0  # jobs waiting for the worker
    processing: int = 0  # jobs being worked on
    n_decode: int = 0  # llama_decode calls (the model's; not the draft model's)
    n_busy_slots: int = 0  # slots in those calls, summed (over n_decode: the average batch's slots)
    n_tokens_max: int = 0  # the longest sequence seen, prompt and generated tokens

    def plus(self, other: EngineStats) -> EngineStats:
        """Both engines' totals together (a model's engines across unloads): counts add up, the longest
        sequence is the longer one."""
        summed = {f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)}
        return EngineStats(**{**summed, "n_tokens_max": max(self.n_tokens_max, other.n_tokens_max)})

    def add_generation(self, gen: GenerationStats) -> None:
        """Count a finished (or cancelled) generation's tokens and times into the totals."""
        self.prompt_tokens += gen.n_prompt
        self.prompt_tokens_evaluated += gen.n_evaluated
        self.prompt_seconds += gen.prompt_ms / 1000
        self.generated_tokens += gen.n_generated
        self.generation_seconds += gen.generation_ms / 1000
        self.draft_tokens += gen.n_drafted
        self.draft_tokens_accepted += gen.n_draft_accepted
        self.draft_steps += gen.n_draft_steps
        self.n_tokens_max = max(self.n_tokens_max, gen.n_prompt + gen.n_generated)


@dataclass(frozen=True)
class ModelSummary:
    """What clients may want to know about the served model."""

    path: Path
    description: str
    n_ctx: int
    n_ctx_train: int
    n_vocab: int
    n_embd: int
    n_params: int
    size_bytes: int
    embeddings: bool
    n_batch: int

    @classmethod
    def of(cls, path: Path, model: Any, ctx: Any, *, n_ctx: int, embeddings: bool) -> ModelSummary:
        """The summary of a loaded model and its context; `n_ctx` is what one request may use."""
        return cls(path=path, description=model.description, n_ctx=n_ctx, n_ctx_train=model.n_ctx_train,
                   n_vocab=model.n_vocab, n_embd=model.n_embd, n_params=model.n_params,
                   size_bytes=model.size_bytes, embeddings=embeddings, n_batch=ctx.n_batch)
