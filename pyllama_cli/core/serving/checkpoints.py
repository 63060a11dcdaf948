"""Context checkpoints: a slot's cache reused as llama-server reuses it when the model's memory cannot
be cut at any position (sliding-window attention without --swa-full, recurrent and hybrid models).

A sliding-window layer keeps the cells of the last n_swa positions only, and a recurrent layer keeps
one state: cut at position p, such a sequence no longer holds what the token at p saw. llama-server
(`--ctx-checkpoints`, default 32 a slot) therefore

- evaluates a prompt's last tokens in batches of their own, ending 4 + n_ubatch and 4 tokens before
  its end, and before each batch near the end saves the part of the sequence that cannot be cut
  (LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY): a checkpoint;
- on the next request, when the cells it keeps may not cover the reused prefix, restores the newest
  checkpoint at or before that prefix and evaluates the rest again, or evaluates the whole prompt.

The same batches are the same rounding: a near-tie between two tokens then falls the same way as in
llama-server, and a repeated request gets the same answer. (Facts from llama-server's update_slots;
none of its code.)
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any

MAX_CHECKPOINTS = 32  # llama-server's --ctx-checkpoints default (cache/settings.py's, for the flag)
MIN_STEP = 8192  # llama-server's --checkpoint-min-step default: the least spacing of mid-prompt checkpoints
LAST_BATCH = 4  # a checkpoint this many tokens (and n_ubatch more) before a prompt's end
PARTIAL_ONLY = 1  # LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY: the cells that cannot be cut (SWA, recurrent)


@dataclass
class Checkpoint:
    n_tokens: int  # prompt tokens the sequence held when it was saved
    pos_min: int  # the memory's positions (llama_memory_seq_pos_min/max) when it was saved
    pos_max: int
    data: bytes

    @property
    def last(self) -> int:
        """The prompt position of pos_max. The same, but right after an M-RoPE image: the memory holds its
        cells at fewer positions than the image takes in the prompt (its text goes on at the prompt's)."""
        return self.n_tokens - 1

    @property
    def first(self) -> int:
        """The prompt position of pos_min, by the same offset."""
        return self.pos_min + self.last - self.pos_max


@dataclass
class SlotCheckpoints:
    """One slot's checkpoints, oldest first."""

    saved: list[Checkpoint] = field(default_factory=list)


def open_checkpoints(model: Any, swa_full: bool, ctx: Any, n_slots: int, settings: Any = None) -> Checkpoints:
    """The context's checkpoints: active for a memory that needs them (memory_n_swa), else inactive."""
    return Checkpoints(ctx, memory_n_swa(model, swa_full), n_slots, settings)


def memory_n_swa(model: Any, swa_full: bool) -> int | None:
    """The window llama-server's reuse check uses (0 for a recurrent or hybrid model), or None when the
    model's memory can be cut anywhere and needs no checkpoints."""
    from ..model.native import lib

    for check in ("llama_model_is_recurrent", "llama_model_is_hybrid"):
        if getattr(lib, check, None) is not None and getattr(lib, check)(model.handle):
            return 0
    n_swa = int(lib.llama_model_n_swa(model.handle)) if hasattr(lib, "llama_model_n_swa") else 0
    return n_swa if n_swa > 0 and not swa_full else None


class Checkpoints:
    """Every slot's checkpoints in a context whose memory needs them (see the module docstring); for any
    other memory (`n_swa` None: inactive) a prompt keeps the slot's common prefix and is cut by nothing."""

    def __init__(self, ctx: Any, n_swa: int | None, n_slots: int, settings: Any = None):
        """`settings`: the prompt cache's (CacheSettings): --ctx-checkpoints, and --cache-ram for the states
        kept across conversations (cache/sequence_states.py); None: llama-server's checkpoints, no cache."""
        from .cache.sequence_states import SequenceStates

        self.ctx, self.n_swa, self.active = ctx, n_swa or 0, n_swa is not None
        self.limit = settings.ctx_checkpoints if settings is not None else MAX_CHECKPOINTS  # 0: none, no cut batches
        self.states = SequenceStates(settings.ram_bytes) if settings is not None and settings.ram_mib != 0 else None
        self.slots = [SlotCheckpoints() for _ in range(n_slots)]

    @property
    def takes_checkpoints(self) -> bool:
        """Whether prompts are cut into batches and checkpoints saved before them (see plan)."""
        return self.active and self.limit > 0

    def cut_chunk(self, slot: Any, chunk: int) -> int:
        """The prompt tokens a slot evaluates this step: `chunk`, ended early at the first boundary inside
        it: a user message's start (the last one, or one past MIN_STEP since the last checkpoint), or
        4 + n_ubatch or 4 tokens before the prompt's end (at most n_batch)."""
        done, n_prompt, starts = len(slot.cached), _prompt_positions(slot), slot.job.user_starts
        saved = self.slots[slot.id].saved
        boundaries = [b for b in starts if b == starts[-1] or not saved or b > saved[-1].n_tokens + MIN_STEP]
        offsets = (LAST_BATCH + self.ctx.n_ubatch, LAST_BATCH)
        boundaries += [n_prompt - min(self.ctx.n_batch, offset) for offset in offsets]
        inside = [b for b in boundaries if done < b < done + chunk]
        return min(inside) - done if inside else chunk

    def kept_prefix(self, slot: Any, prompt: list[int], allowed: bool) -> int:
        """The prompt tokens slot `slot` keeps in its cache (`allowed`: the request may reuse any), at least
        one short of the whole prompt, as reusable_prefix."""
        from ..generate.decide import common_prefix, reusable_prefix

        if not self.active:
            return reusable_prefix(slot.cached, prompt) if allowed else 0
        if self.states is not None and allowed:  # llama-server swaps states in on its own slot choice
            self.states.swap(self.ctx, slot, self.slots[slot.id].saved, prompt)
        common = common_prefix(slot.cached, prompt) if allowed else 0
        kept = self.reuse(slot.id, len(slot.cached), common, len(prompt))
        return kept - 1 if kept == len(prompt) and kept > 0 else kept

    def plan(self, slots: list[Any], chunks: dict[int, int]) -> dict[int, int]:
        """This step's prompt chunks (plan_prefill's) cut at the checkpoint boundaries, and the checkpoints
        saved before they are evaluated."""
        if not self.takes_checkpoints:
            return chunks
        for slot in slots:
            if chunks.get(slot.id, 0) > 0:
                chunks[slot.id] = self.cut_chunk(slot, chunks[slot.id])
                self.before_decode(slot, chunks[slot.id])
        return chunks

    def reuse(self, slot_id: int, n_cached: int, n_common: int, n_prompt: int) -> int:
        """How many prompt tokens the slot keeps of the `n_common` its `n_cached` share with the new prompt:
        all when its cells cover them, else those of a restored checkpoint, else none. Checkpoints past
        the kept prefix are dropped."""
        from ..model.native import lib

        kept, saved = n_common, self.slots[slot_id].saved
        threshold = max(0, kept - self.n_swa - (0 if kept < n_prompt else 1))
        if 0 < kept <= n_cached and int(lib.llama_memory_seq_pos_min(self.ctx.memory, slot_id)) >= threshold:
            usable = [c for c in saved if c.last <= kept and (c.first < threshold or c.pos_min == 0)]
            if usable and self._load(slot_id, usable[-1]):
                kept = min(kept, max(usable[-1].first + 1, usable[-1].last), usable[-1].n_tokens)
            else:
                kept = 0
        saved[:] = [c for c in saved if c.last <= kept]
        return kept

    def before_decode(self, slot: Any, chunk: int) -> None:
        """Save a checkpoint of the slot's sequence before this step's `chunk` of its prompt is evaluated,
        where llama-server saves one: before a chunk near the prompt's end, or one that starts a user
        message (the last one, the first checkpoint, or one past MIN_STEP)."""
        from ..model.native import lib

        slot_id, n_start, n_prompt, starts = slot.id, len(slot.cached), _prompt_positions(slot), slot.job.user_starts
        saved = self.slots[slot_id].saved
        near_end = n_prompt < n_start + chunk + self.ctx.n_ubatch
        last_user = bool(starts) and n_start == starts[-1]
        if not (near_end or n_start in starts):
            return
        if not (near_end or last_user or not saved or n_start > saved[-1].n_tokens + MIN_STEP):
            return
        pos_min = int(lib.llama_memory_seq_pos_min(self.ctx.memory, slot_id))
        if pos_min < 0:
            return  # nothing evaluated yet
        kept = [c for c in saved if c.n_tokens != n_start]  # a new one at the same place supersedes it
        saved[:] = kept[max(0, len(kept) + 1 - self.limit):]  # the oldest go first
        pos_max = int(lib.llama_memory_seq_pos_max(self.ctx.memory, slot_id))
        saved.append(Checkpoint(n_start, pos_min, pos_max, self._read(slot_id)))

    def forget(self, slot_id: int) -> None:
        """The slot's sequence was emptied or replaced: its checkpoints no longer apply."""
        self.slots[slot_id].saved.clear()

    def _read(self, slot_id: int) -> bytes:
        from ..model.native import lib

        size = int(lib.llama_state_seq_get_size_ext(self.ctx.handle, slot_id, PARTIAL_ONLY))
        buffer = (ctypes.c_uint8 * size)()
        written = int(lib.llama_state_seq_get_data_ext(self.ctx.handle, buffer, size, slot_id, PARTIAL_ONLY))
        return bytes(buffer)[:written]

    def _load(self, slot_id: int, checkpoint: Checkpoint) -> bool:
        from ..model.native import lib

        data = checkpoint.data
        buffer = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        return int(lib.llama_state_seq_set_data_ext(self.ctx.handle, buffer, len(data), slot_id, PARTIAL_ONLY)) != 0


def _prompt_positions(slot: Any) -> int:
    """A prefilling slot's prompt length in positions, the unit of its cached tokens and of the boundaries
    (its stats count cells: more than positions past an M-RoPE image)."""
    return len(slot.cached) + len(slot.pending)


# ---------------------------------------------------------------- where user messages start


USER_PROBE = "U_USER_MSG Hello END_U"  # a user message no template renders by accident


def user_start_marker(render: Any) -> str:
    """The text a chat template writes before a user message's content (ChatML: "<|im_start|>user"), found
    as llama.cpp's template analysis finds it: `render(messages)` of no message and of one user message
    differ by the user block; its markers before the content, less a leading end marker and whitespace."""
    import re

    user = {"role": "user", "content": USER_PROBE}
    try:
        before, after = render([]), render([user])
    except Exception:  # noqa: BLE001 - a template that refuses an empty chat: compare longer ones
        first = [{"role": "user", "content": "V_USER_MSG Hello END_V"}, {"role": "assistant", "content": "A_MSG"}]
        try:
            before, after = render(first), render([*first, user])
        except Exception:  # noqa: BLE001 - no marker: no user spans, as in llama.cpp
            return ""
    common = 0
    while common < min(len(before), len(after)) and before[common] == after[common]:
        common += 1
    block = after[common:]
    if USER_PROBE not in block:
        return ""
    segments = re.findall(r"<[^>]*>|\[[^\]]*\]|[^<\[]+", block[:block.index(USER_PROBE)])
    kept: list[str] = []
    for segment in segments:
        marker = segment[0] in "<["
        if not kept and ((marker and ("end" in segment.lower() or "close" in segment.lower()))
                         or (not marker and not segment.strip())):
            continue
        kept.append(segment)
    return "".join(kept).strip()


def find_user_starts(ids: list[int], marker: list[int]) -> tuple[int, ...]:
    """The positions in `ids` where the tokens of `marker` begin."""
    n = len(marker)
    if n == 0:
        return ()
    first = marker[0]
    return tuple(i for i, token in enumerate(ids) if token == first and ids[i:i + n] == marker)
