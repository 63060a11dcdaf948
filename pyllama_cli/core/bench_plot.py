"""`--plot FILE.png`: t/s per test and parameter combination, drawn with matplotlib (optional extra)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import UsageError
from .bench import BenchResult

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
    fd, tmp = tempfile.mkstemp(prefix=".pyllama-plot-", suffix=path.suffix or ".png", dir=path.parent or ".")
    os.close(fd)
    try:
        fig.savefig(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 is for the temporary name only
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.unlink(tmp)
