"""`--plot FILE.png`: t/s per test and parameter combination, drawn with matplotlib (optional extra)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...errors import UsageError
from ..paths import atomic_write, output_target
from .output import field_values, md_heading
from .spec import BenchResult, BuildInfo

PLOT_HINT = "install it with: pip install 'pyllama-cli[plot]' (or pip install matplotlib)"


def require_matplotlib() -> Any:
    """matplotlib's pyplot on a file-only backend; a clear error when it is not installed.

    Raises:
        UsageError: matplotlib is missing.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise UsageError("--plot needs matplotlib, which is not installed", hint=PLOT_HINT) from exc
    return plt


def check_plot_format(path: Path) -> None:
    """Refuse a file ending matplotlib cannot draw to (before the benchmark runs, not after).

    Raises:
        UsageError: an ending such as .txt; none at all means PNG.
    """
    plt = require_matplotlib()
    formats = plt.gcf().canvas.get_supported_filetypes()
    plt.close("all")
    ending = path.suffix.lower().lstrip(".")
    if ending and ending not in formats:
        raise UsageError(f"--plot {path}: matplotlib cannot write .{ending} files",
                         hint="end the name in one of: " + ", ".join(f".{f}" for f in sorted(formats)))


def check_plot_target(path: Path) -> None:
    """Refuse a --plot file that could not be written, before the benchmark runs.

    Raises:
        UsageError: matplotlib is missing or cannot write the ending, or the folder is missing.
    """
    check_plot_format(path)
    folder = output_target(path).parent  # a symlink's target is what gets written
    if not folder.is_dir():
        if folder.exists():
            raise UsageError(f"--plot {path}: {folder} is not a folder", hint="pick another path")
        raise UsageError(f"--plot {path}: folder {folder} does not exist", hint="create it or pick another path")


def plot_sweep(results: Sequence[BenchResult], cols: Sequence[str], build: BuildInfo, path: Path) -> None:
    """Plot a bench run, labelling each bar with the model (when several) and the parameters that
    differ between rows (`cols`: the Markdown table's columns)."""
    values = [field_values(r, build) for r in results]
    params = [c for c in cols if c in values[0] and c not in ("model", "size", "params", "backend")]
    varying = [c for c in ["model_type", *params] if len({v[c] for v in values}) > 1]
    labels = [" ".join(v[c] if c == "model_type" else f"{md_heading(c)}={v[c]}" for c in varying) for v in values]
    plot_results(results, labels, path)


def plot_results(results: Sequence[BenchResult], labels: Sequence[str], path: Path) -> None:
    """One bar chart per test (pp512, tg128, ...): a bar per parameter combination, with ± stddev.

    `labels[i]` names the combination of `results[i]`. The file is written whole or not at all.
    """
    plt = require_matplotlib()
    tests = list(dict.fromkeys(r.instance.test_name for r in results))
    fig, axes = plt.subplots(len(tests), 1, figsize=(8, 1.2 + 0.45 * len(results)), squeeze=False)
    for ax, test in zip(axes[:, 0], tests):
        rows = [(label, r) for label, r in zip(labels, results) if r.instance.test_name == test and not r.error]
        names = [label or test for label, _ in rows]
        ax.barh(names, [r.avg_ts for _, r in rows], xerr=[r.stddev_ts for _, r in rows], color="tab:blue")
        ax.invert_yaxis()
        ax.set_title(test)
        ax.set_xlabel("tokens/s")
    fig.tight_layout()
    path = Path(path)
    try:
        # matplotlib picks the format from the name's ending: the temporary name keeps it.
        with atomic_write(path, suffix=path.suffix or ".png") as temp:
            fig.savefig(temp)
    finally:
        plt.close(fig)
