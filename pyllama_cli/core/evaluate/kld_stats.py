"""KL-divergence statistics, as llama-perplexity computes and prints them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .perplexity import Scratch, block_rows, shifted_log_sum

LOG_PROB_RANGE = 16.0
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
