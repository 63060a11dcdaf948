"""A slot of the parallel scheduler (one sequence of the shared context, and its speculative draft)
and the step padding trial."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..generate.decide import Turn
from ...errors import ContextOverflow
from ..generate.stats import GenerationStats
from ..media.prompt import context_room, prompt_cells
from ..text.reasoning import ThinkBudget
from .jobs import GenerationJob, JobStream

IDLE, PREFILL, GENERATING = "idle", "prefill", "generating"


@dataclass
class Slot:
    """One sequence of the shared context and the request it is serving."""

    id: int
    cached: list[int] = field(default_factory=list)  # tokens in this sequence's KV cache
    state: str = IDLE
    stream: JobStream | None = None
    sampler: Any = None
    pending: list[int] = field(default_factory=list)  # prompt tokens still to evaluate
    last_token: int = -1  # sampled, not yet evaluated
    batch_index: int = -1  # where this slot's logits sit in the last batch (-1: none)
    in_batch: bool = False  # whether the last batch held any of this slot's tokens
    stats: GenerationStats = field(default_factory=GenerationStats)
    turn: Turn | None = None  # the per-token decisions of the current request
    budget: ThinkBudget | None = None  # the request's thinking budget, if it has one
    requests_served: int = 0
    drafter: Any = None  # this slot's speculative drafter (None: no speculation)
    drafts: list[int] = field(default_factory=list)  # tokens drafted after last_token in this step's batch
    lora: tuple[float, ...] = ()  # the LoRA scales the request runs with, and that made the cached tokens
    media: Any = None  # a prompt with images (core/media's MediaPrompt) whose chunks libmtmd still has to evaluate

    def prefill_media(self, ctx: Any, text_after: bool = False) -> None:
        """Evaluate the images of a request that just started (and its text up to the last token, which
        the next batch evaluates with the other slots' tokens, for its logits; with `text_after`, the
        scheduler's batches evaluate all the text after the last image: see prefill_slot)."""
        from ..media.prompt import prefill_slot

        media, self.media = self.media, None
        held = prefill_slot(media, ctx, self.id, len(self.cached), text_after=text_after)
        self.cached, self.pending = list(media.tokens[:held]), list(media.tokens[held:])

    def plan_draft(self, n_ctx: int, n_max: int, n_min: int) -> list[int]:
        """What to draft after `last_token` this step (nothing without a drafter or room for one)."""
        from ..generate.speculative import draft_room, safe_draft

        self.drafts = []
        if self.drafter is None or self.state != GENERATING or self.turn is None:
            return self.drafts
        room = draft_room(self.turn, len(self.cached), n_ctx, n_max)
        if room > 0:
            drafts = safe_draft(self.drafter, [*self.cached, self.last_token], room)
            self.drafts = drafts if len(drafts) >= max(n_min, 1) else []
        return self.drafts

    def settle_draft(self, ctx: Any, position: int, result: Any) -> None:
        """Count this step's draft (a speculative.Verified) and drop what the model did not agree with
        from the KV cache; `position` is where last_token sat."""
        if not self.drafts:
            return
        self.drafter.feedback(len(self.drafts), result.accepted)
        self.stats.n_drafted += len(self.drafts)
        self.stats.n_draft_accepted += result.accepted
        self.stats.n_draft_steps += 1
        kept = position + 1 + result.kept
        ctx.remove_tokens(self.id, kept, -1)
        del self.cached[kept:]
        self.drafts = []

    @property
    def job(self) -> GenerationJob:
        assert self.stream is not None
        return self.stream.job  # type: ignore[return-value]

    def next_token(self, ctx: Any, index: int) -> int:
        """The token sampled from batch row `index`, or the one a spent thinking budget forces (the sampler
        records it too)."""
        forced = self.budget.forced() if self.budget is not None else None
        if forced is None:
            token = self.sampler.sample(ctx, index)
        else:
            token = forced
            self.sampler.accept(token)
        if self.budget is not None:
            self.budget.accepted(token)
        return token

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.id, "state": self.state, "n_cached": len(self.cached),
            "n_prompt": self.stats.n_prompt if self.state != IDLE else 0,
            "n_generated": self.stats.n_generated if self.state != IDLE else 0,
            "requests_served": self.requests_served,
        }


def plan_drafts(slots: list[Slot], spec: Any, n_ctx: int, room: int) -> int:
    """Each generating slot's draft for this step (--spec-type `spec`, or None), within the `room` the
    batch has; returns the drafted tokens in all."""
    used = 0
    for slot in slots:
        slot.drafts = []
        if spec is not None and slot.drafter is not None and room - used > 0:
            used += len(slot.plan_draft(n_ctx, min(spec.n_max, room - used), spec.n_min))
    return used


def plan_prefill(slots: list[Slot], room: int, ubatch_room: int) -> dict[int, int]:
    """How many prompt tokens each prefilling slot evaluates this step, within `room`: the shortest
    rest first. An agent's later turn (a few dozen new tokens after a cached prefix) then gets its
    first token in the next step instead of waiting behind another conversation's long first prompt,
    which loses only those few tokens of room (llama-server fills the room in slot order).

    A step that gives someone a token (a slot generating, or a prompt that ends within one ubatch)
    stops at one ubatch (`ubatch_room`: n_ubatch less the step's other tokens), and a step that ends
    a prompt carries no part of a prompt it does not end. llama_decode returns only when its whole
    batch is done, so more of another prompt would hold those tokens back by the time that part takes,
    time it costs the same in the steps after."""
    prefilling = sorted((s for s in slots if s.state == PREFILL), key=lambda s: (len(s.pending), s.id))
    ends_one = bool(prefilling) and len(prefilling[0].pending) <= ubatch_room
    if (ends_one or any(s.state == GENERATING for s in slots)) and ubatch_room > 0:
        room = min(room, ubatch_room)
    chunks: dict[int, int] = {}
    for slot in prefilling:
        rest = len(slot.pending)
        chunks[slot.id] = rest if rest <= room else (0 if ends_one else max(room, 0))
        room -= chunks[slot.id]
    return chunks


class PaddingTrial:
    """Whether a step of three tokens should get a fourth, throwaway one: decided by timing both.

    On a CPU, llama.cpp multiplies repacked weights (Q4_0, Q4_K, IQ4_NL, ...) by four tokens at
    a time and by leftover tokens one at a time, each reading the whole matrix again, so three
    tokens cost more than four (9.5 ms against 7.7 on the 246M Q4_0 benchmark model). Other
    weights, and GPUs, scale the other way. So the first steps that could be padded alternate
    between padded and not, and after TRIALS of each the faster choice is kept for good.
    """

    TRIALS = 8

    def __init__(self) -> None:
        self.seconds: dict[bool, list[float]] = {True: [], False: []}
        self.decision: bool | None = None

    def choose(self) -> bool:
        if self.decision is not None:
            return self.decision
        return len(self.seconds[True]) < len(self.seconds[False])  # alternate, unpadded first

    def record(self, padded: bool, seconds: float) -> None:
        if self.decision is not None:
            return
        self.seconds[padded].append(seconds)
        if all(len(times) >= self.TRIALS for times in self.seconds.values()):
            self.decision = statistics.median(self.seconds[True]) < statistics.median(self.seconds[False])

    def unpad(self, ctx: Any, slot: Slot, position: int) -> None:
        """Drop the throwaway token from the idle slot's sequence. A memory that cannot drop a
        sequence's last token alone (a recurrent model's) forgets the slot's cache instead, and
        padding stops."""
        if not ctx.remove_tokens(slot.id, position, -1):
            ctx.remove_tokens(slot.id, 0, -1)
            slot.cached = []
            self.decision = False


def runs_with(slots: list[Slot], candidate: Slot, kv_unified: bool) -> int:
    """How many runs of consecutive busy slots there would be with `candidate` busy too: each run
    is a separate pass over the model at every step (see the scheduler's _build_batch), so between
    slots that cache the prompt equally well, the one that closes a gap is the better choice."""
    if kv_unified:  # one stream: llama.cpp passes any mix of sequences at once
        return 1
    busy = [slot.state != IDLE or slot is candidate for slot in slots]
    return sum(b and (i == 0 or not busy[i - 1]) for i, b in enumerate(busy))


def add_slot_tokens(slot: Slot, batch: Any, n_prompt: int) -> None:
    """Add a slot's tokens to the step's batch: a generating slot's last token and its draft (logits at
    each), or a prefilling slot's next `n_prompt` prompt tokens (plan_prefill's share; logits at the
    prompt's last)."""
    if slot.state == GENERATING:
        slot.batch_index, slot.in_batch = batch.n_tokens, True
        for token in [slot.last_token, *slot.drafts]:
            batch.add(token, len(slot.cached), (slot.id,), True)
            slot.cached.append(token)
    elif slot.state == PREFILL and n_prompt > 0:
        chunk, slot.pending = slot.pending[:n_prompt], slot.pending[n_prompt:]
        slot.in_batch = True
        for k, token in enumerate(chunk):
            last = not slot.pending and k == len(chunk) - 1
            if last:
                slot.batch_index = batch.n_tokens
            batch.add(token, len(slot.cached), (slot.id,), last)
            slot.cached.append(token)


def pad_candidate(slots: list[Slot], padding: PaddingTrial, kv_unified: bool, n_ctx_slot: int) -> Slot | None:
    """The idle slot that could hold a throwaway token making this step four tokens instead of
    three (see PaddingTrial), or None. Only for steps of one token per slot in a KV cache per
    sequence, where the idle slot's own cells have room; its cached tokens stay as they are."""
    if kv_unified or padding.decision is False:  # nothing to pad, or to time
        return None
    busy = [slot for slot in slots if slot.state != IDLE]
    if len(busy) % 4 != 3 or any(slot.drafts for slot in busy) \
            or any(slot.state == PREFILL and len(slot.pending) != 1 for slot in busy):
        return None
    idle = [slot for slot in slots if slot.state == IDLE and len(slot.cached) < n_ctx_slot - 1]
    return min(idle, key=lambda s: runs_with(slots, s, kv_unified)) if idle else None


def check_slot_fits(media: Any, n_positions: int, n_ctx_slot: int) -> tuple[int, int]:
    """The KV cells a prompt of `n_positions` positions fills in a slot, and the positions the slot has for
    it and its answer (fewer than its cells when M-RoPE images take more cells than positions).

    Raises:
        ContextOverflow: the prompt does not fit a slot.
    """
    n_prompt = prompt_cells(media, n_positions)
    if n_prompt >= n_ctx_slot:
        raise ContextOverflow(f"the prompt has {n_prompt} tokens but a slot's context holds {n_ctx_slot}",
                              hint="shorten the prompt, or restart with a larger -c/--ctx-size or fewer --parallel")
    return n_prompt, context_room(media, n_ctx_slot)


def prefill_media(slots: list[Slot], ctx: Any, fail: Callable[[Slot, Exception], None], text_after: bool = False) -> None:
    """libmtmd encodes the images of requests that just started (seconds for a large model), outside the
    scheduler's lock, so that requests keep arriving meanwhile; a request whose media fail goes to `fail`.
    `text_after`: leave the text after the last image to the scheduler's batches (Slot.prefill_media)."""
    for slot in slots:
        if slot.media is not None:
            try:
                slot.prefill_media(ctx, text_after)
            except Exception as exc:  # noqa: BLE001 - one bad request must not stop the others
                fail(slot, exc)
