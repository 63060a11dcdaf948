"""Context checkpoints: a sequence's cache reused as llama-server reuses it when the model's memory cannot
be cut at any position (sliding-window attention without --swa-full, recurrent and hybrid models).

A sliding-window layer keeps the cells of the last n_swa positions only, and a recurrent layer keeps
one state: cut at position p, such a sequence no longer holds what the token at p saw. llama-server
(`--ctx-checkpoints`, default 32 a slot) therefore

- evaluates a prompt in batches that end at each user message's start (the last one, or one past
  MIN_STEP since the last checkpoint) and 4 + n_ubatch and 4 tokens before its end, and before such
  a batch saves the part of the sequence that cannot be cut (LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY):
  a checkpoint;
- on the next request, when the cells it keeps may not cover the reused prefix, restores the newest
  checkpoint at or before that prefix and evaluates the rest again, or evaluates the whole prompt.

The same batches are the same rounding: a near-tie between two tokens then falls the same way as in
llama-server, and a repeated request gets the same answer. (Facts from llama-server's update_slots;
none of its code.) The server's slots (core/serving/checkpoints.py) and chat's generator use these.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

MAX_CHECKPOINTS = 32  # llama-server's --ctx-checkpoints default (serving's cache/settings.py's, for the flag)
MIN_STEP = 8192  # llama-server's --checkpoint-min-step default: the least spacing of mid-prompt checkpoints
LAST_BATCH = 4  # a checkpoint this many tokens (and n_ubatch more) before a prompt's end
PARTIAL_ONLY = 1  # LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY: the cells that cannot be cut (SWA, recurrent)


@dataclass
class Checkpoint:
    n_tokens: int  # prompt positions the sequence held when it was saved
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


def memory_n_swa(model: Any, swa_full: bool) -> int | None:
    """The window llama-server's reuse check uses (0 for a recurrent or hybrid model), or None when the
    model's memory can be cut anywhere and needs no checkpoints."""
    from ..model.native import lib

    for check in ("llama_model_is_recurrent", "llama_model_is_hybrid"):
        if getattr(lib, check, None) is not None and getattr(lib, check)(model.handle):
            return 0
    n_swa = int(lib.llama_model_n_swa(model.handle)) if hasattr(lib, "llama_model_n_swa") else 0
    return n_swa if n_swa > 0 and not swa_full else None


# ---------------------------------------------------------------- where the batches end


def cut_chunk(done: int, chunk: int, n_prompt: int, starts: Sequence[int], saved: list[Checkpoint],
              n_batch: int, n_ubatch: int) -> int:
    """The prompt tokens to evaluate next of the `chunk` planned, `done` being evaluated: `chunk`, ended early
    at the first boundary inside it (a user message's start, or 4 + n_ubatch or 4 tokens before the end)."""
    boundaries = [b for b in starts if b == starts[-1] or not saved or b > saved[-1].n_tokens + MIN_STEP]
    boundaries += [n_prompt - min(n_batch, offset) for offset in (LAST_BATCH + n_ubatch, LAST_BATCH)]
    inside = [b for b in boundaries if done < b < done + chunk]
    return min(inside) - done if inside else chunk


def saves_before(n_start: int, chunk: int, n_prompt: int, starts: Sequence[int], saved: list[Checkpoint],
                 n_ubatch: int) -> bool:
    """Whether llama-server saves a checkpoint before a batch of `chunk` tokens from `n_start`: one near the
    prompt's end, or one that starts a user message (the last one, the first checkpoint, or past MIN_STEP)."""
    near_end = n_prompt < n_start + chunk + n_ubatch
    if not (near_end or n_start in starts):
        return False
    last_user = bool(starts) and n_start == starts[-1]
    return near_end or last_user or not saved or n_start > saved[-1].n_tokens + MIN_STEP


def next_batch(ctx: Any, seq_id: int, done: int, chunk: int, n_prompt: int, starts: Sequence[int],
               saved: list[Checkpoint], limit: int) -> int:
    """The prompt tokens sequence `seq_id` evaluates next of the `chunk` planned (cut_chunk), with a checkpoint
    saved before them where llama-server saves one (saves_before)."""
    chunk = cut_chunk(done, chunk, n_prompt, starts, saved, ctx.n_batch, ctx.n_ubatch)
    if saves_before(done, chunk, n_prompt, starts, saved, ctx.n_ubatch):
        save(ctx, seq_id, done, saved, limit)
    return chunk


# ---------------------------------------------------------------- saving and restoring


def save(ctx: Any, seq_id: int, n_tokens: int, saved: list[Checkpoint], limit: int) -> None:
    """Append a checkpoint of sequence `seq_id` holding `n_tokens` prompt positions (the oldest go past
    `limit`; one at the same place is replaced); nothing when the sequence is still empty."""
    from ..model.native import lib

    pos_min = int(lib.llama_memory_seq_pos_min(ctx.memory, seq_id))
    if pos_min < 0:
        return
    kept = [c for c in saved if c.n_tokens != n_tokens]
    saved[:] = kept[max(0, len(kept) + 1 - limit):]
    pos_max = int(lib.llama_memory_seq_pos_max(ctx.memory, seq_id))
    saved.append(Checkpoint(n_tokens, pos_min, pos_max, _read(ctx, seq_id)))


def restore(ctx: Any, seq_id: int, saved: list[Checkpoint], n_swa: int, n_cached: int, n_common: int,
            n_prompt: int) -> int:
    """How many prompt tokens sequence `seq_id` keeps of the `n_common` its `n_cached` share with a new prompt
    of `n_prompt`: all when its cells cover them, else those of a restored checkpoint, else none.
    Checkpoints past the kept prefix are dropped from `saved`."""
    from ..model.native import lib

    kept = n_common
    threshold = max(0, kept - n_swa - (0 if kept < n_prompt else 1))
    if 0 < kept <= n_cached and int(lib.llama_memory_seq_pos_min(ctx.memory, seq_id)) >= threshold:
        usable = [c for c in saved if c.last <= kept and (c.first < threshold or c.pos_min == 0)]
        if usable and _load(ctx, seq_id, usable[-1]):
            kept = min(kept, max(usable[-1].first + 1, usable[-1].last), usable[-1].n_tokens)
        else:
            kept = 0
    saved[:] = [c for c in saved if c.last <= kept]
    return kept


def _read(ctx: Any, seq_id: int) -> bytes:
    from ..model.native import lib

    size = int(lib.llama_state_seq_get_size_ext(ctx.handle, seq_id, PARTIAL_ONLY))
    buffer = (ctypes.c_uint8 * size)()
    written = int(lib.llama_state_seq_get_data_ext(ctx.handle, buffer, size, seq_id, PARTIAL_ONLY))
    return bytes(buffer)[:written]


def _load(ctx: Any, seq_id: int, checkpoint: Checkpoint) -> bool:
    from ..model.native import lib

    data = checkpoint.data
    buffer = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
    return int(lib.llama_state_seq_set_data_ext(ctx.handle, buffer, len(data), seq_id, PARTIAL_ONLY)) != 0


# ---------------------------------------------------------------- where user messages start


USER_PROBE = "U_USER_MSG Hello END_U"  # a user message no template renders by accident


def user_start_marker(render: Callable[[list[dict[str, str]]], str]) -> str:
    """The text a chat template writes before a user message's content (ChatML: "<|im_start|>user"), found
    as llama.cpp's template analysis finds it: `render(messages)` of no message and of one user message
    differ by the user block; its markers before the content, less a leading end marker and whitespace."""
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


def user_marker_tokens(render: Callable[[list[dict[str, str]]], str], tokenize: Callable[[str], list[int]]) -> list[int]:
    """The tokens of user_start_marker's text ([] when the template has none), for find_user_starts."""
    text = user_start_marker(render)
    return tokenize(text) if text else []


def find_user_starts(ids: list[int], marker: list[int]) -> tuple[int, ...]:
    """The positions in `ids` where the tokens of `marker` begin."""
    n = len(marker)
    if n == 0:
        return ()
    first = marker[0]
    return tuple(i for i, token in enumerate(ids) if token == first and ids[i:i + n] == marker)
