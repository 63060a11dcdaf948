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


@pytest.mark.parametrize("with_model", [False, True])
def test_hf_file_without_a_repo_is_refused(tiny_model: Path, with_model: bool) -> None:
    # With -m it used to be ignored: the local file was shown as if -hff had picked it.
    model = ("-m", str(tiny_model)) if with_model else ()
    result = run_cli("info", *model, "-hff", "x.gguf")
    assert_clean_error(result, "Error: -hff/--hf-file needs -hf/--hf-repo to say which repo it is in")


def test_malformed_repo_id() -> None:
    result = run_cli("info", "-hf", "not-a-repo")
    assert_clean_error(result, "Error: invalid Hugging Face repo 'not-a-repo'")


def test_unknown_flag_is_a_usage_error_exit_2() -> None:
    result = run_cli("info", "--bogus")
    assert result.exit_code == 2
    assert result.stderr.splitlines() == ["Error: unknown option --bogus", "Hint: pyllama info --help lists the options"]


OPTIONS_HINT = "Hint: pyllama complete --help lists the options"


@pytest.mark.parametrize(("args", "lines"), [
    (("complete", "-f", "{tmp}"), ["Error: -f/--file: File '{tmp}' is a directory", OPTIONS_HINT]),
    (("complete", "--temp", "warm"), ["Error: --temp takes a number, not 'warm'",
                                      "Hint: --temp takes a number, at least 0.0"]),
    # Before: "'abc' is not a valid int range." and "-5 is not in the range x>=-1."
    (("complete", "-n", "abc"), ["Error: -n/--n-predict takes a whole number, not 'abc'",
                                 "Hint: -n/--n-predict takes a whole number, at least -1"]),
    (("complete", "--n-predict=-5"), ["Error: -n/--n-predict must be at least -1 (got -5)", OPTIONS_HINT]),
    (("nosuch",), ["Error: unknown command 'nosuch'", "Hint: pyllama --help lists the commands"]),
    (("sevre",), ["Error: unknown command 'sevre'", "Hint: did you mean `pyllama serve`?"]),
    # Before: "No such option: --bogus (Possible options: --verbose)", a suggestion that did not help.
    (("chat", "--bogus"), ["Error: unknown option --bogus", "Hint: pyllama chat --help lists the options"]),
    (("chat", "--verbos"), ["Error: unknown option --verbos", "Hint: did you mean --verbose?"]),
    (("complete", "-p"), ["Error: -p needs a value", OPTIONS_HINT]),
    (("completion", "show"), ["Error: missing the SHELL argument", "Hint: choose one of: bash, zsh, fish"]),
])
def test_flags_click_cannot_read_are_one_error_line(tmp_path: Path, args: tuple[str, ...], lines: list[str]) -> None:
    # They were boxed in a panel with a usage line: four lines or more, unlike every other error.
    result = run_cli(*(a.format(tmp=tmp_path) for a in args))
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [line.format(tmp=tmp_path) for line in lines]


@pytest.mark.parametrize("args", [(), ("completion",)])
def test_a_group_without_a_command_shows_its_help_and_exits_2(args: tuple[str, ...]) -> None:
    # click's NoArgsIsHelpError: its message is the help, shown on stdout; no error line follows it.
    result = run_cli(*args)
    assert (result.exit_code, result.stderr) == (2, "")
    assert result.stdout.splitlines()[0].split() == ["Usage:", "pyllama", *args, "[OPTIONS]", "COMMAND", "[ARGS]..."]


def test_a_context_bigger_than_the_machine_s_memory_is_refused_before_llama_cpp_tries(tiny_model: Path) -> None:
    # llama.cpp's buffers were granted by overcommit, then filled until the kernel killed the process (137).
    result = run_process("complete", "-m", str(tiny_model), "-p", "hi", "-n", "1", "-c", "2000000000", timeout=60)
    assert result.exit_code == 1 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines[0].startswith("Error: a context of 2000000000 tokens needs a 1907.3 GiB KV cache for tiny.gguf, "
                               "more than this machine's ")
    assert lines[1:] == ["Hint: lower -c/--ctx-size (the model was trained on 2048 tokens)"]


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


def test_the_exit_runs_atexit_handlers_and_flushes_output() -> None:
    proc = _main_in_a_process("import atexit; atexit.register(lambda: print('atexit ran', file=sys.stderr))",
                              "--version")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"pyllama {__version__}\n", "atexit ran\n")


def test_the_exit_code_survives_the_exit(tmp_path: Path) -> None:
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


# ---------------------------------------------------------------- streams, numbers and folders


def _process_with(args: list[str], **popen: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pyllama_cli", *args], capture_output="stdout" not in popen,
                          timeout=60, cwd=REPO_ROOT, **popen)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_full_disk_under_stdout_is_one_error_line(tiny_model: Path) -> None:
    with open("/dev/full", "w") as full:
        proc = _process_with(["info", "-m", str(tiny_model)], stdout=full, stderr=subprocess.PIPE, text=True)
    assert (proc.returncode, proc.stderr) == (1, "Error: writing the output failed: No space left on device\n"
                                                 "Hint: free some space, or send the output somewhere else\n")


@pytest.mark.parametrize(("fd", "args", "line"), [
    (1, ["tokenize", "-m", "{model}", "-p", "hello"], "Error: standard output is closed"),
    (0, ["tokenize", "-m", "{model}", "--stdin"], "Error: standard input is closed"),
])
def test_a_closed_standard_stream_is_one_error_line(fd: int, args: list[str], line: str, tiny_model: Path) -> None:
    # As `pyllama ... >&-` or `<&-` in a shell: the child starts with the descriptor closed.
    args = [a.format(model=tiny_model) for a in args]
    proc = subprocess.run([sys.executable, "-m", "pyllama_cli", *args], stdin=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, timeout=60, cwd=REPO_ROOT,
                          preexec_fn=lambda: os.close(fd))
    assert (proc.returncode, proc.stderr) == (
        1, f"{line}\nHint: redirect the stream (e.g. to /dev/null) instead of closing it\n")


def test_more_threads_than_ggml_allows_is_a_usage_error(tiny_model: Path) -> None:
    # ggml crashed creating 100000 threads.
    result = run_cli("complete", "-m", str(tiny_model), "-p", "x", "-n", "1", "-t", "100000")
    assert result.exit_code == 2
    assert result.first_stderr_line == "Error: -t/--threads must be from -1 to 512 (got 100000)"


@pytest.mark.parametrize(("args", "line", "limit"), [
    (("-c", "4294967300"), "Error: -c 4294967300 is too large", 2**31 - 1),
    (("-s", "4294967296"), "Error: -s 4294967296 is too large", 2**32 - 1),
    (("-n", "2147483648"), "Error: -n 2147483648 is too large", 2**31 - 1),
])
def test_numbers_that_would_wrap_in_llama_cpp_are_refused(args: tuple[str, ...], line: str, limit: int,
                                                          tiny_model: Path) -> None:
    # -c 4294967300 went into a 32-bit field as a 4-token context.
    result = run_cli("complete", "-m", str(tiny_model), "-p", "x", *args)
    assert_clean_error(result, line)
    assert f"Hint: llama.cpp takes at most {limit}" in result.stderr


@pytest.mark.parametrize("flag", ["--temp", "--top-p", "--min-p", "--repeat-penalty", "--mirostat-lr"])
def test_nan_sampling_values_are_refused(flag: str, tiny_model: Path) -> None:
    result = run_cli("complete", "-m", str(tiny_model), "-p", "x", "-n", "1", flag, "nan")
    assert_clean_error(result, f"Error: {flag} nan: not a finite number")


def test_quantize_thread_counts_past_ggml_s_limit_are_refused(tiny_model: Path, tmp_path: Path) -> None:
    result = run_cli("quantize", str(tiny_model), str(tmp_path / "out.gguf"), "Q8_0", "100000")
    assert_clean_error(result, "Error: thread count 100000 is out of range")
    assert "Hint: give 1 to 512 (ggml's limit), or 0 for every hardware thread" in result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value", ["4294967296", "-5"])
def test_quantize_int_overrides_outside_uint32_are_refused(value: str, tiny_model: Path, tmp_path: Path) -> None:
    # llama.cpp stores an int override as the uint32 of its absolute value: -5 would become 5.
    result = run_cli("quantize", "--override-kv", f"a=int:{value}", str(tiny_model), str(tmp_path / "o.gguf"), "Q8_0")
    assert_clean_error(result, f"Error: --override-kv 'a=int:{value}': an int is stored as an unsigned 32-bit value")
    assert list(tmp_path.iterdir()) == []


def test_a_log_file_in_a_missing_folder_is_refused(tiny_model: Path, tmp_path: Path) -> None:
    log = tmp_path / "no" / "x.log"
    result = run_cli("complete", "-m", str(tiny_model), "-p", "x", "-n", "1", "--log-file", str(log))
    assert_clean_error(result, f"Error: cannot open the log file {log}: No such file or directory")


def test_a_prompt_cache_in_a_missing_folder_is_refused_and_no_folder_is_made(tiny_model: Path,
                                                                             tmp_path: Path) -> None:
    cache = tmp_path / "no" / "deeper" / "c.bin"
    result = run_cli("complete", "-m", str(tiny_model), "-p", "x", "-n", "1", "--prompt-cache", str(cache))
    assert_clean_error(result, f"Error: cannot write the prompt cache {cache}: the folder {cache.parent} does not exist")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("args", "line"), [
    (("complete", "-p", "x", "--chat-template", "chatml"), "Error: --chat-template needs --chat"),
    (("perplexity", "-f", "README.md", "--chunks", "0"), "Error: --chunks 0 leaves nothing to score"),
])
def test_flags_that_would_be_ignored_are_refused(args: tuple[str, ...], line: str, tiny_model: Path) -> None:
    result = run_cli(*args[:1], "-m", str(tiny_model), *args[1:])
    assert_clean_error(result, line)


def test_an_imatrix_folder_is_named_as_a_folder(tiny_model: Path, tmp_path: Path) -> None:
    result = run_cli("quantize", "--imatrix", str(tmp_path), str(tiny_model), str(tmp_path / "o.gguf"), "IQ2_XS")
    assert_clean_error(result, f"Error: imatrix file {tmp_path} is a folder")


def test_bench_refuses_more_threads_than_ggml_allows(tiny_model: Path) -> None:
    result = run_cli("bench", "-m", str(tiny_model), "-t", "4,100000", "-p", "8", "-n", "0")
    assert_clean_error(result, "Error: -t: every value must be at most 512, got 4,100000")


def test_a_closed_stdin_is_no_error_when_nothing_needs_it(tiny_model: Path) -> None:
    # complete only looks for piped text after -p: a closed stdin is no input, not a failure.
    proc = subprocess.run([sys.executable, "-m", "pyllama_cli", "complete", "-m", str(tiny_model), "-p", "hi",
                           "-n", "2", "-s", "1"], capture_output=True, timeout=60, cwd=REPO_ROOT,
                          preexec_fn=lambda: os.close(0))
    assert (proc.returncode, proc.stderr) == (0, b"")
    assert len(proc.stdout) > 0


def test_an_error_raised_without_a_hint_still_gets_a_useful_one(tiny_model: Path) -> None:
    # Not "set PYLLAMA_DEBUG=1 for a traceback": there is no bug to trace in a usage error.
    result = run_cli("tokenize", "-m", str(tiny_model), "-p", "hi", "--ids", "--json")
    assert result.stderr == ("Error: --ids and --json are two output formats: pick one\n"
                             "Hint: pyllama tokenize --help lists the options\n")
