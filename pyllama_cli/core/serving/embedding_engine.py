"""`EmbeddingEngine`: `serve --embeddings`, one input at a time on one worker thread fed by a queue."""

from __future__ import annotations

import asyncio
import queue
import threading
from dataclasses import replace
from typing import Any

import numpy as np

from ...errors import InputError, Interrupted, ServerShutdown
from ..generate.decide import STOP_INTERRUPTED
from ..generate.stats import GenerationStats
from ..embed.compute import decode_count, embed_inputs
from ..embed.pooling import embedding_context
from .engine import CLOSED, READY, Engine
from .jobs import EmbeddingJob, EngineStats, Event, GenerationJob, JobStream, ModelSummary


class EmbeddingEngine(Engine):
    """One worker thread owns the model and its embedding context and runs queued jobs in order."""

    def __init__(self, *args: Any, pooling: int = -1, embd_normalize: int = 2, **kwargs: Any):
        kwargs["embeddings"] = True
        super().__init__(*args, **kwargs)
        self.pooling, self.embd_normalize = pooling, embd_normalize  # --pooling (-1: the model's), --embd-normalize
        self._jobs: queue.Queue[JobStream | None] = queue.Queue()
        self._lock = threading.Lock()
        self._stats = EngineStats()
        self._current: JobStream | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="pyllama-embeddings", daemon=True)
            self._thread.start()

    def submit(self, job: GenerationJob | EmbeddingJob) -> JobStream:
        if self.state != READY:
            raise RuntimeError(f"the engine is {self.state}")
        if not isinstance(job, EmbeddingJob):
            raise InputError("this server serves embeddings; start it without --embeddings to generate text")
        stream = JobStream(job, asyncio.get_running_loop())
        with self._lock:
            self._stats.queue_depth += 1
        self._jobs.put(stream)
        return stream

    def stats(self) -> EngineStats:
        with self._lock:
            return replace(self._stats)

    def cancel_all(self, reason: BaseException | None = None) -> None:
        with self._jobs.mutex:
            waiting = [s for s in self._jobs.queue if s is not None]
        for stream in [self._current, *waiting]:
            if stream is not None:
                stream.cancel(reason)

    def close(self, timeout: float = 10.0) -> None:
        if self.state == CLOSED:
            return
        current = self._current
        if current is not None:
            current.cancel()
        self._jobs.put(None)
        self._join_and_free(self._thread, timeout)

    # ---- worker thread

    def _load(self) -> None:
        session = self._open_session(None)
        try:
            # Pooling needs a whole input in one micro-batch. As llama-server, the batch shrinks to the
            # micro-batch (-ub) rather than the micro-batch growing to -b: a decode of 512 tokens
            # attends over 512 cells, one of 2048 over four times as many (rerank ran ~5% slower).
            settings = replace(self.settings, n_batch=min(self.settings.n_batch, self.settings.n_ubatch))
            session.ctx = embedding_context(session.model, settings, self.pooling)
            self.pooling = session.ctx.pooling_type()  # what the context pools with (the model's own, if -1)
        except BaseException:
            session.close()
            raise
        self.session = session
        self.summary = ModelSummary.of(self.path, session.model, session.ctx, n_ctx=session.ctx.n_ctx,
                                       embeddings=True)

    def _unload(self) -> None:
        pass  # the session is freed by close(): until then, vocabulary helpers may still be in use

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
                stream.put(Event(error=ServerShutdown(), done=True))

    def _process(self, stream: JobStream) -> None:
        job = stream.job
        assert isinstance(job, EmbeddingJob)
        outcome = "cancelled"
        try:
            if stream.cancelled:
                raise Interrupted("cancelled before it started")
            stream.put(Event(done=True, embeddings=self._embed(job, stream)))
            outcome = "done"
        except Interrupted:
            stream.put(Event(done=True, stats=GenerationStats(stop_reason=STOP_INTERRUPTED)))
        except BaseException as exc:  # noqa: BLE001 - a bad job must never take the worker down
            outcome = "failed"
            stream.put(Event(error=exc if isinstance(exc, Exception) else RuntimeError(str(exc)), done=True))
        with self._lock:
            s = self._stats
            s.jobs_done += outcome == "done"
            s.jobs_cancelled += outcome == "cancelled"
            s.jobs_failed += outcome == "failed"
            if outcome == "done":  # an embedding's prompt costs decodes too (llama-server counts them)
                n_tokens = sum(len(ids) for ids in job.inputs)
                s.embedding_inputs += len(job.inputs)
                s.prompt_tokens += n_tokens
                s.prompt_tokens_evaluated += n_tokens
                s.n_decode += decode_count(self.session.ctx, job.inputs)

    def _embed(self, job: EmbeddingJob, stream: JobStream) -> list[np.ndarray]:
        mode = self.embd_normalize if job.normalize is None else job.normalize
        return embed_inputs(self.session.ctx, job.inputs, mode, lambda: stream.cancelled, wipe=False)
