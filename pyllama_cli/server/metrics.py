"""Prometheus metrics: HTTP counters kept here, generation figures read from the engine when scraped."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..core.serving.engine import Engine

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    """Requests answered, by endpoint and status; safe to update from any thread."""

    def __init__(self, endpoints: Iterable[str]):
        self.endpoints = frozenset(endpoints)
        self._lock = threading.Lock()
        self._requests: Counter[tuple[str, int]] = Counter()

    def observe(self, path: str, status: int) -> None:
        endpoint = path if path in self.endpoints else "other"  # bounded labels, whatever clients probe
        with self._lock:
            self._requests[(endpoint, status)] += 1

    def render(self, engine: Engine) -> str:
        with self._lock:
            requests = sorted(self._requests.items())
        stats = engine.stats()
        lines: list[str] = []
        _metric(lines, "requests_total", "counter", "HTTP requests answered, by endpoint and status.",
                [(f'endpoint="{e}",status="{s}"', n) for (e, s), n in requests])
        _metric(lines, "request_errors_total", "counter", "HTTP requests answered with an error status (4xx, 5xx).",
                [("", sum(n for (_, s), n in requests if s >= 400))])
        _metric(lines, "prompt_tokens_total", "counter", "Prompt tokens of finished generations.",
                [("", stats.prompt_tokens)])
        _metric(lines, "prompt_tokens_evaluated_total", "counter", "Prompt tokens evaluated (not reused from cache).",
                [("", stats.prompt_tokens_evaluated)])
        _metric(lines, "generated_tokens_total", "counter", "Tokens generated.", [("", stats.generated_tokens)])
        _metric(lines, "prompt_seconds_total", "counter", "Time spent evaluating prompts.",
                [("", round(stats.prompt_seconds, 6))])
        _metric(lines, "generation_seconds_total", "counter", "Time spent generating tokens.",
                [("", round(stats.generation_seconds, 6))])
        _metric(lines, "prompt_tokens_per_second", "gauge", "Average prompt evaluation speed.",
                [("", _rate(stats.prompt_tokens_evaluated, stats.prompt_seconds))])
        _metric(lines, "generated_tokens_per_second", "gauge", "Average generation speed.",
                [("", _rate(stats.generated_tokens, stats.generation_seconds))])
        _metric(lines, "draft_tokens_total", "counter", "Tokens drafted by speculative decoding.",
                [("", stats.draft_tokens)])
        _metric(lines, "draft_tokens_accepted_total", "counter", "Drafted tokens the model accepted.",
                [("", stats.draft_tokens_accepted)])
        _metric(lines, "jobs_total", "counter", "Engine jobs (generations, embedding batches) by outcome.",
                [('outcome="done"', stats.jobs_done), ('outcome="cancelled"', stats.jobs_cancelled),
                 ('outcome="failed"', stats.jobs_failed)])
        _metric(lines, "embedding_inputs_total", "counter", "Inputs embedded.", [("", stats.embedding_inputs)])
        _metric(lines, "queue_depth", "gauge", "Requests waiting for the engine.", [("", stats.queue_depth)])
        _metric(lines, "requests_processing", "gauge", "Requests the engine is working on.", [("", stats.processing)])
        states = Counter(slot["state"] for slot in engine.slot_states()) if engine.ready else Counter()
        _metric(lines, "slots", "gauge", "Slots by state.",
                [(f'state="{state}"', states.get(state, 0)) for state in ("idle", "prefill", "generating")])
        _metric(lines, "context_size", "gauge", "Tokens one request may use.", [("", engine.n_ctx)])
        return "\n".join(lines) + "\n"


def _metric(lines: list[str], name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
    lines.append(f"# HELP pyllama_{name} {help_text}")
    lines.append(f"# TYPE pyllama_{name} {kind}")
    for labels, value in samples:
        lines.append(f"pyllama_{name}{{{labels}}} {value}" if labels else f"pyllama_{name} {value}")


def _rate(n: int, seconds: float) -> float:
    return round(n / seconds, 3) if seconds > 0 else 0.0


class MetricsMiddleware:
    """Counts every response (errors from other middleware included) by endpoint and status."""

    def __init__(self, app: ASGIApp, metrics: Metrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]

        async def observe(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.observe(path, message["status"])
            await send(message)

        await self.app(scope, receive, observe)
