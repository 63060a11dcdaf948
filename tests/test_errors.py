"""Bad input ends in one `Error:` line with a hint and exit code 1, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import gguf
import pytest

from pyllama_cli import __version__
from tests.helpers import REPO_ROOT, run_cli, run_process


def assert_clean_error(result, first_line: str, code: int = 1) -> None:
    assert result.exit_code == code, (result.stdout, result.stderr)
    assert result.first_stderr_line == first_line
    assert "Traceback" not in result.stderr + result.stdout
    assert result.stdout == ""


def test_missing_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.gguf"
    result = run_cli("info", "-m", str(missing))
    assert_clean_error(result, f"Error: model file not found: {missing}")
    assert "Hint: check the path" in result.stderr


def test_directory(tmp_path: Path) -> None:
    result = run_cli("info", "-m", str(tmp_path))
    assert_clean_error(result, f"Error: {tmp_path} is a directory, not a GGUF file")


def test_not_a_gguf_file(tmp_path: Path) -> None:
    path = tmp_path / "notes.gguf"
    path.write_text("this is not a model\n")
    result = run_cli("info", "-m", str(path))
    assert_clean_error(result, f"Error: {path} is not a GGUF file (it does not start with the GGUF magic bytes)")


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    result = run_cli("info", "-m", str(path))
    assert_clean_error(result, f"Error: {path} is not a GGUF file (it does not start with the GGUF magic bytes)")


def test_header_truncated(tiny_model: Path, tmp_path: Path) -> None:
    path = tmp_path / "cut-header.gguf"
    path.write_bytes(tiny_model.read_bytes()[:100])
    result = run_cli("info", "-m", str(path))
    assert_clean_error(result, f"Error: {path} is not a valid GGUF file: header ends early at byte 100")


def test_tensor_data_truncated(tiny_model: Path, tmp_path: Path) -> None:
    reader = gguf.GGUFReader(tiny_model)
    first = min(reader.tensors, key=lambda t: t.data_offset)
    keep = first.data_offset + 10  # ten bytes of the first tensor's data survive
    path = tmp_path / "cut-data.gguf"
    path.write_bytes(tiny_model.read_bytes()[:keep])
    missing = first.n_bytes - 10
    result = run_cli("info", "-m", str(path))
    assert_clean_error(
        result, f"Error: {path} is truncated: tensor '{first.name}' needs {missing} bytes past the end of the file"
    )
    assert "Hint: the download or conversion did not finish" in result.stderr


def test_no_model_lists_a_first_choice() -> None:
    result = run_cli("info")
    assert_clean_error(result, "Error: no model given: use -m FILE.gguf or -hf user/repo[:quant]")
    assert "-hf ggml-org/gemma-3-1b-it-GGUF" in result.stderr


def test_both_m_and_hf_is_a_usage_error(tiny_model: Path) -> None:
    result = run_cli("info", "-m", str(tiny_model), "-hf", "org/repo")
    assert_clean_error(result, "Error: give either -m/--model or -hf/--hf-repo, not both")


def test_malformed_repo_id() -> None:
    result = run_cli("info", "-hf", "not-a-repo")
    assert_clean_error(result, "Error: invalid Hugging Face repo 'not-a-repo'")


def test_unknown_flag_is_a_usage_error_exit_2() -> None:
    result = run_cli("info", "--bogus")
    assert result.exit_code == 2
    assert "No such option" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("case", ["missing", "truncated"])
def test_real_process_exit_code_and_no_traceback(case: str, tiny_model: Path, tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    if case == "truncated":
        path.write_bytes(tiny_model.read_bytes()[:100])
    result = run_process("info", "-m", str(path))
    expected = (f"Error: model file not found: {path}" if case == "missing"
                else f"Error: {path} is not a valid GGUF file: header ends early at byte 100")
    assert_clean_error(result, expected)


def test_debug_env_shows_the_traceback(tmp_path: Path) -> None:
    result = run_process("info", "-m", str(tmp_path / "x.gguf"), env={"PYLLAMA_DEBUG": "1"})
    assert result.exit_code == 1
    assert "Traceback" in result.stderr
    assert "ModelNotFound" in result.stderr


def _main_in_a_process(setup: str, *args: str) -> subprocess.CompletedProcess:
    """`pyllama ARGS` through the console entry point, after `setup` ran in the same interpreter."""
    code = f"import sys\n{setup}\nfrom pyllama_cli.cli import main\nsys.argv = ['pyllama', *{list(args)!r}]\nmain()\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)


def test_the_quick_exit_still_runs_atexit_handlers_and_flushes_output() -> None:
    proc = _main_in_a_process("import atexit; atexit.register(lambda: print('atexit ran', file=sys.stderr))",
                              "--version")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"pyllama {__version__}\n", "atexit ran\n")


def test_the_exit_code_survives_the_quick_exit(tmp_path: Path) -> None:
    proc = _main_in_a_process("", "info", "-m", str(tmp_path / "none.gguf"))
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"Error: model file not found: {tmp_path / 'none.gguf'}\n")


def test_exit_waits_for_a_thread_still_working(tmp_path: Path) -> None:
    marker = tmp_path / "written-by-the-thread"
    setup = ("import threading, time, pathlib\n"
             f"threading.Thread(target=lambda: (time.sleep(0.5), pathlib.Path({str(marker)!r}).write_text('done'))"
             ").start()")
    proc = _main_in_a_process(setup, "--version")
    assert proc.returncode == 0
    assert marker.read_text() == "done"


def test_version_flag_prints_the_version_without_a_command() -> None:
    result = run_cli("--version")
    assert (result.exit_code, result.stdout) == (0, f"pyllama {__version__}\n")


def test_only_a_closed_stdout_counts_as_the_reader_leaving(monkeypatch: pytest.MonkeyPatch) -> None:
    # A BrokenPipeError from another pipe or socket is a real error, not `| head` going away.
    from pyllama_cli.cli import _stdout_reader_gone

    read_end, write_end = os.pipe()
    with os.fdopen(write_end, "w") as pipe_out:
        monkeypatch.setattr(sys, "stdout", pipe_out)
        assert not _stdout_reader_gone()
        os.close(read_end)
        assert _stdout_reader_gone()
        monkeypatch.undo()
