"""`pyllama bench --lora/--lora-scaled`: the adapters reach every test's context, the output names them,
and a bad adapter is refused before any test runs. llama-bench has no adapter flag to compare with."""

from __future__ import annotations

import ctypes
import json
from pathlib import Path

import numpy as np
import pytest

from pyllama_cli.core.bench.output import FIELDS
from pyllama_cli.core.bench.runner import _bench_context, load_bench_model
from pyllama_cli.core.bench.spec import BenchModel, Instance
from pyllama_cli.core.model.adapters import AdapterFile
from pyllama_cli.core.model.native import Batch, lib
from tests.fixtures.make_adapters import write_lora_gguf
from tests.helpers import run_cli

FAST = ("-t", "1", "-r", "1", "--no-warmup")


@pytest.fixture(scope="module")
def loras(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("bench-loras")
    return {"a": write_lora_gguf(folder / "a.gguf", seed=1), "b": write_lora_gguf(folder / "b.gguf", seed=3),
            "qwen2": write_lora_gguf(folder / "qwen2.gguf", seed=1, arch="qwen2")}


def test_every_row_names_its_adapters(tiny_model: Path, loras: dict[str, Path]) -> None:
    result = run_cli("bench", "-m", str(tiny_model), *FAST, "-p", "8", "-n", "4", "--lora", str(loras["a"]),
                     "--lora-scaled", f"{loras['b']}:0.5", "-o", "json")
    assert result.exit_code == 0, result.stderr
    pp, tg = json.loads(result.stdout)
    assert list(tg) == [*FIELDS, "samples_ns", "samples_ts", "peak_rss_bytes", "lora", "error"]
    assert [(r["n_prompt"], r["n_gen"], r["lora"], r["error"]) for r in (pp, tg)] == [
        (8, 0, "a.gguf:1,b.gguf:0.5", None), (0, 4, "a.gguf:1,b.gguf:0.5", None)]
    assert tg["avg_ts"] > 0 and len(tg["samples_ns"]) == 1
    md = run_cli("bench", "-m", str(tiny_model), *FAST, "-p", "0", "-n", "4", "--lora", str(loras["a"]))
    header, _, row = md.stdout.splitlines()[:3]
    assert [c.strip() for c in header.split("|")][-5:-1] == ["lora", "test", "t/s", "peak RSS"]
    assert [c.strip() for c in row.split("|")][-5:-3] == ["a.gguf:1", "tg4"]


def _logits(model_path: Path, loras: tuple[AdapterFile, ...]) -> np.ndarray:
    """The last logits of 8 tokens decoded on the context a bench test gets."""
    inst = Instance(BenchModel("tiny", model_path), 8, 0, 0, 512, 512, "f16", "f16", 1, -1, False, "auto", "auto",
                    loras=loras)
    model = load_bench_model(inst)
    try:
        with _bench_context(model, inst, 0) as ctx, Batch(8) as batch:
            for pos, token in enumerate([1, 40, 41, 42, 43, 44, 45, 46]):
                batch.add(token, pos, (0,), pos == 7)
            ctx.decode(batch)
            row = ctypes.cast(lib.llama_get_logits_ith(ctx.handle, -1), ctypes.POINTER(ctypes.c_float))
            return np.ctypeslib.as_array(row, shape=(model.n_vocab,)).copy()
    finally:
        model.close()


def test_the_adapters_are_applied_to_the_test_context(tiny_model: Path, loras: dict[str, Path]) -> None:
    plain = _logits(tiny_model, ())
    assert np.array_equal(_logits(tiny_model, (AdapterFile(loras["a"], 0.0),)), plain)  # scale 0: left out
    full, half = _logits(tiny_model, (AdapterFile(loras["a"]),)), _logits(tiny_model, (AdapterFile(loras["a"], 0.5),))
    assert np.abs(full - plain).max() > 1e-3 and np.abs(half - plain).max() > 1e-3
    assert np.abs(full - half).max() > 1e-3


@pytest.mark.parametrize("flags,error", [
    (("--lora", "missing.gguf"), "Error: LoRA adapter file not found: missing.gguf"),
    (("--lora-scaled", "a.gguf:x"), "Error: --lora-scaled 'a.gguf:x': the scale 'x' is not a number"),
    (("--lora", "{qwen2}"), "Error: LoRA adapter qwen2.gguf is for qwen2 models, but tiny.gguf is llama"),
])
def test_a_bad_adapter_is_refused_before_any_test(tiny_model: Path, loras: dict[str, Path], flags: tuple[str, ...],
                                                 error: str) -> None:
    args = [flag.replace("{qwen2}", str(loras["qwen2"])) for flag in flags]
    result = run_cli("bench", "-m", str(tiny_model), *FAST, "-p", "0", "-n", "4", "-o", "json", *args)
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr.splitlines()[0] == error
