"""Prometheus metrics: HTTP counters kept here, generation figures read from the engines when scraped
(labelled `model="ID"` on a server of several models).

The request counters leave out the monitoring reads (GET /metrics, /health, /v1/health, /props), as
Prometheus' own instrumentation leaves out its scrapes: probes would make up most of the count, and
they must not change what a sleeping server shows. While every model sleeps (unloaded for idleness,
--sleep-idle-seconds), /metrics answers the text of the moment the server fell asleep, as
llama-server's cached metrics do; requests made meanwhile are counted, and show once it wakes.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..core.serving.jobs import EngineStats
from .llamacpp_metrics import LlamaCppSeries

if TYPE_CHECKING:
    from .model_set import ModelSet

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
UNCOUNTED = frozenset({"/metrics", "/health", "/v1/health", "/props"})  # GET (and HEAD) only: see above


class Metrics:
    """Requests answered, by endpoint and status; safe to update from any thread."""

    def __init__(self, endpoints: Iterable[str]):
        self.endpoints = frozenset(endpoints)
        self._lock = threading.Lock()
        self._requests: Counter[tuple[str, int]] = Counter()
        self._llamacpp = LlamaCppSeries()
        self.started = int(time.time())  # the Process-Start-Time-Unix header (llama-server's)
        self._snapshot: _Snapshot | None = None  # what /metrics shows while the server sleeps

    def observe(self, path: str, status: int) -> None:
        endpoint = path if path in self.endpoints else "other"  # bounded labels, whatever clients probe
        with self._lock:
            self._requests[(endpoint, status)] += 1

    def render(self, models: ModelSet) -> str:
        """Every series; the engines' are labelled by model on a server of several (`model="ID"`). While
        every model sleeps: the snapshot fall_asleep() took."""
        snapshot = self._snapshot if models.asleep() else None
        if snapshot is None:
            self._snapshot = None
            return self._render(models)
        return snapshot.serve(self._llamacpp)

    def fall_asleep(self, models: ModelSet) -> None:
        """Keep this moment's text for the scrapes while the server sleeps (its last model still loaded)."""
        self._snapshot = _Snapshot(self._render(models, commit=False),
                                   self._render(models, commit=False, settled=True), _lifetime(models))

    def _render(self, models: ModelSet, *, commit: bool = True, settled: bool = False) -> str:
        with self._lock:
            requests = sorted(self._requests.items())
        engines = [(label_pair("model", label) if label is not None else "", engine, engine.stats())
                   for label, engine in models.engines()]
        lines: list[str] = []
        _metric(lines, "requests_total", "counter", "HTTP requests answered, by endpoint and status.",
                [(f'endpoint="{e}",status="{s}"', n) for (e, s), n in requests])
        _metric(lines, "request_errors_total", "counter", "HTTP requests answered with an error status (4xx, 5xx).",
                [("", sum(n for (_, s), n in requests if s >= 400))])
        for name, kind, help_text, read in _ENGINE_SERIES:
            _metric(lines, name, kind, help_text, [(label, read(stats)) for label, _, stats in engines])
        _metric(lines, "jobs_total", "counter", "Engine jobs (generations, embedding batches) by outcome.",
                [(_join(label, f'outcome="{outcome}"'), getattr(stats, f"jobs_{outcome}"))
                 for label, _, stats in engines for outcome in ("done", "cancelled", "failed")])
        _metric(lines, "queue_depth", "gauge", "Requests waiting for the engine.",
                [(label, stats.queue_depth) for label, _, stats in engines])
        _metric(lines, "requests_processing", "gauge", "Requests the engine is working on.",
                [(label, stats.processing) for label, _, stats in engines])
        slot_samples = []
        for label, engine, _ in engines:
            states = Counter(slot["state"] for slot in engine.slot_states()) if engine.ready else Counter()
            slot_samples += [(_join(label, f'state="{state}"'), states.get(state, 0))
                             for state in ("idle", "prefill", "generating")]
        _metric(lines, "slots", "gauge", "Slots by state.", slot_samples)
        _metric(lines, "context_size", "gauge", "Tokens one request may use.",
                [(label, engine.n_ctx) for label, engine, _ in engines])
        _prompt_cache_series(lines, engines)
        for name, kind, help_text, samples in models.model_series():
            _metric(lines, name, kind, help_text, samples)
        lines += self._llamacpp.render(_lifetime(models), commit=commit, settled=settled)
        return "\n".join(lines) + "\n"


@dataclass
class _Snapshot:
    """/metrics of a sleeping server: its first scrape shows the throughput window up to the sleep and
    closes it (llama-server's bucket), the later ones show empty windows."""

    first: str
    settled: str
    totals: list[tuple[str, EngineStats]]
    shown: bool = False

    def serve(self, series: LlamaCppSeries) -> str:
        if self.shown:
            return self.settled
        series.commit(self.totals)
        self.shown = True
        return self.first


def _lifetime(models: ModelSet) -> list[tuple[str, EngineStats]]:
    return [(label_pair("model", label) if label is not None else "", stats)
            for label, stats in models.lifetime_stats()]


def _prompt_cache_series(lines: list[str], engines: list[tuple[str, Any, EngineStats]]) -> None:
    """The prompt cache's routes and tiers (core/serving/cache), for the engines that have one."""
    series: dict[str, tuple[str, str, list[tuple[str, float]]]] = {}
    for label, engine, _ in engines:
        cache = getattr(engine, "prompt_cache", None)
        for name, kind, help_text, samples in cache.series() if cache is not None else []:
            entry = series.setdefault(name, (kind, help_text, []))
            entry[2].extend((_join(label, labels), value) for labels, value in samples)
    for name, (kind, help_text, samples) in series.items():
        _metric(lines, name, kind, help_text, samples)


def label_pair(name: str, value: str) -> str:
    """`name="value"` with the value escaped as the exposition format says (backslash, quote, newline):
    a model file may be named `q"uote.gguf`."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'{name}="{escaped}"'


def _join(*labels: str) -> str:
    return ",".join(label for label in labels if label)


# Series read from each engine's stats: (name, type, help, how to read it).
_ENGINE_SERIES: list[tuple[str, str, str, Callable[[EngineStats], float]]] = [
    ("prompt_tokens_total", "counter", "Prompt tokens of finished generations and embeddings.",
     lambda s: s.prompt_tokens),
    ("prompt_tokens_evaluated_total", "counter", "Prompt tokens evaluated (not reused from cache).",
     lambda s: s.prompt_tokens_evaluated),
    ("generated_tokens_total", "counter", "Tokens generated.", lambda s: s.generated_tokens),
    ("prompt_seconds_total", "counter", "Time spent evaluating prompts.", lambda s: round(s.prompt_seconds, 6)),
    ("generation_seconds_total", "counter", "Time spent generating tokens.",
     lambda s: round(s.generation_seconds, 6)),
    ("prompt_tokens_per_second", "gauge", "Average prompt evaluation speed.",
     lambda s: _rate(s.prompt_tokens_evaluated, s.prompt_seconds)),
    ("generated_tokens_per_second", "gauge", "Average generation speed.",
     lambda s: _rate(s.generated_tokens, s.generation_seconds)),
    ("draft_tokens_total", "counter", "Tokens drafted by speculative decoding.", lambda s: s.draft_tokens),
    ("draft_tokens_accepted_total", "counter", "Drafted tokens the model accepted.",
     lambda s: s.draft_tokens_accepted),
    ("embedding_inputs_total", "counter", "Inputs embedded.", lambda s: s.embedding_inputs),
]


def _metric(lines: list[str], name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
    lines.append(f"# HELP pyllama_{name} {help_text}")
    lines.append(f"# TYPE pyllama_{name} {kind}")
    for labels, value in samples:
        lines.append(f"pyllama_{name}{{{labels}}} {value}" if labels else f"pyllama_{name} {value}")


def _rate(n: int, seconds: float) -> float:
    return round(n / seconds, 3) if seconds > 0 else 0.0


class MetricsMiddleware:
    """Counts every response (errors from other middleware included) by endpoint and status, but for
    the monitoring reads (UNCOUNTED)."""

    def __init__(self, app: ASGIApp, metrics: Metrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if path in UNCOUNTED and scope["method"] in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return

        async def observe(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.observe(path, message["status"])
            await send(message)

        await self.app(scope, receive, observe)
