"""llama-server's own pytest suite, its five quick files, against `pyllama serve`: every test those files
pass against llama-server (tests/fixtures/llama_server_passes.txt) passes against pyllama too. The run is
benchmarks/llama_server_suite.py's; the whole suite beside llama-server is the command in docs/llama-server.md.

The suite ships in llama-cpp-python's source package. The test reads it from where the reference build
unpacked it (~/.cache/pyllama-ref/src) and skips without it: the suite runs offline."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT

SOURCE = Path("~/.cache/pyllama-ref/src").expanduser()
PASSES = Path(REPO_ROOT) / "tests" / "fixtures" / "llama_server_passes.txt"


def _suite_present() -> bool:
    return any(SOURCE.glob("llama_cpp_python-*/vendor/llama.cpp/tools/server/tests/utils.py"))


@pytest.mark.skipif(not _suite_present(), reason="llama-server's suite is unpacked by shared/tools/build-llamacpp-ref.sh")
def test_the_quick_files_pass_whatever_llama_server_passes(tmp_path: Path) -> None:
    env = {**os.environ, "PYLLAMA_BENCH_DIR": str(tmp_path / "models")}
    run = subprocess.run([sys.executable, "benchmarks/llama_server_suite.py", "--src", str(SOURCE),
                          "--work", str(tmp_path / "work")], cwd=REPO_ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    passed = {line[len("  pass  "):] for line in run.stdout.splitlines() if line.startswith("  pass  ")}
    expected = {line for line in PASSES.read_text().splitlines() if line and not line.startswith("#")}
    assert len(expected) == 80
    assert sorted(expected - passed) == []
