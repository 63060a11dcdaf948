"""The boundary between the HTTP server and llama.cpp: the `Engine` interface.

An `Engine` owns the model's `Session` (model and context); nothing else calls llama.cpp for them.
The server submits jobs and reads `JobStream`s (see jobs.py). Two engines implement it:
`ParallelEngine` (scheduler.py, generation on N slots) and `EmbeddingEngine` (embedding_engine.py).
The model loads on the engine's own worker thread, in the background: see `state`.

Vocabulary helpers (tokenize, detokenize, chat rendering) read only the immutable vocabulary and
metadata, so they run on the caller's thread.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ContextOverflow, InputError
from ..model.settings import LoadSettings
from .jobs import EmbeddingJob, EngineStats, GenerationJob, JobStream, ModelSummary, TokenProb

LOADING, READY, FAILED, CLOSED = "loading", "ready", "failed", "closed"
BROKEN = "broken"  # loaded, then unable to run: an RPC server under the model died (see ParallelEngine.break_down)


# ---------------------------------------------------------------- interface


class Engine(ABC):
    """Runs jobs on one loaded model. Load happens in the background: see `state`."""

    def __init__(self, path: Path, settings: LoadSettings, *, embeddings: bool = False,
                 on_ready: Callable[[Engine], None] | None = None,
                 on_failure: Callable[[BaseException], None] | None = None, projector: Any = None):
        self.path = path
        self.settings = settings
        self.embeddings = embeddings
        self.projector_settings = projector  # core/media's ProjectorSettings (None: text only)
        self.projector: Any = None  # core/media's Projector once loaded, when there is one
        self.state = LOADING
        self.error: BaseException | None = None
        self.session: Any = None  # core.model.session.Session once loaded
        self.summary: ModelSummary | None = None
        self._on_ready = on_ready
        self._on_failure = on_failure
        self._user_markers: dict[str | None, list[int]] = {}  # each template's user marker, tokenized

    @property
    def model(self) -> Any:
        """The loaded native.Model (None until loaded)."""
        return self.session.model if self.session is not None else None

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
    def cancel_all(self, reason: BaseException | None = None) -> None:
        """Stop every running and queued job; the engine keeps serving.

        `reason` (errors.ServerShutdown for a server shutting down or a model being unloaded) is what
        each cut job's reader gets instead of a normal end (see JobStream.cancel)."""

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

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True,
                 dedupe_bos: bool = True) -> list[int]:
        """Token ids of `text`. With `dedupe_bos` (for prompts), a BOS that the vocab adds in front of
        a BOS the text writes is dropped; without it, the ids are llama.cpp's tokenizer's exactly."""
        # tolist(): Python ints in one C pass (a comprehension over numpy scalars took a third of
        # a fully cached request's preparation on a 7k-token prompt)
        ids: list[int] = self.model.tokenize(text.encode("utf-8"), add_special=add_special,
                                             parse_special=parse_special).tolist()
        # A prompt that writes BOS itself, tokenized with add_special, would start with two.
        bos = self.model.bos
        if dedupe_bos and len(ids) >= 2 and ids[0] == ids[1] == bos:
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
                    template: str | None = None, add_generation_prompt: bool = True,
                    template_kwargs: dict[str, Any] | None = None) -> str:
        """The prompt a chat template makes of `messages`, as llama-server makes it: a leading BOS text
        (or trailing EOS text) that tokenizing adds anyway is dropped, as its Jinja path drops it; a
        built-in template's leading BOS text always, as llama.cpp's built-ins never write one."""
        from ..text.chat_template import BUILTIN_TEMPLATES, render_chat
        from ..text.tokenizer import drop_added_specials

        prompt = render_chat(self.model, messages, template=template, add_generation_prompt=add_generation_prompt,
                             tools=tools, template_kwargs=template_kwargs)
        return drop_added_specials(self.model, prompt, builtin_template=template in BUILTIN_TEMPLATES)

    def user_starts(self, ids: list[int], template: str | None = None) -> tuple[int, ...]:
        """Where the user messages of a rendered chat start in its tokens, for an engine that evaluates a
        prompt in batches ending there (a memory with checkpoints: checkpoints.py); () for the others."""
        checkpoints = getattr(self, "_checkpoints", None)
        if checkpoints is None or not checkpoints.active:
            return ()
        from ..generate.context_checkpoints import find_user_starts, user_marker_tokens

        markers = self._user_markers
        if template not in markers:
            markers[template] = user_marker_tokens(
                lambda m: self.render_chat(m, template=template, add_generation_prompt=False),
                lambda text: self.tokenize(text, add_special=False, parse_special=True))
        return find_user_starts(ids, markers[template])

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

    def _open_session(self, context: dict[str, Any] | None) -> Any:
        """Load the model, and a context with these Context arguments if given (the worker's first step)."""
        from ..model.resolve import ResolvedModel
        from ..model.session import load_session

        return load_session(ResolvedModel(self.path, (self.path,)), self.settings, context=context)

    def _open_projector(self) -> None:
        """Load --mmproj for the loaded model (the worker's step after the session)."""
        from ..media.projector import Projector

        settings = self.projector_settings
        if settings is not None and settings.enabled and settings.path is not None:
            self.projector = Projector.load(settings.path, self.session.model, settings, self.settings.n_threads)

    def _join_and_free(self, worker: Any, timeout: float) -> None:
        """Wait for the worker thread to stop, mark the engine closed, and free the context and model.
        A worker still running after `timeout` keeps them (vocabulary helpers use the model until then)."""
        if worker is not None and worker is not threading.current_thread():
            worker.join(0 if self.state == BROKEN else timeout)  # a broken engine's worker never returns
        if self.state not in (FAILED, BROKEN):
            self.state = CLOSED
        if self.session is not None and (worker is None or not worker.is_alive()):
            if self.projector is not None:  # it points into the model: freed first
                self.projector.close()
            self.session.close()

    def _load(self) -> None:
        raise NotImplementedError

    def _work(self) -> None:
        raise NotImplementedError

    def _unload(self) -> None:
        raise NotImplementedError
