"""Continuous batching: N slots share one context, and one scheduler thread runs them all.

Each slot owns a sequence id in the context, the tokens its KV cache holds, and the sampler chain
of its current request. At every step the scheduler builds ONE batch from every active slot — the
next prompt chunk of slots still evaluating their prompt beside the last sampled token of slots
that are generating — and calls llama_decode once for it. A request that arrives while others
generate starts at the next step instead of waiting for them (llama-server's design, `-np N`).

With speculative decoding (--spec-type), each generating slot drafts on its own: its last token
and its draft go into the same batch with logits at every position, and the slot samples along
its draft until the model disagrees (`speculative.verify`); the rest leaves its KV cache. A slot
with nothing to draft adds one token, as without speculation.

Requests beyond N wait in a FIFO queue. A new request goes to the idle slot whose cached tokens
share the longest prefix with its prompt, and only the rest of the prompt is evaluated.

LoRA adapters apply to the whole context, so a step runs the slots of one adapter set only (the
sets of the busy slots take turns, step by step), and a slot's cached tokens are reused only by a
request with the adapter set that made them (see lora_sets.py; the prompt cache, cache/, keeps
each entry's set too). The HTTP layer only submits jobs and reads `JobStream`s; it never touches llama.cpp.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any

from ...errors import InputError, ServerShutdown
from ..generate.decide import STOP_INTERRUPTED, Turn, common_prefix
from ..generate.speculative import SpeculativeSettings, verify
from ..media.prompt import prompt_cells
from ..generate.stats import GenerationStats
from ..text.reasoning import ThinkBudget
from .arrivals import Arrivals
from .cache.reuse import open_chunk_reuse, reuse_slot_chunks
from .cache.settings import CacheSettings
from .engine import BROKEN, CLOSED, READY, Engine
from .jobs import EmbeddingJob, EngineStats, Event, GenerationJob, JobStream, ModelSummary
from .checkpoints import Checkpoints, open_checkpoints
from .cut import StepCut, roll_back
from .post_sampling import post_sampling_prob
from .lora_sets import LoraTurns
from .slots import (GENERATING, IDLE, PREFILL, PaddingTrial, Slot, add_slot_tokens, check_slot_fits, pad_candidate,
                    plan_drafts, plan_prefill, prefill_media, runs_with)

SlotTask = tuple[int, Callable[[Any, Slot], Any], Future[Any]]  # (slot id, action, its result): on_idle_slot
Start = tuple[Slot, JobStream, list[int]]  # a request given a slot, to start (slot, stream, prompt)


class ParallelEngine(Engine):
    """N slots, one context, one scheduler thread doing continuous batching."""

    def __init__(self, *args: Any, n_slots: int = 1, kv_unified: bool = False,
                 speculative: SpeculativeSettings | None = None, prompt_cache: CacheSettings | None = None,
                 **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.speculative, self.cache_settings = speculative, prompt_cache
        self.prompt_cache: Any = None  # cache.prompt_cache.PromptCache once loaded, when enabled
        self._reuse_chunk = 0  # --cache-reuse, where the memory can shift
        self._speculation: Any = None
        if n_slots < 1:
            raise InputError(f"--parallel must be at least 1, got {n_slots}")
        self.n_slots = n_slots
        self.kv_unified = kv_unified
        self.slots = [Slot(i) for i in range(n_slots)]
        self._queue: deque[JobStream] = deque()
        self._cond = threading.Condition()
        self._stats = EngineStats()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._ctx: Any = None
        self._batch: Any = None
        self.n_ctx_slot = 0
        self._outbox: list[tuple[JobStream, Event]] = []  # events of this step, delivered together
        self._padding = PaddingTrial()
        self._arrivals = Arrivals(self._cond)  # requests on their way to submit (arrivals.py)
        self._pad: tuple[Slot, int] | None = None  # (idle slot, position) of this step's throwaway token
        self._timing_padding = False  # whether this step is one of PaddingTrial's
        self._slot_tasks: list[SlotTask] = []  # guarded by _cond
        self._cut = StepCut()  # aborts the step in flight (cut.py)
        self._marks: dict[int, int] = {}  # each slot's cached length before this step
        self.lora = LoraTurns()  # the LoRA adapters and whose turn it is (set by _load)
        self._checkpoints = Checkpoints(None, None, n_slots)  # what a prompt reuses, and its batches (checkpoints.py)

    # ---------------------------------------------------------------- Engine interface

    @property
    def n_ctx(self) -> int:
        return self.n_ctx_slot

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="pyllama-scheduler", daemon=True)
            self._thread.start()

    def submit(self, job: GenerationJob | EmbeddingJob) -> JobStream:
        if self.state not in (READY, BROKEN):
            raise RuntimeError(f"the engine is {self.state}")
        if isinstance(job, EmbeddingJob):
            raise InputError("this server generates text; start it with --embeddings to serve embeddings")
        stream = JobStream(job, asyncio.get_running_loop())
        with self._cond:
            self._arrivals.submitted()
            if self.state == BROKEN:  # broke since the route checked: the job ends as break_down ends the others
                stream.put(Event(error=self.error, done=True))
                return stream
            self._queue.append(stream)
            self._stats.queue_depth = len(self._queue)
            self._cond.notify()
        return stream

    def arriving(self) -> AbstractContextManager[None]:
        """Requests that reach the server together start in the same step (arrivals.py)."""
        return self._arrivals.arriving()

    def stats(self) -> EngineStats:
        with self._cond:
            s = replace(self._stats)
            s.queue_depth = len(self._queue)
            s.processing = sum(slot.state != IDLE for slot in self.slots)
            return s

    def slot_states(self) -> list[dict[str, Any]]:
        with self._cond:
            return [slot.describe() for slot in self.slots]

    def on_idle_slot(self, slot_id: int, action: Callable[[Any, Slot], Any]) -> Future[Any]:
        """Run `action(context, slot)` on the scheduler thread once slot `slot_id` is idle (llama-server's
        slot save, restore and erase); the future holds its result or error."""
        future: Future[Any] = Future()
        with self._cond:
            self._slot_tasks.append((slot_id, action, future))
            self._cond.notify()
        return future

    def _due_slot_tasks(self) -> list[SlotTask]:
        """The slot tasks whose slot is idle, taken off the list (with _cond held; run without it)."""
        due = [t for t in self._slot_tasks if self.slots[t[0]].state == IDLE]
        self._slot_tasks = [t for t in self._slot_tasks if t not in due]
        return due

    def _run_slot_tasks(self, due: list[SlotTask]) -> None:
        for slot_id, action, future in due:
            self._checkpoints.forget(slot_id)  # the slot's cells are saved, replaced or erased
            try:
                future.set_result(action(self._ctx, self.slots[slot_id]))
            except Exception as exc:  # noqa: BLE001 - the route answers with it
                future.set_exception(exc)

    def cancel_all(self, reason: BaseException | None = None) -> None:
        with self._cond:
            for stream in [*(slot.stream for slot in self.slots), *self._queue]:
                if stream is not None:
                    stream.cancel(reason)
            if reason is not None:
                self._cut.request()  # a cut that waited for the step in flight could miss its deadline
            self._cond.notify()

    def break_down(self, error: BaseException) -> None:
        """The context can never run again (an RPC server died under it, and the scheduler thread waits
        inside llama.cpp for good): every running and queued request ends with `error`, later ones get 503.

        Called from ggml's RPC thread (see _work), while the scheduler thread waits for it in llama.cpp.
        """
        with self._cond:
            self.error, self.state = error, BROKEN
            streams = [slot.stream for slot in self.slots if slot.stream is not None] + list(self._queue)
            self._queue.clear()
            self._stats.jobs_failed += len(streams)
        JobStream.put_all([(stream, Event(error=error, done=True)) for stream in streams])

    def close(self, timeout: float = 10.0) -> None:
        if self.state == CLOSED:
            return
        with self._cond:
            self._stopping = True
            for slot in self.slots:
                if slot.stream is not None:
                    slot.stream.cancel()
            self._cut.request()
            self._cond.notify()
        self._join_and_free(self._thread, timeout)

    # ---------------------------------------------------------------- scheduler thread

    def _load(self) -> None:
        from ..model.native import Batch

        # -c (or the model's training context) is shared by the slots.
        session = self._open_session({"n_seq_max": self.n_slots, "kv_unified": self.kv_unified})
        self.session, self._ctx = session, session.ctx
        # Without a unified cache each sequence gets an equal share of the context, as llama-server does.
        self.n_ctx_slot = self._ctx.n_ctx if self.kv_unified else self._ctx.n_ctx // self.n_slots
        self._cut.install(self._ctx)
        try:
            self._batch = Batch(max(session.ctx.n_batch, self.n_slots), n_seq_max=1)
            self._open_speculation()
        except BaseException:
            session.close()
            raise
        self.summary = ModelSummary.of(self.path, session.model, self._ctx, n_ctx=self.n_ctx_slot, embeddings=False)
        self._open_projector()
        self.lora = LoraTurns(session.model.adapters)
        self._checkpoints = open_checkpoints(session.model, self.settings.swa_full, self._ctx, self.n_slots,
                                             self.cache_settings)
        if self.cache_settings is not None and self.cache_settings.enabled:
            from .cache.prompt_cache import open_prompt_cache

            self.prompt_cache = open_prompt_cache(self.cache_settings, self, self.session.model)
        self._reuse_chunk = open_chunk_reuse(self.cache_settings, self._ctx)

    def _open_speculation(self) -> None:
        from ..generate.speculative import open_speculation

        if self.speculative is None:
            return
        self._speculation = open_speculation(self.speculative, self.settings, self.session.model,
                                             n_ctx_seq=self.n_ctx_slot, n_seq=self.n_slots, kv_unified=self.kv_unified)
        for slot in self.slots:
            slot.drafter = self._speculation.drafter(slot.id) if self._speculation is not None else None

    def _unload(self) -> None:
        for slot in self.slots:
            if slot.stream is not None:
                self._finish(slot, STOP_INTERRUPTED)
        self._flush()
        while self._queue:
            self._queue.popleft().put(Event(error=ServerShutdown(), done=True))
        if self._batch is not None:
            self._batch.close()
        if self._speculation is not None:
            self._speculation.close()
        if self.prompt_cache is not None:
            self.prompt_cache.close(self._ctx, self.slots)
        # The session (context and model) is freed by close(): vocabulary helpers may still be in use.

    def _work(self) -> None:
        """_cond guards the queue and who holds which slot. No llama.cpp call that touches the KV cache
        runs with it held (slot tasks, a start's prompt cache, the step): over RPC, such a call waits for
        ggml's RPC thread, which takes _cond when the server dies (break_down); both would wait for good."""
        while True:
            with self._cond:
                while (not self._stopping and not self._queue and not self._slot_tasks
                       and all(s.state == IDLE for s in self.slots)):
                    self._cond.wait()
                if self._stopping:
                    return
                due = self._due_slot_tasks()
                if not due:
                    starting = self._assign_waiting()
                    starting += self._wait_for_arrivals()
                    self._cut.clear()  # requested for requests cut by now: dropped next
            if due:  # their slots stay idle until they ran: requests are assigned on the next turn
                self._run_slot_tasks(due)
                continue
            self._start_all(starting)
            self._drop_cancelled()
            prefill_media(self.slots, self._ctx, self._fail, self._checkpoints.takes_checkpoints)
            if self._build_batch():
                self._decode_and_sample()
            self._flush()

    # ---- admission

    def _assign_waiting(self) -> list[Start]:
        """Give queued requests (in arrival order) to idle slots, best prefix match first; a request
        for a slot that is busy (llama-server's id_slot) waits for it without holding up the others.
        With _cond held: each slot given holds its request at once; _start_all starts them."""
        held: list[JobStream] = []
        starting: list[Start] = []
        while self._queue:
            idle = [s for s in self.slots if s.state == IDLE]
            if not idle:
                break
            stream = self._queue.popleft()
            if stream.cancelled:
                stream.put(Event(done=True, stats=GenerationStats(stop_reason=STOP_INTERRUPTED)))
                self._stats.jobs_cancelled += 1
                continue
            wanted = getattr(stream.job, "id_slot", -1)
            if wanted >= 0:
                idle = [s for s in idle if s.id == wanted]
                if not idle:
                    held.append(stream)
                    continue
            prompt = list(stream.job.prompt)  # type: ignore[union-attr]
            slot = max(idle, key=lambda s: (common_prefix(s.cached, prompt),
                                            -runs_with(self.slots, s, self.kv_unified), -s.requests_served, -s.id))
            slot.stream, slot.state = stream, PREFILL  # held for it: cancel_all and break_down see it there
            starting.append((slot, stream, prompt))
        self._queue.extendleft(reversed(held))
        self._stats.queue_depth = len(self._queue)
        return starting

    def _start_all(self, starting: list[Start]) -> None:
        for slot, stream, prompt in starting:
            try:
                self._start(slot, stream, prompt)
                if self.prompt_cache is not None:
                    self.prompt_cache.free_idle_slots(self._ctx, self.slots)
            except Exception as exc:  # noqa: BLE001 - one bad request must not stop the others
                with self._cond:
                    self._release(slot)
                    self._stats.jobs_failed += 1
                stream.put(Event(error=exc, done=True))

    def _wait_for_arrivals(self) -> list[Start]:
        """Hold this step (with _cond held) while a slot is free for requests still on their way
        to submit, up to arrivals.ARRIVAL_WAIT_S after the newest of them reached the server (see arriving)."""
        starting: list[Start] = []
        while self._arrivals and not self._stopping and any(slot.state == IDLE for slot in self.slots):
            remaining = self._arrivals.seconds_left()
            if remaining <= 0:
                break
            self._cond.wait(remaining)
            starting += self._assign_waiting()
        return starting

    def _start(self, slot: Slot, stream: JobStream, prompt: list[int]) -> None:
        from ..generate.sampling import Sampler

        job: GenerationJob = stream.job  # type: ignore[assignment]
        n_prompt, n_ctx = check_slot_fits(job.media, len(prompt), self.n_ctx_slot)  # cells, and positions left
        slot.sampler = Sampler(self.model, job.sampling)
        slot.sampler.accept_prompt(prompt)
        lora = self.lora.scales_of(job)  # the slot's cells serve only the adapter set that made them
        allowed = job.cache_prompt and lora == slot.lora
        reuse = self._checkpoints.kept_prefix(slot, prompt, allowed)
        shifted = (reuse_slot_chunks(self._ctx, slot, prompt, reuse, self._reuse_chunk, self.prompt_cache)
                   if allowed and not self._checkpoints.active else reuse)
        if self.prompt_cache is not None:  # saves the slot's cells under slot.lora, the set that made them
            reuse, _ = self.prompt_cache.prepare(self._ctx, slot, self.slots, prompt, shifted, job.cache_prompt, lora,
                                                 shifted=shifted > reuse)
        else:
            reuse = shifted
            self._ctx.remove_tokens(slot.id, reuse, -1)
        slot.media = job.media  # its images are evaluated outside the lock, before the next batch
        slot.lora = lora
        slot.cached = prompt[:reuse]
        slot.pending = prompt[reuse:]
        slot.stream, slot.state = stream, PREFILL
        slot.stats = GenerationStats(n_prompt=n_prompt, n_cached=prompt_cells(job.media, reuse),
                                     seed=slot.sampler.settings.seed, id_slot=slot.id)
        settings = slot.sampler.settings
        slot.turn = Turn(self.model, max_tokens=job.max_tokens, stop=job.stop, n_ctx=n_ctx,
                         ignore_eos=settings.ignore_eos, grammar=bool(settings.grammar), stats=slot.stats)
        slot.budget = None if job.think_budget is None else ThinkBudget(
            job.think_budget, lambda t: self.model.token_to_piece(t, special=False).decode("utf-8", errors="replace"))
        if slot.drafter is not None:  # each request drafts afresh: an earlier one's bad luck must not stop it
            slot.drafter.new_request()
        slot.batch_index = -1
        if job.progress:
            self._post(stream, Event(progress=(len(prompt), reuse, reuse)))

    # ---- one step

    def _drop_cancelled(self) -> None:
        for slot in self.slots:
            if slot.stream is not None and slot.stream.cancelled:
                self._finish(slot, STOP_INTERRUPTED)

    def _build_batch(self) -> bool:
        """Fill the batch in slot order: a generating slot's last token, a prefilling slot's next prompt
        chunk (room left of n_batch, shortest rest first: plan_prefill), maybe a throwaway token (_pad_candidate).

        The order is what makes a step one pass over the model. With a KV cache per sequence,
        llama.cpp cuts a batch into ubatches of consecutive, increasing sequence ids, each a full
        pass: a new request in slot 2 added after slots 0, 1 and 3 (llama-server's order) would
        make two passes of that step (measured 14.5 ms instead of 8.6 on the 246M benchmark model).
        """
        batch = self._batch
        batch.clear()
        self._marks = {slot.id: len(slot.cached) for slot in self.slots}
        room = self._ctx.n_batch - sum(slot.state == GENERATING for slot in self.slots)
        room -= plan_drafts(self.slots, self.speculative, self.n_ctx_slot, room)
        turn = self.lora.next_turn(self._ctx, self.slots)
        candidate = pad_candidate(self.slots, self._padding, self.kv_unified, self.n_ctx_slot) if turn is None else None
        self._timing_padding = candidate is not None and self._padding.decision is None
        pad_slot = candidate if candidate is not None and self._padding.choose() else None
        self._pad = None
        turn_slots = [s for s in self.slots if turn is None or s.lora == turn]
        ubatch_room = room - self._ctx.n_batch + self._ctx.n_ubatch
        chunks = self._checkpoints.plan(self.slots, plan_prefill(turn_slots, room, ubatch_room))  # cut at checkpoints
        for slot in self.slots:
            slot.batch_index, slot.in_batch = -1, False
            if turn is not None and slot.state != IDLE and slot.lora != turn:
                continue  # another adapter set's turn: this slot waits for its own
            if slot is pad_slot:
                self._pad = (slot, len(slot.cached))
                batch.add(0, len(slot.cached), (slot.id,), False)
            else:
                add_slot_tokens(slot, batch, chunks.get(slot.id, 0))
        return batch.n_tokens > 0

    def _decode_and_sample(self) -> None:
        started = time.perf_counter()
        try:
            self._ctx.decode(self._batch)
        except Exception as exc:  # noqa: BLE001 - fail the slots in this batch, keep serving
            if self._cut.requested:  # aborted (cut.py): its cut requests end, the others go on next step
                for slot in roll_back(self._ctx, self.slots, self._marks):
                    self._finish(slot, STOP_INTERRUPTED)
                return
            for slot in self.slots:
                if slot.state != IDLE and slot.in_batch:
                    self._fail(slot, exc)
            return
        finally:
            if self._pad is not None:
                self._padding.unpad(self._ctx, *self._pad)
        if self._timing_padding:
            self._padding.record(self._pad is not None, time.perf_counter() - started)
        self._stats.n_decode += 1
        self._stats.n_busy_slots += sum(slot.in_batch for slot in self.slots)
        for slot in self.slots:
            if slot.state == PREFILL and slot.in_batch and slot.job.progress:
                done = slot.stats.n_prompt - len(slot.pending)  # in cells: an M-RoPE image has more than positions
                self._post(slot.stream, Event(progress=(slot.stats.n_prompt, slot.stats.n_cached, done)))
        for slot in self.slots:
            if slot.batch_index < 0 or slot.stream is None:
                continue
            if slot.state == PREFILL:
                slot.turn.prefilled()
                slot.state = GENERATING
            self._sample(slot)

    def _sample(self, slot: Slot) -> None:
        """Sample the slot's next token, and on along its draft while the model agrees (speculative.verify)."""
        job, turn, drafts = slot.job, slot.turn, slot.drafts
        if (reason := turn.stop_before_sampling(slot.stream.cancelled)) is not None:
            return self._finish(slot, reason)
        position = len(slot.cached) - 1 - len(drafts)  # where the token at batch_index sits

        def emit(accepted: Any, token: int, index: int) -> None:
            probs = []
            if accepted.counted and job.n_probs >= 0:
                logits = self._ctx.logits(index)
                probs = [post_sampling_prob(self, logits, token, job.n_probs, slot.sampler.settings)
                         if job.post_sampling else self.token_prob(logits, token, job.n_probs)]
            if accepted.text or probs or accepted.counted:
                self._post(slot.stream, Event(text=accepted.text, probs=probs,
                                              tokens=[token] if accepted.counted else []))

        result = verify(turn, lambda i: slot.next_token(self._ctx, i), slot.batch_index, position, drafts, emit,
                        lambda: slot.stream.cancelled)
        slot.settle_draft(self._ctx, position, result)
        if result.stop is not None:
            return self._finish(slot, result.stop)
        slot.last_token = result.token

    # ---- ending a request

    def _finish(self, slot: Slot, reason: str) -> None:
        stats, stream = slot.stats, slot.stream
        tail = slot.turn.finish(reason)  # every slot with a request has its Turn (see _start); sets stop_reason
        if tail and stream is not None:
            self._post(stream, Event(text=tail))
        with self._cond:
            self._stats.jobs_done += reason != STOP_INTERRUPTED
            self._stats.jobs_cancelled += reason == STOP_INTERRUPTED
            self._stats.add_generation(stats)
            slot.requests_served += 1
            self._release(slot)
        # Released first, so a client that sees the end of its stream also sees its slot idle.
        if stream is not None:
            self._post(stream, Event(done=True, stats=stats))

    def _post(self, stream: JobStream, event: Event) -> None:
        self._outbox.append((stream, event))

    def _flush(self) -> None:
        if self._outbox:
            JobStream.put_all(self._outbox)
            self._outbox = []

    def _fail(self, slot: Slot, exc: Exception) -> None:
        stream = slot.stream
        # What the failed batch left in this sequence is unknown: forget the slot's cache.
        self._ctx.remove_tokens(slot.id, 0, -1)
        slot.cached = []
        self._checkpoints.forget(slot.id)
        with self._cond:
            self._stats.jobs_failed += 1
            self._release(slot)
        if stream is not None:
            self._post(stream, Event(error=exc, done=True))

    def _release(self, slot: Slot) -> None:
        if slot.sampler is not None:
            slot.sampler.close()
        slot.sampler, slot.stream, slot.state = None, None, IDLE
        slot.pending, slot.batch_index, slot.last_token, slot.drafts = [], -1, -1, []
        slot.turn, slot.budget, slot.media = None, None, None
