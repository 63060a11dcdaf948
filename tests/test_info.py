"""`pyllama info`: what a GGUF holds, from its header."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

from tests.fixtures.make_gguf import TINY, write_llama_gguf
from tests.helpers import REPO_ROOT, run_cli


def test_info_json_reports_architecture_layers_and_vocab(tiny_model: Path) -> None:
    result = run_cli("info", "-m", str(tiny_model), "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["architecture"] == "llama"
    assert data["layers"] == TINY.n_layer == 2
    assert data["vocab_size"] == TINY.n_vocab == 1024
    assert data["embedding_length"] == 256
    assert data["head_count"] == 4 and data["head_count_kv"] == 2
    assert data["context_length"] == 2048
    assert data["quantization"] == "F32"
    assert data["parameters"] == 1_705_216
    assert data["file_size"] == tiny_model.stat().st_size
    assert data["chat_template"] is True
    assert data["vocab_type"] == "llama"
    assert data["special_tokens"]["bos"] == {"id": 1, "text": "<s>"}
    assert data["special_tokens"]["eos"] == {"id": 2, "text": "</s>"}
    assert data["special_tokens"]["eot"] == {"id": 260, "text": "<|im_end|>"}
    assert result.stderr == ""


def test_info_text_lists_the_model_section(tiny_model: Path) -> None:
    result = run_cli("info", "-m", str(tiny_model))
    assert result.exit_code == 0
    lines = [line.strip() for line in result.stdout.splitlines()]
    assert lines[0] == "Model"
    assert "architecture          llama" in lines
    assert "layers                2" in lines
    assert "vocab size            1024" in lines
    assert "chat template         yes" in lines
    assert "bos                   1  '<s>'" in lines


def test_control_characters_in_metadata_are_shown_escaped(tmp_path: Path) -> None:
    model = write_llama_gguf(tmp_path / "evil.gguf", dataclasses.replace(TINY, name="evil\x1b[31mred\x07\x9b"))
    result = run_cli("info", "-m", str(model))
    assert result.exit_code == 0
    assert "    name                  evil\\x1b[31mred\\x07\\x9b" in result.stdout.splitlines()
    assert json.loads(run_cli("info", "-m", str(model), "--json").stdout)["name"] == "evil\x1b[31mred\x07\x9b"


def _header_only_gguf(path: Path, **floats: float) -> Path:
    """A GGUF of one small tensor and the given float32 metadata, and a name with control characters."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_string("general.name", "a\x9b31mb")
    for key, value in floats.items():
        writer.add_float32(key, value)
    writer.add_tensor("x", np.zeros((4, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_non_finite_metadata_is_null_in_json(tmp_path: Path) -> None:
    model = _header_only_gguf(tmp_path / "nan.gguf", **{"llama.rope.freq_base": float("nan"), "x.inf": float("inf")})
    result = run_cli("info", "-m", str(model), "--metadata", "--json")
    assert result.exit_code == 0, result.stderr

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    data = json.loads(result.stdout, parse_constant=refuse)
    assert data["llama.rope.freq_base"] is None and data["x.inf"] is None
    text = run_cli("info", "-m", str(model), "--metadata").stdout.splitlines()
    assert "llama.rope.freq_base  nan" in text


def test_metadata_listing_escapes_control_characters_in_keys_and_values(tmp_path: Path) -> None:
    model = _header_only_gguf(tmp_path / "evil.gguf", **{"evil\x1b[2Jkey": 1.5})
    result = run_cli("info", "-m", str(model), "--metadata")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == ['general.architecture  "llama"', 'general.name          "a\\x9b31mb"',
                                         "evil\\x1b[2Jkey        1.5"]


def test_missing_head_count_is_left_out_not_shown_as_none(tmp_path: Path) -> None:
    result = run_cli("info", "-m", str(_header_only_gguf(tmp_path / "bare.gguf")))
    assert result.exit_code == 0, result.stderr
    assert "None" not in result.stdout
    assert [line.split()[0] for line in result.stdout.splitlines()] == [
        "Model", "name", "architecture", "parameters", "file", "quantization", "chat"]


def test_info_template_prints_the_chat_template(tiny_model: Path) -> None:
    result = run_cli("info", "-m", str(tiny_model), "--template")
    assert result.exit_code == 0
    assert result.stdout == TINY.chat_template + "\n"
    as_json = run_cli("info", "-m", str(tiny_model), "--template", "--json")
    assert json.loads(as_json.stdout) == {"chat_template": TINY.chat_template}


def test_info_template_and_metadata_together_are_refused(tiny_model: Path) -> None:
    result = run_cli("info", "-m", str(tiny_model), "--template", "--metadata")
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr == ("Error: --template and --metadata print different things: pick one\n"
                             "Hint: pyllama info --help lists the options\n")


def test_info_metadata_summarizes_long_arrays(tiny_model: Path) -> None:
    result = run_cli("info", "-m", str(tiny_model), "--metadata", "--json")
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["general.architecture"] == "llama"
    assert data["llama.block_count"] == 2
    tokens = data["tokenizer.ggml.tokens"]
    assert tokens["type"] == "array[str]" and tokens["length"] == 1024
    assert tokens["first"][:3] == ["<unk>", "<s>", "</s>"]


def test_help_imports_neither_llama_cpp_nor_the_hub() -> None:
    code = (
        "import sys\n"
        "from pyllama_cli.cli import run\n"
        "try:\n    run(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('llama_cpp', 'huggingface_hub', 'numpy', 'fastapi') if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)
    assert proc.stdout.strip().splitlines()[-1] == "[]"
