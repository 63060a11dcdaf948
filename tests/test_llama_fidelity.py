"""The KV cache, sampler, RoPE, context-shift and placement flags give what llama.cpp's own tools give.

Each test runs llama.cpp's tool (from LLAMA_CPP_BIN) and pyllama with the same flags and seed, and
compares the text: 64 tokens sampled at temperature 0.8 are equal only if every stage of the chain,
the cache and the positions are the same.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.make_gguf import TINY_MOE, WIDE, write_llama_gguf
from tests.helpers import free_port, post_json, run_cli

pytestmark = pytest.mark.reference


def _tool(name: str) -> Path | None:
    folder = os.environ.get("LLAMA_CPP_BIN")
    tool = Path(folder) / name if folder else None
    return tool if tool is not None and tool.is_file() else None


needs_completion = pytest.mark.skipif(_tool("llama-completion") is None,
                                      reason="set LLAMA_CPP_BIN to a folder with llama-completion")
PROMPT = "the cat sat on the mat and the cat sat on the"
COMMON = ("-p", PROMPT, "-n", "64", "-s", "1234", "--temp", "0.8", "-t", "1", "-c", "512", "--ignore-eos")


@pytest.fixture(scope="session")
def wide_model(models_dir: Path) -> Path:
    """A 32k-token vocabulary with peaked distributions (the samplers' cuts matter there)."""
    return write_llama_gguf(models_dir / "wide.gguf", WIDE)


@pytest.fixture(scope="session")
def moe(models_dir: Path) -> Path:
    return write_llama_gguf(models_dir / "tiny-moe-ref.gguf", TINY_MOE)


def theirs(model: Path, *flags: str, common: tuple[str, ...] = COMMON) -> str:
    """llama-completion's text. Its log thread sometimes loses the end of the output at exit, so it runs
    until two runs agree (at most 4), and the longest text is kept (each run is a prefix of it)."""
    texts: list[str] = []
    while len(texts) < 4 and (len(texts) < 2 or len(set(texts)) == len(texts)):
        proc = subprocess.run([str(_tool("llama-completion")), "-m", str(model), *common, *flags, "-no-cnv",
                               "--no-display-prompt", "--no-warmup"], capture_output=True, timeout=120, check=False)
        assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
        texts.append(proc.stdout.decode("utf-8", errors="replace").rstrip("\n"))
    return max(texts, key=len)


def ours(model: Path, *flags: str, common: tuple[str, ...] = COMMON) -> str:
    result = run_cli("complete", "-m", str(model), *common, *flags)
    assert result.exit_code == 0, result.stderr
    return result.stdout


SAMPLERS = {
    "dry": ("--dry-multiplier", "0.8", "--dry-allowed-length", "1", "--dry-base", "2"),
    "dry-breakers": ("--dry-multiplier", "1.5", "--dry-sequence-breaker", "cat", "--dry-sequence-breaker", "mat"),
    "xtc": ("--xtc-probability", "0.5", "--xtc-threshold", "0.02"),
    "top-n-sigma": ("--top-n-sigma", "1.0"),
    "dynatemp": ("--dynatemp-range", "0.5", "--dynatemp-exp", "1.5"),
    "adaptive-p": ("--samplers", "min_p;temperature;adaptive_p", "--adaptive-target", "0.3", "--adaptive-decay", "0.8"),
    "penalties": ("--repeat-penalty", "1.3", "--presence-penalty", "0.5", "--frequency-penalty", "0.2"),
    "order-a": ("--samplers", "top_k;temperature;top_p;min_p", "--top-k", "20", "--top-p", "0.6"),
    "order-b": ("--samplers", "min_p;top_p;temperature;top_k", "--top-k", "20", "--top-p", "0.6"),
    "sampler-seq": ("--sampler-seq", "xpkt", "--xtc-probability", "0.7", "--xtc-threshold", "0.01", "--top-p", "0.7"),
}
CONTEXT = {
    "kv-q8_0-fa": ("-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on"),
    "kv-k-q4_0": ("-ctk", "q4_0"),
    "rope-yarn": ("--rope-scaling", "yarn", "--rope-scale", "2"),
    "rope-base": ("--rope-freq-base", "5000", "--rope-freq-scale", "0.5"),
}


@needs_completion
@pytest.mark.parametrize("flags", list(SAMPLERS.values()), ids=list(SAMPLERS))
@pytest.mark.parametrize("which", ["tiny", "wide"])
def test_samplers_sample_what_llama_completion_samples(which: str, flags: tuple[str, ...], tiny_model: Path,
                                                       wide_model: Path) -> None:
    model = tiny_model if which == "tiny" else wide_model
    assert ours(model, *flags) == theirs(model, *flags)


@needs_completion
@pytest.mark.parametrize("flags", list(CONTEXT.values()), ids=list(CONTEXT))
@pytest.mark.parametrize("which", ["tiny", "wide"])
def test_cache_types_and_rope_give_llama_completions_text(which: str, flags: tuple[str, ...], tiny_model: Path,
                                                          wide_model: Path) -> None:
    model = tiny_model if which == "tiny" else wide_model
    assert ours(model, *flags) == theirs(model, *flags)


@needs_completion
@pytest.mark.parametrize("keep", ["0", "4", "-1"])
def test_keep_with_a_context_shift_gives_llama_completions_text(keep: str, tiny_model: Path) -> None:
    # llama.cpp rounds contexts up to 256 tokens: 300 tokens shift it at least once
    common = ("-p", PROMPT, "-n", "300", "-s", "99", "-t", "1", "-c", "256", "--ignore-eos", "--context-shift")
    text = theirs(tiny_model, "--keep", keep, common=common)
    assert ours(tiny_model, "--keep", keep, common=common) == text


# ---------------------------------------------------------------- placement: llama-cli's log


def _placement_lines(text: str) -> list[str]:
    return [line[line.index("tensor "):] for line in text.splitlines() if "buffer type overridden to" in line]


@pytest.mark.skipif(_tool("llama-cli") is None and _tool("llama-completion") is None,
                    reason="set LLAMA_CPP_BIN to a folder with llama-completion")
@pytest.mark.parametrize("flags", [("--cpu-moe",), ("--n-cpu-moe", "1"), ("-ot", r"blk\.1\.ffn_(up|down)_exps=CPU"),
                                   ("-ot", "attn_q=CPU,exps=CPU", "-ncmoe", "1")])
def test_moe_placement_matches_llama_cpps_log(flags: tuple[str, ...], moe: Path) -> None:
    # -fit off: llama.cpp's fitting would load the model (and log the placement) a first time
    proc = subprocess.run([str(_tool("llama-completion")), "-m", str(moe), "-p", "hi", "-n", "1", "-t", "1", "-c", "256",
                           "-no-cnv", "--no-warmup", "-v", "-fit", "off", *flags], capture_output=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    expected = _placement_lines(proc.stderr.decode(errors="replace"))
    result = run_cli("complete", "-m", str(moe), "-p", "hi", "-n", "1", "-t", "1", "-c", "256", "--verbose", *flags)
    assert result.exit_code == 0 and expected and _placement_lines(result.stderr) == expected


# ---------------------------------------------------------------- the server's sampler fields


@pytest.fixture(scope="module")
def llama_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("llama-server") / "log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen([str(_tool("llama-server")), "-m", str(tiny_model), "-c", "512", "-t", "1", "-np", "1",
                                 "--host", "127.0.0.1", "--port", str(port)], stdout=sink, stderr=sink)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        else:
            pytest.fail("llama-server did not start:\n" + log.read_text(errors="replace")[-2000:])
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=15)


@pytest.fixture(scope="module")
def pyllama_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from tests.test_serve import spawn_serve

    server = spawn_serve(tmp_path_factory.mktemp("serve-ref") / "stderr.log", ["-m", str(tiny_model), "-c", "512"])
    yield server.url
    server.stop()


SERVER_BODIES = {
    "dry": {"dry_multiplier": 0.8, "dry_allowed_length": 1, "dry_sequence_breakers": ["mat"]},
    "xtc": {"xtc_probability": 0.5, "xtc_threshold": 0.02},
    "top_n_sigma": {"top_n_sigma": 1.0},
    "dynatemp": {"dynatemp_range": 0.5, "dynatemp_exponent": 1.5},
    "samplers-names": {"samplers": ["min_p", "temperature", "top_k"], "top_k": 10},
    "samplers-letters": {"samplers": "xkt", "xtc_probability": 0.6, "xtc_threshold": 0.01},
    "adaptive": {"samplers": ["min_p", "temperature", "adaptive_p"], "adaptive_target": 0.3},
}


@pytest.mark.skipif(_tool("llama-server") is None, reason="set LLAMA_CPP_BIN to a folder with llama-server")
@pytest.mark.parametrize("fields", list(SERVER_BODIES.values()), ids=list(SERVER_BODIES))
def test_server_sampler_fields_answer_as_llama_server(fields: dict, llama_server: str, pyllama_server: str) -> None:
    body = {"prompt": PROMPT, "n_predict": 32, "seed": 77, "temperature": 0.8, "ignore_eos": True, **fields}
    expected = post_json(f"{llama_server}/completion", body)["content"]
    assert post_json(f"{pyllama_server}/completion", body)["content"] == expected


# ---------------------------------------------------------------- bench: -ctk, -ctv, -ot lists as llama-bench


@pytest.mark.skipif(_tool("llama-bench") is None, reason="set LLAMA_CPP_BIN to a folder with llama-bench")
def test_bench_cache_type_and_override_lists_as_llama_bench(moe: Path) -> None:
    from pyllama_cli.core.bench.output import FIELDS
    from pyllama_cli.core.gguf.ftypes import size_label

    args = ["-m", str(moe), "-t", "1", "-r", "1", "-p", "8", "-n", "0", "-ot", "exps=CPU,,attn_q=CPU;attn_k=CPU",
            "-ctk", "f16,q8_0", "-ctv", "q8_0", "-fa", "on"]
    theirs_md = subprocess.run([str(_tool("llama-bench")), *args], capture_output=True, timeout=120, check=True)
    ours_md = run_cli("bench", *args)
    assert ours_md.stdout.splitlines()[0].startswith(theirs_md.stdout.decode().splitlines()[0].removesuffix(" |"))
    timing = {"build_commit", "build_number", "test_time", "avg_ns", "stddev_ns", "avg_ts", "stddev_ts",
              "samples_ns", "samples_ts"}
    theirs_json = json.loads(subprocess.run([str(_tool("llama-bench")), *args, "-o", "json"], capture_output=True,
                                            timeout=120, check=True).stdout)
    ours_json = json.loads(run_cli("bench", *args, "-o", "json").stdout)
    for row in theirs_json:  # llama.cpp names no size for this model ("?B"); pyllama counts its parameters
        row["model_type"] = row["model_type"].replace(" ?B ", f" {size_label(row['model_n_params'])} ")
    assert [{k: v for k, v in row.items() if k not in timing} for row in theirs_json] == \
        [{k: v for k, v in row.items() if k not in timing and k in FIELDS} for row in ours_json]


@needs_completion
def test_a_quantized_v_cache_without_flash_attention_is_refused_as_llama_cpp_refuses_it(tiny_model: Path) -> None:
    flags = ("-p", "hi", "-n", "2", "-t", "1", "-c", "256", "-ctv", "q8_0", "-fa", "off")
    proc = subprocess.run([str(_tool("llama-completion")), "-m", str(tiny_model), *flags, "-no-cnv", "--no-warmup"],
                          capture_output=True, timeout=120, check=False)
    assert proc.returncode == 1  # its log line saying so comes through an asynchronous log, sometimes lost at exit
    result = run_cli("complete", "-m", str(tiny_model), *flags)
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr.splitlines()[0] == "Error: a quantized V cache (-ctv q8_0) needs flash attention, and -fa is off"
