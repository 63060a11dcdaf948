"""`pyllama gguf-split`: llama-gguf-split's parts and merges, byte for byte, and one error line for bad input."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from pyllama_cli.core.gguf.reader import read_gguf
from tests.fixtures.make_gguf import TINY, write_llama_gguf
from tests.helpers import run_cli

N_TENSORS = 21  # TINY: embeddings, output norm and output, 9 per layer


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def tiny_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_llama_gguf(tmp_path_factory.mktemp("split") / "model.gguf", TINY)


@pytest.fixture()
def model(tiny_src: Path, tmp_path: Path) -> Path:
    return Path(shutil.copy(tiny_src, tmp_path / "model.gguf"))


def split(*args: str) -> list[Path]:
    result = run_cli("gguf-split", *args)
    assert result.exit_code == 0, result.stderr
    return [Path(line) for line in result.stdout.splitlines()]


def test_split_by_tensor_count_names_parts_and_keeps_metadata_in_the_first(model: Path, tmp_path: Path) -> None:
    parts = split("--split-max-tensors", "8", str(model), str(tmp_path / "out"))
    assert [p.name for p in parts] == [f"out-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    headers = [read_gguf(p) for p in parts]
    assert [len(h.tensors) for h in headers] == [8, 8, 5]
    assert [(h.get("split.no"), h.get("split.count"), h.get("split.tensors.count")) for h in headers] == [
        (0, 3, N_TENSORS), (1, 3, N_TENSORS), (2, 3, N_TENSORS)]
    original = read_gguf(model)
    assert headers[0].get("general.architecture") == "llama"
    assert list(headers[0].metadata)[:len(original.metadata)] == list(original.metadata)
    assert list(headers[0].metadata)[len(original.metadata):] == ["split.no", "split.tensors.count", "split.count"]
    assert list(headers[1].metadata) == ["split.no", "split.tensors.count", "split.count"]
    assert [t.name for h in headers for t in h.tensors] == [t.name for t in original.tensors]


def test_split_by_size_keeps_each_part_under_the_limit(model: Path, tmp_path: Path) -> None:
    parts = split("--split-max-size", "2M", str(model), str(tmp_path / "out"))
    assert len(parts) == 4
    for part in parts:
        h = read_gguf(part)
        assert sum(t.n_bytes for t in h.tensors) <= 2_000_000


def test_dry_run_prints_the_plan_and_writes_nothing(model: Path, tmp_path: Path) -> None:
    result = run_cli("gguf-split", "--split-max-tensors", "8", "--dry-run", str(model), str(tmp_path / "out"))
    assert result.exit_code == 0, result.stderr
    assert os.listdir(tmp_path) == ["model.gguf"]
    parts = split("--split-max-tensors", "8", str(model), str(tmp_path / "out"))
    # Every TINY tensor's size is a multiple of 32: no padding, so a part's size is its file's.
    assert result.stdout.splitlines() == ["n_split: 3"] + [
        f"split {i:05d}: n_tensors = {len(read_gguf(p).tensors)}, total_size = {p.stat().st_size // 10**6}M"
        for i, p in enumerate(parts, 1)]


def test_no_tensor_first_split_leaves_only_metadata_in_the_first_part(model: Path, tmp_path: Path) -> None:
    parts = split("--no-tensor-first-split", str(model), str(tmp_path / "out"))
    first, second = read_gguf(parts[0]), read_gguf(parts[1])
    assert (len(parts), len(first.tensors), len(second.tensors)) == (2, 0, N_TENSORS)
    assert first.get("general.architecture") == "llama" and "general.architecture" not in second.metadata


def test_merge_gives_back_the_file_that_was_split_byte_for_byte(model: Path, tmp_path: Path) -> None:
    parts = split("--split-max-tensors", "8", str(model), str(tmp_path / "a"))
    merged = tmp_path / "merged.gguf"
    assert split("--merge", str(parts[0]), str(merged)) == [merged]
    assert sha256(merged) == sha256(model)
    again = split("--split-max-tensors", "8", str(merged), str(tmp_path / "b"))
    assert [sha256(p) for p in again] == [sha256(p) for p in parts]


def _data(path: Path, header: object) -> bytes:
    return path.read_bytes()[header.data_offset:]  # type: ignore[attr-defined]


def test_the_first_part_loads_and_completes_as_the_whole_file(model: Path, tmp_path: Path) -> None:
    parts = split("--split-max-size", "2M", str(model), str(tmp_path / "out"))
    args = ("-p", "hello world", "-n", "8", "--temp", "0", "-s", "1")
    whole, first = run_cli("complete", "-m", str(model), *args), run_cli("complete", "-m", str(parts[0]), *args)
    assert whole.exit_code == first.exit_code == 0, first.stderr
    assert first.stdout == whole.stdout and whole.stdout.strip()


def test_quantize_reads_a_split_and_keeps_it_split(model: Path, tmp_path: Path) -> None:
    parts = split("--split-max-tensors", "8", str(model), str(tmp_path / "in"))
    result = run_cli("quantize", "--keep-split", str(parts[0]), str(tmp_path / "q.gguf"), "Q8_0", "1")
    assert result.exit_code == 0, result.stderr
    outs = [tmp_path / f"q-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert result.stdout.splitlines() == [str(p) for p in outs]
    assert [len(read_gguf(p).tensors) for p in outs] == [8, 8, 5]


# --- bad input: one error line each --------------------------------------------------------------


def _error(*args: str) -> str:
    result = run_cli("gguf-split", *args)
    assert result.exit_code != 0
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("Error: ") and len(lines) <= 2, result.stderr
    return lines[0]


def test_split_of_a_file_that_is_not_gguf(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("not a model\n")
    assert _error(str(text), str(tmp_path / "out")) == (
        f"Error: {text} is not a GGUF file (it does not start with the GGUF magic bytes)")
    assert os.listdir(tmp_path) == ["notes.txt"]


def test_merge_names_a_missing_part(model: Path, tmp_path: Path) -> None:
    parts = split("--split-max-tensors", "8", str(model), str(tmp_path / "out"))
    parts[1].unlink()
    assert _error("--merge", str(parts[0]), str(tmp_path / "m.gguf")) == f"Error: split part missing: {parts[1]}"
    assert not (tmp_path / "m.gguf").exists()


def test_merge_names_a_part_from_another_split(model: Path, tmp_path: Path) -> None:
    parts = split("--split-max-tensors", "8", str(model), str(tmp_path / "out"))
    other = split("--split-max-tensors", "7", str(model), str(tmp_path / "other"))
    shutil.copy(other[1], parts[1])
    assert _error("--merge", str(parts[0]), str(tmp_path / "m.gguf")) == (
        f"Error: split part {parts[1]} belongs to another split: tensor blk.0.ffn_gate.weight is also in an earlier part")
    assert not (tmp_path / "m.gguf").exists()


def test_merge_refuses_a_file_that_is_not_a_first_part(model: Path, tmp_path: Path) -> None:
    assert _error("--merge", str(model), str(tmp_path / "m.gguf")) == (
        f"Error: {model} is not part of a split model (it has no split.count)")


def test_merge_refuses_an_existing_output(model: Path, tmp_path: Path) -> None:
    parts = split(str(model), str(tmp_path / "out"))
    assert _error("--merge", str(parts[0]), str(model)) == f"Error: output file {model} already exists"


@pytest.mark.parametrize(("args", "line"), [
    (["--split", "--merge"], "Error: either --split or --merge can be given, not both"),
    (["--split-max-size", "1G", "--split-max-tensors", "3"],
     "Error: either --split-max-tensors or --split-max-size can be given, not both"),
    (["--split-max-size", "500K"], "Error: --split-max-size '500K': the units are M (megabytes) or G (gigabytes)"),
    (["--split-max-size", "1M"], "Error: one of the parts would hold no tensor"),
])
def test_flag_errors(model: Path, tmp_path: Path, args: list[str], line: str) -> None:
    assert _error(*args, str(model), str(tmp_path / "out")) == line
    assert os.listdir(tmp_path) == ["model.gguf"]


def test_split_into_a_missing_folder_writes_nothing(model: Path, tmp_path: Path) -> None:
    line = _error(str(model), str(tmp_path / "nope" / "out"))
    assert line == f"Error: cannot write split part {tmp_path}/nope/out-00001-of-00001.gguf: the folder " \
                   f"{tmp_path}/nope does not exist"


# --- llama.cpp's own tool (skipped unless LLAMA_CPP_BIN has llama-gguf-split) -------------------


def _tool(name: str) -> Path | None:
    folder = os.environ.get("LLAMA_CPP_BIN")
    tool = Path(folder) / name if folder else None
    return tool if tool is not None and tool.is_file() else None


@pytest.mark.reference
@pytest.mark.skipif(_tool("llama-gguf-split") is None, reason="set LLAMA_CPP_BIN to a folder with llama-gguf-split")
@pytest.mark.parametrize("flags", [["--split-max-size", "2M"], ["--split-max-tensors", "8"],
                                   ["--split-max-tensors", "5", "--no-tensor-first-split"]])
def test_parts_and_merge_byte_identical_to_llama_gguf_split(model: Path, tmp_path: Path, flags: list[str]) -> None:
    tool = str(_tool("llama-gguf-split"))
    subprocess.run([tool, *flags, str(model), str(tmp_path / "theirs")], check=True, capture_output=True)
    ours = split(*flags, str(model), str(tmp_path / "ours"))
    theirs = sorted(tmp_path.glob("theirs-*.gguf"))
    assert [p.name.replace("ours", "theirs") for p in ours] == [p.name for p in theirs]
    assert [sha256(p) for p in ours] == [sha256(p) for p in theirs]
    subprocess.run([tool, "--merge", str(theirs[0]), str(tmp_path / "theirs.gguf")], check=True, capture_output=True)
    split("--merge", str(ours[0]), str(tmp_path / "ours.gguf"))
    assert sha256(tmp_path / "ours.gguf") == sha256(model)
    # llama-gguf-split's merge is the same file plus the split's three keys (split.count 0).
    mine, its = read_gguf(tmp_path / "ours.gguf"), read_gguf(tmp_path / "theirs.gguf")
    assert {k: v for k, v in its.metadata.items() if not k.startswith("split.")} == mine.metadata
    assert (its.get("split.count"), its.get("split.no")) == (0, 0)
    assert _data(tmp_path / "theirs.gguf", its) == _data(model, mine)


@pytest.mark.reference
@pytest.mark.skipif(_tool("llama-quantize") is None, reason="set LLAMA_CPP_BIN to a folder with llama-quantize")
def test_keep_split_byte_identical_to_llama_quantize(model: Path, tmp_path: Path) -> None:
    parts = split("--split-max-tensors", "8", str(model), str(tmp_path / "in"))
    subprocess.run([str(_tool("llama-quantize")), "--keep-split", str(parts[0]), str(tmp_path / "theirs.gguf"),
                    "Q4_K_M", "2"], check=True, capture_output=True)
    assert run_cli("quantize", "--keep-split", str(parts[0]), str(tmp_path / "ours.gguf"), "Q4_K_M", "2").exit_code == 0
    for i in (1, 2, 3):
        assert sha256(tmp_path / f"ours-0000{i}-of-00003.gguf") == sha256(tmp_path / f"theirs-0000{i}-of-00003.gguf")
