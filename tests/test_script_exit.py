"""The `pyllama` script's end: the interpreter's shutdown finds nothing for the collector to scan.

A model command imports numpy and llama.cpp's bindings and builds its own objects after the script
froze its start-up imports; the shutdown would scan all of them twice only to free what the process's
exit frees anyway. The script freezes them when the command ends. Its atexit handlers still run.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO_ROOT

# Runs as the script does (pyllama_cli.main), with an atexit handler registered first, so it runs last.
_CHILD = """\
import atexit, gc, sys
atexit.register(lambda: print("at exit:", len(gc.get_objects()), "tracked,", gc.get_freeze_count(), "frozen",
                              file=sys.stderr))
import pyllama_cli
sys.argv = ["pyllama", *sys.argv[1:]]
pyllama_cli.main()
"""


def at_exit(*args: str) -> tuple[int, int, subprocess.CompletedProcess[str]]:
    done = subprocess.run([sys.executable, "-c", _CHILD, *args], capture_output=True, text=True, cwd=REPO_ROOT,
                          timeout=120)
    line = done.stderr.strip().splitlines()[-1]
    words = line.split()
    assert words[:2] == ["at", "exit:"], done.stderr
    return int(words[2]), int(words[4]), done


def test_a_model_command_ends_with_its_objects_frozen(tiny_model: Path) -> None:
    tracked, frozen, done = at_exit("tokenize", "-m", str(tiny_model), "-p", "hello world", "--ids")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith("[") and done.stdout.strip().endswith("]")
    # Without the final freeze the command's own objects (bindings, core modules) stay tracked: thousands.
    assert tracked < 500 and frozen > 20_000, (tracked, frozen)


def test_an_error_ends_the_same_way_and_exits_non_zero(tmp_path: Path) -> None:
    tracked, frozen, done = at_exit("tokenize", "-m", str(tmp_path / "missing.gguf"), "-p", "x")
    assert done.returncode == 1
    assert "Error: model file not found" in done.stderr
    assert tracked < 500, tracked
