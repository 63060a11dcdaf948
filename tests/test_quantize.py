"""`pyllama quantize`: llama-quantize's arguments and output bytes, and files that are never left half-written."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import stat
import struct
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from pyllama_cli.errors import UsageError
from tests.fixtures.make_gguf import TINY, write_llama_gguf, write_quantized, write_split_gguf
from tests.helpers import REPO_ROOT, default_sigint, run_cli

# The types whose bytes must match llama-quantize's.
IDENTICAL_TYPES = ["Q8_0", "Q4_0", "Q4_K_M", "Q6_K", "F16"]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def f32_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_llama_gguf(tmp_path_factory.mktemp("quant") / "model-F32.gguf", TINY)


@pytest.fixture()
def src(f32_model: Path, tmp_path: Path) -> Path:
    """A private copy of the F32 model, so each test owns its folder."""
    return Path(shutil.copy(f32_model, tmp_path / "model-F32.gguf"))


def greedy_tokens(path: Path, n: int = 4) -> list[int]:
    from pyllama_cli.core.model.native import Batch, Context, Model
    from pyllama_cli.core.model.settings import LoadSettings

    settings = LoadSettings(n_ctx=64, n_threads=1, n_batch=64, n_ubatch=64)
    with Model.load(path, settings) as model, Context(model, settings) as ctx, Batch(64) as batch:
        tokens = [int(t) for t in model.tokenize(b"hello world")]
        out: list[int] = []
        batch.fill(tokens, 0)
        for pos in range(len(tokens), len(tokens) + n):
            ctx.decode(batch)
            logits = ctx.logits(-1)
            assert np.isfinite(logits).all()
            out.append(int(np.argmax(logits)))
            batch.fill([out[-1]], pos)
    return out


# --- output bytes, loading, info -------------------------------------------------------------


@pytest.mark.parametrize("qtype", IDENTICAL_TYPES)
def test_output_matches_llama_model_quantize_loads_and_generates(src: Path, tmp_path: Path, qtype: str) -> None:
    result = run_cli("quantize", str(src), qtype.lower(), "1")
    out = tmp_path / f"model-{qtype}.gguf"
    assert result.exit_code == 0, result.stderr
    assert result.stdout == f"{out}\n"
    # llama-quantize passes llama_model_quantize's default parameters with the type; so must we.
    reference = write_quantized(src, tmp_path / "reference.gguf", qtype)
    assert sha256(out) == sha256(reference)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == sorted(
        ["model-F32.gguf", f"model-{qtype}.gguf", "reference.gguf"])
    tokens = greedy_tokens(out)
    assert len(tokens) == 4 and all(0 <= t < TINY.n_vocab for t in tokens)
    info = run_cli("info", "-m", str(out), "--json")
    assert json.loads(info.stdout)["quantization"] == qtype


def test_summary_names_sizes_ratio_and_time(src: Path, tmp_path: Path) -> None:
    result = run_cli("quantize", str(src), str(tmp_path / "small.gguf"), "Q8_0")
    assert result.exit_code == 0
    line = result.stderr.strip()
    assert line.startswith("model-F32.gguf (6.53 MiB) -> small.gguf (Q8_0, 1.75 MiB): 3.72x smaller in ")
    assert line.endswith(" s")


def _quantize_in_child(src: Path, out: Path, then: str) -> list[str]:
    """Run `quantize SRC OUT Q8_0` in a fresh interpreter, then the code `then`; return its stdout lines."""
    code = (
        "import sys\n"
        "from pyllama_cli.cli import run\n"
        f"try:\n    run(['quantize', {str(src)!r}, {str(out)!r}, 'Q8_0'])\n"
        "except SystemExit as e:\n    assert e.code in (0, None), e.code\n"
        + then
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert out.is_file()
    return proc.stdout.splitlines()


def test_quantize_loads_only_what_it_needs(src: Path, tmp_path: Path) -> None:
    # Start-up time counts against a job that takes a second: quantize must not import numpy, rich
    # (off a terminal) or llama-cpp-python's high-level API, and the bindings it loads must still
    # serve a later, full `import llama_cpp`.
    lines = _quantize_in_child(src, tmp_path / "q.gguf", (
        "print(sorted(m for m in ('numpy', 'rich', 'jinja2', 'llama_cpp', 'llama_cpp.llama') if m in sys.modules))\n"
        "bindings = sys.modules['llama_cpp.llama_cpp']\n"
        "import llama_cpp\n"
        "print(llama_cpp.llama_cpp is bindings, callable(llama_cpp.Llama))\n"
    ))
    assert lines[-2:] == ["[]", "True True"]


def test_quantize_loads_no_load_flags_and_no_model_runtime(src: Path, tmp_path: Path) -> None:
    # quantize has no load flags and loads no model: the flags' modules (devices, CPU placement,
    # adapters, KV cache, --fit), LoadSettings and Model/Context's cost every start without them.
    lines = _quantize_in_child(src, tmp_path / "q.gguf", (
        "print(sorted(m for m in sys.modules if m.startswith(('pyllama_cli.options.hardware', "
        "'pyllama_cli.options.adapters', 'pyllama_cli.options.kv_cache', 'pyllama_cli.options.context', "
        "'pyllama_cli.core.model.native', 'pyllama_cli.core.model.sizing', 'pyllama_cli.core.model.settings', "
        "'pyllama_cli.core.model.adapters'))))\n"
    ))
    assert lines[-1] == "[]"


def test_tensors_that_fall_back_to_another_type_are_noted(tmp_path: Path) -> None:
    odd = write_llama_gguf(tmp_path / "odd.gguf", replace(TINY, n_ff=320))  # rows not a multiple of 256
    result = run_cli("quantize", str(odd), "Q4_K_M")
    assert result.exit_code == 0
    assert result.stderr.splitlines()[:2] == [
        "note: blk.0.ffn_down.weight - ncols 320 not divisible by 256 (required for type q4_K) -> falling back to q5_0",
        "note: blk.1.ffn_down.weight - ncols 320 not divisible by 256 (required for type q6_K) -> falling back to q8_0",
    ]


def test_json_result(src: Path, tmp_path: Path) -> None:
    result = run_cli("quantize", str(src), "7", "--json")  # 7 is Q8_0's file-type number
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    out = tmp_path / "model-Q8_0.gguf"
    assert data["output"] == [str(out)] and data["type"] == "Q8_0" and data["ftype"] == 7
    assert data["input_bytes"] == src.stat().st_size and data["output_bytes"] == out.stat().st_size
    assert data["ratio"] == round(src.stat().st_size / out.stat().st_size, 4)


def test_override_kv_and_output_tensor_type(src: Path, tmp_path: Path) -> None:
    out = tmp_path / "o.gguf"
    result = run_cli("quantize", "--override-kv", "general.name=str:renamed", "--output-tensor-type", "q8_0",
                     "--pure", str(src), str(out), "Q4_0")
    assert result.exit_code == 0, result.stderr
    from pyllama_cli.core.gguf.reader import read_gguf

    head = read_gguf(out)
    assert head.get("general.name") == "renamed"
    types = {t.name: t.type_name for t in head.tensors}
    assert types["output.weight"] == "Q8_0" and types["blk.0.ffn_down.weight"] == "Q4_0"


def test_keep_split_writes_one_part_per_input_part(tmp_path: Path) -> None:
    parts = write_split_gguf(tmp_path / "split", TINY, 2)
    result = run_cli("quantize", "--keep-split", str(parts[0]), str(tmp_path / "q.gguf"), "Q8_0")
    assert result.exit_code == 0, result.stderr
    outs = [tmp_path / "q-00001-of-00002.gguf", tmp_path / "q-00002-of-00002.gguf"]
    assert result.stdout.split() == [str(p) for p in outs]
    assert len(greedy_tokens(outs[0])) == 4


def test_hf_repo_as_input_writes_into_the_current_folder(f32_model: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.fixtures.fake_hf import FakeHub

    with FakeHub() as hub:
        hub.add_repo("org/m-GGUF", {"m-F32.gguf": f32_model})
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.chdir(tmp_path)
        result = run_cli("quantize", "-hf", "org/m-GGUF:F32", "Q8_0")
    assert result.exit_code == 0, result.stderr
    assert result.stdout == f"{tmp_path / 'm-Q8_0.gguf'}\n"
    assert sha256(tmp_path / "m-Q8_0.gguf") == sha256(write_quantized(f32_model, tmp_path / "ref.gguf", "Q8_0"))


# --- arguments -------------------------------------------------------------------------------


def test_positionals_follow_llama_quantize() -> None:
    from pyllama_cli.core.quantize.arguments import parse_positionals

    p = parse_positionals(["in.gguf", "q4_k_m"], input_named=False)
    assert (p.input, p.output, p.quant.name, p.nthreads) == ("in.gguf", None, "Q4_K_M", None)
    p = parse_positionals(["in.gguf", "out.gguf", "Q8_0", "3"], input_named=False)
    assert (p.input, p.output, p.quant.name, p.nthreads) == ("in.gguf", "out.gguf", "Q8_0", 3)
    p = parse_positionals(["15", "2"], input_named=True)  # -hf/-m gave the input
    assert (p.input, p.output, p.quant.name, p.nthreads) == (None, None, "Q4_K_M", 2)


@pytest.mark.parametrize(("args", "message"), [
    (["in.gguf", "out.gguf", "Q4_0", "\u00b2"], "unexpected argument '\u00b2' after TYPE"),
    (["in.gguf", "out.gguf", "Q4_0", "2", "extra"], "unexpected argument 'extra' after NTHREADS"),
    (["in.gguf", "1_5"], "unknown quantization type '1_5'"),
    (["in.gguf", "\u0661\u0665"], "unknown quantization type '\u0661\u0665'"),  # Arabic-Indic 15
])
def test_positionals_that_are_not_llama_quantize_s_are_refused(args: list[str], message: str) -> None:
    from pyllama_cli.core.quantize.arguments import parse_positionals

    with pytest.raises(UsageError) as caught:
        parse_positionals(args, input_named=False)
    assert caught.value.message == message


def test_default_output_replaces_a_type_suffix(tmp_path: Path) -> None:
    from pyllama_cli.core.gguf.ftypes import parse_type
    from pyllama_cli.core.quantize.arguments import default_output

    q = parse_type("iq4_xs")
    assert default_output(tmp_path / "m-F16.gguf", q, from_hub=False) == tmp_path / "m-IQ4_XS.gguf"
    assert default_output(tmp_path / "m-00001-of-00002.gguf", q, from_hub=False) == tmp_path / "m-IQ4_XS.gguf"
    assert default_output(tmp_path / "model.gguf", q, from_hub=True) == Path.cwd() / "model-IQ4_XS.gguf"


def test_list_shows_numbers_bpw_descriptions_and_imatrix_needs() -> None:
    result = run_cli("quantize", "--list")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[0] == "NUM  TYPE          BPW  DESCRIPTION"
    assert "  2  Q4_0         4.50  4.34G, +0.4685 ppl @ Llama-3-8B" in lines
    assert " 15  Q4_K_M       4.50  4.58G, +0.1754 ppl @ Llama-3-8B" in lines
    assert " 20  IQ2_XS       2.31  2.31 bpw quantization  (needs --imatrix)" in lines
    assert lines[-1] == "     COPY               only copy tensors, no quantizing"
    data = json.loads(run_cli("quantize", "--list", "--json").stdout)
    assert len(data) == len(lines) - 1
    assert data[2] == {"name": "Q4_0", "ftype": 2, "bpw": 4.5, "description": "4.34G, +0.4685 ppl @ Llama-3-8B",
                       "needs_imatrix": False, "alias_of": None}
    assert {d["name"] for d in data if d["needs_imatrix"]} == {
        "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XXS", "IQ3_XS", "Q2_K_S"}


def test_unknown_type_lists_close_matches(src: Path) -> None:
    result = run_cli("quantize", str(src), "Q4_K_X")
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        "Error: unknown quantization type 'Q4_K_X'",
        "Hint: did you mean Q4_K_S, Q4_K_M, Q4_K, Q5_K_S? (pyllama quantize --list shows every type)",
    ]


def _token_length_offsets(path: Path) -> list[int]:
    """File offsets of the u64 length before each string of tokenizer.ggml.tokens."""
    import gguf

    reader = gguf.GGUFReader(path)
    field = reader.fields["tokenizer.ggml.tokens"]
    base = reader.data.ctypes.data
    # parts: key length, key, value type, item type, count, then (length, bytes) per token
    return [int(part.ctypes.data - base) for part in field.parts[5::2]]


@pytest.mark.parametrize("damage", ["cut", "length"])
def test_a_damaged_vocabulary_is_an_invalid_gguf(src: Path, tmp_path: Path, damage: str) -> None:
    # quantize steps over the vocabulary without decoding it; damage there is still caught.
    middle = _token_length_offsets(src)[200]
    data = bytearray(src.read_bytes())
    if damage == "cut":
        del data[middle + 4:]
    else:
        data[middle:middle + 8] = struct.pack("<Q", 1 << 40)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    result = run_cli("quantize", str(bad), str(tmp_path / "out.gguf"), "Q8_0")
    reason = (f"header ends early at byte {middle + 4}" if damage == "cut"
              else "a string length runs past the end of the file")
    assert result.exit_code == 1
    assert result.first_stderr_line == f"Error: {bad} is not a valid GGUF file: {reason}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.gguf", "model-F32.gguf"]


def test_unknown_tensor_type_is_refused(src: Path) -> None:
    result = run_cli("quantize", "--token-embedding-type", "q9_0", str(src), "Q8_0")
    assert result.exit_code == 1
    assert result.first_stderr_line == "Error: unknown tensor type for --token-embedding-type 'q9_0'"


def test_malformed_override_kv_is_refused_before_any_work(src: Path, tmp_path: Path) -> None:
    result = run_cli("quantize", "--override-kv", "general.name=text:x", str(src), "Q8_0")
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        "Error: malformed --override-kv 'general.name=text:x'",
        "Hint: write KEY=TYPE:VALUE with TYPE int, float, bool or str, e.g. general.name=str:my-model",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model-F32.gguf"]


# --- refusals --------------------------------------------------------------------------------


def test_existing_output_is_refused_without_force(src: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.gguf"
    out.write_bytes(b"keep me")
    result = run_cli("quantize", str(src), str(out), "Q8_0")
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        f"Error: {out} already exists",
        "Hint: pass --force to replace it, or choose another OUTPUT",
    ]
    assert out.read_bytes() == b"keep me"
    assert run_cli("quantize", "--force", str(src), str(out), "Q8_0").exit_code == 0
    assert out.stat().st_size > 1_000_000


def test_a_symlinked_output_is_written_through(src: Path, tmp_path: Path) -> None:
    target = tmp_path / "models" / "q8.gguf"
    target.parent.mkdir()
    target.write_bytes(b"old")
    link = tmp_path / "out.gguf"
    link.symlink_to(target)
    assert run_cli("quantize", "--force", str(src), str(link), "Q8_0").exit_code == 0
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_bytes()[:4] == b"GGUF" and target.stat().st_size > 1_000_000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model-F32.gguf", "models", "out.gguf"]
    assert os.listdir(target.parent) == ["q8.gguf"]  # the temporary file was next to the target, and is gone


def test_a_replaced_output_keeps_its_mode_and_a_long_name_can_be_staged(src: Path, tmp_path: Path) -> None:
    private = tmp_path / "private.gguf"
    private.write_bytes(b"old")
    private.chmod(0o600)
    assert run_cli("quantize", "--force", str(src), str(private), "Q8_0").exit_code == 0
    assert stat.S_IMODE(private.stat().st_mode) == 0o600  # it came back 0644
    long_name = tmp_path / ("b" * 245 + ".gguf")  # a valid name; ".NAME.RANDOM.tmp" would pass 255 bytes
    result = run_cli("quantize", str(src), str(long_name), "Q8_0")
    assert result.exit_code == 0, result.stderr
    assert long_name.stat().st_size > 1_000_000
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_fifo_output_is_refused_even_with_force(src: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "out.gguf"
    os.mkfifo(fifo)
    result = run_cli("quantize", "--force", str(src), str(fifo), "Q8_0")
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [f"Error: {fifo} is not a regular file", "Hint: name a new or regular file"]
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model-F32.gguf", "out.gguf"]


def test_split_output_parts_must_lead_to_one_folder(tmp_path: Path) -> None:
    parts = write_split_gguf(tmp_path / "split", TINY, 2)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "q-00002-of-00002.gguf").symlink_to(elsewhere / "part2.gguf")
    result = run_cli("quantize", "--keep-split", str(parts[0]), str(tmp_path / "q.gguf"), "Q8_0")
    assert result.exit_code == 1
    folders = sorted(os.path.realpath(p) for p in (tmp_path, elsewhere))
    assert result.first_stderr_line == f"Error: the output parts lead to more than one folder ({', '.join(folders)})"
    assert os.listdir(elsewhere) == []


def test_output_equal_to_input_is_refused_even_with_force(src: Path) -> None:
    before = sha256(src)
    result = run_cli("quantize", "-f", str(src), str(src), "Q8_0")
    assert result.exit_code == 1
    assert result.first_stderr_line == f"Error: OUTPUT {src} is the input file"
    assert sha256(src) == before


def test_requantizing_needs_allow_requantize(src: Path, tmp_path: Path) -> None:
    q8 = write_quantized(src, tmp_path / "model-Q8_0.gguf", "Q8_0")
    result = run_cli("quantize", str(q8), "Q4_0")
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        "Error: model-Q8_0.gguf is already quantized (requantizing from type q8_0 is disabled)",
        ("Hint: quantize from the F16/BF16/F32 original, or pass --allow-requantize (quality drops more than "
         "quantizing once)"),
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model-F32.gguf", "model-Q8_0.gguf"]
    assert run_cli("quantize", "--allow-requantize", str(q8), "Q4_0").exit_code == 0
    assert (tmp_path / "model-Q4_0.gguf").is_file()


def test_imatrix_types_refuse_to_run_without_one(src: Path, tmp_path: Path) -> None:
    result = run_cli("quantize", str(src), "IQ2_XS")
    assert result.exit_code == 1
    assert result.first_stderr_line == "Error: IQ2_XS needs an importance matrix"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model-F32.gguf"]


# --- imatrix ---------------------------------------------------------------------------------


def write_imatrix(path: Path, spec=TINY) -> Path:
    """An imatrix GGUF as llama-imatrix writes it: `<tensor>.in_sum2` and `<tensor>.counts` per weight."""
    import gguf

    writer = gguf.GGUFWriter(path, "imatrix")
    writer.add_type("imatrix")
    writer.add_array("imatrix.datasets", ["test-data.txt"])
    writer.add_uint32("imatrix.chunk_count", 3)
    writer.add_uint32("imatrix.chunk_size", 512)
    rng = np.random.default_rng(1)
    widths = {"attn_q": spec.n_embd, "attn_k": spec.n_embd, "attn_v": spec.n_embd, "attn_output": spec.n_embd,
              "ffn_gate": spec.n_embd, "ffn_up": spec.n_embd, "ffn_down": spec.n_ff}
    for i in range(spec.n_layer):
        for name, width in widths.items():
            writer.add_tensor(f"blk.{i}.{name}.weight.in_sum2", (rng.random((1, width)) * 1536).astype(np.float32))
            writer.add_tensor(f"blk.{i}.{name}.weight.counts", np.array([[1536.0]], dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_legacy_imatrix(path: Path, spec=TINY) -> Path:
    """The same entries in llama-imatrix's older binary format (sums pre-divided by the call count)."""
    rng = np.random.default_rng(2)
    entries = [(f"blk.{i}.{name}.weight", spec.n_ff if name == "ffn_down" else spec.n_embd)
               for i in range(spec.n_layer)
               for name in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")]
    data = struct.pack("<i", len(entries))
    for name, width in entries:
        data += struct.pack("<i", len(name)) + name.encode() + struct.pack("<ii", 7, width)
        data += (rng.random(width) * 100).astype(np.float32).tobytes()
    data += struct.pack("<ii", 5, len(b"legacy.txt")) + b"legacy.txt"
    path.write_bytes(data)
    return path


def test_legacy_imatrix_is_read_as_llama_quantize_reads_it(tmp_path: Path) -> None:
    from pyllama_cli.core.quantize.imatrix import load_imatrix

    data = load_imatrix(str(write_legacy_imatrix(tmp_path / "im.dat")), exclude=["ffn"])
    assert (data.chunk_count, data.datasets, len(data.entries)) == (5, ["legacy.txt"], 8)
    first = (np.random.default_rng(2).random(TINY.n_embd) * 100).astype(np.float32)
    np.testing.assert_array_equal(data.entries["blk.0.attn_q.weight"], first / np.float32(7))


def test_imatrix_enables_types_that_need_one_and_is_recorded(src: Path, tmp_path: Path) -> None:
    imatrix = write_imatrix(tmp_path / "imatrix.gguf")
    out = tmp_path / "q2ks.gguf"
    result = run_cli("quantize", "--imatrix", str(imatrix), "--exclude-weights", "ffn_down",
                     str(src), str(out), "Q2_K_S")
    assert result.exit_code == 1  # Q2_K_S needs imatrix data for ffn_down too
    assert result.stderr.splitlines() == [
        ("Error: Q2_K_S needs importance-matrix data for every tensor it quantizes (llama.cpp: Missing importance "
        "matrix for tensor blk.0.ffn_down.weight in a very low-bit quantization)"),
        ("Hint: the imatrix lacks that tensor: check --include-weights/--exclude-weights, or use one made for this "
        "model"),
    ]
    assert not out.exists()
    # Q2_K_S: the fastest type that needs an imatrix (the IQ2 types take seconds even on this model).
    result = run_cli("quantize", "--imatrix", str(imatrix), str(src), str(out), "Q2_K_S")
    assert result.exit_code == 0, result.stderr
    from pyllama_cli.core.gguf.reader import read_gguf

    head = read_gguf(out)
    assert head.get("quantize.imatrix.file") == str(imatrix)
    assert head.get("quantize.imatrix.dataset") == "test-data.txt"
    assert head.get("quantize.imatrix.entries_count") == 14
    assert head.get("quantize.imatrix.chunks_count") == 3


# --- interruption ----------------------------------------------------------------------------


def _hidden_file_with_data(folder: Path) -> bool:
    for path in folder.iterdir():
        try:
            if path.name.startswith(".") and path.stat().st_size > 0:
                return True
        except FileNotFoundError:  # the writability probe: created and removed again at once
            continue
    return False


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_mid_run_exits_130_and_leaves_no_file(tmp_path: Path, signum: int) -> None:
    # IQ3_M on a 20 MB model takes over a second: time enough to interrupt it mid-write.
    model = write_llama_gguf(tmp_path / "big.gguf", replace(TINY, n_layer=6, n_ff=768))
    proc = subprocess.Popen([sys.executable, "-m", "pyllama_cli", "quantize", str(model), "IQ3_M", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO_ROOT, preexec_fn=default_sigint)
    deadline = time.monotonic() + 60
    while not _hidden_file_with_data(tmp_path):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.01)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert out == b""
    assert err.decode().strip() == "quantization interrupted; no output file was written"
    assert os.listdir(tmp_path) == ["big.gguf"]


# --- llama.cpp's own tool (skipped unless LLAMA_CPP_BIN has llama-quantize) -----------------


def _llama_quantize() -> Path | None:
    folder = os.environ.get("LLAMA_CPP_BIN")
    tool = Path(folder) / "llama-quantize" if folder else None
    return tool if tool is not None and tool.is_file() else None


@pytest.mark.reference
@pytest.mark.skipif(_llama_quantize() is None, reason="set LLAMA_CPP_BIN to a folder with llama-quantize")
@pytest.mark.parametrize("qtype", IDENTICAL_TYPES + ["IQ2_XS+imatrix", "IQ2_XS+legacy", "Q4_K_M+exclude"])
def test_byte_identical_to_llama_quantize(src: Path, tmp_path: Path, qtype: str) -> None:
    qtype, _, imatrix = qtype.partition("+")
    flags: list[str] = []
    if imatrix == "legacy":
        flags = ["--imatrix", str(write_legacy_imatrix(tmp_path / "imatrix.dat"))]
    elif imatrix:
        flags = ["--imatrix", str(write_imatrix(tmp_path / "imatrix.gguf"))]
    if imatrix == "exclude":
        flags += ["--exclude-weights", "blk.1.attn_q"]
    theirs, ours = tmp_path / "theirs.gguf", tmp_path / "ours.gguf"
    subprocess.run([str(_llama_quantize()), *flags, str(src), str(theirs), qtype, "2"], check=True,
                   capture_output=True)
    assert run_cli("quantize", *flags, str(src), str(ours), qtype, "2").exit_code == 0
    assert sha256(ours) == sha256(theirs)
