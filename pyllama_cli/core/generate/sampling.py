"""Sampling settings (llama.cpp's names and defaults) and the llama.cpp sampler chain built from them."""

from __future__ import annotations

import ctypes
import random
from dataclasses import dataclass, field, replace
from typing import Any

from ...errors import InputError
from .sampler_names import DEFAULT_DRY_SEQUENCE_BREAKERS, DEFAULT_SAMPLERS

DEFAULT_TEMPERATURE = 0.8
DEFAULT_TOP_K = 40
DEFAULT_TOP_P = 0.95
DEFAULT_MIN_P = 0.05
DEFAULT_TYPICAL_P = 1.0
DEFAULT_REPEAT_PENALTY = 1.0
DEFAULT_REPEAT_LAST_N = 64
DEFAULT_MIROSTAT_LR = 0.1  # eta
DEFAULT_MIROSTAT_ENT = 5.0  # tau
DEFAULT_XTC_THRESHOLD = 0.1
DEFAULT_DRY_BASE = 1.75
DEFAULT_DRY_ALLOWED_LENGTH = 2
DEFAULT_DRY_PENALTY_LAST_N = 64
DEFAULT_ADAPTIVE_DECAY = 0.9
RANDOM_SEED = -1
NO_TOKEN = -1  # what `Sampler.sample` returns when the grammar allows no token at all


@dataclass(frozen=True)
class SamplingSettings:
    """How the next token is picked; `seed=-1` draws a random seed (see `with_seed`)."""

    temperature: float = DEFAULT_TEMPERATURE
    top_k: int = DEFAULT_TOP_K
    top_p: float = DEFAULT_TOP_P
    min_p: float = DEFAULT_MIN_P
    typical_p: float = DEFAULT_TYPICAL_P
    repeat_penalty: float = DEFAULT_REPEAT_PENALTY
    repeat_last_n: int = DEFAULT_REPEAT_LAST_N
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    mirostat: int = 0
    mirostat_lr: float = DEFAULT_MIROSTAT_LR
    mirostat_ent: float = DEFAULT_MIROSTAT_ENT
    seed: int = RANDOM_SEED
    ignore_eos: bool = False
    logit_bias: tuple[tuple[int, float], ...] = field(default_factory=tuple)
    grammar: str | None = None  # GBNF text, already validated
    # llama.cpp's newer samplers; each default leaves its stage out (a no-op in llama.cpp's chain).
    dry_multiplier: float = 0.0
    dry_base: float = DEFAULT_DRY_BASE
    dry_allowed_length: int = DEFAULT_DRY_ALLOWED_LENGTH
    dry_penalty_last_n: int = DEFAULT_DRY_PENALTY_LAST_N
    dry_sequence_breakers: tuple[str, ...] = DEFAULT_DRY_SEQUENCE_BREAKERS
    xtc_probability: float = 0.0
    xtc_threshold: float = DEFAULT_XTC_THRESHOLD
    top_n_sigma: float = -1.0
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    adaptive_target: float = -1.0
    adaptive_decay: float = DEFAULT_ADAPTIVE_DECAY
    samplers: tuple[str, ...] = DEFAULT_SAMPLERS  # the chain's order (--samplers / --sampler-seq)

    def with_seed(self) -> SamplingSettings:
        """A copy whose seed is concrete, so a run can report the seed that reproduces it."""
        if self.seed >= 0:
            return self
        return replace(self, seed=random.randrange(0, 2**32 - 1))


def check_logit_bias(logit_bias: tuple[tuple[int, float], ...], n_vocab: int, name: str = "--logit-bias") -> None:
    """Refuse a biased token id outside the vocabulary; `name` is the flag or setting it came from.

    Raises:
        InputError: naming the first such id.
    """
    bad = next((token for token, _ in logit_bias if not 0 <= token < n_vocab), None)
    if bad is not None:
        raise InputError(f"{name} token {bad} is out of range: the vocabulary has {n_vocab} tokens (0..{n_vocab - 1})")


class Sampler:
    """A llama.cpp sampler chain; `sample(ctx, i)` picks from output i's logits and records the token.

    With a grammar, the grammar and bias stages run outside the chain: when they leave no token
    possible (the grammar is complete but EOS is banned, or it wants text no token spells),
    llama.cpp would pick one anyway and then throw from C++, which aborts the whole process.
    `sample` returns NO_TOKEN instead, and the caller ends the generation.
    """

    def __init__(self, model: Any, settings: SamplingSettings):
        from ..model.native import lib, sampler_sample

        self._lib = lib
        self._sample_chain = sampler_sample
        self.settings = settings.with_seed()
        params = lib.llama_sampler_chain_default_params()
        params.no_perf = True
        self.chain = lib.llama_sampler_chain_init(params)
        self._constraints: list[Any] = []
        constraints = _constraints(lib, model, self.settings)
        if self.settings.grammar:
            self._constraints, constraints = constraints, []
            self._candidates = _candidates(model.n_vocab)
        for stage in constraints + _choosers(lib, model, self.settings):
            lib.llama_sampler_chain_add(self.chain, stage)
        self._keeps_history = _keeps_history(self.settings)

    def sample(self, ctx: Any, index: int = -1) -> int:
        if self._constraints:
            return self._sample_constrained(ctx, index)
        # llama_sampler_sample also accepts the token (penalties, grammar and mirostat state advance).
        return int(self._sample_chain(self.chain, ctx.handle, index))

    def _sample_constrained(self, ctx: Any, index: int) -> int:
        """llama_sampler_sample's steps, stopping before the pick when the constraints allow nothing."""
        import numpy as np

        lib, data = self._lib, self._candidates
        logits = lib.llama_get_logits_ith(ctx.handle, index)
        data["id"] = np.arange(len(data), dtype=np.int32)
        data["logit"] = np.ctypeslib.as_array(logits, shape=(len(data),))
        data["p"] = 0.0
        cur = lib.llama_token_data_array(data.ctypes.data_as(ctypes.POINTER(lib.llama_token_data)), len(data), -1,
                                         False)
        for stage in self._constraints:
            lib.llama_sampler_apply(stage, ctypes.byref(cur))
        if not np.isfinite(data["logit"]).any():
            return NO_TOKEN
        lib.llama_sampler_apply(self.chain, ctypes.byref(cur))
        token = int(cur.data[cur.selected].id)
        self.accept(token)
        return token

    def accept(self, token: int) -> None:
        """Record a token the sampler did not pick (e.g. a prompt token for the repetition penalty)."""
        for stage in self._constraints:
            self._lib.llama_sampler_accept(stage, token)
        self._lib.llama_sampler_accept(self.chain, token)

    def accept_prompt(self, tokens: Any) -> None:
        """Record the prompt in the chain (never the grammar), as llama-completion and llama-server do, so
        that the penalties and DRY see it. Skipped when no stage looks back (a ctypes call a token)."""
        if self._keeps_history:
            accept, chain = self._lib.llama_sampler_accept, self.chain
            for token in tokens:
                if token >= 0:  # a negative id stands for an image's position (core/media/prompt.py)
                    accept(chain, int(token))

    def reset(self) -> None:
        for stage in self._constraints:
            self._lib.llama_sampler_reset(stage)
        self._lib.llama_sampler_reset(self.chain)

    def close(self) -> None:
        for stage in self._constraints:
            self._lib.llama_sampler_free(stage)
        self._constraints = []
        if self.chain:
            self._lib.llama_sampler_free(self.chain)
            self.chain = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def _candidates(n_vocab: int) -> Any:
    """A reusable buffer laid out as n_vocab llama_token_data records (id, logit, p)."""
    import numpy as np

    return np.zeros(n_vocab, dtype=np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")]))


def _constraints(lib: Any, model: Any, s: SamplingSettings) -> list[Any]:
    """The chain's first stages, in llama.cpp's default order: grammar, then bias."""
    stages = []
    if s.grammar:
        from . import grammar_pool

        stages.append(grammar_pool.take(model, s.grammar) or grammar_pool.parse(model, s.grammar))
    bias = _logit_bias(model, s)
    if bias:
        stages.append(bias)
    return stages


def _choosers(lib: Any, model: Any, s: SamplingSettings) -> list[Any]:
    """The rest of the chain, as llama.cpp's common sampler builds it: with mirostat, temperature and
    mirostat alone; else the stages of `s.samplers` in order, then the pick (adaptive-p when the order
    names it, else a draw). Stages whose settings make them a no-op in llama.cpp are left out."""
    if s.mirostat == 1:
        return [lib.llama_sampler_init_temp(s.temperature),
                lib.llama_sampler_init_mirostat(model.n_vocab, s.seed, s.mirostat_ent, s.mirostat_lr, 100)]
    if s.mirostat == 2:
        return [lib.llama_sampler_init_temp(s.temperature),
                lib.llama_sampler_init_mirostat_v2(s.seed, s.mirostat_ent, s.mirostat_lr)]
    if _greedy(s):
        # What the chain would pick anyway (temperature 0 keeps only the best token), without sorting.
        before = [name for name in s.samplers if name in ("penalties", "dry")]
        return [stage for name in before if (stage := _stage(lib, model, s, name)) is not None] + [
            lib.llama_sampler_init_greedy()]
    stages = [stage for name in s.samplers if (stage := _stage(lib, model, s, name)) is not None]
    if "adaptive_p" in s.samplers:
        stages.append(lib.llama_sampler_init_adaptive_p(s.adaptive_target, s.adaptive_decay, s.seed))
    else:
        stages.append(lib.llama_sampler_init_dist(s.seed))
    return stages


def _keeps_history(s: SamplingSettings) -> bool:
    """Whether a stage of the chain reads the tokens accepted so far (the penalties, DRY)."""
    penalties = "penalties" in s.samplers and (s.repeat_penalty != 1.0 or s.presence_penalty or s.frequency_penalty)
    return not s.mirostat and (bool(penalties) or ("dry" in s.samplers and s.dry_multiplier != 0))


def _greedy(s: SamplingSettings) -> bool:
    """Whether the chain surely picks the most likely token after the penalties: temperature 0 last, and
    nothing before it that can drop the best token (XTC does)."""
    return (s.temperature <= 0 and s.samplers[-1:] == ("temperature",)
            and not ("xtc" in s.samplers and _xtc_active(s)))


def _xtc_active(s: SamplingSettings) -> bool:
    return s.xtc_probability > 0 and s.xtc_threshold <= 0.5


def _stage(lib: Any, model: Any, s: SamplingSettings, name: str) -> Any:
    """One named stage of llama.cpp's chain, or None where its settings make it a no-op."""
    if name == "penalties":
        if s.repeat_penalty == 1.0 and not s.presence_penalty and not s.frequency_penalty:
            return None
        last_n = model.n_ctx_train if s.repeat_last_n == -1 else s.repeat_last_n
        return lib.llama_sampler_init_penalties(model.n_vocab, last_n, s.repeat_penalty, s.frequency_penalty,
                                                s.presence_penalty)
    if name == "dry":
        return _dry(lib, model, s) if s.dry_multiplier != 0 and s.dry_base >= 1 and s.dry_penalty_last_n else None
    if name == "top_n_sigma":
        return lib.llama_sampler_init_top_n_sigma(s.top_n_sigma) if s.top_n_sigma > 0 else None
    if name == "top_k":
        return lib.llama_sampler_init_top_k(s.top_k) if s.top_k > 0 else None
    if name == "typ_p":
        return lib.llama_sampler_init_typical(s.typical_p, 1) if s.typical_p < 1.0 else None
    if name == "top_p":
        return lib.llama_sampler_init_top_p(s.top_p, 1) if s.top_p < 1.0 else None
    if name == "min_p":
        return lib.llama_sampler_init_min_p(s.min_p, 1) if s.min_p > 0.0 else None
    if name == "xtc":
        return lib.llama_sampler_init_xtc(s.xtc_probability, s.xtc_threshold, 1, s.seed) if _xtc_active(s) else None
    if name == "temperature":
        return lib.llama_sampler_init_temp_ext(s.temperature, s.dynatemp_range, s.dynatemp_exponent)
    if name == "infill":
        return lib.llama_sampler_init_infill(model.vocab)
    return None  # adaptive_p: the pick, added last


def _dry(lib: Any, model: Any, s: SamplingSettings) -> Any:
    breakers = [text.encode() for text in s.dry_sequence_breakers]
    array = (ctypes.c_char_p * max(1, len(breakers)))(*breakers)
    return lib.llama_sampler_init_dry(model.vocab, s.dry_multiplier, s.dry_base, s.dry_allowed_length,
                                      s.dry_penalty_last_n, array, len(breakers))


def _logit_bias(model: Any, s: SamplingSettings) -> Any:
    from ..model.native import lib

    biases = list(s.logit_bias)
    if s.ignore_eos:
        biases += [(t, float("-inf")) for t in model.eog_tokens]
    if not biases:
        return None
    arr = (lib.llama_logit_bias * len(biases))()
    for i, (token, bias) in enumerate(biases):
        arr[i].token, arr[i].bias = token, bias
    return lib.llama_sampler_init_logit_bias(model.n_vocab, len(biases), arr)
