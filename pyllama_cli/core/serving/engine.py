"""The boundary between the HTTP server and llama.cpp: jobs go in, streams of events come out.

An `Engine` owns the model and its context(s); nothing else calls llama.cpp for them. The server
submits a job (a generation or an embedding) from its event loop and reads the answer as a
`JobStream` of `Event`s; `JobStream.cancel()` stops the job at the next token (or mid prompt
evaluation). `SingleSlotEngine` runs one job at a time on one worker thread fed by a queue; an
engine that batches several slots implements the same interface and the server does not change.

Vocabulary helpers (tokenize, detokenize, chat rendering) read only the immutable vocabulary and
metadata, so they run on the caller's thread.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ContextOverflow, InputError, Interrupted
from ..generate.generator import STOP_INTERRUPTED, GenerationStats
from ..interrupt import StopFlag
from ..generate.sampling import SamplingSettings
from ..model.settings import LoadSettings

LOADING, READY, FAILED, CLOSED = "loading", "ready", "failed", "closed"


# ---------------------------------------------------------------- jobs and events


@dataclass(frozen=True)
class GenerationJob:
    """Generate from `prompt` (token ids); `n_probs` -1 = no logprobs, k >= 0 = the chosen token's and k others."""

    prompt: tuple[int, ...]
    sampling: SamplingSettings
    max_tokens: int
    stop: tuple[str, ...] = ()
    n_probs: int = -1


@dataclass(frozen=True)
class EmbeddingJob:
    """One pooled, L2-normalised embedding per input (token ids)."""

    inputs: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class TokenProb:
    """A generated token with its log-probability and the `top` most likely alternatives (id, piece, logprob)."""

    token: int
    piece: bytes
    logprob: float
    top: tuple[tuple[int, bytes, float], ...] = ()


@dataclass
class Event:
    """A piece of a job's answer. The last event of a job has `done` set (and `stats` or `embeddings`)."""

    text: str = ""
    probs: list[TokenProb] = field(default_factory=list)
    done: bool = False
    stats: GenerationStats | None = None
    embeddings: list[np.ndarray] | None = None
    error: BaseException | None = None


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

    def cancel(self) -> None:
        """Stop the job as soon as possible (it may still be queued)."""
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
        return event


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
    queue_depth: int = 0  # jobs waiting for the worker
    processing: int = 0  # jobs being worked on


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


# ---------------------------------------------------------------- interface


class Engine(ABC):
    """Runs jobs on one loaded model. Load happens in the background: see `state`."""

    def __init__(self, path: Path, settings: LoadSettings, *, embeddings: bool = False,
                 on_ready: Callable[[Engine], None] | None = None,
                 on_failure: Callable[[BaseException], None] | None = None):
        self.path = path
        self.settings = settings
        self.embeddings = embeddings
        self.state = LOADING
        self.error: BaseException | None = None
        self.model: Any = None  # native.Model once loaded
        self.summary: ModelSummary | None = None
        self._on_ready = on_ready
        self._on_failure = on_failure

    @property
    def ready(self) -> bool:
        return self.state == READY

    @property
    def n_ctx(self) -> int:
        """Tokens one request may use (prompt plus generated)."""
        return self.summary.n_ctx if self.summary else 0

    @abstractmethod
    def start(self) -> None:
        """Begin loading the model in the background (returns at once)."""

    @abstractmethod
    def submit(self, job: GenerationJob | EmbeddingJob) -> JobStream:
        """Queue a job; call from the event loop that will read the returned stream."""

    @contextmanager
    def arriving(self) -> Iterator[None]:
        """Wrap a request's way from reaching the server to `submit` (parsing, tokenizing): an engine
        that batches may hold a step a moment for it. Here: nothing to do."""
        yield

    def cancel(self, stream: JobStream) -> None:
        """Stop a submitted job at the next token (the same as `stream.cancel()`)."""
        stream.cancel()

    @abstractmethod
    def cancel_all(self) -> None:
        """Stop every running and queued job (a shutting-down server); the engine keeps serving."""

    @abstractmethod
    def stats(self) -> EngineStats:
        """A snapshot of the counters (thread-safe)."""

    def slot_states(self) -> list[dict[str, Any]]:
        """Each slot's state (idle, prefill, generating) and token counts; engines without slots report one."""
        busy = self.stats().processing > 0
        return [{"id": 0, "state": "generating" if busy else "idle"}]

    @abstractmethod
    def close(self) -> None:
        """Cancel running work, stop the worker(s) and free the model."""

    # ---- vocabulary helpers: immutable model data, safe from any thread once loaded

    def check_fits(self, n_prompt: int) -> None:
        if n_prompt >= self.n_ctx:
            raise ContextOverflow(f"the prompt has {n_prompt} tokens but the context holds {self.n_ctx}",
                                  hint="shorten the prompt, or restart the server with a larger -c/--ctx-size")

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        ids = [int(t) for t in self.model.tokenize(text.encode("utf-8"), add_special=add_special,
                                                    parse_special=parse_special)]
        # A template that writes BOS itself, tokenized with add_special, would start with two.
        bos = self.model.bos
        if len(ids) >= 2 and ids[0] == ids[1] == bos:
            ids = ids[1:]
        return ids

    def detokenize(self, tokens: Sequence[int]) -> str:
        self.check_token_ids(tokens)
        return self.model.detokenize(list(tokens)).decode("utf-8", errors="replace")

    def piece(self, token: int) -> bytes:
        return self.model.token_to_piece(token, special=True)

    def check_token_ids(self, tokens: Sequence[int], what: str = "token") -> None:
        n_vocab = self.model.n_vocab
        bad = next((t for t in tokens if not 0 <= t < n_vocab), None)
        if bad is not None:
            raise InputError(f"{what} id {bad} is out of range: the vocabulary has ids 0..{n_vocab - 1}")

    def chat_template_text(self, override: str | None = None) -> str:
        """The chat template in use: `override` (NAME|FILE|JINJA), else the model's own."""
        from ..text.chat_template import resolve_template

        return resolve_template(self.model.chat_template(), override)[0]

    def render_chat(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None,
                    template: str | None = None, add_generation_prompt: bool = True) -> str:
        from ..text.chat_template import render_chat

        return render_chat(self.model, messages, template=template, add_generation_prompt=add_generation_prompt,
                           tools=tools)

    def is_eog(self, token: int) -> bool:
        return self.model.is_eog(token)

    def token_prob(self, logits: np.ndarray, token: int, k: int) -> TokenProb:
        """The token's log-probability under `logits` (before any sampler stage) and the `k` likeliest tokens."""
        values = logits.astype(np.float64)
        top = values.max()
        logprobs = values - (top + np.log(np.exp(values - top).sum()))
        best: tuple[tuple[int, bytes, float], ...] = ()
        if k > 0:
            ids = np.argpartition(-logprobs, min(k, len(logprobs) - 1))[:k]
            ids = ids[np.argsort(-logprobs[ids], kind="stable")]
            best = tuple((int(i), self.piece(int(i)), float(logprobs[i])) for i in ids)
        return TokenProb(token, self.piece(token), float(logprobs[token]), best)

    # ---- the worker thread's life: load, report, work, clean up

    def _run(self) -> None:
        try:
            self._load()
        except BaseException as exc:  # noqa: BLE001 - reported to the server, which exits with it
            self.error, self.state = exc, FAILED
            if self._on_failure is not None:
                self._on_failure(exc)
            return
        self.state = READY
        if self._on_ready is not None:
            self._on_ready(self)
        try:
            self._work()
        finally:
            self._unload()

    def _load(self) -> None:
        raise NotImplementedError

    def _work(self) -> None:
        raise NotImplementedError

    def _unload(self) -> None:
        raise NotImplementedError


# ---------------------------------------------------------------- one slot, one worker thread


class SingleSlotEngine(Engine):
    """One worker thread owns the model and context and runs queued jobs one after another.

    Between generations the context keeps sequence 0's cache, so a prompt that extends the previous
    one (the next turn of a chat) evaluates only its new tokens.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._jobs: queue.Queue[JobStream | None] = queue.Queue()
        self._lock = threading.Lock()
        self._stats = EngineStats()
        self._current: JobStream | None = None
        self._thread: threading.Thread | None = None
        self._ctx: Any = None
        self._generator: Any = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="pyllama-engine", daemon=True)
            self._thread.start()

    def submit(self, job: GenerationJob | EmbeddingJob) -> JobStream:
        if self.state != READY:
            raise RuntimeError(f"the engine is {self.state}")
        stream = JobStream(job, asyncio.get_running_loop())
        with self._lock:
            self._stats.queue_depth += 1
        self._jobs.put(stream)
        return stream

    def stats(self) -> EngineStats:
        with self._lock:
            return replace(self._stats)

    def cancel_all(self) -> None:
        with self._jobs.mutex:
            waiting = [s for s in self._jobs.queue if s is not None]
        for stream in [self._current, *waiting]:
            if stream is not None:
                stream.cancel()

    def close(self, timeout: float = 10.0) -> None:
        if self.state == CLOSED:
            return
        current = self._current
        if current is not None:
            current.cancel()
        self._jobs.put(None)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        if self.state != FAILED:
            self.state = CLOSED
        if self.model is not None and (self._thread is None or not self._thread.is_alive()):
            self.model.close()

    # ---- worker thread

    def _work(self) -> None:
        while True:
            stream = self._jobs.get()
            if stream is None:
                break
            with self._lock:
                self._stats.queue_depth -= 1
                self._stats.processing += 1
            self._current = stream
            try:
                self._process(stream)
            finally:
                self._current = None
                with self._lock:
                    self._stats.processing -= 1
        # Jobs still queued at shutdown get an answer instead of waiting forever.
        while not self._jobs.empty():
            stream = self._jobs.get_nowait()
            if stream is not None:
                stream.put(Event(error=InputError("the server is shutting down"), done=True))

    def _load(self) -> None:
        from ..model.native import Context, Model

        model = Model.load(self.path, self.settings)
        try:
            if self.embeddings:
                # Pooling needs a whole input in one micro-batch.
                self._ctx = _embedding_context(model, replace(self.settings, n_ubatch=self.settings.n_batch))
            else:
                from ..generate.generator import Generator

                self._ctx = Context(model, self.settings)
                self._generator = Generator(model, self._ctx)
        except BaseException:
            model.close()
            raise
        self.model = model
        self.summary = ModelSummary(
            path=self.path, description=model.description, n_ctx=self._ctx.n_ctx, n_ctx_train=model.n_ctx_train,
            n_vocab=model.n_vocab, n_embd=model.n_embd, n_params=model.n_params, size_bytes=model.size_bytes,
            embeddings=self.embeddings, n_batch=self._ctx.n_batch,
        )

    def _unload(self) -> None:
        if self._generator is not None:
            self._generator.close()
        if self._ctx is not None:
            self._ctx.close()
        # The model is freed by close(): until then, vocabulary helpers may still be in use.

    def _process(self, stream: JobStream) -> None:
        job = stream.job
        outcome = "cancelled"
        try:
            if stream.cancelled:
                raise Interrupted("cancelled before it started")
            if isinstance(job, EmbeddingJob):
                stream.put(Event(done=True, embeddings=self._embed(job, stream)))
                outcome = "done"
            else:
                outcome = self._generate(job, stream)
        except Interrupted:
            stream.put(Event(done=True, stats=GenerationStats(stop_reason=STOP_INTERRUPTED)))
        except BaseException as exc:  # noqa: BLE001 - a bad job must never take the worker down
            outcome = "failed"
            stream.put(Event(error=exc if isinstance(exc, Exception) else RuntimeError(str(exc)), done=True))
        self._count(outcome, len(job.inputs) if isinstance(job, EmbeddingJob) and outcome == "done" else 0)

    def _generate(self, job: GenerationJob, stream: JobStream) -> str:
        """Stream one generation's events; return "done" or "cancelled"."""
        probs: list[TokenProb] = []
        on_token = (lambda token: probs.append(self.token_prob(self._ctx.logits(-1), token, job.n_probs))) if job.n_probs >= 0 else None
        gen = self._generator
        try:
            for text in gen.stream(list(job.prompt), job.sampling, max_tokens=job.max_tokens, stop=job.stop,
                                   stop_flag=stream.stop_flag.__bool__, on_token=on_token):
                stream.put(Event(text=text, probs=probs[:]))
                probs.clear()
        finally:
            self._count_tokens(gen.stats)
        stream.put(Event(done=True, probs=probs, stats=gen.stats))
        return "cancelled" if gen.stats.stop_reason == STOP_INTERRUPTED else "done"


    def _embed(self, job: EmbeddingJob, stream: JobStream) -> list[np.ndarray]:
        from ..model.native import Batch, lib

        ctx = self._ctx
        vectors = []
        with Batch(ctx.n_batch) as batch:
            for ids in job.inputs:
                if len(ids) > ctx.n_batch:
                    raise InputError(f"an input has {len(ids)} tokens but at most {ctx.n_batch} fit in one batch",
                                     hint="restart the server with a larger -b/--batch-size")
                if stream.cancelled:
                    raise Interrupted("embedding cancelled")
                ctx.clear_memory()
                batch.clear()
                for pos, token in enumerate(ids):
                    batch.add(token, pos, (0,), True)
                ctx.decode(batch)
                ptr = lib.llama_get_embeddings_seq(ctx.handle, 0)
                vector = np.ctypeslib.as_array(ptr, shape=(self.model.n_embd,)).astype(np.float32)
                norm = float(np.linalg.norm(vector))
                vectors.append(vector / norm if norm > 0 else vector)
        return vectors

    def _count(self, outcome: str, embedding_inputs: int = 0) -> None:
        with self._lock:
            s = self._stats
            s.jobs_done += outcome == "done"
            s.jobs_cancelled += outcome == "cancelled"
            s.jobs_failed += outcome == "failed"
            s.embedding_inputs += embedding_inputs

    def _count_tokens(self, gen: GenerationStats) -> None:
        with self._lock:
            s = self._stats
            s.prompt_tokens += gen.n_prompt
            s.prompt_tokens_evaluated += gen.n_evaluated
            s.prompt_seconds += gen.prompt_ms / 1000
            s.generated_tokens += gen.n_generated
            s.generation_seconds += gen.generation_ms / 1000


def _embedding_context(model: Any, settings: LoadSettings) -> Any:
    """A context that returns pooled embeddings; mean pooling when the model declares none."""
    from ..model.native import Context, lib

    ctx = Context(model, settings, embeddings=True)
    if lib.llama_pooling_type(ctx.handle) == lib.LLAMA_POOLING_TYPE_NONE:
        ctx.close()
        ctx = Context(model, settings, embeddings=True, pooling_type=lib.LLAMA_POOLING_TYPE_MEAN)
    return ctx
