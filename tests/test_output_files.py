"""Every file pyllama writes goes through `core.paths.atomic_write`: whole or not at all, through a
symlink (the link stays a link), with a plain file's mode, and never over a FIFO, a device or a folder.

No test here opens a FIFO: pyllama must refuse one before it opens it (a writer with no reader blocks).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from pyllama_cli.core.paths import atomic_write, make_folders, output_target
from pyllama_cli.errors import InputError
from tests.fixtures.make_gguf import _COMMON_WORDS
from tests.helpers import run_cli, run_process

NOT_REGULAR_HINT = "Hint: name a new or regular file"


@contextmanager
def umask(mask: int) -> Iterator[None]:
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def is_fifo(path: Path) -> bool:
    return stat.S_ISFIFO(path.lstat().st_mode)


def linked(link: Path, target: Path) -> Path:
    """`link` -> `target`, with the target in another folder (so a temporary file next to the link is wrong)."""
    target.parent.mkdir(exist_ok=True)
    link.symlink_to(target)
    return link


def assert_still_a_link(link: Path, target: Path) -> None:
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.is_file() and not target.is_symlink()


def hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


# ---------------------------------------------------------------- the shared helper


def test_a_new_file_gets_the_umask_mode_and_a_replaced_file_keeps_its_mode(tmp_path: Path) -> None:
    new, private = tmp_path / "new.txt", tmp_path / "private.txt"
    private.write_text("old")
    private.chmod(0o600)
    with umask(0o022):
        for path in (new, private):
            with atomic_write(path) as temp:
                temp.write_text("new")
    assert (new.read_text(), mode(new)) == ("new", 0o644)
    assert (private.read_text(), mode(private)) == ("new", 0o600)
    with umask(0o077):
        with atomic_write(new) as temp:
            temp.write_text("again")
    assert mode(new) == 0o644  # the file it replaced was 0644


def test_a_name_of_the_longest_length_can_be_written(tmp_path: Path) -> None:
    # The temporary name adds a dot, 12 random characters and a suffix: it passed 255 bytes before.
    path = tmp_path / ("\u00e9" * 60 + "b" * 130 + ".json")  # 255 bytes, with two-byte characters
    assert len(path.name.encode()) == 255
    with atomic_write(path) as temp:
        assert len(temp.name.encode()) <= 255
        temp.write_text("{}")
    assert path.read_text() == "{}"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_a_symlink_is_written_through(tmp_path: Path) -> None:
    target = tmp_path / "real" / "data.txt"
    target.parent.mkdir()
    target.write_text("old")
    link = linked(tmp_path / "link.txt", target)
    with atomic_write(link) as temp:
        assert temp.parent == target.parent  # the rename stays inside the target's folder
        temp.write_text("new")
    assert_still_a_link(link, target)
    assert link.read_text() == "new"
    assert hidden(tmp_path) == [] and hidden(target.parent) == []


def test_a_failure_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "keep.txt"
    path.write_text("old")
    with pytest.raises(KeyboardInterrupt), atomic_write(path) as temp:
        temp.write_text("half")
        raise KeyboardInterrupt
    with pytest.raises(InputError) as caught, atomic_write(path, "the notes") as temp:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert caught.value.message == f"cannot write the notes {path}: No space left on device"
    assert caught.value.hint == "free some space, or choose a path on another disk"
    assert path.read_text() == "old"
    assert os.listdir(tmp_path) == ["keep.txt"]


def test_fifos_devices_and_folders_are_refused(tmp_path: Path) -> None:
    pipe = fifo(tmp_path / "pipe")
    link = linked(tmp_path / "link", pipe)
    for path in (pipe, link, tmp_path, Path("/dev/null")):
        with pytest.raises(InputError) as caught:
            output_target(path)
        assert (caught.value.message, caught.value.hint) == (f"{path} is not a regular file", NOT_REGULAR_HINT[6:])
    with pytest.raises(InputError), atomic_write(pipe):
        pytest.fail("the block must not run")
    assert is_fifo(pipe) and link.is_symlink()
    assert sorted(os.listdir(tmp_path)) == ["link", "pipe"]


def test_make_folders_names_the_file_in_the_way(tmp_path: Path) -> None:
    blocker = tmp_path / "data"
    blocker.write_text("a file, not a folder")
    path = blocker / "a" / "b" / "file.txt"
    with pytest.raises(InputError) as caught:
        make_folders(path.parent, path)
    assert caught.value.message == f"cannot write {path}: {blocker} is not a folder"
    make_folders(tmp_path / "x" / "y", tmp_path / "x" / "y" / "z")
    assert (tmp_path / "x" / "y").is_dir()


# ---------------------------------------------------------------- bench --plot


def bench_plot(model: Path, plot: Path):
    return run_cli("bench", "-m", str(model), "-t", "1", "-p", "8", "-n", "0", "-r", "1", "-o", "csv",
                   "--plot", str(plot))


def test_bench_plot_writes_through_a_symlink(tiny_model: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    target = tmp_path / "plots" / "speed.png"
    link = linked(tmp_path / "link.png", target)
    result = bench_plot(tiny_model, link)
    assert result.exit_code == 0, result.stderr
    assert_still_a_link(link, target)
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_plot_on_a_fifo_is_refused_before_any_test_runs(tiny_model: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    pipe = fifo(tmp_path / "ff.png")
    result = bench_plot(tiny_model, pipe)
    assert result.exit_code == 1
    assert result.stdout == ""  # not even the csv header: nothing ran
    assert result.stderr.splitlines() == [f"Error: {pipe} is not a regular file", NOT_REGULAR_HINT]
    assert is_fifo(pipe)


# ---------------------------------------------------------------- chat /save


def chat(model: Path, stdin: str):
    return run_cli("chat", "-m", str(model), "-t", "1", "-c", "256", "-n", "2", "--temp", "0", stdin=stdin)


def test_chat_save_follows_the_umask(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "chat.json"
    with umask(0o022):
        result = chat(tiny_model, f"hi\n/save {out}\n")
    assert result.exit_code == 0, result.stderr
    assert mode(out) == 0o644  # mkstemp's 0600 was the bug


def test_chat_save_writes_through_a_symlink_and_refuses_a_fifo(tiny_model: Path, tmp_path: Path) -> None:
    target = tmp_path / "notes" / "chat.md"
    link = linked(tmp_path / "chat.md", target)
    pipe = fifo(tmp_path / "pipe.json")
    result = chat(tiny_model, f"hi\n/save {link}\n/save {pipe}\n")
    assert_still_a_link(link, target)
    assert target.read_text().startswith("# Chat with tiny.gguf\n\n## User\n\nhi\n")
    assert f"Error: {pipe} is not a regular file\n{NOT_REGULAR_HINT}\n" in result.stderr
    assert is_fifo(pipe)


# ---------------------------------------------------------------- complete --prompt-cache


def test_prompt_cache_through_a_symlink_is_written_and_reused(tiny_model: Path, tmp_path: Path) -> None:
    target = tmp_path / "caches" / "prompt.cache"
    link = linked(tmp_path / "prompt.cache", target)  # dangling until the first run
    args = ("complete", "-m", str(tiny_model), "-t", "1", "-c", "256", "-n", "1", "-p", "the quick brown fox",
            "--prompt-cache", str(link), "--stats", "--json")
    assert run_cli(*args).exit_code == 0
    assert_still_a_link(link, target)
    assert target.read_bytes().startswith(b"pyllama-prompt-cache\n")
    again = run_cli(*args)
    assert '"reused_tokens": ' in again.stderr and '"reused_tokens": 0' not in again.stderr


def test_prompt_cache_on_a_fifo_is_refused_before_loading(tiny_model: Path, tmp_path: Path) -> None:
    # A real process with a time limit: reading the FIFO, were it not refused, would block forever.
    pipe = fifo(tmp_path / "cache.fifo")
    result = run_process("complete", "-m", str(tiny_model), "-p", "x", "-n", "1", "--prompt-cache", str(pipe),
                         timeout=60)
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [f"Error: {pipe} is not a regular file", NOT_REGULAR_HINT]
    assert is_fifo(pipe)


# ---------------------------------------------------------------- perplexity --kl-divergence-base


@pytest.fixture
def text(tmp_path: Path) -> Path:
    path = tmp_path / "text.txt"
    path.write_text(" ".join(_COMMON_WORDS[i * 7 % len(_COMMON_WORDS)] for i in range(400)) + "\n")
    return path


def save_base(model: Path, text: Path, base: Path):
    return run_cli("perplexity", "-m", str(model), "-t", "1", "-c", "128", "-fa", "off", "--chunks", "1",
                   "-f", str(text), "--kl-divergence-base", str(base))


def test_kld_base_writes_through_a_symlink(tiny_model: Path, text: Path, tmp_path: Path) -> None:
    target = tmp_path / "bases" / "base.kld"
    link = linked(tmp_path / "base.kld", target)
    with umask(0o022):
        result = save_base(tiny_model, text, link)
    assert result.exit_code == 0, result.stderr
    assert_still_a_link(link, target)
    assert target.read_bytes()[:8] == b"_logits_" and mode(target) == 0o644


def test_kld_base_on_a_fifo_is_refused_before_the_run(tiny_model: Path, text: Path, tmp_path: Path) -> None:
    pipe = fifo(tmp_path / "base.kld")
    result = save_base(tiny_model, text, pipe)
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.splitlines() == [f"Error: {pipe} is not a regular file", NOT_REGULAR_HINT]
    assert is_fifo(pipe)


# ---------------------------------------------------------------- FIFOs as inputs that are read at offsets


def test_a_fifo_as_model_or_kld_base_is_refused_instead_of_blocking(tiny_model: Path, tmp_path: Path) -> None:
    pipe = fifo(tmp_path / "m.gguf")
    model = run_process("info", "-m", str(pipe), timeout=30)  # opening it blocked until killed
    assert (model.exit_code, model.stderr.splitlines()) == (
        1, [f"Error: {pipe} is not a regular file, so not a GGUF model", "Hint: give the path of a .gguf file"])
    base = run_process("perplexity", "-m", str(tiny_model), "--kl-divergence", "--kl-divergence-base", str(pipe),
                       timeout=30)
    assert (base.exit_code, base.stderr.splitlines()[0]) == (
        1, f"Error: {pipe} is not a regular file, so not a KL-divergence base file")
    assert is_fifo(pipe)


def test_a_file_where_the_output_folder_should_be_is_named(tiny_model: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    quantize = run_cli("quantize", str(tiny_model), str(blocker / "x.gguf"), "Q8_0")
    assert (quantize.exit_code, quantize.first_stderr_line) == (
        1, f"Error: cannot write OUTPUT {blocker / 'x.gguf'}: {blocker} is not a folder")
    missing = run_cli("quantize", str(tiny_model), str(tmp_path / "no" / "x.gguf"), "Q8_0")
    assert (missing.exit_code, missing.first_stderr_line) == (
        1, f"Error: cannot write OUTPUT {tmp_path / 'no' / 'x.gguf'}: the folder {tmp_path / 'no'} does not exist")
    pytest.importorskip("matplotlib")
    plot = run_cli("bench", "-m", str(tiny_model), "-p", "8", "-n", "0", "--plot", str(blocker / "x.png"))
    assert (plot.exit_code, plot.first_stderr_line) == (1, f"Error: --plot {blocker / 'x.png'}: {blocker} is not a folder")
