"""LoRA adapters and control vectors on the loading commands: flags, errors, and llama-completion's text."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.fixtures.make_adapters import write_control_vector, write_lora_gguf
from tests.fixtures.make_gguf import TINY, write_llama_gguf
from tests.helpers import CliResult, run_cli

FAST = ("-t", "1", "-c", "512")
PROMPT = ("-p", "hello world", "-n", "12", "--temp", "0")


@pytest.fixture(scope="session")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two LoRA adapters and a control vector for the tiny model, and an adapter made for qwen2."""
    folder = tmp_path_factory.mktemp("adapters")
    return {
        "a": write_lora_gguf(folder / "a.gguf", seed=1),
        "b": write_lora_gguf(folder / "b.gguf", seed=3),
        "qwen2": write_lora_gguf(folder / "qwen2.gguf", seed=1, arch="qwen2"),
        "cvec": write_control_vector(folder / "cvec.gguf"),
    }


def complete(model: Path, *args: str) -> CliResult:
    return run_cli("complete", "-m", str(model), *FAST, *PROMPT, *args)


def _ok(result: CliResult) -> str:
    assert result.exit_code == 0, result.stderr
    return result.stdout


def test_each_adapter_set_gives_its_own_text(tiny_model: Path, adapters: dict[str, Path]) -> None:
    a, b, cvec = str(adapters["a"]), str(adapters["b"]), str(adapters["cvec"])
    texts = {
        "base": _ok(complete(tiny_model)),
        "a": _ok(complete(tiny_model, "--lora", a)),
        "a@0.5": _ok(complete(tiny_model, "--lora-scaled", f"{a}:0.5")),
        "a+b": _ok(complete(tiny_model, "--lora", f"{a},{b}")),
        "cvec": _ok(complete(tiny_model, "--control-vector", cvec)),
    }
    assert len(set(texts.values())) == len(texts), texts
    # The same adapters said another way give the same text.
    assert _ok(complete(tiny_model, "--lora-scaled", f"{a}:1")) == texts["a"]
    assert _ok(complete(tiny_model, "--lora", a, "--lora", b)) == texts["a+b"]
    assert _ok(complete(tiny_model, "--control-vector-scaled", f"{cvec}:1.0")) == texts["cvec"]
    assert _ok(complete(tiny_model, "--lora-scaled", f"{a}:0")) == texts["base"]
    # Loaded but not applied: the base model's text.
    assert _ok(complete(tiny_model, "--lora", a, "--lora-init-without-apply")) == texts["base"]
    # llama.cpp adds direction.N to the output of layer N (0-based), so the tiny model's two layers use
    # direction.1 alone: the range 1..1 is the whole vector, 2..2 none of it.
    assert _ok(complete(tiny_model, "--control-vector", cvec, "--control-vector-layer-range", "1", "1")) \
        == texts["cvec"]
    assert _ok(complete(tiny_model, "--control-vector", cvec, "--control-vector-layer-range", "2", "2")) \
        == texts["base"]


def test_a_draft_model_runs_without_the_target_s_adapters(tiny_model: Path, adapters: dict[str, Path],
                                                         tmp_path: Path) -> None:
    # The draft is another model (here with a wider feed-forward): the target's adapter does not fit it, and
    # the verified text is the adapted target's.
    from dataclasses import replace

    draft = write_llama_gguf(tmp_path / "draft.gguf", replace(TINY, n_ff=768, seed=5))
    lora = ("--lora", str(adapters["a"]))
    assert _ok(complete(tiny_model, *lora, "-md", str(draft))) == _ok(complete(tiny_model, *lora))


def test_an_adapter_for_another_architecture_is_one_error_naming_both(tiny_model: Path,
                                                                      adapters: dict[str, Path]) -> None:
    result = complete(tiny_model, "--lora", str(adapters["qwen2"]))
    assert result.exit_code == 1
    assert result.stderr.splitlines() == ["Error: LoRA adapter qwen2.gguf is for qwen2 models, but tiny.gguf is llama",
                                          "Hint: use an adapter made for this base model"]


def test_an_adapter_of_another_shape_is_one_error_naming_both(tmp_path: Path, adapters: dict[str, Path]) -> None:
    from dataclasses import replace

    wide = write_llama_gguf(tmp_path / "other.gguf", replace(TINY, n_ff=768, name="other"))
    result = complete(wide, "--lora", str(adapters["a"]))
    assert result.exit_code == 1
    assert result.stderr.splitlines()[0] == "Error: LoRA adapter a.gguf does not fit other.gguf"
    assert result.stderr.splitlines()[1].startswith("Hint: its tensors are missing from or shaped unlike")


@pytest.mark.parametrize(("args", "lines"), [
    (("--lora", "missing.gguf"),
     ["Error: LoRA adapter file not found: missing.gguf", "Hint: give --lora the path of a GGUF LoRA adapter file"]),
    (("--lora-scaled", "a.gguf:half"),
     ["Error: --lora-scaled 'a.gguf:half': the scale 'half' is not a number",
      "Hint: write --lora-scaled FNAME:SCALE, e.g. adapter.gguf:0.5"]),
    (("--lora-scaled", "a.gguf"),
     ["Error: --lora-scaled 'a.gguf' has no scale", "Hint: write --lora-scaled FNAME:SCALE, e.g. adapter.gguf:0.5"]),
    (("--control-vector", "missing.gguf"),
     ["Error: control vector file not found: missing.gguf",
      "Hint: give --control-vector the path of a GGUF control vector file"]),
    (("--control-vector-scaled", "v.gguf:1e"),
     ["Error: --control-vector-scaled 'v.gguf:1e': the scale '1e' is not a number",
      "Hint: write --control-vector-scaled FNAME:SCALE, e.g. adapter.gguf:0.5"]),
])
def test_bad_adapter_flags_are_one_error_with_a_hint(tiny_model: Path, args: tuple[str, ...],
                                                     lines: list[str]) -> None:
    result = complete(tiny_model, *args)
    assert (result.exit_code, result.stdout, result.stderr.splitlines()) == (1, "", lines)


def test_a_model_file_is_no_adapter(tiny_model: Path) -> None:
    result = complete(tiny_model, "--lora", str(tiny_model))
    assert result.exit_code == 1
    assert result.stderr.splitlines()[0] == (f"Error: {tiny_model} is not a LoRA adapter "
                                             "(general.type None, adapter.type None)")


def test_chat_takes_lora_and_control_vectors(tiny_model: Path, adapters: dict[str, Path]) -> None:
    def chat(*args: str) -> str:
        result = run_cli("chat", "-m", str(tiny_model), *FAST, "-n", "8", "--temp", "0", *args, stdin="hi\n")
        assert result.exit_code == 0, result.stderr
        return result.stdout

    base = chat()
    assert chat("--lora", str(adapters["a"])) != base
    assert chat("--control-vector", str(adapters["cvec"])) != base
    assert chat("--lora", str(adapters["a"]), "--lora-init-without-apply") == base


def test_perplexity_takes_lora(tiny_model: Path, adapters: dict[str, Path], tmp_path: Path) -> None:
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog " * 40)
    args = ("perplexity", "-m", str(tiny_model), "-t", "1", "-c", "128", "-f", str(text))
    base, adapted = run_cli(*args), run_cli(*args, "--lora", str(adapters["a"]))
    assert base.exit_code == adapted.exit_code == 0, adapted.stderr
    final = [line for line in (base.stdout + base.stderr).splitlines() if "Final estimate" in line]
    final_adapted = [line for line in (adapted.stdout + adapted.stderr).splitlines() if "Final estimate" in line]
    assert final and final_adapted and final != final_adapted


# ---------------------------------------------------------------- against llama-completion itself

LLAMA_COMPLETION = Path(os.environ.get("LLAMA_CPP_BIN", "/nonexistent")) / "llama-completion"
reference = pytest.mark.skipif(not LLAMA_COMPLETION.is_file(),
                               reason="set LLAMA_CPP_BIN to a folder with llama-completion")


def llama_completion_text(model: Path, *args: str) -> str:
    """llama-completion's text. Its log thread can drop the end of stdout as the process exits; whole
    output ends with a newline, so output without one is asked for again."""
    for _ in range(10):
        proc = subprocess.run([str(LLAMA_COMPLETION), "-m", str(model), *FAST, *PROMPT, "-no-cnv",
                               "--no-display-prompt", "--no-warmup", *args],
                              capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
        if proc.stdout.endswith(b"\n"):
            return proc.stdout.decode("utf-8", "replace").rstrip("\n").removesuffix(" [end of text]")
    raise AssertionError("llama-completion cut its output 10 times in a row")


@pytest.mark.reference
@reference
@pytest.mark.parametrize("case", ["lora", "lora-scaled-0.5", "two-loras", "control-vector", "cvec-layer-2"])
def test_greedy_text_equals_llama_completion_s(tiny_model: Path, adapters: dict[str, Path], case: str) -> None:
    a, b, cvec = str(adapters["a"]), str(adapters["b"]), str(adapters["cvec"])
    args = {
        "lora": ("--lora", a),
        "lora-scaled-0.5": ("--lora-scaled", f"{a}:0.5"),
        "two-loras": ("--lora", a, "--lora", b),
        "control-vector": ("--control-vector", cvec),
        "cvec-layer-2": ("--control-vector-scaled", f"{cvec}:0.5", "--control-vector-layer-range", "1", "2"),
    }[case]
    assert _ok(complete(tiny_model, *args)) == llama_completion_text(tiny_model, *args)
