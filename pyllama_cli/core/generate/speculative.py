"""Speculative decoding: cheap guesses of the next tokens, checked by the target model in one batch.

A `Drafter` proposes tokens that may follow a sequence (its evaluated tokens plus the last sampled
token, not evaluated yet). The generator puts that last token and the draft in one batch with
logits at every position, and `verify()` samples the target at each position in turn: while the
sampled token equals the drafted one, the draft is accepted and the next position's logits are
already there; at the first difference, the sampled token is kept and the rest is dropped (the
caller removes it from the KV cache with llama_memory_seq_rm).

Every draft here is deterministic: a point mass on one token. For such a proposal, the standard
rejection rule (accept with probability min(1, p/q), else draw from the residual max(0, p - q))
is exactly "accept with probability p(token), else draw from p without that token", which is what
sampling from the target and comparing does. So the output has the target's distribution at any
temperature, and at temperature 0 it is the same text. Grammars, penalties and mirostat see the
same accepted tokens in the same order, since the sampler chain samples each position only after
the previous one was accepted.

Drafters: `NgramSimple` (the last n tokens seen before: copy what followed them),
`NgramMapK` (every n-gram of the context with its continuations counted: the most frequent one),
and `DraftModel` (a smaller model of the same vocabulary, greedy).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ...errors import InputError, UsageError
from .decide import STOP_CONTEXT, Accepted, Turn

SPEC_NONE = "none"
SPEC_DRAFT = "draft-simple"
SPEC_NGRAM_SIMPLE = "ngram-simple"
SPEC_NGRAM_MAP_K = "ngram-map-k"
SPEC_NGRAM_CACHE = "ngram-cache"
SPEC_TYPES = (SPEC_NONE, SPEC_DRAFT, SPEC_NGRAM_SIMPLE, SPEC_NGRAM_MAP_K, SPEC_NGRAM_CACHE)
IMPLEMENTED = (SPEC_NONE, SPEC_DRAFT, SPEC_NGRAM_SIMPLE, SPEC_NGRAM_MAP_K)

DEFAULT_DRAFT_N_MAX = 16
DEFAULT_DRAFT_N_MIN = 0
DEFAULT_DRAFT_P_MIN = 0.0
DEFAULT_NGRAM_SIZE_N = 12  # llama.cpp's --spec-ngram-*-size-n: the n-gram looked up
DEFAULT_NGRAM_SIZE_M = 48  # --spec-ngram-*-size-m: the m-gram after it that is drafted
DEFAULT_NGRAM_MIN_HITS = 1


@dataclass(frozen=True)
class SpeculativeSettings:
    """--spec-type and its parameters; `draft_path` is the resolved -md/-hfd file."""

    type: str = SPEC_NONE
    n_max: int = DEFAULT_DRAFT_N_MAX
    n_min: int = DEFAULT_DRAFT_N_MIN
    p_min: float = DEFAULT_DRAFT_P_MIN
    ngram_size_n: int = DEFAULT_NGRAM_SIZE_N
    ngram_size_m: int = DEFAULT_NGRAM_SIZE_M
    ngram_min_hits: int = DEFAULT_NGRAM_MIN_HITS
    draft_path: Path | None = None

    @property
    def enabled(self) -> bool:
        return self.type != SPEC_NONE

    def with_draft(self, path: Path) -> SpeculativeSettings:
        return replace(self, draft_path=path)


def check_spec_type(spec_type: str, has_draft: bool) -> str:
    """The --spec-type to run: draft-simple when only -md/-hfd is given, as llama.cpp does.

    Raises:
        UsageError: an unknown or unimplemented type, or draft-simple without a draft model.
    """
    if spec_type not in SPEC_TYPES:
        raise UsageError(f"--spec-type {spec_type!r} is not one of {', '.join(SPEC_TYPES)}")
    if spec_type not in IMPLEMENTED:
        raise UsageError(f"--spec-type {spec_type} is not implemented in pyllama",
                         hint=f"use one of {', '.join(IMPLEMENTED[1:])}")
    if spec_type == SPEC_NONE and has_draft:
        return SPEC_DRAFT
    if spec_type == SPEC_DRAFT and not has_draft:
        raise UsageError("--spec-type draft-simple needs a draft model", hint="add -md FILE or -hfd user/repo[:quant]")
    return spec_type


def resolve_draft(settings: SpeculativeSettings, request: Any, tqdm_class: Any = None) -> SpeculativeSettings:
    """`settings` with the -md/-hfd model (a ModelRequest, or None) resolved to a checked local file."""
    if request is None:
        return settings
    from ..model.resolve import resolve_model

    return settings.with_draft(resolve_model(request, tqdm_class=tqdm_class).path)


# ---------------------------------------------------------------- drafters


class NgramSimple:
    """llama.cpp's ngram-simple: find the latest earlier occurrence of the last `size_n` tokens and
    draft the `size_m` tokens that followed it."""

    def __init__(self, size_n: int, size_m: int):
        self.size_n, self.size_m = size_n, size_m

    def draft(self, history: Sequence[int], n_max: int) -> list[int]:
        n, cur = self.size_n, len(history)
        if cur <= n + 1 or n_max <= 0:
            return []
        pattern = list(history[cur - n:])
        first = pattern[0]
        for j in range(cur - n - 1, -1, -1):  # backwards: the latest occurrence first, the current one skipped
            if history[j] == first and list(history[j:j + n]) == pattern:
                return copy_on(history, j + n, min(self.size_m, n_max))
        return []

    def reset(self) -> None:
        pass


def copy_on(history: Sequence[int], start: int, n: int) -> list[int]:
    """`n` tokens copied from `start` on, the copy reading its own output past the end (as LZ77 does):
    a loop shorter than the draft, the usual repetition, is drafted whole instead of cut at its period."""
    seq = list(history[start:])
    while len(seq) < n:
        seq.extend(seq[:n - len(seq)])
    return seq[:n]


class NgramMapK:
    """llama.cpp's ngram-map-k: every n-gram of the sequence is a key whose continuations are counted;
    the draft is the most frequent continuation (the latest among equals), once seen `min_hits` times.
    The map grows as the sequence does, so a lookup costs the same at any length."""

    def __init__(self, size_n: int, size_m: int, min_hits: int):
        self.size_n, self.size_m, self.min_hits = size_n, size_m, max(1, min_hits)
        self.reset()

    def reset(self) -> None:
        self._seen: list[int] = []
        self._keys: dict[tuple[int, ...], Counter[int]] = {}  # key -> {start of continuation: hits}
        self._first: dict[tuple[int, ...], dict[int, int]] = {}  # key -> {continuation token: latest start}

    def draft(self, history: Sequence[int], n_max: int) -> list[int]:
        self._sync(history)
        n = self.size_n
        if len(history) <= n or n_max <= 0:
            return []
        key = tuple(history[-n:])
        hits = self._keys.get(key)
        if not hits:
            return []
        token, count = max(hits.items(), key=lambda item: (item[1], self._first[key][item[0]]))
        if count < self.min_hits:
            return []
        return copy_on(history, self._first[key][token], min(self.size_m, n_max))

    def _sync(self, history: Sequence[int]) -> None:
        """Index the n-grams that end before the last token (whose continuation is known)."""
        seen = self._seen
        same = 0
        limit = min(len(seen), len(history))
        while same < limit and seen[same] == history[same]:
            same += 1
        if same < len(seen):  # the sequence changed (a new prompt): index it again
            self.reset()
            seen, same = self._seen, 0
        n = self.size_n
        for end in range(max(same, n), len(history)):  # history[end] follows the n-gram ending before it
            key = tuple(history[end - n:end])
            token = history[end]
            self._keys.setdefault(key, Counter())[token] += 1
            self._first.setdefault(key, {})[token] = end
        seen.extend(history[len(seen):])


class DraftModel:
    """A smaller model with the target's vocabulary, in its own context (one sequence per slot)."""

    def __init__(self, session: Any, n_seq: int, n_ctx_seq: int):
        from ..model.native import Batch

        self.session = session
        self.n_ctx_seq = n_ctx_seq
        self.model, self.ctx = session.model, session.ctx
        self.cached: list[list[int]] = [[] for _ in range(n_seq)]
        self.batch = Batch(max(self.ctx.n_batch, 1))

    def close(self) -> None:
        self.batch.close()
        self.session.close()

    def drafter(self, seq: int, p_min: float) -> DraftModelSeq:
        return DraftModelSeq(self, seq, p_min)

    def draft(self, seq: int, history: Sequence[int], n_max: int, p_min: float) -> list[int]:
        """Greedy tokens after `history`; stop early where the draft's top token is less likely than p_min."""
        import numpy as np

        ctx, cached = self.ctx, self.cached[seq]
        n_max = min(n_max, self.n_ctx_seq - len(history))
        if n_max <= 0 or not history:
            return []
        keep = _common(cached, history)
        keep = min(keep, len(history) - 1)  # the last token is always evaluated again, for its logits
        ctx.remove_tokens(seq, keep, -1)
        del cached[keep:]
        self._evaluate(seq, list(history[keep:]))
        drafted: list[int] = []
        while True:
            logits = ctx.logits(-1)
            token = int(np.argmax(logits))
            if p_min > 0:
                shifted = np.exp(logits - logits[token])
                if 1.0 / float(shifted.sum()) < p_min:
                    break
            drafted.append(token)
            if len(drafted) >= n_max:
                break
            self._evaluate(seq, [token])
        return drafted

    def _evaluate(self, seq: int, tokens: list[int]) -> None:
        cached, batch = self.cached[seq], self.batch
        for start in range(0, len(tokens), self.ctx.n_batch):
            chunk = tokens[start:start + self.ctx.n_batch]
            batch.clear()
            for k, token in enumerate(chunk):
                batch.add(token, len(cached) + k, (seq,), start + k == len(tokens) - 1)
            self.ctx.decode(batch)
            cached.extend(chunk)


class DraftModelSeq:
    """One sequence's view of a DraftModel, with the Drafter interface."""

    def __init__(self, owner: DraftModel, seq: int, p_min: float):
        self.owner, self.seq, self.p_min = owner, seq, p_min

    def draft(self, history: Sequence[int], n_max: int) -> list[int]:
        return self.owner.draft(self.seq, history, n_max, self.p_min)

    def reset(self) -> None:
        pass


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Adaptive:
    """A drafter whose draft length follows its recent luck: one more than what was accepted after a
    rejection, twice as long after a draft accepted whole (up to --spec-draft-n-max).

    On a CPU, checking a token costs little only while the batch stays memory-bound: a long draft
    that is mostly rejected (text that does not repeat) would cost more than it saves.
    """

    def __init__(self, inner: Any):
        self.inner = inner
        self.limit = 1 << 30  # the first draft is as long as allowed

    def draft(self, history: Sequence[int], n_max: int) -> list[int]:
        return self.inner.draft(history, min(n_max, self.limit))

    def feedback(self, drafted: int, accepted: int) -> None:
        """What the model made of the last draft."""
        self.limit = min(max(self.limit, drafted) * 2, 1 << 30) if accepted >= drafted else accepted + 1

    def new_request(self) -> None:
        """Draft at full length again: a limit learnt on one text says nothing of the next (and one below
        --spec-draft-n-min would otherwise stop drafting for good, since no draft is checked to raise it)."""
        self.limit = 1 << 30

    def reset(self) -> None:
        self.inner.reset()


class Speculation:
    """What --spec-type made: per-sequence drafters, sharing a draft model's context when there is one."""

    def __init__(self, settings: SpeculativeSettings, draft: DraftModel | None = None):
        self.settings = settings
        self.draft_model = draft

    def drafter(self, seq: int = 0) -> Any:
        inner = self._drafter(seq)
        return Adaptive(inner) if inner is not None else None

    def _drafter(self, seq: int) -> Any:
        s = self.settings
        if s.type == SPEC_NGRAM_SIMPLE:
            return NgramSimple(s.ngram_size_n, s.ngram_size_m)
        if s.type == SPEC_NGRAM_MAP_K:
            return NgramMapK(s.ngram_size_n, s.ngram_size_m, s.ngram_min_hits)
        if s.type == SPEC_DRAFT and self.draft_model is not None:
            return self.draft_model.drafter(seq, s.p_min)
        return None

    def close(self) -> None:
        if self.draft_model is not None:
            self.draft_model.close()
            self.draft_model = None


def open_speculation(settings: SpeculativeSettings, load: Any, target: Any, *, n_ctx_seq: int, n_seq: int = 1,
                     kv_unified: bool = False) -> Speculation | None:
    """The drafters --spec-type asks for (None for none); a draft model is loaded and checked here.

    Raises:
        InputError: the draft model's vocabulary is not the target's.
        ModelLoadError: the draft model could not be loaded.
    """
    if not settings.enabled:
        return None
    if settings.type != SPEC_DRAFT or settings.draft_path is None:
        return Speculation(settings)
    from ..model.resolve import ResolvedModel
    from ..model.session import load_session

    from dataclasses import replace

    from ..model.adapters import AdapterSettings

    resolved = ResolvedModel(settings.draft_path, (settings.draft_path,))
    load = replace(load, adapters=AdapterSettings())  # --lora and --control-vector are the target's
    session = load_session(resolved, load, context=None)
    try:
        check_same_vocab(target, session.model)
        # The target's shape: a sequence per slot, each with a slot's share of the context (or all of it).
        n_ctx = n_ctx_seq if kv_unified else n_ctx_seq * n_seq
        session.open_context(load, n_ctx=n_ctx, n_seq_max=n_seq, kv_unified=kv_unified)
    except BaseException:
        session.close()
        raise
    return Speculation(settings, DraftModel(session, n_seq, n_ctx_seq))


@contextmanager
def speculating(settings: SpeculativeSettings | None, load: Any, target: Any, n_ctx: int) -> Iterator[Speculation | None]:
    """open_speculation for one sequence (complete, chat), closed on exit."""
    speculation = open_speculation(settings, load, target, n_ctx_seq=n_ctx) if settings is not None else None
    try:
        yield speculation
    finally:
        if speculation is not None:
            speculation.close()


def check_same_vocab(target: Any, draft: Any) -> None:
    """Refuse a draft model whose token ids do not mean what the target's do.

    Raises:
        InputError: naming the first difference.
    """
    hint = "use a draft model of the target's family (the same tokenizer), e.g. a smaller quant of it"
    if draft.n_vocab != target.n_vocab:
        raise InputError(f"the draft model's vocabulary differs from the target's: {draft.n_vocab} tokens against "
                         f"{target.n_vocab}", hint=hint)
    step = max(1, target.n_vocab // 4096)  # every token of a small vocabulary, a spread sample of a large one
    ids = sorted({*range(0, target.n_vocab, step), target.bos, target.eos, *target.eog_tokens} - {-1})
    for token in ids:
        if draft.token_to_piece(token) != target.token_to_piece(token):
            raise InputError(f"the draft model's vocabulary differs from the target's: token {token} is "
                             f"{draft.token_to_piece(token)!r} there and {target.token_to_piece(token)!r} here",
                             hint=hint)


def safe_draft(drafter: Any, history: Sequence[int], n_max: int) -> list[int]:
    """The drafter's guess, or none when drafting fails (a draft model's context is full): speculation
    only ever saves time, so its failure must not end the generation."""
    try:
        return drafter.draft(history, n_max)
    except Exception:  # noqa: BLE001 - see above
        return []


# ---------------------------------------------------------------- verification


def draft_room(turn: Turn, position: int, n_ctx: int, n_max: int) -> int:
    """How many tokens may be drafted after the token at `position`: within --spec-draft-n-max, the
    context (a drafted token needs a position), and the -n budget (the last sample needs none)."""
    room = min(n_max, n_ctx - 1 - position)
    if turn.max_tokens >= 0:
        room = min(room, turn.max_tokens - turn.stats.n_generated - 1)
    return max(room, 0)


@dataclass
class Verified:
    """What one verification step decided."""

    kept: int  # drafted tokens that stay in the KV cache (accepted, and not the one that ended generation)
    token: int  # the last token sampled (the next step's input), when generation goes on
    stop: str | None
    evaluated: bool = False  # the last token is already in the KV cache (a drafted one that filled the context)
    accepted: int = -1  # drafted tokens the target agreed with (-1: the same as kept)

    def __post_init__(self) -> None:
        if self.accepted < 0:
            self.accepted = self.kept


def verify(turn: Turn, sample: Callable[[int], int], first_index: int, position: int, drafts: Sequence[int],
           emit: Callable[[Accepted, int, int], None], interrupted: Callable[[], bool]) -> Verified:
    """Sample the target at each position of a verified draft until it disagrees or generation ends.

    Args:
        sample: samples output `i` of the batch (the sampler chain accepts what it picks).
        first_index: the batch output of the last sampled token (at `position`); the drafts follow it.
        emit: told each decided token (Accepted, token, batch output) as Turn.accept decided it.
    """
    kept = 0
    for i in range(len(drafts) + 1):
        if i and (reason := turn.stop_before_sampling(interrupted())) is not None:
            return Verified(kept, -1, reason)
        token = sample(first_index + i)
        accepted = turn.accept(token, position + i + 1)
        emit(accepted, token, first_index + i)
        matched = i < len(drafts) and token == drafts[i]
        if accepted.stop is not None:
            evaluated = matched and accepted.stop == STOP_CONTEXT
            return Verified(kept + evaluated, token, accepted.stop, evaluated, kept + matched)
        if not matched:
            return Verified(kept, token, None)
        kept += 1
    raise AssertionError("unreachable: the last position has no draft to match")
