"""llama-imatrix --show-statistics: per-tensor statistics of a matrix, and their weighted mean per layer.

Every figure is computed in float32 in llama.cpp's order (running sums, not numpy's pairwise ones),
so the printed table is the same to the last digit.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from .collector import Stats

_F = np.float32
_BLOCK = re.compile(r"blk\.(\d+)\.")
HEADER = "\t".join([" Layer", "       Tensor", "          Σ(Act²)", "  Min", "            Max", "           μ",
                    "   σ", " % Active", "N", "   Entropy", "E (norm)", "ZD", "  CosSim"])
RULE = "=" * 169
LAYER_HEADER = "\t".join(["  Layer", "     μΣ(Act²)", "      μZD", "μCosSim"])
LAYER_RULE = "=" * 48


@dataclass
class TensorStats:
    name: str
    values: np.ndarray
    total: float
    mean: float
    max: float
    min: float
    elements: int
    stddev: float
    active: float
    entropy: float
    zd: float
    cossim: float = 0.0


def _running_sum(values: np.ndarray) -> np.float32:
    """A float32 sum added left to right (std::accumulate)."""
    return np.cumsum(values, dtype=_F)[-1] if values.size else _F(0)


def tensor_stats(name: str, e: Stats) -> TensorStats | None:
    """None where llama.cpp skips the tensor (no counts, mismatched sizes, all counts zero)."""
    if not e.counts.size or e.values.size % e.counts.size:
        return None
    row = e.values.size // e.counts.size
    rows = [e.values[i * row:(i + 1) * row] / _F(c) for i, c in enumerate(e.counts) if c != 0]
    if not rows:
        return None
    act = np.concatenate(rows).astype(_F)
    n = act.size
    total = _running_sum(act)
    mean = _F(total / _F(n))
    var = _F(_running_sum(act * act) / _F(n)) - _F(mean * mean)
    dev = _F(math.sqrt(max(_F(0), var)))
    inactive = int(np.count_nonzero(np.abs(act) <= _F(1e-5)))
    active = _F(1) - _F(_F(inactive) / _F(n))
    entropy = _F(0)
    if total > 0:
        p = act / total
        p = p[p > 0]
        log2 = np.log2(p.astype(np.float64)).astype(_F)  # glibc's log2f is correctly rounded; numpy's float32 one is not
        entropy = -_running_sum(p * log2)
    z = int(np.count_nonzero((act - mean) / dev > 1)) if dev > 0 else 0
    return TensorStats(name, e.values, float(total), float(mean), float(act.max()), float(act.min()), n, float(dev),
                       float(active), float(entropy), float(_F(_F(z) / _F(n))))


def add_cossim(stats: list[TensorStats]) -> None:
    """Cosine similarity of each tensor's sums with the same tensor of the previous layer."""
    by_name = {t.name: t for t in stats}
    for t in stats:
        match = _BLOCK.search(t.name)
        if not match:
            continue
        prev = by_name.get(t.name[:match.start(1)] + str(int(match.group(1)) - 1) + t.name[match.end(1):])
        if prev is None:
            continue
        dot = _running_sum(t.values * prev.values[:t.values.size]) if prev.values.size >= t.values.size else None
        if dot is None:
            continue
        cur = _F(math.sqrt(_running_sum(t.values * t.values)))
        old = _F(math.sqrt(_running_sum(prev.values * prev.values)))
        with np.errstate(divide="ignore", invalid="ignore"):
            t.cossim = float(_F(dot / _F(cur * old)))


def split_name(name: str) -> tuple[str, str]:
    """(layer, tensor) as llama-imatrix shows them: blk.3.attn_k.weight -> ("3", "attn_k")."""
    parts = name.split(".")
    layer = next((parts[i + 1] for i in range(len(parts) - 1) if parts[i] == "blk"), "")
    tensor = next((parts[i - 1] for i in range(1, len(parts)) if parts[i] == "weight"), "")
    return layer or "-", tensor or name


def table_lines(source: str, entries: dict[str, Stats]) -> list[str]:
    """The whole --show-statistics report, line by line."""
    stats = [s for s in (tensor_stats(n, e) for n, e in entries.items()) if s is not None]
    add_cossim(stats)
    stats.sort(key=lambda s: (split_name(s.name)[1], -s.total))
    lines = ["", f"Computing statistics for {source} ({len(stats)} tensors)", "", HEADER, RULE]
    layers: dict[int, list[float]] = {}
    for s in stats:
        layer, tensor = split_name(s.name)
        norm = float(_F(100.0 * (s.entropy / math.log2(s.elements)))) if s.elements > 0 else 0.0
        active, zd = float(_F(s.active) * _F(100)), float(_F(100) * _F(s.zd))
        lines.append(f"{layer:>5}\t{tensor:<20}\t{s.total:10.2f}\t{s.min:8.4f}\t{s.max:11.4f}\t{s.mean:6.2f}\t"
                     f"{s.stddev:6.2f}\t{active:8.2f}%\t{s.elements:6d}\t{s.entropy:10.4f}\t{norm:6.2f}%\t"
                     f"{zd:10.2f}%\t{s.cossim:8.4f}")
        block = int(layer) if layer.isdigit() else -1
        sums = layers.setdefault(block, [_F(0), _F(0), _F(0), 0])
        sums[0] = _F(sums[0] + _F(s.elements) * _F(s.total))
        sums[1] = _F(sums[1] + _F(s.elements) * _F(s.zd))
        sums[2] = _F(sums[2] + _F(s.elements) * _F(s.cossim))
        sums[3] += s.elements
    n_layers = sum(1 for b in layers if b >= 0)
    lines += ["", f"Computing weighted average statistics per layer ({n_layers} layers)", "", LAYER_HEADER, LAYER_RULE]
    for block in sorted(layers):
        bias, zd, cos, n = layers[block]
        if n and block >= 0:
            mean_bias, mean_zd, mean_cos = (float(_F(bias) / _F(n)), float(_F(100) * (_F(zd) / _F(n))),
                                            float(_F(cos) / _F(n)))
            lines.append(f"{block:5d}\t{mean_bias:14.2f}\t{mean_zd:10.4f}%\t{mean_cos:6.4f}")
    return lines + [""]
