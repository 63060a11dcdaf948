"""`Generator`: one sequence of a context, driven token by token by `decide.Turn` (complete, chat).

`Generator` owns a context's sequence 0 and remembers which tokens its KV cache holds, so a new
prompt that starts like the previous one evaluates only the new tokens (chat turns, prompt reuse).
`stream()` yields text as it is produced: UTF-8 sequences are never split, stop strings are never
emitted (text that might begin one is held back until it is decided), and the statistics of the
run are in `Generator.stats` when the iterator ends. What ends a generation is decided in
`decide.py`, which the server's parallel scheduler uses too. With speculative decoding
(`speculative.py`), each step evaluates the last token with a draft of the next ones.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ...errors import ContextOverflow, Interrupted, PyllamaError
from ..media.prompt import context_room, prompt_cells
from ..model.native import Batch, Context, Model
from .context_checkpoints import Checkpoint, memory_n_swa, next_batch, restore
from .decide import STOP_CONTEXT, STOP_INTERRUPTED, Turn, reusable_prefix
from .sampling import Sampler, SamplingSettings
from .speculative import Speculation, Verified, draft_room, safe_draft, verify
from .stats import GenerationStats


class Generator:
    """Generates from one model/context pair, keeping the KV cache between calls."""

    def __init__(self, model: Model, ctx: Context, speculation: Speculation | None = None, *,
                 checkpoints: int = 0):
        """`checkpoints`: how many context checkpoints to keep (0: none) for a memory that cannot be cut
        anywhere (recurrent, hybrid, sliding windows). Prompts are then evaluated in llama-server's batches
        with checkpoints saved before them, so a later prompt that shares less than the cache holds
        restores one instead of starting over (chat)."""
        self.model = model
        self.ctx = ctx
        self.n_swa = memory_n_swa(model, ctx.swa_full) if checkpoints > 0 else None
        self.checkpoints: list[Checkpoint] | None = [] if self.n_swa is not None else None
        self.max_checkpoints = checkpoints
        self.cached: list[int] = []  # tokens whose keys/values sit in sequence 0
        self.speculation = speculation
        self.drafter = speculation.drafter(0) if speculation is not None else None
        self.batch = Batch(max(ctx.n_batch, 1))
        self.stats = GenerationStats()
        # With a context shift (complete's --context-shift): the tokens at the start that a shift keeps.
        self.shift_keep: int | None = None
        # A prompt with images (core/media's MediaPrompt): its chunks are what `prefill` evaluates.
        self.media: Any = None

    def close(self) -> None:
        self.batch.close()

    def reset(self) -> None:
        """Forget the KV cache (the next prompt is evaluated whole)."""
        self.ctx.clear_memory()
        self.cached = []
        if self.checkpoints is not None:
            self.checkpoints.clear()

    def check_fits(self, n_prompt: int) -> None:
        if n_prompt >= self.ctx.n_ctx:
            raise ContextOverflow(
                f"the prompt has {n_prompt} tokens but the context holds {self.ctx.n_ctx}",
                hint=f"raise the context with -c/--ctx-size (e.g. -c {_next_pow2(n_prompt + 256)})",
            )

    def prefill(self, prompt: Sequence[int], stop_flag: Callable[[], bool] = lambda: False,
                user_starts: Sequence[int] = ()) -> int:
        """Evaluate the part of `prompt` not already cached; return how many positions were reused.
        `user_starts`: where the prompt's user messages start (checkpoints are saved before them)."""
        self.check_fits(prompt_cells(self.media, len(prompt)))
        reuse = reusable_prefix(self.cached, prompt)
        if self.media is not None:  # an image is never cut: it is evaluated whole
            reuse = self.media.cut_before(reuse)
        if self.checkpoints is not None and reuse < len(self.cached):  # a cut the memory may not make
            reuse = restore(self.ctx, 0, self.checkpoints, self.n_swa or 0, len(self.cached), reuse, len(prompt))
        # Drop everything past the reused prefix, including entries an aborted decode left behind. A
        # recurrent or hybrid memory (Qwen3.5) cannot cut its state before its end: it starts over.
        if not self.ctx.remove_tokens(0, reuse, -1):
            self.ctx.clear_memory(data=False)
            reuse = 0
            if self.checkpoints is not None:
                self.checkpoints.clear()
        self.cached = list(prompt[:reuse])
        self.ctx.abort_check = stop_flag
        try:
            with self.ctx.abortable():
                if self.checkpoints is not None:
                    self._evaluate_in_checkpoint_batches(prompt, user_starts, stop_flag)
                    return reuse
                if self.media is not None:
                    self._evaluate_media(reuse, stop_flag)
                    self.cached = list(prompt)
                self._evaluate_text(prompt, len(prompt))
        finally:
            self.ctx.abort_check = None
        return reuse

    def _evaluate_text(self, prompt: Sequence[int], end: int) -> None:
        """Decode the prompt's tokens after those cached, up to `end`, in batches of n_batch."""
        for start in range(len(self.cached), end, self.ctx.n_batch):
            chunk = prompt[start:min(start + self.ctx.n_batch, end)]
            self.batch.fill(chunk, start, logits_last=start + len(chunk) == len(prompt))
            self.ctx.decode(self.batch)
            self.cached.extend(int(t) for t in chunk)

    def _evaluate_in_checkpoint_batches(self, prompt: Sequence[int], user_starts: Sequence[int],
                                        stop_flag: Callable[[], bool]) -> None:
        """Evaluate the prompt as the server's scheduler does for such a memory: its images (and the text
        before them) through libmtmd, then its text in batches that end where llama-server's end, with a
        checkpoint saved before each batch where llama-server saves one (context_checkpoints.py)."""
        assert self.checkpoints is not None
        n_prompt = len(prompt)
        if self.media is not None and len(self.cached) < self.media.media_end:
            self._evaluate_media(len(self.cached), stop_flag, end=self.media.media_end)
            self.cached = list(prompt[:self.media.media_end])
        while len(self.cached) < n_prompt:
            done = len(self.cached)
            chunk = next_batch(self.ctx, 0, done, min(self.ctx.n_batch, n_prompt - done), n_prompt, user_starts,
                               self.checkpoints, self.max_checkpoints)
            self._evaluate_text(prompt, done + chunk)

    def _evaluate_media(self, start: int, stop_flag: Callable[[], bool], end: int | None = None) -> None:
        """The prompt's libmtmd chunks from `start` on (to `end`); a Ctrl-C that aborted a decode is Interrupted."""
        try:
            self.media.evaluate(self.ctx.handle, start, self.ctx.n_batch, end=end)
        except PyllamaError:
            if stop_flag():
                raise Interrupted("evaluation interrupted") from None
            raise

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
        user_starts: Sequence[int] = (),
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
            user_starts: where the prompt's user messages start (see prefill).
        """
        stats = self.stats = GenerationStats(n_prompt=prompt_cells(self.media, len(prompt)))
        sampler = Sampler(self.model, sampling)
        sampler.accept_prompt(prompt)
        stats.seed = sampler.settings.seed
        # a shift makes room: no full context; M-RoPE images take more cells than positions
        n_ctx = context_room(self.media, self.ctx.n_ctx) if self.shift_keep is None else 2**62
        turn = Turn(self.model, max_tokens=max_tokens, stop=stop, n_ctx=n_ctx, stats=stats, show_cut_character=True,
                    ignore_eos=sampler.settings.ignore_eos, grammar=bool(sampler.settings.grammar))
        try:
            stats.n_cached = prompt_cells(self.media, self.prefill(prompt, stop_flag, user_starts))
        except BaseException:
            sampler.close()
            stats.stop_reason = STOP_INTERRUPTED
            raise
        turn.prefilled()
        try:
            if after_prefill is not None:
                after_prefill()
            yield from self._token_loop(turn, sampler, stop_flag, on_token)
        finally:
            sampler.close()

    def _token_loop(self, turn: Turn, sampler: Sampler, stop_flag: Callable[[], bool],
                    on_token: Callable[[int], None] | None) -> Iterator[str]:
        ctx = self.ctx
        if (reason := turn.stop_before_sampling(stop_flag())) is None:
            token = sampler.sample(ctx, -1)
            turn.generation_started = time.perf_counter()  # generation time runs from the first token
            accepted = turn.accept(token, len(self.cached))
            if accepted.counted and on_token is not None:
                on_token(token)
            if accepted.text:
                yield accepted.text
            reason = accepted.stop
            while reason is None:
                if (reason := turn.stop_before_sampling(stop_flag())) is not None:
                    break
                # `token` is sampled, not evaluated: evaluate it (with a draft of what follows) and sample on.
                texts: list[str] = []
                result = self._step(turn, sampler, token, texts, stop_flag, on_token)
                yield from texts
                token, reason = result.token, result.stop
                if result.evaluated:  # a drafted token filled the context: it is in the KV cache already
                    break
            else:
                if reason == STOP_CONTEXT:  # the token took the context's last position: the conversation keeps it
                    self._evaluate(token, [])
        tail = turn.finish(reason)
        if tail:
            yield tail

    def _step(self, turn: Turn, sampler: Sampler, token: int, texts: list[str], stop_flag: Callable[[], bool],
              on_token: Callable[[int], None] | None) -> Verified:
        """Evaluate `token` and any draft after it, and sample until the model disagrees with the draft."""
        if self.shift_keep is not None and len(self.cached) + 1 >= self.ctx.n_ctx:
            self._shift()
        position = len(self.cached)
        drafts = self._draft(turn, token, position)
        self._evaluate(token, drafts)

        def emit(accepted: Any, sampled: int, _index: int) -> None:
            if accepted.counted and on_token is not None:
                on_token(sampled)
            if accepted.text:
                texts.append(accepted.text)

        result = verify(turn, lambda i: sampler.sample(self.ctx, i), 0, position, drafts, emit, stop_flag)
        if drafts:
            self.drafter.feedback(len(drafts), result.accepted)  # type: ignore[union-attr]
            turn.stats.n_drafted += len(drafts)
            turn.stats.n_draft_accepted += result.accepted
            kept = position + 1 + result.kept
            self.ctx.remove_tokens(0, kept, -1)  # what the model did not agree with leaves the KV cache
            del self.cached[kept:]
        return result

    def _shift(self) -> None:
        """llama-completion's context shift: keep the first `shift_keep` tokens, drop half of the rest, and
        move what follows back into their positions."""
        keep = self.shift_keep or 0
        n_discard = (len(self.cached) - keep) // 2
        self.ctx.shift_tokens(0, keep, n_discard, len(self.cached))
        del self.cached[keep:keep + n_discard]

    def _draft(self, turn: Turn, token: int, position: int) -> list[int]:
        if self.drafter is None or self.shift_keep is not None:
            return []
        spec = self.speculation.settings  # type: ignore[union-attr]
        room = draft_room(turn, position, self.ctx.n_ctx, min(spec.n_max, self.ctx.n_batch - 1))  # one decode
        drafts = safe_draft(self.drafter, [*self.cached, token], room) if room > 0 else []
        return drafts if len(drafts) >= max(spec.n_min, 1) else []

    def _evaluate(self, token: int, drafts: list[int]) -> None:
        """Decode `token` and the drafted tokens after it, each with its logits."""
        batch, position = self.batch, len(self.cached)
        batch.clear()
        for k, t in enumerate([token, *drafts]):
            batch.add(t, position + k, (0,), True)
        self.ctx.decode(batch)
        self.cached.extend([token, *drafts])


def _next_pow2(n: int) -> int:
    p = 512
    while p < n:
        p *= 2
    return p
