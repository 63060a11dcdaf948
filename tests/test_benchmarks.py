"""The benchmark scripts are not run by the suite (they take minutes), but each must still start: a
helper moved between modules once broke two of them without any test noticing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPTS = sorted(p for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_"))


def test_there_are_benchmark_scripts() -> None:
    assert {"bench_router.py", "bench_agents.py", "bench_speculative.py"} <= {p.name for p in SCRIPTS}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_benchmark_script_starts_and_explains_itself(script: Path) -> None:
    done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=60,
                          cwd=BENCHMARKS.parent)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: "), done.stdout
