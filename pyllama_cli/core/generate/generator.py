"""The one token loop that `complete`, `chat` and `serve` share.

`Generator` owns a context's sequence 0 and remembers which tokens its KV cache holds, so a new
prompt that starts like the previous one evaluates only the new tokens (chat turns, prompt reuse).
`stream()` yields text as it is produced: UTF-8 sequences are never split, stop strings are never
emitted (text that might begin one is held back until it is decided), and the statistics of the
run are in `Generator.stats` when the iterator ends.
"""

from __future__ import annotations

import codecs
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from ...errors import ContextOverflow
from ..model.native import Batch, Context, Model
from .sampling import NO_TOKEN, Sampler, SamplingSettings

STOP_EOS = "eos"
STOP_LENGTH = "length"
STOP_STOP = "stop"
STOP_GRAMMAR = "grammar"
STOP_INTERRUPTED = "interrupted"
STOP_CONTEXT = "context"


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
    tokens: list[int] = field(default_factory=list)

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
        }


class Generator:
    """Generates from one model/context pair, keeping the KV cache between calls."""

    def __init__(self, model: Model, ctx: Context):
        self.model = model
        self.ctx = ctx
        self.cached: list[int] = []  # tokens whose keys/values sit in sequence 0
        self.batch = Batch(max(ctx.n_batch, 1))
        self.stats = GenerationStats()

    def close(self) -> None:
        self.batch.close()

    def reset(self) -> None:
        """Forget the KV cache (the next prompt is evaluated whole)."""
        self.ctx.clear_memory()
        self.cached = []

    def check_fits(self, n_prompt: int) -> None:
        if n_prompt >= self.ctx.n_ctx:
            raise ContextOverflow(
                f"the prompt has {n_prompt} tokens but the context holds {self.ctx.n_ctx}",
                hint=f"raise the context with -c/--ctx-size (e.g. -c {_next_pow2(n_prompt + 256)})",
            )

    def prefill(self, prompt: Sequence[int], stop_flag: Callable[[], bool] = lambda: False) -> int:
        """Evaluate the part of `prompt` not already cached; return how many tokens were reused."""
        self.check_fits(len(prompt))
        reuse = common_prefix(self.cached, prompt)
        if reuse == len(prompt):
            reuse -= 1  # the last prompt token must be evaluated again to get fresh logits
        # Drop everything past the reused prefix, including entries an aborted decode left behind.
        self.ctx.remove_tokens(0, reuse, -1)
        self.cached = list(prompt[:reuse])
        self.ctx.abort_check = stop_flag
        try:
            with self.ctx.abortable():
                for start in range(reuse, len(prompt), self.ctx.n_batch):
                    chunk = prompt[start:start + self.ctx.n_batch]
                    self.batch.fill(chunk, start, logits_last=start + len(chunk) == len(prompt))
                    self.ctx.decode(self.batch)
                    self.cached.extend(int(t) for t in chunk)
        finally:
            self.ctx.abort_check = None
        return reuse

    def stream(
        self,
        prompt: Sequence[int],
        sampling: SamplingSettings,
        *,
        max_tokens: int = -1,
        stop: Sequence[str] = (),
        stop_flag: Callable[[], bool] = lambda: False,
        on_token: Callable[[int], None] | None = None,
        after_prefill: Callable[[], None] | None = None,
    ) -> Iterator[str]:
        """Yield generated text for `prompt`; `self.stats` is complete once the iterator ends.

        Args:
            prompt: token ids (BOS included if wanted).
            sampling: sampler settings (a random seed is drawn when seed is -1).
            max_tokens: tokens to generate at most (-1: until end of generation or a full context).
            stop: strings that end generation; they are never yielded.
            stop_flag: polled between tokens and during the prompt evaluation; True stops the run.
            on_token: called with each generated token as soon as it is sampled, while `ctx.logits(-1)`
                still holds the distribution it was drawn from (the server's logprobs read it).
            after_prefill: called once the prompt is in the KV cache, before the first token is sampled
                (complete's --prompt-cache saves the state there).
        """
        stats = self.stats = GenerationStats(n_prompt=len(prompt))
        start = time.perf_counter()
        sampler = Sampler(self.model, sampling)
        stats.seed = sampler.settings.seed
        try:
            stats.n_cached = self.prefill(prompt, stop_flag)
        except BaseException:
            sampler.close()
            stats.stop_reason = STOP_INTERRUPTED
            raise
        stats.prompt_ms = (time.perf_counter() - start) * 1000
        try:
            if after_prefill is not None:
                after_prefill()
            yield from self._token_loop(sampler, max_tokens, stop, stop_flag, start, on_token)
        finally:
            sampler.close()

    def _token_loop(self, sampler: Sampler, max_tokens: int, stop: Sequence[str],
                    stop_flag: Callable[[], bool], start: float,
                    on_token: Callable[[int], None] | None = None) -> Iterator[str]:
        stats, model, ctx, batch = self.stats, self.model, self.ctx, self.batch
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        held = StopMatcher(stop)
        gen_start = time.perf_counter()
        reason = STOP_LENGTH
        while True:
            if stop_flag():
                reason = STOP_INTERRUPTED
                break
            if max_tokens >= 0 and stats.n_generated >= max_tokens:
                reason = STOP_LENGTH
                break
            if len(self.cached) >= ctx.n_ctx:
                reason = STOP_CONTEXT
                break
            token = sampler.sample(ctx, -1)
            if stats.n_generated == 0:
                stats.ttft_ms = (time.perf_counter() - start) * 1000
                gen_start = time.perf_counter()
            if token == NO_TOKEN or (model.is_eog(token) and not sampler.settings.ignore_eos):
                reason = STOP_GRAMMAR if sampler.settings.grammar else STOP_EOS
                break
            stats.n_generated += 1
            stats.tokens.append(token)
            if on_token is not None:
                on_token(token)
            text, hit = held.feed(decoder.decode(model.token_to_piece(token, special=False)))
            if text:
                yield text
            if hit:
                reason = STOP_STOP
                break
            if stats.n_generated == max_tokens:
                break  # the budget is spent: evaluating this last token would be wasted work
            batch.clear()
            batch.add(token, len(self.cached), (0,), True)
            ctx.decode(batch)
            self.cached.append(token)
        if reason != STOP_STOP:
            tail = held.flush(decoder.decode(b"", final=True))
            if tail:
                yield tail
        stats.generation_ms = (time.perf_counter() - gen_start) * 1000
        stats.stop_reason = reason


class StopMatcher:
    """Holds back text that could be the start of a stop string until it is decided."""

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """Add text; return (text safe to emit, whether a stop string was hit)."""
        if not self.stops:
            return text, False
        self.pending += text
        cut = min((i for i in (self.pending.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            out, self.pending = self.pending[:cut], ""
            return out, True
        keep = max((_overlap(self.pending, s) for s in self.stops), default=0)
        out = self.pending[: len(self.pending) - keep]
        self.pending = self.pending[len(self.pending) - keep:]
        return out, False

    def flush(self, text: str = "") -> str:
        out, self.pending = self.pending + text, ""
        return out


def _overlap(text: str, stop: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `stop`."""
    for n in range(min(len(text), len(stop) - 1), 0, -1):
        if text.endswith(stop[:n]):
            return n
    return 0


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _next_pow2(n: int) -> int:
    p = 512
    while p < n:
        p *= 2
    return p
