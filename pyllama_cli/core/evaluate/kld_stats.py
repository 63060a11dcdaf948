"""KL-divergence statistics, computed and printed as llama-perplexity computes and prints them.

For each scored position, this model's logits are compared with the base file's stored row, step by
step as llama-perplexity does, in the same precisions (float, with sums in double):

    log q_i  = logit_i - (max logit + log Σ exp(logit - max))     this model
    log p_i  = scale * stored_i + min_log_prob                    the base, as the file gives it
    KLD      = Σ over i with log p_i > -16 of p_i * (log p_i - log q_i)

The base is *not* renormalized. A token whose stored log-prob is -16 or less counts as zero
probability, and the rest keep the probabilities the file gives them, which then sum to a little under
1. On a large vocabulary with a peaked distribution that missing mass is not small (a few 1e-4 with
262,144 tokens), and each position's sum leaves those tokens out: the figures are llama-perplexity's, the ones
published quantization tables hold, rather than the divergence of the true distributions. For the same
reason a model compared with itself gives small values either side of 0, not exactly 0.

"Same top p" counts positions where the first token of highest logit is also the first token of highest
stored log-prob (a tie in the 16-bit base goes to the lower id, as in llama-perplexity); Δp is the
difference of the target token's probability, p(Q) - p(base). The text of a NaN is C's "-nan": every
NaN here comes from an x86 invalid operation (0/0, the root of a negative), whose sign bit is set.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .perplexity import Scratch, block_rows, shifted_log_sum

# A stored log-prob at or below this (absolute, in nats) counts as zero probability.
KEPT_ABOVE = np.float32(-16.0)
# llama-perplexity prints the closing statistics only from this many scored positions on.
MIN_SUMMARY_POSITIONS = 100


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
        f32, f64 = np.float32, np.float64
        scale, min_log_prob, q = base
        idx = np.arange(len(rows))
        # max logit + log Σ exp(logit - max): the log-sum in double, rounded to float, then a float sum.
        norm = rows.max(axis=1) + shifted_log_sum(rows, scratch)[1].astype(f32)
        log_p = scale[:, None] * q + min_log_prob[:, None]  # float32, as stored: not renormalized
        # Each term p * ((log p - logit) + norm) in float; a row's terms summed in double in vocabulary
        # order (cumsum adds strictly in order, as llama-perplexity's loop does).
        terms = _expf(log_p) * ((log_p - rows) + norm[:, None])
        terms[log_p <= KEPT_ABOVE] = 0
        kld = np.cumsum(terms, axis=1, dtype=f64)[:, -1]
        nll = norm - rows[idx, targets]
        nll_base = -log_p[idx, targets]
        p_diff = _expf(-nll) - _expf(-nll_base)
        p_diff2 = (p_diff * p_diff).astype(f64)
        same = rows.argmax(axis=1) == log_p.argmax(axis=1)  # both the first index of the highest value
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
        self.kld_values.append(kld.astype(f32))
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
        ratio_var = log_ppl_unc * log_ppl_unc + log_base_unc * log_base_unc - 2.0 * self._covariance()
        kld, kld_unc = self._mean(self.sum_kld, self.sum_kld2)
        mse, mse_unc = self._mean(self.sum_p_diff2, self.sum_p_diff4)
        rms = math.sqrt(mse)
        top = _c_div(self.n_same_top, self.count)
        return {
            "ppl": math.exp(log_ppl), "ppl_unc": math.exp(log_ppl) * log_ppl_unc,
            "ln_ppl_ratio": log_ppl - log_base, "ln_ppl_ratio_unc": _c_sqrt(ratio_var),
            "kld": kld, "kld_unc": kld_unc,
            "rms_dp": rms, "rms_dp_unc": _c_mul(_c_div(0.5, rms), mse_unc),
            "same_top": top, "same_top_unc": _proportion_unc(top, self.count),
        }

    def summary(self) -> dict[str, dict[str, float]]:
        """Everything in llama-perplexity's three closing blocks, as numbers."""
        log_ppl, log_ppl_unc = self._mean(self.sum_nll, self.sum_nll2)
        log_base, log_base_unc = self._mean(self.sum_nll_base, self.sum_nll_base2)
        cov = self._covariance()
        ppl, ppl_base = math.exp(log_ppl), math.exp(log_base)
        ppl_unc, ppl_base_unc = ppl * log_ppl_unc, ppl_base * log_base_unc
        ratio_unc = _c_sqrt(log_ppl_unc * log_ppl_unc + log_base_unc * log_base_unc - 2.0 * cov)
        ppl_cov = ppl * ppl_base * cov
        kld_sorted = np.sort(np.concatenate(self.kld_values)) if self.kld_values else np.zeros(1, np.float32)
        dp_sorted = np.sort(np.concatenate(self.p_diff_values)) if self.p_diff_values else np.zeros(1, np.float32)
        kld, kld_unc = self._mean(self.sum_kld, self.sum_kld2)
        dp, dp_unc = self._mean(self.sum_p_diff, self.sum_p_diff2)
        row = self.row()
        return {
            "perplexity": {
                "ppl": ppl, "ppl_unc": ppl_unc, "ppl_base": ppl_base, "ppl_base_unc": ppl_base_unc,
                "cor_ln_ppl": _c_div(cov, log_ppl_unc * log_base_unc),
                "ln_ppl_ratio": log_ppl - log_base, "ln_ppl_ratio_unc": ratio_unc,
                "ppl_ratio": math.exp(log_ppl - log_base), "ppl_ratio_unc": math.exp(log_ppl - log_base) * ratio_unc,
                "ppl_diff": ppl - ppl_base,
                "ppl_diff_unc": _c_sqrt(ppl_unc * ppl_unc + ppl_base_unc * ppl_base_unc - 2.0 * ppl_cov),
            },
            "kld": {"mean": kld, "mean_unc": kld_unc, **_percentiles(kld_sorted, KLD_LEVELS)},
            "delta_p": {"mean": dp, "mean_unc": dp_unc, **_percentiles(dp_sorted, DELTA_P_LEVELS),
                        "rms": row["rms_dp"], "rms_unc": row["rms_dp_unc"]},
            "same_top": {"p": row["same_top"], "unc": row["same_top_unc"]},
            "count": {"positions": self.count},
        }


def _expf(x: np.ndarray) -> np.ndarray:
    """C's expf: taken in double and rounded to float, as glibc's is (numpy's float32 exp is not
    correctly rounded)."""
    return np.exp(x.astype(np.float64)).astype(np.float32)


# IEEE arithmetic where Python raises: these reproduce what llama-perplexity's C gets on x86, where an
# invalid operation gives the default NaN (sign bit set, printed "-nan").
_X86_NAN = -math.nan


def _c_sqrt(x: float) -> float:
    return math.sqrt(x) if x >= 0 else (x if math.isnan(x) else _X86_NAN)


def _c_div(a: float, b: float) -> float:
    if b != 0:
        return a / b
    if a == 0 or math.isnan(a):
        return _X86_NAN if a == 0 else a
    return math.copysign(math.inf, a) * math.copysign(1.0, b)


def _c_mul(a: float, b: float) -> float:
    return _X86_NAN if (math.isinf(a) and b == 0) or (math.isinf(b) and a == 0) else a * b


def _proportion_unc(p: float, n: int) -> float:
    return _c_sqrt(_c_div(p * (1 - p), n - 1))


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
    return (f"{chunk:4d}    {_c(r['ppl'], '9.4f')} ± {_c(r['ppl_unc'], '9.4f')}"
            f"    {_c(r['ln_ppl_ratio'], '10.5f')} ± {_c(r['ln_ppl_ratio_unc'], '10.5f')}"
            f"    {_c(r['kld'], '10.5f')} ± {_c(r['kld_unc'], '10.5f')}"
            f"    {_c(100 * r['rms_dp'], '6.3f')} ± {_c(100 * r['rms_dp_unc'], '6.3f')} %"
            f"    {_c(100 * r['same_top'], '6.3f')} ± {_c(100 * r['same_top_unc'], '6.3f')} %")


_LABELS = {"max": "Maximum", "median": "Median ", "min": "Minimum"}


def summary_lines(s: dict[str, dict[str, float]]) -> list[str]:
    p, k, d = s["perplexity"], s["kld"], s["delta_p"]

    def pair(a: float, b: float, spec: str = "10.6f", unc_spec: str = "10.6f") -> str:
        return f"{_c(a, spec)} ± {_c(b, unc_spec)}"

    lines = [
        "====== Perplexity statistics ======",
        f"Mean PPL(Q)                   : {pair(p['ppl'], p['ppl_unc'])}",
        f"Mean PPL(base)                : {pair(p['ppl_base'], p['ppl_base_unc'])}",
        f"Cor(ln(PPL(Q)), ln(PPL(base))): {_c(100 * p['cor_ln_ppl'], '6.2f')}%",
        f"Mean ln(PPL(Q)/PPL(base))     : {pair(p['ln_ppl_ratio'], p['ln_ppl_ratio_unc'])}",
        f"Mean PPL(Q)/PPL(base)         : {pair(p['ppl_ratio'], p['ppl_ratio_unc'])}",
        f"Mean PPL(Q)-PPL(base)         : {pair(p['ppl_diff'], p['ppl_diff_unc'])}",
        "",
        "====== KL divergence statistics ======",
        f"Mean    KLD: {pair(k['mean'], k['mean_unc'])}",
    ]
    lines += [f"{_label(name)} KLD: {_c(k[name], '10.6f')}" for name, _ in KLD_LEVELS]
    lines += ["", "====== Token probability statistics ======",
              f"Mean    Δp: {pair(100 * d['mean'], 100 * d['mean_unc'], '6.3f', '5.3f')} %"]
    lines += [f"{_label(name)} Δp: {_c(100 * d[name], '6.3f')}%" for name, _ in DELTA_P_LEVELS]
    lines += [f"RMS Δp    : {pair(100 * d['rms'], 100 * d['rms_unc'], '6.3f', '5.3f')} %",
              f"Same top p: {pair(100 * s['same_top']['p'], 100 * s['same_top']['unc'], '6.3f', '5.3f')} %"]
    return lines


def _c(value: float, spec: str) -> str:
    """`value` as C's printf writes it with this spec: as Python does, except a NaN with its sign bit
    set, which C writes "-nan"."""
    if math.isnan(value):
        return f"{'-nan' if math.copysign(1.0, value) < 0 else 'nan':>{spec.split('.')[0]}}"
    return format(value, spec)


def _label(name: str) -> str:
    return _LABELS.get(name) or f"{name:>5}  "
