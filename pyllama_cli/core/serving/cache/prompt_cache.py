"""One engine's prompt cache: before a slot starts a request, it gets the longest prefix of the
prompt that anything holds, by the cheapest route that has it.

The routes, in the order a tie is settled:

* `slot`: the slot's own KV cache (what every server does);
* `shift`: the same, with chunks after the common prefix shifted into place (--cache-reuse, reuse.py);
* `other_slot`: another slot holds a longer prefix (a busy one too: its cells for the prefix do not
  change). With --kv-unified the cells are shared (`llama_memory_seq_cp`, no copy: a system prompt
  that N conversations start with is held once); otherwise they are copied through host memory;
* `ram`: an entry of the host-memory tier (ram.py);
* `disk`: an entry of the disk tier (disk.py), which then joins the RAM tier;
* `none`: nothing holds any of it.

Cells depend on the LoRA adapter set (the scales) that computed them: every route serves only a
request with the set that made them (a slot's `lora`, an entry's), so a prefix cached under one set
never serves another. A route other than `slot` is taken only when it saves at least MIN_GAIN tokens over `slot`. Before a
slot's cells are cut or replaced, they are saved (RAM, and disk for long ones) unless an entry
already holds them. Restored cells are those of the same tokens under the same model and settings
(key.py), so a restore gives the logits a prefill would have.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .disk import DiskStore
from .native import read_sequence, share_prefix, write_sequence
from .ram import Entry, Scales, as_tokens, shared_prefix, shared_store
from .settings import CacheSettings

ROUTES = ("slot", "shift", "other_slot", "ram", "disk", "none")
MIN_GAIN = 8  # tokens a restore or copy must save over the slot's own prefix
MIN_SAVE_TOKENS = 32  # shorter slot contents are not worth an entry
# LoadSettings' RoPE and YaRN fields (-ctk/-ctv are keyed by name): each changes what the K cells hold.
_ROPE_FIELDS = ("rope_scaling", "rope_freq_base", "rope_freq_scale", "yarn_orig_ctx", "yarn_ext_factor",
                "yarn_attn_factor", "yarn_beta_slow", "yarn_beta_fast")


@dataclass
class CacheCounters:
    """Per route: requests that took it; per tier: hits, misses (consulted, not taken), failed restores."""

    routes: Counter[str] = field(default_factory=Counter)
    tokens: Counter[str] = field(default_factory=Counter)  # prompt tokens each route supplied
    hits: Counter[str] = field(default_factory=Counter)
    misses: Counter[str] = field(default_factory=Counter)
    failed_restores: int = 0
    saves: int = 0


@dataclass
class _Candidate:
    n: int  # prompt tokens it supplies
    route: str
    source: Any  # the slot, RAM entry or disk path


class PromptCache:
    """The cache of one engine (`owner`): call `prepare` before a slot starts, on the scheduler thread."""

    def __init__(self, settings: CacheSettings, key: dict[str, Any], owner: str, *, kv_unified: bool):
        self.settings, self.key, self.owner, self.kv_unified = settings, key, owner, kv_unified
        self.ram = shared_store(settings.ram_bytes) if settings.ram_mib != 0 else None
        self.disk = (DiskStore(settings.disk_dir, key, settings.disk_max_bytes, settings.disk_min_tokens)
                     if settings.disk_dir is not None else None)
        self.counters = CacheCounters()

    def prepare(self, ctx: Any, slot: Any, slots: Sequence[Any], prompt: list[int], own: int,
                cache_prompt: bool = True, lora: Scales = (), shifted: bool = False) -> tuple[int, str]:
        """Make `slot`'s sequence hold the longest prefix of `prompt` found for adapter set `lora` (its own
        keeps `own`: 0 when the slot's cells were made under another set); returns how many prompt tokens
        it holds and the route that supplied them. slot.cached and slot.lora are the caller's, still the
        previous request's here (`shifted`: the slot's `own` tokens include chunks --cache-reuse moved).
        A request with cache_prompt false reuses nothing, but what the slot held is kept."""
        if not cache_prompt:
            self.save(ctx, slot)
            ctx.remove_tokens(slot.id, 0, -1)
            return 0, "none"
        tokens = as_tokens(prompt)
        best = self._best(slot, slots, tokens, lora)
        if best is not None and best.n >= own + MIN_GAIN:
            self.save(ctx, slot)
            n = self._take(ctx, slot, best, tokens, lora)
            if n > 0:
                return self._count(best.route, n)
            self.counters.failed_restores += 1
            own = 0  # the slot's sequence is empty now
        elif len(slot.cached) - own >= MIN_SAVE_TOKENS:  # a few cut tokens (a re-tokenized answer's
            self.save(ctx, slot)                        # tail) cost less to evaluate again than a copy
        ctx.remove_tokens(slot.id, own, -1)
        return self._count(("shift" if shifted else "slot") if own > 0 else "none", own)

    def save(self, ctx: Any, slot: Any) -> None:
        """Keep what the slot's sequence holds, under the adapter set that made it (unless an entry
        already starts with all of it)."""
        if len(slot.cached) < MIN_SAVE_TOKENS:
            return
        tokens, lora = as_tokens(slot.cached), _lora_of(slot)
        to_ram = self.ram is not None and not self.ram.covers(self.owner, tokens, lora)
        to_disk = (self.disk is not None and len(tokens) >= self.disk.min_tokens
                   and not self.disk.covers(tokens, lora))
        if not (to_ram or to_disk):
            return
        data = read_sequence(ctx, slot.id)
        if not data:
            return
        self.counters.saves += 1
        if to_ram:
            self.ram.put(Entry(self.owner, tokens, data, lora))  # type: ignore[union-attr]
        if to_disk:
            self.disk.save(tokens, data, lora)  # type: ignore[union-attr]

    def free_idle_slots(self, ctx: Any, slots: Sequence[Any]) -> None:
        """--cache-idle-slots with --kv-unified (llama-server's rule): once a request starts, idle slots
        go to the cache and give their cells to the busy ones. Without a unified cache an idle slot
        keeps its own cells, and the `other_slot` route reads it in place."""
        if not (self.kv_unified and self.settings.idle_slots):
            return
        for slot in slots:
            if slot.state == "idle" and slot.cached:
                self.save(ctx, slot)
                ctx.remove_tokens(slot.id, 0, -1)
                slot.cached = []

    def close(self, ctx: Any, slots: Sequence[Any]) -> None:
        """The engine unloads: its slots go to disk (RAM entries go with the engine)."""
        if self.disk is not None:
            if ctx is not None:
                for slot in slots:
                    tokens, lora = as_tokens(slot.cached), _lora_of(slot)
                    if len(tokens) >= self.disk.min_tokens and not self.disk.covers(tokens, lora):
                        data = read_sequence(ctx, slot.id)
                        if data:
                            self.disk.save(tokens, data, lora)
            self.disk.close()
        if self.ram is not None:
            self.ram.drop_owner(self.owner)

    def series(self) -> list[tuple[str, str, str, list[tuple[str, float]]]]:
        """/metrics' prompt cache series: (name, type, help, [(labels, value)])."""
        c = self.counters
        tiers = [t for t in ("ram", "disk") if getattr(self, t) is not None]
        ram = self.ram.counts(self.owner) if self.ram is not None else None
        held = {"ram": ram.bytes_held if ram else 0, "disk": self.disk.bytes_held if self.disk else 0}
        entries = {"ram": ram.entries if ram else 0, "disk": self.disk.entries if self.disk else 0}
        evictions = {"ram": ram.evictions if ram else 0, "disk": self.disk.counts.evictions if self.disk else 0}
        per_tier = lambda values: [(f'tier="{t}"', values[t]) for t in tiers]  # noqa: E731
        return [
            ("prompt_cache_requests_total", "counter", "Requests by the route that supplied their cached prefix.",
             [(f'route="{r}"', c.routes[r]) for r in ROUTES]),
            ("prompt_cache_tokens_total", "counter", "Prompt tokens each route supplied (not evaluated).",
             [(f'route="{r}"', c.tokens[r]) for r in ROUTES]),
            ("prompt_cache_hits_total", "counter", "Requests whose prefix came from this tier.", per_tier(c.hits)),
            ("prompt_cache_misses_total", "counter", "Requests that consulted this tier and took another route.",
             per_tier(c.misses)),
            ("prompt_cache_bytes", "gauge", "Bytes this tier holds for the model.", per_tier(held)),
            ("prompt_cache_entries", "gauge", "Entries this tier holds for the model.", per_tier(entries)),
            ("prompt_cache_evictions_total", "counter", "Entries this tier dropped to stay in its budget.",
             per_tier(evictions)),
            ("prompt_cache_failed_restores_total", "counter", "Restores llama.cpp refused (the prompt was evaluated).",
             [("", c.failed_restores)]),
        ]

    # ---- choosing and taking a route

    def _best(self, slot: Any, slots: Sequence[Any], prompt: np.ndarray, lora: Scales) -> _Candidate | None:
        found: list[_Candidate] = []
        for other in slots:
            if other is not slot and other.cached and _lora_of(other) == lora:
                found.append(_Candidate(shared_prefix(as_tokens(other.cached), prompt), "other_slot", other))
        if self.ram is not None:
            entry, n = self.ram.best(self.owner, prompt, lora)
            found.append(_Candidate(n, "ram", entry))
        if self.disk is not None:
            path, n = self.disk.best(prompt, lora)
            found.append(_Candidate(n, "disk", path))
        for candidate in found:  # the last prompt token is evaluated again, for its logits
            candidate.n = min(candidate.n, len(prompt) - 1)
        found = [c for c in found if c.n > 0 and c.source is not None]
        return max(found, key=lambda c: (c.n, -ROUTES.index(c.route))) if found else None

    def _take(self, ctx: Any, slot: Any, best: _Candidate, prompt: np.ndarray, lora: Scales) -> int:
        """Put the candidate's cells into the slot's sequence, cut to its `n` tokens; 0 when that failed."""
        if best.route == "other_slot":
            if self.kv_unified:
                share_prefix(ctx, best.source.id, slot.id, best.n)
                return best.n
            ok = write_sequence(ctx, slot.id, read_sequence(ctx, best.source.id))
        elif best.route == "ram":
            ok = write_sequence(ctx, slot.id, best.source.state())
        else:
            loaded = self.disk.load(best.source, lora)  # type: ignore[union-attr]
            if loaded is None or shared_prefix(loaded[0], prompt) < best.n:
                return 0
            ok = write_sequence(ctx, slot.id, loaded[1])
            if ok and self.ram is not None:
                self.ram.put(Entry(self.owner, loaded[0].copy(), loaded[1], lora))
        if ok and ctx.remove_tokens(slot.id, best.n, -1):
            return best.n
        ctx.remove_tokens(slot.id, 0, -1)  # a memory that cannot cut a sequence (recurrent) starts over
        return 0

    def _count(self, route: str, n: int) -> tuple[int, str]:
        self.counters.routes[route] += 1
        self.counters.tokens[route] += n
        for tier in ("ram", "disk"):
            if getattr(self, tier) is not None:
                if route == tier:
                    self.counters.hits[tier] += 1
                else:
                    self.counters.misses[tier] += 1
        return n, route


def _lora_of(slot: Any) -> Scales:
    """The adapter set that made the slot's cells (() on an engine without adapters)."""
    return tuple(slot.lora)


def open_prompt_cache(settings: CacheSettings, engine: Any, model: Any) -> PromptCache | None:
    """The engine's cache, or None for a model whose memory cannot be cut at a position (recurrent
    or sliding-window attention: a restored state would hold cells the cut could not drop)."""
    from ...model.native import lib
    from .key import cache_key

    for check in ("llama_model_is_recurrent", "llama_model_is_hybrid"):
        if getattr(lib, check, None) is not None and getattr(lib, check)(model.handle):
            return None
    if getattr(lib, "llama_model_n_swa", None) is not None and lib.llama_model_n_swa(model.handle) > 0:
        return None
    template = settings.template if settings.template is not None else (model.chat_template() or "")
    load = engine.settings
    key = cache_key(engine.path, n_ctx_slot=engine.n_ctx_slot, kv_unified=engine.kv_unified,
                    flash_attn=str(load.flash_attn), template=template, type_k=load.cache_type_k,
                    type_v=load.cache_type_v, rope={name: getattr(load, name) for name in _ROPE_FIELDS},
                    adapters=load.adapters)
    return PromptCache(settings, key, f"{engine.path.name}#{id(engine)}", kv_unified=engine.kv_unified)
