"""llama-perplexity's perplexity: the same chunks, the same scored positions, the same numbers.

The text is tokenized whole (with BOS) and cut into non-overlapping chunks of `n_ctx` tokens. Each
chunk is evaluated from an empty KV cache with its first token replaced by BOS (when the vocab adds
BOS); only the second half of each chunk is scored, so every scored token has at least n_ctx/2
tokens of context. Several chunks share one llama_decode as separate sequences (`n_seq =
n_batch / n_ctx`), as llama.cpp does. Logits are consumed chunk by chunk, so memory does not grow
with the text.
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...errors import InputError, Interrupted, UsageError
from ..interrupt import StopFlag, catch_sigint
from ..text.json_text import json_ready
from ..model.native import Batch, Context, Model, lib
from ..model.settings import LoadSettings
from .modes import DEFAULT_CHUNK_CTX
MAX_SEQUENCES = 256  # llama.cpp's limit on sequences in one context
_BLOCK_ELEMENTS = 1 << 19  # logits per numpy block: keeps the temporaries small whatever the vocab


# ---------------------------------------------------------------- input


def read_text(path: Path) -> bytes:
    """The text file's bytes, less one trailing newline (as llama.cpp's -f reads a prompt file)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"text file not found: {path}", hint="pass an existing file with -f") from None
    except IsADirectoryError:
        raise InputError(f"{path} is a directory, not a text file", hint="pass a file with -f") from None
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from None
    return data[:-1] if data.endswith(b"\n") else data


def tokenize_text(model: Model, text: bytes) -> np.ndarray:
    """Token ids of the whole text, BOS first when the vocab adds it; special tokens stay text."""
    return model.tokenize(text, add_special=True, parse_special=False)


# ---------------------------------------------------------------- planning


@dataclass(frozen=True)
class ChunkPlan:
    """How the tokens are cut into chunks and batched into llama_decode calls."""

    n_ctx: int  # tokens per chunk
    n_chunk: int  # chunks evaluated
    n_seq: int  # chunks per llama_decode (sequences in the context)
    n_batch: int  # tokens per llama_decode

    @property
    def first(self) -> int:
        """Positions before this one are context only; logits are requested from here on."""
        return self.n_ctx // 2

    @property
    def n_scored(self) -> int:
        """Tokens scored per chunk: positions first+1 .. n_ctx-1."""
        return self.n_ctx - 1 - self.first

    @property
    def n_outputs(self) -> int:
        """Logit rows llama.cpp returns per chunk (the last one predicts past the chunk, unused)."""
        return self.n_ctx - self.first


def plan_chunks(n_tokens: int, n_ctx: int, n_batch: int, max_chunks: int = -1) -> ChunkPlan:
    """Cut `n_tokens` into chunks as llama-perplexity does.

    Raises:
        UsageError: a context too small to score anything.
        InputError: fewer than two chunks' worth of tokens.
    """
    if n_ctx < 4:
        raise UsageError(f"-c {n_ctx} is too small for perplexity", hint=f"use -c {DEFAULT_CHUNK_CTX} (the default)")
    if n_tokens < 2 * n_ctx:
        smaller = f", or a smaller context (-c {n_tokens // 2} fits this one)" if n_tokens >= 8 else ""
        raise InputError(
            f"the text is {n_tokens} token{'s' if n_tokens != 1 else ''} long; perplexity with a context of "
            f"{n_ctx} needs at least {2 * n_ctx} tokens",
            hint=f"use a longer text{smaller}",
        )
    n_chunk = n_tokens // n_ctx
    if max_chunks > 0:
        n_chunk = min(n_chunk, max_chunks)
    return plan_for(n_ctx, n_chunk, n_batch)


def plan_for(n_ctx: int, n_chunk: int, n_batch: int, max_seq: int = MAX_SEQUENCES) -> ChunkPlan:
    """The batching of `n_chunk` chunks of `n_ctx` tokens under a logical batch of `n_batch`, at most
    `max_seq` chunks per decode."""
    # The context holds n_seq chunks at once; fewer when there are fewer chunks (same numbers, less memory).
    n_seq = min(max(1, n_batch // n_ctx), n_chunk, max_seq, MAX_SEQUENCES)
    return ChunkPlan(n_ctx=n_ctx, n_chunk=n_chunk, n_seq=n_seq, n_batch=min(n_batch, n_seq * n_ctx))


def open_context(model: Model, settings: LoadSettings, plan: ChunkPlan) -> Context:
    """A context with one KV sequence of `n_ctx` cells per chunk evaluated together."""
    # Context caps n_batch at n_ctx, which gives plan.n_batch, as llama-perplexity's min(n_batch, n_ctx).
    return Context(model, settings, n_ctx=plan.n_seq * plan.n_ctx, n_seq_max=plan.n_seq)


# ---------------------------------------------------------------- evaluation


@dataclass
class ChunkLogits:
    """The scored part of one evaluated chunk. `logits` is only valid until the next chunk."""

    index: int  # 0-based chunk number
    logits: np.ndarray  # (n_scored, n_vocab) float32: row i predicts targets[i]
    targets: np.ndarray  # (n_scored,) int32


class _Layout:
    """One reusable llama_batch per decode step of a group of chunks, with positions, sequence ids
    and output flags written once; only the token ids change from group to group."""

    def __init__(self, plan: ChunkPlan):
        self.plan = plan
        self.steps: list[tuple[int, int, Batch, np.ndarray]] = []  # (start pos, length, batch, token view)
        step = min(plan.n_batch, plan.n_ctx)
        for start in range(0, plan.n_ctx, step):
            length = min(step, plan.n_ctx - start)
            self.steps.append((start, length, *self._make_batch(start, length)))

    def _make_batch(self, start: int, length: int) -> tuple[Batch, np.ndarray]:
        n = self.plan.n_seq * length
        batch = Batch(n, 1)
        raw = batch.raw
        pos = np.arange(start, start + length, dtype=np.int32)
        np.ctypeslib.as_array(raw.pos, shape=(n,))[:] = np.tile(pos, self.plan.n_seq)
        np.ctypeslib.as_array(raw.n_seq_id, shape=(n,))[:] = 1
        np.ctypeslib.as_array(raw.logits, shape=(n,))[:] = np.tile(pos >= self.plan.first, self.plan.n_seq)
        for seq in range(self.plan.n_seq):
            for k in range(seq * length, (seq + 1) * length):
                raw.seq_id[k][0] = seq
        return batch, np.ctypeslib.as_array(raw.token, shape=(n,))

    def close(self) -> None:
        for _, _, batch, _ in self.steps:
            batch.close()


def evaluate_chunks(ctx: Context, windows: np.ndarray, plan: ChunkPlan, bos: int | None,
                    stop: StopFlag | None = None) -> Iterator[ChunkLogits]:
    """Evaluate each row of `windows` (n_chunk x n_ctx tokens) and yield its scored logits.

    Raises:
        Interrupted: Ctrl-C (mid-decode or between chunks).
    """
    stop = stop if stop is not None else StopFlag()
    layout = _Layout(plan)
    n_vocab = ctx.model.n_vocab
    # Chunks longer than one batch gather their outputs here; one chunk at most (n_seq is then 1).
    gathered = np.empty((plan.n_outputs, n_vocab), np.float32) if len(layout.steps) > 1 else None
    ctx.abort_check = stop.__bool__
    try:
        with catch_sigint(stop), ctx.abortable():
            for i in range(0, plan.n_chunk, plan.n_seq):
                group = windows[i:i + plan.n_seq]
                rows = _decode_group(ctx, layout, group, bos, gathered, n_vocab)
                for seq in range(len(group)):
                    yield ChunkLogits(i + seq, rows[seq, :-1], group[seq, plan.first + 1:])
                if stop:
                    raise Interrupted("perplexity interrupted")
    finally:
        ctx.abort_check = None
        layout.close()


def _decode_group(ctx: Context, layout: _Layout, group: np.ndarray, bos: int | None,
                  gathered: np.ndarray | None, n_vocab: int) -> np.ndarray:
    """Decode a group of chunks; return their output logits as (n_seq_group, n_outputs, n_vocab)."""
    plan = layout.plan
    n_group = len(group)
    ctx.clear_memory()
    filled = 0
    for start, length, batch, token_view in layout.steps:
        part = group[:, start:start + length]
        token_view[:n_group * length] = part.reshape(-1)
        if start == 0 and bos is not None:
            token_view[0:n_group * length:length] = bos  # replace, not insert: the chunk keeps n_ctx tokens
        batch.n_tokens = batch.raw.n_tokens = n_group * length
        ctx.decode(batch)
        n_out = n_group * max(0, start + length - max(start, plan.first))
        if gathered is not None and n_out:
            gathered[filled:filled + n_out] = _output_logits(ctx, n_out, n_vocab)
            filled += n_out
    if gathered is not None:
        return gathered[None]
    return _output_logits(ctx, n_group * plan.n_outputs, n_vocab).reshape(n_group, plan.n_outputs, n_vocab)


def _output_logits(ctx: Context, n_outputs: int, n_vocab: int) -> np.ndarray:
    """A view of the last decode's logits: one row per token that asked for them, in batch order."""
    return np.ctypeslib.as_array(lib.llama_get_logits(ctx.handle), shape=(n_outputs, n_vocab))


# ---------------------------------------------------------------- math


class Scratch:
    """Work arrays for `shifted_log_sum` over blocks of up to `rows` rows: fresh temporaries per block
    would cost a page-faulting allocation each, several times the arithmetic itself."""

    def __init__(self, rows: int, n_vocab: int):
        self.rows = rows
        self.shifted = np.empty((rows, n_vocab), np.float32)
        self.exp64 = np.empty((rows, n_vocab), np.float64)
        self.exp32 = np.empty((rows, n_vocab), np.float32)


def block_rows(n_vocab: int) -> int:
    """Rows per block, so that a block is about _BLOCK_ELEMENTS logits."""
    return max(1, _BLOCK_ELEMENTS // n_vocab)


def shifted_log_sum(rows: np.ndarray, scratch: Scratch) -> tuple[np.ndarray, np.ndarray]:
    """(rows - row max, log of the sum of their exps), in llama-perplexity's arithmetic.

    The differences and their exps are floats, summed in double. The exps are taken in double and
    rounded, as glibc's expf is; numpy's own float32 exp is not correctly rounded, and its bias shows
    in the 4th decimal of a high PPL. The shifted rows live in `scratch` until its next use.
    """
    n = len(rows)
    shifted = np.subtract(rows, rows.max(axis=1, keepdims=True), out=scratch.shifted[:n])
    exp64, exp32 = scratch.exp64[:n], scratch.exp32[:n]
    np.copyto(exp64, shifted)
    np.exp(exp64, out=exp64)
    np.copyto(exp32, exp64, casting="same_kind")
    return shifted, np.log(exp32.sum(axis=1, dtype=np.float64))


def token_nll(logits: np.ndarray, targets: np.ndarray, workers: int | None = None) -> np.ndarray:
    """Negative log-likelihood of each target under its logits row, in double.

    The rows are shared out among `workers` threads (default: one per CPU), as llama-perplexity
    shares them among its own: numpy lets go of the GIL in its loops, so a chunk's softmax takes
    1/workers of the time between two decodes. Each thread takes its rows in blocks, so the
    temporaries stay small whatever the vocabulary size.
    """
    n_rows, n_vocab = logits.shape
    out = np.empty(n_rows, np.float64)
    rows = block_rows(n_vocab)
    n_workers = max(1, min(workers or os.cpu_count() or 1, -(-n_rows // rows)))
    step = -(-n_rows // n_workers)
    spans = [(i, min(i + step, n_rows)) for i in range(0, n_rows, step)]
    if len(spans) == 1:
        _nll_span(logits, targets, out, 0, n_rows)
    else:
        list(_nll_pool(n_workers).map(lambda span: _nll_span(logits, targets, out, *span), spans))
    return out


def _nll_span(logits: np.ndarray, targets: np.ndarray, out: np.ndarray, start: int, end: int) -> None:
    """token_nll of rows start..end-1, written into `out`."""
    scratch = Scratch(min(end - start, block_rows(logits.shape[1])), logits.shape[1])
    for i in range(start, end, scratch.rows):
        j = min(i + scratch.rows, end)
        shifted, log_sum = shifted_log_sum(logits[i:j], scratch)
        out[i:j] = log_sum - shifted[np.arange(j - i), targets[i:j]]


@functools.cache
def _nll_pool(workers: int) -> ThreadPoolExecutor:
    """One pool per process for token_nll (its threads sleep between chunks)."""
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pyllama-nll")


@dataclass
class NllSums:
    """Running sums of the scored tokens' NLL, from which PPL and its uncertainty follow."""

    total: float = 0.0
    squares: float = 0.0
    count: int = 0

    def add(self, nll: np.ndarray) -> None:
        self.total += float(nll.sum())
        self.squares += float(np.dot(nll, nll))
        self.count += len(nll)

    @property
    def ppl(self) -> float:
        return math.exp(self.total / self.count) if self.count else float("nan")

    @property
    def uncertainty(self) -> float:
        """llama.cpp's ±: PPL * sqrt((E[nll^2] - E[nll]^2) / (N - 1)) (the delta method)."""
        if self.count < 2:
            return float("nan")
        mean = self.total / self.count
        var = self.squares / self.count - mean * mean
        return self.ppl * math.sqrt(var / (self.count - 1)) if var > 0 else float("nan")


# ---------------------------------------------------------------- the run


@dataclass
class PerplexityResult:
    ppl: float
    uncertainty: float
    chunk_ppl: list[float]  # running PPL after each chunk
    n_tokens: int  # tokens in the text
    n_ctx: int
    n_chunk: int
    n_seq: int
    n_batch: int
    n_scored: int
    seconds: float = 0.0

    def to_dict(self) -> dict[str, object]:
        return json_ready({
            "ppl": round(self.ppl, 6), "uncertainty": round(self.uncertainty, 6),
            "chunks": [{"chunk": i + 1, "ppl": round(v, 6)} for i, v in enumerate(self.chunk_ppl)],
            "n_tokens": self.n_tokens, "n_ctx": self.n_ctx, "n_chunks": self.n_chunk,
            "n_seq": self.n_seq, "n_batch": self.n_batch, "scored_tokens": self.n_scored,
            "seconds": round(self.seconds, 3),
        })


@dataclass
class PerplexityRun:
    """One perplexity evaluation; iterate `chunks()` for running values, then read `result`.

    `on_chunk(chunk_logits, nll)` sees every chunk's scored logits and NLL (the KL-divergence base
    writer uses it).
    """

    model: Model
    settings: LoadSettings
    tokens: np.ndarray
    plan: ChunkPlan
    on_chunk: Callable[[ChunkLogits, np.ndarray], None] | None = None
    sums: NllSums = field(default_factory=NllSums)
    chunk_ppl: list[float] = field(default_factory=list)
    seconds: float = 0.0

    @classmethod
    def prepare(cls, model: Model, settings: LoadSettings, text: bytes, n_ctx: int, max_chunks: int = -1
                ) -> PerplexityRun:
        """Tokenize the text and cut it into chunks of `n_ctx` (see plan_chunks for what is refused)."""
        tokens = tokenize_text(model, text)
        return cls(model, settings, tokens, plan_chunks(len(tokens), n_ctx, settings.n_batch, max_chunks))

    def chunks(self) -> Iterator[tuple[int, float]]:
        """Yield (1-based chunk number, running PPL) as each chunk is scored."""
        windows = self.tokens[:self.plan.n_chunk * self.plan.n_ctx].reshape(self.plan.n_chunk, self.plan.n_ctx)
        bos = self.model.bos if self.model.add_bos else None
        start = time.perf_counter()
        with open_context(self.model, self.settings, self.plan) as ctx:
            for chunk in evaluate_chunks(ctx, windows, self.plan, bos):
                nll = token_nll(chunk.logits, chunk.targets)
                if self.on_chunk is not None:
                    self.on_chunk(chunk, nll)
                self.sums.add(nll)
                self.chunk_ppl.append(self.sums.ppl)
                self.seconds = time.perf_counter() - start
                yield chunk.index + 1, self.sums.ppl

    @property
    def result(self) -> PerplexityResult:
        p = self.plan
        return PerplexityResult(
            ppl=self.sums.ppl, uncertainty=self.sums.uncertainty, chunk_ppl=list(self.chunk_ppl),
            n_tokens=len(self.tokens), n_ctx=p.n_ctx, n_chunk=p.n_chunk, n_seq=p.n_seq, n_batch=p.n_batch,
            n_scored=self.sums.count, seconds=self.seconds,
        )
