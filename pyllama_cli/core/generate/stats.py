"""What one generation measured: token counts, times, and why it stopped."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GenerationStats:
    n_prompt: int = 0  # tokens of the prompt
    n_cached: int = 0  # prompt tokens reused from the KV cache (not evaluated)
    prompt_ms: float = 0.0
    n_generated: int = 0
    generation_ms: float = 0.0
    ttft_ms: float = 0.0  # from the start of the call to the first generated token
    stop_reason: str = ""
    seed: int = -1
    id_slot: int = -1  # the server slot that ran it (-1: none)
    tokens: list[int] = field(default_factory=list)
    end_token: int = -1  # the end-of-generation token that stopped it (-1: none); llama-server lists it in `tokens`
    n_drafted: int = 0  # tokens speculative decoding proposed (llama-server's draft_n)
    n_draft_accepted: int = 0  # of those, the ones the model agreed with (draft_n_accepted)
    n_draft_steps: int = 0  # steps that verified a draft

    @property
    def draft_acceptance(self) -> float:
        return self.n_draft_accepted / self.n_drafted if self.n_drafted else 0.0

    @property
    def n_evaluated(self) -> int:
        return self.n_prompt - self.n_cached

    @property
    def prompt_tps(self) -> float:
        return self.n_evaluated / (self.prompt_ms / 1000) if self.prompt_ms > 0 else 0.0

    @property
    def generation_tps(self) -> float:
        # The first token comes from the prompt's logits; the rest each cost one decode.
        n = self.n_generated - 1
        return n / (self.generation_ms / 1000) if n > 0 and self.generation_ms > 0 else 0.0

    def to_dict(self) -> dict[str, float | int | str]:
        return {
            "prompt_tokens": self.n_prompt, "cached_tokens": self.n_cached, "evaluated_tokens": self.n_evaluated,
            "prompt_ms": round(self.prompt_ms, 3), "prompt_tps": round(self.prompt_tps, 3),
            "generated_tokens": self.n_generated, "generation_ms": round(self.generation_ms, 3),
            "generation_tps": round(self.generation_tps, 3), "ttft_ms": round(self.ttft_ms, 3),
            "stop_reason": self.stop_reason, "seed": self.seed,
            "draft_tokens": self.n_drafted, "draft_accepted": self.n_draft_accepted,
            "draft_acceptance": round(self.draft_acceptance, 4),
        }
