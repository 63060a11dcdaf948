"""llama-server's `timings` object of one generation, which its native answers and its extras on OpenAI's
chat both carry (OpenAI's usage chunk sums several answers' with openai/bodies.py's `timings`)."""

from __future__ import annotations

from typing import Any

from ..core.generate.stats import GenerationStats


def timings(stats: GenerationStats) -> dict[str, Any]:
    """llama-server's `timings`: prompt (evaluated tokens) and generation, counts, times and speeds."""
    return summed_timings([stats])


def summed_timings(all_stats: list[GenerationStats]) -> dict[str, Any]:
    """The `timings` of several generations together (n > 1 choices), with draft_n and draft_n_accepted
    when speculative decoding drafted (llama-server adds them only then)."""
    prompt_n = sum(s.n_evaluated for s in all_stats)
    prompt_ms = sum(s.prompt_ms for s in all_stats)
    predicted_n = sum(s.n_generated for s in all_stats)
    predicted_ms = sum(s.generation_ms for s in all_stats)
    # The first token of each answer comes from the prompt's last batch: no decode step of its own, so
    # the generation rate is over the steps after it, as llama-server counts (one token: 0.0).
    steps = sum(max(s.n_generated - 1, 0) for s in all_stats)
    body: dict[str, Any] = {
        "cache_n": sum(s.n_cached for s in all_stats),
        "prompt_n": prompt_n, "prompt_ms": prompt_ms, "prompt_per_token_ms": _per(prompt_ms, prompt_n),
        "prompt_per_second": _per(prompt_n * 1000, prompt_ms),
        "predicted_n": predicted_n, "predicted_ms": predicted_ms,
        "predicted_per_token_ms": _per(predicted_ms, steps),
        "predicted_per_second": _per(steps * 1000, predicted_ms),
    }
    drafted = sum(s.n_drafted for s in all_stats)
    if drafted:
        body["draft_n"] = drafted
        body["draft_n_accepted"] = sum(s.n_draft_accepted for s in all_stats)
    return body


def progress_timings(prompt_n: int, prompt_ms: float) -> dict[str, Any]:
    """The `timings` a prompt-progress chunk carries (return_progress with timings_per_token): the prompt
    so far, nothing generated yet."""
    return {"cache_n": 0, "prompt_n": prompt_n, "prompt_ms": prompt_ms,
            "prompt_per_token_ms": _per(prompt_ms, prompt_n), "prompt_per_second": _per(prompt_n * 1000, prompt_ms),
            "predicted_n": 0, "predicted_ms": 0.0, "predicted_per_token_ms": 0.0, "predicted_per_second": 0.0}


def _per(a: float, b: float) -> float:
    return a / b if b > 0 else 0.0
