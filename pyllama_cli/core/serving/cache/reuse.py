"""--cache-reuse N (llama-server's `n_cache_reuse`): chunks of a slot's cells that the prompt repeats
further on are moved to their new positions instead of being evaluated again.

After the common prefix, the slot's tokens and the prompt are walked side by side. A run of at least
N tokens that both hold is kept: the cells between it and where the prompt needs it are dropped and
the run's cells are shifted back (`llama_memory_seq_rm` and `llama_memory_seq_add`, which re-rotates
their keys). A shorter run is skipped in the slot's tokens, one token at a time. This serves a prompt
that drops or edits a part in its middle (an agent's trimmed tool output). Shifted keys are rotated
twice, so the cells are close to, not bit-identical with, a prefill's; off (0) by default, as in
llama-server. Only memories that can shift (not recurrent or M-RoPE models) take it.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("uvicorn.error")  # the server's log: one line on stderr


def open_chunk_reuse(settings: Any, ctx: Any) -> int:
    """--cache-reuse's chunk size for this context: 0 (with one log line, as llama-server warns) when
    its memory cannot shift."""
    from ...model.native import lib

    chunk = settings.reuse_chunk if settings is not None else 0
    if chunk > 0 and not lib.llama_memory_can_shift(ctx.memory):
        log.warning("--cache-reuse is not supported by this model's memory: it is off")
        return 0
    return chunk


def reuse_slot_chunks(ctx: Any, slot: Any, prompt: list[int], reuse: int, min_chunk: int, prompt_cache: Any) -> int:
    """The slot's cells that `prompt` repeats after its first `reuse` tokens, shifted into place; how
    many prompt tokens the slot then holds (slot.cached says so). The cells as they were go to the
    prompt cache first, if there is one."""
    if min_chunk <= 0 or len(slot.cached) < reuse + min_chunk:
        return reuse
    if prompt_cache is not None:
        prompt_cache.save(ctx, slot)
    kept = reuse_chunks(ctx, slot.id, slot.cached, prompt, reuse, min_chunk)
    slot.cached = prompt[:kept]
    return kept


def reuse_chunks(ctx: Any, seq_id: int, cached: list[int], prompt: list[int], n_past: int, min_chunk: int) -> int:
    """Shift the runs of at least `min_chunk` tokens that `cached` (the sequence's tokens, whose first
    `n_past` the prompt shares) and `prompt` have in common after `n_past` into place; returns the
    prompt tokens the sequence now holds (never the last: it is evaluated again, for its logits).
    Cells past them are removed."""
    head_c = head_p = n_past
    while head_c < len(cached) and head_p < len(prompt):
        n_match = 0
        while (head_c + n_match < len(cached) and head_p + n_match < len(prompt)
               and cached[head_c + n_match] == prompt[head_p + n_match]):
            n_match += 1
        if n_match >= min_chunk:
            # drop [head_p, head_c), move [head_c, head_c + n_match) back by head_c - head_p
            ctx.shift_tokens(seq_id, head_p, head_c - head_p, head_c + n_match)
            head_c += n_match
            head_p += n_match
        else:
            head_c += 1
    kept = min(head_p, len(prompt) - 1)
    ctx.remove_tokens(seq_id, kept, -1)
    return kept
