"""llama-server's own `/metrics` series (`llamacpp:*`), rendered beside pyllama's so that dashboards made
for llama-server read a pyllama server unchanged. Names, types and meanings are llama-server's: prompt
tokens exclude cached ones, and the two throughput gauges are averaged over the time since the previous
scrape (llama-server's "bucket"), 0 when nothing ran in it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from ..core.serving.jobs import EngineStats

# (name, help, how to read it from an engine's stats).
_COUNTERS: list[tuple[str, str, Callable[[EngineStats], float]]] = [
    ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens",
     lambda s: s.prompt_tokens_evaluated),
    ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache",
     lambda s: s.prompt_tokens - s.prompt_tokens_evaluated),
    ("prompt_seconds_total", "Total time spent processing prompts", lambda s: round(s.prompt_seconds, 6)),
    ("tokens_predicted_total", "Number of generation tokens processed", lambda s: s.generated_tokens),
    ("tokens_predicted_seconds_total", "Total time spent generating tokens",
     lambda s: round(s.generation_seconds, 6)),
    ("n_decode_total", "Number of llama_decode() calls of the served model (not the draft model's)",
     lambda s: s.n_decode),
    ("n_tokens_max", "Largest observed sequence length (prompt + generation)", lambda s: s.n_tokens_max),
    ("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated", lambda s: s.draft_tokens),
    ("spec_decode_num_accepted_tokens_total", "Speculative: Total draft tokens accepted by the target model",
     lambda s: s.draft_tokens_accepted),
    ("spec_decode_num_drafts_total", "Speculative: Total speculative decoding verification steps",
     lambda s: s.draft_steps),
]


class LlamaCppSeries:
    """Renders the `llamacpp:*` series; remembers each engine's totals at the last scrape for the gauges."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[str, EngineStats] = {}

    def render(self, models: list[tuple[str, EngineStats]], *, commit: bool = True,
               settled: bool = False) -> list[str]:
        """`models`: (labels, totals) of each model; labels is "" with one model. `commit`: this is a
        scrape, the gauges' next window starts now; `settled`: as a scrape right after one would show it
        (empty windows)."""
        with self._lock:
            last = {label: stats if settled else self._last.get(label, EngineStats()) for label, stats in models}
            if commit:
                self._last.update(dict(models))
        lines: list[str] = []
        for name, help_text, read in _COUNTERS:
            _series(lines, name, "counter", help_text, [(label, read(stats)) for label, stats in models])
        gauges: list[tuple[str, str, Callable[[EngineStats, EngineStats], float]]] = [
            ("prompt_tokens_seconds", "Average prompt throughput in tokens/s",
             lambda s, p: _rate(s.prompt_tokens_evaluated - p.prompt_tokens_evaluated,
                                s.prompt_seconds - p.prompt_seconds)),
            ("predicted_tokens_seconds", "Average generation throughput in tokens/s",
             lambda s, p: _rate(s.generated_tokens - p.generated_tokens, s.generation_seconds - p.generation_seconds)),
            ("requests_processing", "Number of requests processing", lambda s, _: s.processing),
            ("requests_deferred", "Number of requests deferred", lambda s, _: s.queue_depth),
            ("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call",
             lambda s, _: round(s.n_busy_slots / max(s.n_decode, 1), 6)),
        ]
        for name, help_text, read2 in gauges:
            _series(lines, name, "gauge", help_text, [(label, read2(stats, last[label])) for label, stats in models])
        return lines

    def commit(self, models: list[tuple[str, EngineStats]]) -> None:
        """Start the gauges' next window at these totals (a scrape was answered from a snapshot of them)."""
        with self._lock:
            self._last.update(dict(models))


def _series(lines: list[str], name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
    lines.append(f"# HELP llamacpp:{name} {help_text}")
    lines.append(f"# TYPE llamacpp:{name} {kind}")
    lines.extend(f"llamacpp:{name}{{{labels}}} {value}" if labels else f"llamacpp:{name} {value}"
                 for labels, value in samples)


def _rate(n: float, seconds: float) -> float:
    return round(n / seconds, 3) if seconds > 0 and n > 0 else 0.0
