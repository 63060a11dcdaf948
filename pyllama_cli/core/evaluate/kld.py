"""KL divergence against a base model: the base file of log-probabilities and the statistics.

The base file keeps llama-perplexity's layout, so files made by either tool work with both:

    b"_logits_"                          magic (8 bytes)
    int32 n_ctx, int32 n_vocab, int32 n_chunk
    int32 tokens[n_chunk * n_ctx]        the evaluated text, chunk by chunk
    then, for each chunk and each scored position (n_ctx - 1 - n_ctx/2 per chunk), one row of
    row_width(n_vocab) uint16: float32 scale, float32 min_log_prob, n_vocab quantized log-probs
    (padded to an even count), log p = scale * q + min_log_prob.

Log-probs more than 16 nats below the top one are stored as the floor, which the statistics
treat as zero probability. All integers are little-endian.
"""

from __future__ import annotations

import math
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
from .perplexity import (
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

MAGIC = b"_logits_"
HEADER_BYTES = len(MAGIC) + 3 * 4
LOG_PROB_RANGE = 16.0  # nats below the top log-prob that the file resolves
_LEVELS = 65535
# llama-perplexity prints the closing statistics only from this many scored positions on.
MIN_SUMMARY_POSITIONS = 100
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


# ---------------------------------------------------------------- statistics


@dataclass
class KldStats:
    """Running sums over every compared position, plus the per-position values for percentiles."""

    sum_nll: float = 0.0
    sum_nll2: float = 0.0
    sum_nll_base: float = 0.0
    sum_nll_base2: float = 0.0
    sum_nll_nll_base: float = 0.0
    sum_kld: float = 0.0
    sum_kld2: float = 0.0
    sum_p_diff: float = 0.0
    sum_p_diff2: float = 0.0
    sum_p_diff4: float = 0.0
    n_same_top: int = 0
    count: int = 0
    kld_values: list[np.ndarray] = field(default_factory=list)
    p_diff_values: list[np.ndarray] = field(default_factory=list)

    def add_chunk(self, logits: np.ndarray, targets: np.ndarray,
                  base: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
        """Compare one chunk's logits rows with the base file's rows for the same positions."""
        scale, min_log_prob, q = base
        scratch = Scratch(min(len(logits), block_rows(logits.shape[1])), logits.shape[1])
        for i in range(0, len(logits), scratch.rows):
            part = slice(i, i + scratch.rows)
            self._add_block(logits[part], targets[part], (scale[part], min_log_prob[part], q[part]), scratch)

    def _add_block(self, rows: np.ndarray, targets: np.ndarray,
                   base: tuple[np.ndarray, np.ndarray, np.ndarray], scratch: Scratch) -> None:
        scale, min_log_prob, q = base
        idx = np.arange(len(rows))
        top = rows.max(axis=1)
        shifted, log_sum = shifted_log_sum(rows, scratch)
        log_q = shifted - log_sum[:, None]
        log_p32 = scale[:, None] * q + min_log_prob[:, None]
        log_p = log_p32.astype(np.float64)
        kept = log_p > -LOG_PROB_RANGE
        p = np.where(kept, np.exp(log_p), 0.0)
        # The stored log-probs are rounded to 16 bits, so they sum to 1 only within ~1e-6; taking the
        # divergence from the renormalized base keeps it >= 0 (a model against itself gives 0, not -0).
        mass = p.sum(axis=1)
        raw = (p * np.where(kept, log_p - log_q, 0.0)).sum(axis=1)
        kld = np.maximum(raw / mass - np.log(mass), 0.0)
        # Per-token NLLs and probabilities in float, as llama-perplexity keeps them, for its printed digits.
        nll = (top + log_sum.astype(np.float32)) - rows[idx, targets]
        nll_base = -log_p32[idx, targets]
        p_diff = np.exp(-nll) - np.exp(-nll_base)
        p_diff2 = (p_diff * p_diff).astype(np.float64)
        # A tie in the stored (16-bit) base counts as agreement: the file cannot tell those tokens apart.
        same = log_p32[idx, rows.argmax(axis=1)] >= log_p32.max(axis=1)
        f64 = np.float64
        self.sum_nll += nll.sum(dtype=f64)
        self.sum_nll2 += (nll * nll).sum(dtype=f64)
        self.sum_nll_base += nll_base.sum(dtype=f64)
        self.sum_nll_base2 += (nll_base * nll_base).sum(dtype=f64)
        self.sum_nll_nll_base += (nll * nll_base).sum(dtype=f64)
        self.sum_kld += kld.sum()
        self.sum_kld2 += kld @ kld
        self.sum_p_diff += p_diff.sum(dtype=f64)
        self.sum_p_diff2 += p_diff2.sum()
        self.sum_p_diff4 += (p_diff2 * p_diff2).sum()
        self.n_same_top += int(same.sum())
        self.count += len(rows)
        self.kld_values.append(kld.astype(np.float32))
        self.p_diff_values.append(p_diff)

    # ---- derived values, as llama-perplexity computes them

    def _mean(self, total: float, squares: float) -> tuple[float, float]:
        """Mean and its standard error; the error is 0 with 10 values or fewer."""
        if self.count < 1:
            return 0.0, 0.0
        mean = total / self.count
        var = squares / self.count - mean * mean
        return mean, (math.sqrt(var / (self.count - 1)) if var > 0 and self.count > 10 else 0.0)

    def _covariance(self) -> float:
        if self.count < 10:
            return 0.0
        n = self.count
        return (self.sum_nll_nll_base / n - (self.sum_nll / n) * (self.sum_nll_base / n)) / (n - 1)

    def row(self) -> dict[str, float]:
        """The running values llama-perplexity prints after each chunk."""
        log_ppl, log_ppl_unc = self._mean(self.sum_nll, self.sum_nll2)
        log_base, log_base_unc = self._mean(self.sum_nll_base, self.sum_nll_base2)
        ratio_unc2 = log_ppl_unc ** 2 + log_base_unc ** 2 - 2.0 * self._covariance()
        kld, kld_unc = self._mean(self.sum_kld, self.sum_kld2)
        mse, mse_unc = self._mean(self.sum_p_diff2, self.sum_p_diff4)
        rms = math.sqrt(mse)
        top = self.n_same_top / self.count if self.count else 0.0
        return {
            "ppl": math.exp(log_ppl), "ppl_unc": math.exp(log_ppl) * log_ppl_unc,
            "ln_ppl_ratio": log_ppl - log_base, "ln_ppl_ratio_unc": math.sqrt(max(ratio_unc2, 0.0)),
            "kld": kld, "kld_unc": kld_unc,
            "rms_dp": rms, "rms_dp_unc": 0.5 / rms * mse_unc if rms > 0 else 0.0,
            "same_top": top, "same_top_unc": _proportion_unc(top, self.count),
        }

    def summary(self) -> dict[str, dict[str, float]]:
        """Everything in llama-perplexity's three closing blocks, as numbers."""
        log_ppl, log_ppl_unc = self._mean(self.sum_nll, self.sum_nll2)
        log_base, log_base_unc = self._mean(self.sum_nll_base, self.sum_nll_base2)
        cov = self._covariance()
        ppl, ppl_base = math.exp(log_ppl), math.exp(log_base)
        ppl_unc, ppl_base_unc = ppl * log_ppl_unc, ppl_base * log_base_unc
        ratio_unc = math.sqrt(max(log_ppl_unc ** 2 + log_base_unc ** 2 - 2.0 * cov, 0.0))
        denom = log_ppl_unc * log_base_unc
        kld_sorted = np.sort(np.concatenate(self.kld_values)) if self.kld_values else np.zeros(1, np.float32)
        dp_sorted = np.sort(np.concatenate(self.p_diff_values)) if self.p_diff_values else np.zeros(1, np.float32)
        kld, kld_unc = self._mean(self.sum_kld, self.sum_kld2)
        dp, dp_unc = self._mean(self.sum_p_diff, self.sum_p_diff2)
        row = self.row()
        return {
            "perplexity": {
                "ppl": ppl, "ppl_unc": ppl_unc, "ppl_base": ppl_base, "ppl_base_unc": ppl_base_unc,
                "cor_ln_ppl": cov / denom if denom > 0 else float("nan"),
                "ln_ppl_ratio": log_ppl - log_base, "ln_ppl_ratio_unc": ratio_unc,
                "ppl_ratio": math.exp(log_ppl - log_base), "ppl_ratio_unc": math.exp(log_ppl - log_base) * ratio_unc,
                "ppl_diff": ppl - ppl_base,
                "ppl_diff_unc": math.sqrt(max(ppl_unc ** 2 + ppl_base_unc ** 2 - 2.0 * ppl * ppl_base * cov, 0.0)),
            },
            "kld": {"mean": kld, "mean_unc": kld_unc, **_percentiles(kld_sorted, KLD_LEVELS)},
            "delta_p": {"mean": dp, "mean_unc": dp_unc, **_percentiles(dp_sorted, DELTA_P_LEVELS),
                        "rms": row["rms_dp"], "rms_unc": row["rms_dp_unc"]},
            "same_top": {"p": row["same_top"], "unc": row["same_top_unc"]},
            "count": {"positions": self.count},
        }


def _proportion_unc(p: float, n: int) -> float:
    return math.sqrt(p * (1 - p) / (n - 1)) if n > 1 else 0.0


# (label, fraction): None = median, 0/1 = min/max; the order in which llama-perplexity prints them.
KLD_LEVELS = [("max", 1.0), ("99.9%", 0.999), ("99.0%", 0.99), ("95.0%", 0.95), ("90.0%", 0.90),
              ("median", None), ("10.0%", 0.10), ("5.0%", 0.05), ("1.0%", 0.01), ("0.1%", 0.001), ("min", 0.0)]
DELTA_P_LEVELS = KLD_LEVELS[:5] + [("75.0%", 0.75), ("median", None), ("25.0%", 0.25)] + KLD_LEVELS[6:]


def _percentiles(values: np.ndarray, levels: list[tuple[str, float | None]]) -> dict[str, float]:
    return {label: float(_percentile(values, fraction)) for label, fraction in levels}


def _percentile(values: np.ndarray, fraction: float | None) -> np.float32:
    """Linear interpolation at fraction*(n-1), in float32 as llama-perplexity computes it."""
    f32, n = np.float32, len(values)
    if fraction is None:
        return f32(0.5) * (values[n // 2] + values[n // 2 - 1]) if n % 2 == 0 else values[n // 2]
    if fraction <= 0:
        return values[0]
    if fraction >= 1:
        return values[-1]
    p = f32(fraction) * f32(n - 1)
    ip = int(p)
    p = f32(p - f32(ip))
    return (f32(1) - p) * values[ip] + p * values[min(ip + 1, n - 1)]


# ---------------------------------------------------------------- text, as llama-perplexity prints it


TABLE_HEADER = ("chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              "
                "Δp RMS            Same top p")


def format_row(chunk: int, r: dict[str, float]) -> str:
    return (f"{chunk:4d}    {r['ppl']:9.4f} ± {r['ppl_unc']:9.4f}"
            f"    {r['ln_ppl_ratio']:10.5f} ± {r['ln_ppl_ratio_unc']:10.5f}"
            f"    {r['kld']:10.5f} ± {r['kld_unc']:10.5f}"
            f"    {100 * r['rms_dp']:6.3f} ± {100 * r['rms_dp_unc']:6.3f} %"
            f"    {100 * r['same_top']:6.3f} ± {100 * r['same_top_unc']:6.3f} %")


_LABELS = {"max": "Maximum", "median": "Median ", "min": "Minimum"}


def summary_lines(s: dict[str, dict[str, float]]) -> list[str]:
    p, k, d = s["perplexity"], s["kld"], s["delta_p"]
    lines = [
        "====== Perplexity statistics ======",
        f"Mean PPL(Q)                   : {p['ppl']:10.6f} ± {p['ppl_unc']:10.6f}",
        f"Mean PPL(base)                : {p['ppl_base']:10.6f} ± {p['ppl_base_unc']:10.6f}",
        f"Cor(ln(PPL(Q)), ln(PPL(base))): {100 * p['cor_ln_ppl']:6.2f}%",
        f"Mean ln(PPL(Q)/PPL(base))     : {p['ln_ppl_ratio']:10.6f} ± {p['ln_ppl_ratio_unc']:10.6f}",
        f"Mean PPL(Q)/PPL(base)         : {p['ppl_ratio']:10.6f} ± {p['ppl_ratio_unc']:10.6f}",
        f"Mean PPL(Q)-PPL(base)         : {p['ppl_diff']:10.6f} ± {p['ppl_diff_unc']:10.6f}",
        "",
        "====== KL divergence statistics ======",
        f"Mean    KLD: {k['mean']:10.6f} ± {k['mean_unc']:10.6f}",
    ]
    lines += [f"{_label(name)} KLD: {k[name]:10.6f}" for name, _ in KLD_LEVELS]
    lines += ["", "====== Token probability statistics ======",
              f"Mean    Δp: {100 * d['mean']:6.3f} ± {100 * d['mean_unc']:5.3f} %"]
    lines += [f"{_label(name)} Δp: {100 * d[name]:6.3f}%" for name, _ in DELTA_P_LEVELS]
    lines += [f"RMS Δp    : {100 * d['rms']:6.3f} ± {100 * d['rms_unc']:5.3f} %",
              f"Same top p: {100 * s['same_top']['p']:6.3f} ± {100 * s['same_top']['unc']:5.3f} %"]
    return lines


def _label(name: str) -> str:
    return _LABELS.get(name) or f"{name:>5}  "


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
    def prepare(cls, model: Model, settings: LoadSettings, header: BaseHeader, max_chunks: int = -1) -> KldRun:
        n_chunk = min(header.n_chunk, max_chunks) if max_chunks > 0 else header.n_chunk
        return cls(model, settings, header, plan_for(header.n_ctx, n_chunk, settings.n_batch))

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
