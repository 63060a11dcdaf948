"""KL divergence against a base model: the base file of log-probabilities and the statistics.

The base file keeps llama-perplexity's layout, so files made by either tool work with both:

    b"_logits_"                          magic (8 bytes)
    int32 n_ctx, int32 n_vocab, int32 n_chunk
    int32 tokens[n_chunk * n_ctx]        the evaluated text, chunk by chunk
    then, for each chunk and each scored position (n_ctx - 1 - n_ctx/2 per chunk), one row of
    row_width(n_vocab) uint16: float32 scale, float32 min_log_prob, n_vocab quantized log-probs
    (padded to an even count), log p = scale * q + min_log_prob.

Log-probs more than 16 nats below the top one are stored as the floor. The statistics (kld_stats.py)
take the rows as stored, as llama-perplexity does: a log-prob of -16 or below counts as zero
probability. All integers are little-endian.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import numpy as np

from ...errors import InputError, UsageError
from ..model.native import Model
from ..paths import atomic_write
from .kld_stats import MIN_SUMMARY_POSITIONS, TABLE_HEADER, KldStats, format_row, summary_lines
from .perplexity import (
    DEFAULT_CHUNK_CTX,
    ChunkLogits,
    ChunkPlan,
    Scratch,
    block_rows,
    evaluate_chunks,
    open_context,
    plan_for,
    shifted_log_sum,
)
from ..model.settings import LoadSettings

__all__ = ["MIN_SUMMARY_POSITIONS", "TABLE_HEADER", "KldRun", "KldStats", "format_row", "summary_lines"]

MAGIC = b"_logits_"
HEADER_BYTES = len(MAGIC) + 3 * 4
LOG_PROB_RANGE = 16.0  # nats below the top log-prob that the file resolves
_LEVELS = 65535
MAKE_BASE_HINT = "make one with: pyllama perplexity -m BASE.gguf -f TEXT --kl-divergence-base FILE"


def row_width(n_vocab: int) -> int:
    """uint16 values per stored position: 4 for the two floats, then the vocab padded to even."""
    return 2 * ((n_vocab + 1) // 2) + 4


# ---------------------------------------------------------------- the file


@dataclass(frozen=True)
class BaseHeader:
    path: Path
    n_ctx: int
    n_vocab: int
    n_chunk: int
    tokens: np.ndarray  # (n_chunk * n_ctx,) int32

    @property
    def n_scored(self) -> int:
        return scored_positions(self.n_ctx)


def scored_positions(n_ctx: int) -> int:
    """Positions scored in each chunk: the second half of the context, less the last token."""
    return n_ctx - 1 - n_ctx // 2


def base_file_size(n_ctx: int, n_vocab: int, n_chunk: int) -> int:
    """Bytes in a base file: header, tokens, and one row per scored position of every chunk."""
    return HEADER_BYTES + 4 * n_chunk * n_ctx + 2 * n_chunk * scored_positions(n_ctx) * row_width(n_vocab)


def read_base_header(path: Path) -> BaseHeader:
    """Read and check a base file's header and tokens.

    Raises:
        InputError: a missing, foreign, corrupt or truncated file.
    """
    if path.exists() and not path.is_file():  # a FIFO would block, and the rows are read at offsets
        raise InputError(f"{path} is not a regular file, so not a KL-divergence base file", hint=MAKE_BASE_HINT)
    try:
        with open(path, "rb") as f:
            n_ctx, n_vocab, n_chunk = _read_counts(f, path)
            # The size is checked first: a corrupt count must not make the token read allocate gigabytes.
            _check_size(path, os.fstat(f.fileno()).st_size, n_ctx, n_vocab, n_chunk)
            tokens = np.fromfile(f, "<i4", n_chunk * n_ctx).astype(np.int32)
    except FileNotFoundError:
        raise InputError(f"KL-divergence base file not found: {path}", hint=MAKE_BASE_HINT) from None
    except IsADirectoryError:
        raise InputError(f"{path} is a directory, not a KL-divergence base file") from None
    if tokens.min() < 0 or tokens.max() >= n_vocab:
        raise InputError(f"{path} holds token ids outside its own {n_vocab}-token vocabulary",
                         hint="make the base file again")
    return BaseHeader(path, n_ctx, n_vocab, n_chunk, tokens)


def _read_counts(f: IO[bytes], path: Path) -> tuple[int, int, int]:
    """n_ctx, n_vocab and n_chunk from the header, each checked to be possible."""
    head = f.read(HEADER_BYTES)
    if len(head) < HEADER_BYTES or not head.startswith(MAGIC):
        raise InputError(f"{path} is not a KL-divergence base file (no {MAGIC.decode()} header)", hint=MAKE_BASE_HINT)
    n_ctx, n_vocab, n_chunk = (int(v) for v in np.frombuffer(head, "<i4", 3, len(MAGIC)))
    if n_ctx < 4 or n_vocab < 1 or n_chunk < 1:
        raise InputError(f"{path} has a corrupt header (n_ctx={n_ctx}, n_vocab={n_vocab}, chunks={n_chunk})",
                         hint=MAKE_BASE_HINT)
    return n_ctx, n_vocab, n_chunk


def _check_size(path: Path, size: int, n_ctx: int, n_vocab: int, n_chunk: int) -> None:
    """A base file is exactly as long as its header says (llama-perplexity writes nothing more), so a
    size that differs is a truncated file or a corrupt header: reading on would compare garbage."""
    expected = base_file_size(n_ctx, n_vocab, n_chunk)
    if size < expected:
        raise InputError(f"{path} is truncated: {size} bytes where {n_chunk} chunks of {n_ctx} tokens "
                         f"need {expected}", hint="make the base file again")
    if size > expected:
        raise InputError(f"{path} has a corrupt header: {size} bytes where {n_chunk} chunks of {n_ctx} tokens "
                         f"with a {n_vocab}-token vocabulary take {expected}", hint="make the base file again")


def check_compatible(header: BaseHeader, n_vocab: int, n_ctx: int | None) -> None:
    """Refuse a base file made with another vocabulary or (when -c was given) another context.

    Raises:
        InputError: the vocabularies differ.
        UsageError: -c differs from the file's context.
    """
    if header.n_vocab != n_vocab:
        raise InputError(
            f"{header.path} was made with a {header.n_vocab}-token vocabulary; this model has {n_vocab} tokens",
            hint="KL divergence compares models that share a tokenizer (e.g. quantizations of one model)")
    if n_ctx and n_ctx != header.n_ctx:
        raise UsageError(f"{header.path} was made with a context of {header.n_ctx} tokens; this run asked for "
                         f"-c {n_ctx}", hint=f"drop -c, or pass -c {header.n_ctx}")


class BaseReader:
    """Reads a base file's stored rows chunk by chunk."""

    def __init__(self, header: BaseHeader):
        self.header = header
        self.width = row_width(header.n_vocab)
        self._file: IO[bytes] = open(header.path, "rb")  # noqa: SIM115 - closed by close()
        self._file.seek(HEADER_BYTES + 4 * header.n_chunk * header.n_ctx)
        self._chunk = 0

    def next_chunk(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(scale, min_log_prob, quantized log-probs (n_scored, n_vocab)) of the next chunk."""
        n = self.header.n_scored
        rows = np.fromfile(self._file, "<u2", n * self.width)
        if len(rows) < n * self.width:
            raise InputError(f"{self.header.path} ended early", hint="make the base file again")
        rows = rows.reshape(n, self.width)
        floats = np.ascontiguousarray(rows[:, :4]).view("<f4")
        scale, min_log_prob = floats[:, 0], floats[:, 1]
        if not _plausible_rows(scale, min_log_prob):
            raise InputError(f"{self.header.path} holds corrupt log-probs (chunk {self._chunk + 1})",
                             hint="make the base file again")
        self._chunk += 1
        return scale, min_log_prob, rows[:, 4:4 + self.header.n_vocab]

    def close(self) -> None:
        self._file.close()


def _plausible_rows(scale: np.ndarray, min_log_prob: np.ndarray) -> bool:
    """Whether stored rows are ones quantize_log_probs can write: 0 <= scale <= 16/65535 (with float
    slack) and a finite min_log_prob <= 0. Anything else is corruption, and would turn every
    statistic into NaN or overflow."""
    scale_ok = (scale >= 0) & (scale <= np.float32(1.001 * LOG_PROB_RANGE / _LEVELS))
    return bool(np.all(scale_ok & np.isfinite(min_log_prob) & (min_log_prob <= 0)))


class BaseWriter:
    """Writes a base file's header, tokens and rows to an open file; `path` names the file in errors."""

    def __init__(self, file: IO[bytes], path: Path, n_ctx: int, n_vocab: int, tokens: np.ndarray):
        self._file = file
        self.path = path
        self.n_vocab = n_vocab
        n_chunk = len(tokens) // n_ctx
        self._write(MAGIC + np.array([n_ctx, n_vocab, n_chunk], "<i4").tobytes())
        self._write(np.asarray(tokens, "<i4").tobytes())

    def add(self, logits: np.ndarray) -> None:
        """Append the quantized log-probs of these rows (one per scored position)."""
        self._write(quantize_log_probs(logits, row_width(self.n_vocab)).tobytes())

    def on_chunk(self, chunk: ChunkLogits, _nll: np.ndarray) -> None:
        """A `PerplexityRun.on_chunk` hook: store each chunk as it is scored."""
        self.add(chunk.logits)

    def _write(self, data: bytes) -> None:
        try:
            self._file.write(data)
        except OSError as exc:
            raise InputError(f"cannot write {self.path}: {exc.strerror}") from None


@contextmanager
def writing_base(path: Path, plan: ChunkPlan, n_vocab: int, tokens: np.ndarray) -> Iterator[BaseWriter]:
    """A base-file writer for a perplexity run; the file appears only if the block completes."""
    with atomic_write(path) as temp, open(temp, "wb") as file:
        yield BaseWriter(file, path, plan.n_ctx, n_vocab, tokens[:plan.n_chunk * plan.n_ctx])


def quantize_log_probs(logits: np.ndarray, width: int) -> np.ndarray:
    """Rows of `width` uint16 for these logits rows, rounded as llama-perplexity rounds them."""
    n_rows, n_vocab = logits.shape
    out = np.zeros((n_rows, width), np.uint16)
    scratch = Scratch(min(n_rows, block_rows(n_vocab)), n_vocab)
    for i in range(0, n_rows, scratch.rows):
        out[i:i + scratch.rows] = _quantize_block(logits[i:i + scratch.rows], width, scratch)
    return out


def _quantize_block(rows: np.ndarray, width: int, scratch: Scratch) -> np.ndarray:
    f32 = np.float32
    top = rows.max(axis=1)
    floor = np.maximum(rows.min(axis=1), top - f32(LOG_PROB_RANGE))
    log_sum = shifted_log_sum(rows, scratch)[1].astype(f32)
    scale = ((top - floor) / f32(_LEVELS)).astype(f32)
    min_log_prob = (floor - top - log_sum).astype(f32)
    inv = np.divide(f32(1), scale, out=np.zeros_like(scale), where=scale > 0)
    q = np.rint(inv[:, None] * (rows - floor[:, None]))
    q[rows <= floor[:, None]] = 0
    out = np.zeros((len(rows), width), np.uint16)
    out[:, :4] = np.stack([scale, min_log_prob], axis=1).astype("<f4").view("<u2")
    out[:, 4:4 + rows.shape[1]] = q
    return out


# ---------------------------------------------------------------- the run


@dataclass
class KldRun:
    """Evaluate the base file's tokens with this model and compare, chunk by chunk."""

    model: Model
    settings: LoadSettings
    header: BaseHeader
    plan: ChunkPlan
    stats: KldStats = field(default_factory=KldStats)
    seconds: float = 0.0

    @classmethod
    def prepare(cls, model: Model, settings: LoadSettings, header: BaseHeader, max_chunks: int = -1,
                n_ctx: int | None = None) -> KldRun:
        """The run over the file's chunks (at most `max_chunks`); `n_ctx` is the -c given, if any.

        llama-perplexity sizes its context by -c (512 when not given) whatever the file's context, with
        batch_size / -c sequences, and evaluates that many of the file's chunks per decode at most. A
        file of 128-token chunks read without -c thus goes 4 chunks per decode, not 16: decodes of
        another size round differently, so the same cap keeps every printed digit its.
        """
        n_chunk = min(header.n_chunk, max_chunks) if max_chunks > 0 else header.n_chunk
        max_seq = max(1, settings.n_batch // (n_ctx or DEFAULT_CHUNK_CTX))
        return cls(model, settings, header, plan_for(header.n_ctx, n_chunk, settings.n_batch, max_seq))

    def chunks(self) -> Iterator[tuple[int, dict[str, float]]]:
        """Yield (1-based chunk number, running statistics row) as each chunk is compared."""
        plan = self.plan
        windows = self.header.tokens[:plan.n_chunk * plan.n_ctx].reshape(plan.n_chunk, plan.n_ctx)
        bos = self.model.bos if self.model.add_bos else None
        reader = BaseReader(self.header)
        start = time.perf_counter()
        try:
            with open_context(self.model, self.settings, plan) as ctx:
                for chunk in evaluate_chunks(ctx, windows, plan, bos):
                    self.stats.add_chunk(chunk.logits, chunk.targets, reader.next_chunk())
                    self.seconds = time.perf_counter() - start
                    yield chunk.index + 1, self.stats.row()
        finally:
            reader.close()
