"""`pyllama imatrix`: llama-imatrix's matrix (same bytes), combining, statistics, and one-line errors."""

from __future__ import annotations

import hashlib
import os
import random
import re
import shutil
import struct
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from pyllama_cli.core.gguf.reader import read_gguf
from tests.fixtures.make_gguf import N_SPECIAL_TOKENS, TINY, english_pieces, write_llama_gguf
from tests.helpers import run_cli

# A 32k vocabulary on TINY's layers: rows of 256, so IQ2_XS and Q4_K_M apply.
VOCAB_32K = replace(TINY, n_vocab_pieces=32000 - N_SPECIAL_TOKENS, ftype="F16", name="pyllama-imatrix-32k")
N_CTX, N_CHUNKS = 128, 8
LAYER_WEIGHTS = ("attn_k", "attn_output", "attn_q", "attn_v", "ffn_down", "ffn_gate", "ffn_up")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("imatrix")
    write_llama_gguf(folder / "tiny.gguf", TINY)
    words = [w.lstrip("▁") for w in english_pieces() if w.lstrip("▁").isalpha()]
    rng = random.Random(7)
    (folder / "corpus.txt").write_text(" ".join(rng.choice(words) for _ in range(3000)) + "\n")
    return folder


@pytest.fixture()
def work(shared: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The tiny model and corpus in this test's own folder, which is also the current one (the matrix stores
    the -f path as written, so relative names keep files comparable)."""
    for name in ("tiny.gguf", "corpus.txt"):
        shutil.copy(shared / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def imatrix(*args: str) -> str:
    result = run_cli("imatrix", *args)
    assert result.exit_code == 0, result.stderr
    return result.stdout


def collect(out: str = "imatrix.gguf", *args: str, model: str = "tiny.gguf") -> Path:
    assert imatrix("-m", model, "-f", "corpus.txt", "--chunks", str(N_CHUNKS), "-c", str(N_CTX), "-o", out,
                   *args) == f"{out}\n"
    return Path(out)


_CACHE: dict[tuple[str, ...], bytes] = {}  # flags -> the bytes of the first matrix made with them


def cached(out: str = "imatrix.gguf", *args: str) -> Path:
    """`collect(out, *args)`, run once per session: later calls write the first run's bytes."""
    if args not in _CACHE:
        _CACHE[args] = collect(out, *args).read_bytes()
    path = Path(out)
    path.write_bytes(_CACHE[args])
    return path


def tensors(path: Path) -> dict[str, np.ndarray]:
    header = read_gguf(path)
    data = path.read_bytes()
    return {t.name: np.frombuffer(data, np.float32, t.n_elements, header.data_offset + t.offset).reshape(
        t.shape[::-1]) for t in header.tensors}


# --- the matrix ----------------------------------------------------------------------------------


def test_matrix_file_holds_every_layer_weight_and_llama_imatrix_metadata(work: Path) -> None:
    path = cached()
    header = read_gguf(path)
    assert header.metadata == {"general.type": "imatrix", "imatrix.datasets": ["corpus.txt"],
                               "imatrix.chunk_count": N_CHUNKS, "imatrix.chunk_size": N_CTX}
    names = [f"blk.{i}.{w}.weight" for i in range(TINY.n_layer) for w in LAYER_WEIGHTS]
    assert [t.name for t in header.tensors] == [f"{n}.{s}" for n in sorted(names) for s in ("in_sum2", "counts")]
    values = tensors(path)
    assert values["blk.0.ffn_down.weight.in_sum2"].shape == (TINY.n_ff,)
    assert values["blk.0.attn_q.weight.in_sum2"].shape == (TINY.n_embd,)
    assert all(values[f"{n}.counts"].tolist() == [N_CHUNKS * N_CTX] for n in names)
    assert all((values[f"{n}.in_sum2"] > 0).all() for n in names)


def test_weights_fed_the_same_input_get_the_same_sums(work: Path) -> None:
    values = tensors(cached())
    for layer in range(TINY.n_layer):
        q = values[f"blk.{layer}.attn_q.weight.in_sum2"]
        assert np.array_equal(q, values[f"blk.{layer}.attn_k.weight.in_sum2"])
        assert np.array_equal(q, values[f"blk.{layer}.attn_v.weight.in_sum2"])
        assert np.array_equal(values[f"blk.{layer}.ffn_gate.weight.in_sum2"],
                              values[f"blk.{layer}.ffn_up.weight.in_sum2"])
        assert not np.array_equal(q, values[f"blk.{layer}.ffn_gate.weight.in_sum2"])


def test_process_output_adds_output_weight_and_no_ppl_changes_nothing_else(work: Path) -> None:
    plain = tensors(cached("plain.gguf"))
    with_output = tensors(collect("out.gguf", "--process-output", "--no-ppl"))
    assert set(with_output) - set(plain) == {"output.weight.in_sum2", "output.weight.counts"}
    assert all(np.array_equal(plain[k], with_output[k]) for k in plain)


def test_collection_is_reproducible_byte_for_byte(work: Path) -> None:
    assert sha256(cached("a.gguf")) == sha256(collect("b.gguf", "-t", "1"))


def test_ppl_is_streamed_per_chunk_on_stderr(work: Path) -> None:
    result = run_cli("imatrix", "-m", "tiny.gguf", "-f", "corpus.txt", "--chunks", "3", "-c", "128", "-b", "128")
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "imatrix.gguf\n"
    ppl_line = next(line for line in result.stderr.splitlines() if line.startswith("[1]"))
    assert [part.split("]")[0] for part in ppl_line.rstrip(",").split(",")] == ["[1", "[2", "[3"]
    assert "Final estimate: PPL = " in result.stderr


def test_save_frequency_keeps_numbered_copies(work: Path) -> None:
    collect("imatrix.gguf", "--save-frequency", "4", "-b", "256")
    assert read_gguf(Path("imatrix.gguf.at_4")).get("imatrix.chunk_count") == 4
    assert read_gguf(Path("imatrix.gguf.at_8")).get("imatrix.chunk_count") == 8


def test_chunk_skips_the_first_chunks(work: Path) -> None:
    skipped = tensors(cached("s.gguf", "--chunk", "1"))
    assert not np.array_equal(skipped["blk.0.attn_q.weight.in_sum2"], tensors(cached())["blk.0.attn_q.weight.in_sum2"])


# --- combining and formats -----------------------------------------------------------------------


def test_in_files_combine_sums_counts_and_datasets(work: Path) -> None:
    a, b = cached("a.gguf"), cached("b.gguf", "--chunk", "1")
    assert imatrix("--in-file", "a.gguf", "--in-file", "b.gguf", "-c", str(N_CTX), "-o", "ab.gguf") == "ab.gguf\n"
    ta, tb, tab = tensors(a), tensors(b), tensors(Path("ab.gguf"))
    for name in ta:
        assert np.array_equal(tab[name], ta[name] + tb[name]), name
    assert read_gguf(Path("ab.gguf")).metadata == {
        "general.type": "imatrix", "imatrix.datasets": ["corpus.txt", "corpus.txt"],
        "imatrix.chunk_count": 2 * N_CHUNKS, "imatrix.chunk_size": N_CTX}


def test_legacy_dat_format_is_read_back_as_the_same_matrix(work: Path) -> None:
    cached()
    assert imatrix("--in-file", "imatrix.gguf", "-o", "old.dat", "--output-format", "dat") == "old.dat\n"
    data = Path("old.dat").read_bytes()
    (n_entries,) = struct.unpack_from("<i", data)
    assert n_entries == TINY.n_layer * len(LAYER_WEIGHTS)
    imatrix("--in-file", "old.dat", "-o", "back.gguf")
    original, back = tensors(Path("imatrix.gguf")), tensors(Path("back.gguf"))
    for name in original:
        assert np.allclose(back[name], original[name], rtol=1e-6), name
    assert data.endswith(struct.pack("<i", len(b"corpus.txt")) + b"corpus.txt")


def test_show_statistics_prints_a_row_per_weight_and_a_row_per_layer(work: Path) -> None:
    cached()
    lines = imatrix("--in-file", "imatrix.gguf", "--show-statistics").splitlines()
    n = TINY.n_layer * len(LAYER_WEIGHTS)
    assert lines[:3] == ["", f"Computing statistics for imatrix.gguf ({n} tensors)", ""]
    assert lines[3].split("\t")[:3] == [" Layer", "       Tensor", "          Σ(Act²)"]
    rows = [line.split("\t") for line in lines[5:5 + n]]
    assert [r[1].strip() for r in rows] == sorted(w for w in LAYER_WEIGHTS for _ in range(TINY.n_layer))
    values = tensors(Path("imatrix.gguf"))
    q = values["blk.0.attn_q.weight.in_sum2"] / values["blk.0.attn_q.weight.counts"]
    row = next(r for r in rows if r[0].strip() == "0" and r[1].strip() == "attn_q")
    assert float(row[2]) == pytest.approx(float(q.sum(dtype=np.float64)), abs=0.01)
    assert int(row[8]) == TINY.n_embd
    assert lines[5 + n + 1] == f"Computing weighted average statistics per layer ({TINY.n_layer} layers)"
    assert [line.split("\t")[0].strip() for line in lines[5 + n + 5:-1]] == ["0", "1"]


# --- bad input: one error line each --------------------------------------------------------------


def _error(*args: str) -> str:
    result = run_cli("imatrix", *args)
    assert result.exit_code != 0 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert lines[-2 if lines[-1].startswith("Hint:") else -1].startswith("Error: "), result.stderr
    return next(line for line in lines if line.startswith("Error: "))


def test_text_shorter_than_two_chunks(work: Path) -> None:
    Path("short.txt").write_text("hello world, a short text\n")
    assert _error("-m", "tiny.gguf", "-f", "short.txt", "-c", "128") == (
        "Error: the text is 10 tokens long; imatrix with a context of 128 needs at least 256 tokens")
    assert not Path("imatrix.gguf").exists()


def test_output_in_a_missing_folder(work: Path) -> None:
    assert _error("-m", "tiny.gguf", "-f", "corpus.txt", "-o", "nope/imatrix.gguf") == (
        "Error: cannot write imatrix nope/imatrix.gguf: the folder nope does not exist")


def test_nothing_to_do_and_statistics_of_two_files(work: Path) -> None:
    assert _error("-m", "tiny.gguf") == "Error: no text (-f) and no matrices (--in-file) to combine"
    assert _error("--in-file", "a", "--in-file", "b", "--show-statistics") == (
        "Error: --show-statistics needs exactly one --in-file matrix")


def test_in_file_that_is_not_a_matrix(work: Path) -> None:
    Path("junk.dat").write_bytes(b"\0" * 16)
    assert _error("--in-file", "junk.dat") == "Error: junk.dat is not a valid imatrix file"


def test_quantize_refuses_a_matrix_made_for_another_model(work: Path) -> None:
    wide = replace(TINY, n_embd=512, n_head=8, n_head_kv=4, name="pyllama-other")
    write_llama_gguf(work / "other.gguf", wide)
    collect("other.gguf.imatrix", model="other.gguf")
    result = run_cli("quantize", "--imatrix", "other.gguf.imatrix", "tiny.gguf", "q.gguf", "Q4_K_M")
    assert result.exit_code == 1
    assert result.stderr.splitlines()[0] == ("Error: the imatrix does not fit this model: imatrix size 512 is "
                                             "different from tensor size 256 for blk.0.attn_k.weight")
    assert not Path("q.gguf").exists()


# --- llama.cpp's own tool (skipped unless LLAMA_CPP_BIN has llama-imatrix) -----------------------


def _tool(name: str) -> Path | None:
    folder = os.environ.get("LLAMA_CPP_BIN")
    tool = Path(folder) / name if folder else None
    return tool if tool is not None and tool.is_file() else None


@pytest.fixture(scope="module")
def model_32k(shared: Path) -> Path:
    return write_llama_gguf(shared / "vocab32k.gguf", VOCAB_32K)


def llama_imatrix(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(_tool("llama-imatrix")), *args], check=True, capture_output=True, text=True,
                          timeout=600)


def their_statistics(n_lines: int) -> list[str]:
    """llama-imatrix's --show-statistics table, without its log's time prefixes.

    llama-imatrix prints it through llama.cpp's asynchronous log and returns from main at once, so
    most runs lose part or all of it (the log thread is stopped first): run it until a whole table shows.
    """
    prefix = re.compile(r"^\d+\.\d+\.\d+\.\d+ [IWE] ")
    for _ in range(100):
        run = llama_imatrix("-m", "m.gguf", "--in-file", "theirs/imatrix.gguf", "--show-statistics")
        lines = [prefix.sub("", line) for line in (run.stdout + run.stderr).splitlines()]
        if len(lines) >= n_lines:
            return lines
    pytest.fail("llama-imatrix never printed its whole table")


@pytest.mark.usefixtures("work")
@pytest.mark.reference
@pytest.mark.skipif(_tool("llama-imatrix") is None, reason="set LLAMA_CPP_BIN to a folder with llama-imatrix")
def test_matrix_statistics_and_quants_identical_to_llama_imatrix(model_32k: Path) -> None:
    shutil.copy(model_32k, "m.gguf")
    flags = ["-f", "corpus.txt", "--chunks", str(N_CHUNKS), "-c", str(N_CTX)]
    os.mkdir("ours")
    os.mkdir("theirs")
    theirs_run = llama_imatrix("-m", "m.gguf", *flags, "-o", "theirs/imatrix.gguf")
    ours_run = run_cli("imatrix", "-m", "m.gguf", *flags, "-o", "ours/imatrix.gguf")
    assert ours_run.exit_code == 0, ours_run.stderr
    assert sha256(Path("ours/imatrix.gguf")) == sha256(Path("theirs/imatrix.gguf"))
    # The same PPL per chunk, to the 4 printed decimals.
    chunk_ppl = re.compile(r"\[\d+\]\d+\.\d{4},")
    assert chunk_ppl.findall(ours_run.stderr) == chunk_ppl.findall(theirs_run.stdout + theirs_run.stderr)
    assert len(chunk_ppl.findall(ours_run.stderr)) == N_CHUNKS
    # --show-statistics, line for line.
    ours = imatrix("--in-file", "theirs/imatrix.gguf", "--show-statistics").splitlines()
    assert their_statistics(len(ours)) == ours
    # --in-file a --in-file b: the same combined bytes.
    llama_imatrix("-m", "m.gguf", *flags, "--chunk", "1", "-o", "theirs/b.gguf")
    llama_imatrix("-m", "m.gguf", "--in-file", "theirs/imatrix.gguf", "--in-file", "theirs/b.gguf", "-c", str(N_CTX),
                  "-o", "theirs/ab.gguf")
    imatrix("--in-file", "theirs/imatrix.gguf", "--in-file", "theirs/b.gguf", "-c", str(N_CTX), "-o", "ours/ab.gguf")
    assert sha256(Path("ours/ab.gguf")) == sha256(Path("theirs/ab.gguf"))
    # Quantizing with either matrix gives the same model (the matrix's path is stored: run from each folder).
    for qtype in ("IQ2_XS", "Q4_K_M"):
        digests = []
        for folder in ("ours", "theirs"):
            os.chdir(folder)
            result = run_cli("quantize", "--imatrix", "imatrix.gguf", "../m.gguf", f"q-{qtype}.gguf", qtype, "2")
            assert result.exit_code == 0, result.stderr
            digests.append(sha256(Path(f"q-{qtype}.gguf")))
            os.chdir("..")
        assert digests[0] == digests[1], qtype


def test_ctrl_c_saves_the_chunks_done_and_exits_130(work: Path) -> None:
    import signal
    import sys
    import time

    from tests.helpers import REPO_ROOT, default_sigint

    corpus = Path("corpus.txt").read_text() * 4
    Path("long.txt").write_text(corpus)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pyllama_cli", "imatrix", "-m", str(work / "tiny.gguf"), "-f", str(work / "long.txt"),
         "-c", "64", "-b", "64", "-o", str(work / "imatrix.gguf")],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=default_sigint)
    seen, deadline = b"", time.monotonic() + 60
    while b"[2]" not in seen and time.monotonic() < deadline:
        seen += os.read(proc.stderr.fileno(), 256)  # type: ignore[union-attr]
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    lines = (seen + err).decode().strip().splitlines()
    assert proc.returncode == 130, lines
    chunks = read_gguf(work / "imatrix.gguf").get("imatrix.chunk_count")
    assert lines[-1] == f"imatrix interrupted; the {chunks} chunks collected so far are in {work}/imatrix.gguf"
    assert chunks >= 2
    assert tensors(work / "imatrix.gguf")["blk.0.attn_q.weight.counts"].tolist() == [64 * chunks]
    assert out == b"" and sorted(os.listdir(work)) == ["corpus.txt", "imatrix.gguf", "long.txt", "tiny.gguf"]
