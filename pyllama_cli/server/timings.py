"""llama-server's `timings` object of one generation, which its native answers and its extras on OpenAI's
chat both carry (OpenAI's usage chunk sums several answers' with openai/bodies.py's `timings`)."""

from __future__ import annotations

from typing import Any

from ..core.generate.stats import GenerationStats


def timings(stats: GenerationStats) -> dict[str, Any]:
    """llama-server's `timings`: prompt (evaluated tokens) and generation, counts, times and speeds."""
    prompt_n, predicted_n = stats.n_evaluated, stats.n_generated
    return {"cache_n": stats.n_cached, "prompt_n": prompt_n, "prompt_ms": stats.prompt_ms,
            "prompt_per_token_ms": stats.prompt_ms / prompt_n if prompt_n else 0.0,
            "prompt_per_second": 1000 * prompt_n / stats.prompt_ms if stats.prompt_ms > 0 else 0.0,
            "predicted_n": predicted_n, "predicted_ms": stats.generation_ms,
            "predicted_per_token_ms": stats.generation_ms / predicted_n if predicted_n else 0.0,
            "predicted_per_second": 1000 * predicted_n / stats.generation_ms if stats.generation_ms > 0 else 0.0}
