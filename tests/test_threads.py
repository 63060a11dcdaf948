"""Every context pyllama makes runs on llama.cpp's thread pools, made as llama.cpp's tools make them.

Each command path is run and its log read: the line a context writes when its pools are attached
(or that it has none) names how many pools of how many threads. The lookup of the native functions
is checked on its own too, so a build or a binding change that loses them fails here by name.
"""

from __future__ import annotations

import ctypes
import json
import subprocess
from pathlib import Path

import pytest

from pyllama_cli.core.model.library import shipped_library
from pyllama_cli.core.model.settings import CpuPlacement, LoadSettings, parse_cpu_mask, parse_cpu_range
from pyllama_cli.core.model.threads import _typed, pool_functions, pool_params
from pyllama_cli.errors import ThreadPoolError, UsageError
from pyllama_cli.options.hardware.cpu import cpu_set
from tests.helpers import run_cli
from tests.test_bench import _llama_bench

ONE_POOL_1 = "pyllama: thread pools attached: 1 pool of 1 thread"
ONE_POOL_2 = "pyllama: thread pools attached: 1 pool of 2 threads"
BATCH_POOL = "pyllama: thread pools attached: a batch pool of 1 thread and a paused pool of 2 threads for generation"


def pool_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if line.startswith(("pyllama: thread pool", "pyllama: no thread pool"))]


def logged(path: Path) -> list[str]:
    return pool_lines(path.read_text())


@pytest.fixture
def text_file(tmp_path: Path) -> Path:
    path = tmp_path / "text.txt"
    path.write_text("The cat sat on the mat and the dog ran in the park. " * 20)
    return path


# ---------------------------------------------------------------- the native functions


def test_this_build_has_the_pool_functions_and_a_pool_can_be_made_and_freed() -> None:
    fns = pool_functions()  # raises ThreadPoolError, failing this test, when any is missing
    params = pool_params(2, CpuPlacement())
    pool = fns.new(ctypes.byref(params))
    assert pool
    fns.free(pool)


def test_a_function_the_library_lacks_is_a_typed_error_naming_it() -> None:
    with pytest.raises(ThreadPoolError, match=r"^llama_no_such_function is not exported by libllama"):
        _typed(shipped_library("llama"), "llama_no_such_function", [], None)


def test_pool_params_carry_the_placement() -> None:
    params = pool_params(3, CpuPlacement(cpus=(0, 2), prio=1, poll=0, strict=True), paused=True)
    assert [i for i in range(8) if params.cpumask[i]] == [0, 2]
    assert (params.n_threads, params.prio, params.poll, params.strict_cpu, params.paused) == (3, 1, 0, True, True)
    default = pool_params(2, CpuPlacement())
    assert not any(default.cpumask) and (default.poll, default.prio, default.strict_cpu) == (50, 0, False)


# ---------------------------------------------------------------- each command's contexts


def test_complete_runs_on_one_pool_of_its_threads(tiny_model: Path, tmp_path: Path) -> None:
    log = tmp_path / "llama.log"
    result = run_cli("complete", "-m", str(tiny_model), "-p", "Hello", "-n", "2", "-t", "2", "--log-file", str(log))
    assert result.exit_code == 0, result.stderr
    assert logged(log) == [ONE_POOL_2]


def test_other_batch_threads_make_a_batch_pool_and_a_paused_one(tiny_model: Path, tmp_path: Path) -> None:
    log = tmp_path / "llama.log"
    result = run_cli("complete", "-m", str(tiny_model), "-p", "Hello", "-n", "2", "-t", "2", "-tb", "1",
                     "--log-file", str(log))
    assert result.exit_code == 0, result.stderr
    assert logged(log) == [BATCH_POOL]


def test_other_batch_placement_alone_makes_two_pools(tiny_model: Path, tmp_path: Path) -> None:
    log = tmp_path / "llama.log"
    result = run_cli("complete", "-m", str(tiny_model), "-p", "Hello", "-n", "2", "-t", "2", "--poll-batch", "0",
                     "--log-file", str(log))
    assert result.exit_code == 0, result.stderr
    assert logged(log) == ["pyllama: thread pools attached: a batch pool of 2 threads and a paused pool of "
                           "2 threads for generation"]


def test_chat_runs_on_one_pool(tiny_model: Path, tmp_path: Path) -> None:
    log = tmp_path / "llama.log"
    result = run_cli("chat", "-m", str(tiny_model), "-t", "1", "-c", "512", "--log-file", str(log), stdin="/exit\n")
    assert result.exit_code == 0, result.stderr
    assert logged(log) == [ONE_POOL_1]


def test_perplexity_runs_on_one_pool(tiny_model: Path, text_file: Path, tmp_path: Path) -> None:
    log = tmp_path / "llama.log"
    result = run_cli("perplexity", "-m", str(tiny_model), "-f", str(text_file), "-c", "32", "--chunks", "2",
                     "-t", "2", "--log-file", str(log))
    assert result.exit_code == 0, result.stderr
    assert logged(log) == [ONE_POOL_2]


def test_imatrix_runs_on_one_pool(tiny_model: Path, text_file: Path, tmp_path: Path) -> None:
    log, out = tmp_path / "llama.log", tmp_path / "imatrix.gguf"
    result = run_cli("imatrix", "-m", str(tiny_model), "-f", str(text_file), "-c", "32", "--chunks", "2",
                     "-t", "2", "-o", str(out), "--log-file", str(log))
    assert result.exit_code == 0, result.stderr
    assert out.is_file()
    assert logged(log) == [ONE_POOL_2]


def test_embed_runs_on_one_pool(tiny_model: Path, tmp_path: Path) -> None:
    log = tmp_path / "llama.log"
    result = run_cli("embed", "-m", str(tiny_model), "-p", "hello there", "-t", "1", "--log-file", str(log))
    assert result.exit_code == 0, result.stderr
    # The tiny model names no pooling: its metadata says so, and the one context pools by mean.
    assert logged(log) == [ONE_POOL_1]
    result = run_cli("embed", "-m", str(tiny_model), "-p", "hello there", "-t", "1", "--pooling", "last",
                     "--log-file", str(log))
    assert result.exit_code == 0, result.stderr
    assert logged(log) == [ONE_POOL_1] * 2


def test_bench_makes_a_pool_per_test_with_that_tests_threads_and_placement(tiny_model: Path) -> None:
    result = run_cli("bench", "-m", str(tiny_model), "-t", "1,2", "-p", "8", "-n", "2", "-r", "1", "-C", "0x1",
                     "--poll", "0", "-o", "json", "-v")
    assert result.exit_code == 0, result.stderr
    assert pool_lines(result.stderr) == [ONE_POOL_1, ONE_POOL_1, ONE_POOL_2, ONE_POOL_2]
    rows = json.loads(result.stdout)
    assert [(r["n_threads"], r["cpu_mask"], r["cpu_strict"], r["poll"]) for r in rows] == [(1, "0x1", False, 0)] * 2 \
        + [(2, "0x1", False, 0)] * 2


def test_serve_engine_context_runs_on_its_pools(tiny_model: Path) -> None:
    from pyllama_cli.core.serving.scheduler import ParallelEngine

    eng = ParallelEngine(tiny_model, LoadSettings(n_ctx=256, n_threads=2, n_threads_batch=1), n_slots=2)
    eng._load()
    try:
        assert eng._ctx.threads.attached == 2 and eng._ctx.threads.missing is None
    finally:
        eng._unload()
        eng.model.close()


# ---------------------------------------------------------------- the flags


def test_masks_and_ranges_read_as_llama_cpp_reads_them() -> None:
    assert parse_cpu_mask("0x5") == [0, 2]
    assert parse_cpu_mask("F0") == [4, 5, 6, 7]
    assert parse_cpu_range("2-4") == [2, 3, 4]
    assert parse_cpu_range("-1") == [0, 1]
    assert parse_cpu_range("510-") == [510, 511]
    assert cpu_set("0x1", "3-4", "-C", "-Cr") == (0, 3, 4)
    with pytest.raises(UsageError, match="longer than 128 hex digits"):
        parse_cpu_mask("1" * 129)


@pytest.mark.parametrize(("flags", "error"), [
    (("-C", "0xZ1"), "Error: -C '0xZ1': 'Z' is not a hex digit"),
    (("-Cb", "0x"), "Error: -Cb '0x' has no hex digits"),
    (("-Cr", "5"), "Error: -Cr '5' is not a range"),
    (("-Cr", "3-1"), "Error: -Cr '3-1' ends before it starts"),
    (("-Crb", "0-512"), "Error: -Crb '0-512' is out of bounds"),
    (("--prio", "4"), "Error: --prio must be from -1 to 3 (got 4)"),
    (("--poll", "101"), "Error: --poll must be from 0 to 100 (got 101)"),
])
def test_a_bad_cpu_flag_is_one_error_line_naming_it(tiny_model: Path, flags: tuple[str, ...], error: str) -> None:
    result = run_cli("complete", "-m", str(tiny_model), "-p", "hi", "-n", "1", *flags)
    assert result.exit_code != 0
    assert result.first_stderr_line == error
    assert "Traceback" not in result.stderr


@pytest.mark.reference
@pytest.mark.skipif(_llama_bench() is None, reason="set LLAMA_CPP_BIN to a folder with llama-bench")
def test_bench_sweeps_the_pool_flags_as_llama_bench_does(tiny_model: Path) -> None:
    args = ["-m", str(tiny_model), "-t", "1", "-r", "1", "-p", "8", "-n", "0", "-C", "0x1,0x3", "--cpu-strict", "0,1",
            "--poll", "0,50", "--prio", "0", "-o", "json"]
    theirs = json.loads(subprocess.run([str(_llama_bench()), *args], check=True, capture_output=True,
                                       timeout=120).stdout)
    ours = json.loads(run_cli("bench", *args).stdout)
    keys = ("n_threads", "cpu_mask", "cpu_strict", "poll", "n_prompt")
    assert [[row[k] for k in keys] for row in ours] == [[row[k] for k in keys] for row in theirs]
    assert len(ours) == 8
