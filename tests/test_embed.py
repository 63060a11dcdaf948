"""`pyllama embed` (llama-embedding's pooling, normalisation and formats) and serve's --pooling."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.fixtures.make_gguf import TINY, write_llama_gguf
from tests.helpers import CliResult, run_cli
from tests.test_serve import Server, spawn_serve

FAST = ("-t", "1", "-c", "512")
PROMPTS = "hello world\nthe quick brown fox\nyes"
POOLINGS = ["none", "mean", "cls", "last"]


def embed(model: Path, *args: str, prompt: str = PROMPTS) -> CliResult:
    return run_cli("embed", "-m", str(model), *FAST, "-p", prompt, *args)


def vectors(model: Path, *args: str, prompt: str = PROMPTS) -> np.ndarray:
    result = embed(model, "--embd-output-format", "array", *args, prompt=prompt)
    assert result.exit_code == 0, result.stderr
    return np.array(json.loads(result.stdout))


def test_raw_is_one_line_of_n_embd_numbers_per_prompt(tiny_model: Path) -> None:
    result = embed(tiny_model)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 3 and result.stdout.endswith("\n")
    rows = np.array([[float(x) for x in line.split(" ")] for line in lines])
    assert rows.shape == (3, 256)
    assert np.allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-5)
    assert all(len(x.split(".")[1]) == 7 for x in lines[0].split(" "))  # "%1.7f", as llama-embedding


def test_every_format_holds_the_same_numbers(tiny_model: Path) -> None:
    array = vectors(tiny_model)
    listed = json.loads(embed(tiny_model, "--embd-output-format", "json").stdout)
    assert [d["index"] for d in listed["data"]] == [0, 1, 2] and listed["object"] == "list"
    assert np.array_equal(np.array([d["embedding"] for d in listed["data"]]), array)
    plus = json.loads(embed(tiny_model, "--embd-output-format", "json+").stdout)
    cos = np.array(plus["cosineSimilarity"])
    assert cos.shape == (3, 3) and np.allclose(np.diag(cos), 1.0)
    assert np.allclose(cos, np.round(array @ array.T, 2), atol=0.011)


def test_each_pooling_gives_its_own_vectors(tiny_model: Path) -> None:
    pooled = {p: vectors(tiny_model, "--pooling", p) for p in POOLINGS}
    n_tokens = [len(run_cli("tokenize", "-m", str(tiny_model), "--ids", line).stdout.split(","))
                for line in PROMPTS.split("\n")]
    assert pooled["none"].shape == (sum(n_tokens), 256)  # a vector per token
    assert {p: pooled[p].shape for p in POOLINGS[1:]} == {p: (3, 256) for p in POOLINGS[1:]}
    # cls takes each prompt's first token (BOS: the same for all), last its last token.
    assert np.allclose(pooled["cls"], pooled["cls"][0])
    ends = np.cumsum(n_tokens) - 1
    assert np.allclose(pooled["last"], pooled["none"][ends], atol=1e-6)
    assert not np.allclose(pooled["mean"], pooled["last"])


@pytest.mark.parametrize(("named", "pools_as"), [(2, "cls"), (3, "last"), (1, "mean"), (0, "mean"), (0xFFFFFFFF, "mean")])
def test_without_pooling_the_model_s_own_is_used_and_mean_when_it_names_none(
        tmp_path: Path, named: int, pools_as: str) -> None:
    # Read from the model's metadata (`llama.pooling_type`); 0 is llama.cpp's "none", and a value it has no
    # name for leaves the choice to the context llama.cpp makes.
    model = write_llama_gguf(tmp_path / "pooled.gguf", replace(TINY, pooling=named))
    assert np.array_equal(vectors(model), vectors(model, "--pooling", pools_as))


def test_normalisations(tiny_model: Path) -> None:
    raw = vectors(tiny_model, "--embd-normalize", "-1")
    assert np.allclose(vectors(tiny_model, "--embd-normalize", "1"), raw / np.abs(raw).sum(1, keepdims=True), atol=1e-7)
    scaled = vectors(tiny_model, "--embd-normalize", "0")
    assert np.array_equal(scaled, np.round(scaled)) and np.abs(scaled).max() == 32760
    assert np.allclose(vectors(tiny_model, "--embd-normalize", "3"),
                       raw / (np.abs(raw) ** 3).sum(1, keepdims=True) ** (1 / 3), atol=1e-7)


def test_embed_reads_a_file_with_a_separator(tiny_model: Path, tmp_path: Path) -> None:
    (tmp_path / "p.txt").write_text("hello world<#>yes\n")
    result = run_cli("embed", "-m", str(tiny_model), *FAST, "-f", str(tmp_path / "p.txt"), "--embd-separator", "<#>",
                     "--embd-output-format", "array")
    assert np.array_equal(np.array(json.loads(result.stdout)), vectors(tiny_model, prompt="hello world\nyes"))


@pytest.mark.parametrize(("args", "lines"), [
    (("--pooling", "rank"), ["Error: --pooling rank needs a classification head, and tiny.gguf has none",
                             "Hint: rank pooling is for rerankers; use --pooling mean, cls, last or none"]),
    (("--pooling", "avg"), ["Error: --pooling 'avg' is not a pooling type",
                            "Hint: use one of none, mean, cls, last, rank"]),
    (("--embd-output-format", "csv"), ["Error: --embd-output-format 'csv' is not a format",
                                       "Hint: use one of raw, array, json, json+"]),
])
def test_bad_embed_flags_are_one_error(tiny_model: Path, args: tuple[str, ...], lines: list[str]) -> None:
    result = embed(tiny_model, *args)
    assert (result.exit_code, result.stdout, result.stderr.splitlines()) == (1, "", lines)


@pytest.fixture(scope="module")
def cls_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("serve-cls") / "stderr.log"
    srv = spawn_serve(log, ["-m", str(tiny_model), "-c", "512", "--embeddings", "--pooling", "last",
                            "--embd-normalize", "1"])
    yield srv
    srv.stop()


def test_serve_pools_and_normalises_as_embed(cls_server: Server, tiny_model: Path) -> None:
    answer = httpx.post(f"{cls_server.url}/v1/embeddings", json={"input": PROMPTS.split("\n")}, timeout=60).json()
    served = np.array([d["embedding"] for d in answer["data"]])
    assert np.allclose(served, vectors(tiny_model, "--pooling", "last", "--embd-normalize", "1"), atol=1e-7)


def test_serve_refuses_a_pooling_the_model_cannot_do(tiny_model: Path) -> None:
    result = run_cli("serve", "-m", str(tiny_model), "--embeddings", "--pooling", "rank", "--port", "0")
    assert result.exit_code == 1
    assert result.stderr.splitlines()[0] == "Error: --pooling rank needs a classification head, and tiny.gguf has none"


# ---------------------------------------------------------------- against llama-embedding itself

LLAMA_EMBEDDING = Path(os.environ.get("LLAMA_CPP_BIN", "/nonexistent")) / "llama-embedding"


def llama_embedding_array(model: Path, *args: str) -> np.ndarray:
    """llama-embedding's --embd-output-format array. Its log thread can drop the end of stdout when the
    process exits (the queue's end marker overtakes entries still queued), so a cut answer is asked again."""
    for _ in range(20):
        proc = subprocess.run([str(LLAMA_EMBEDDING), "-m", str(model), *FAST, "-p", PROMPTS, *args,
                               "--embd-output-format", "array"], capture_output=True, timeout=120)
        assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
        try:
            return np.array(json.loads(proc.stdout.decode().strip()))
        except json.JSONDecodeError:
            continue
    raise AssertionError("llama-embedding cut its output 20 times in a row")


@pytest.mark.reference
@pytest.mark.skipif(not LLAMA_EMBEDDING.is_file(), reason="set LLAMA_CPP_BIN to a folder with llama-embedding")
@pytest.mark.parametrize("pooling", POOLINGS)
@pytest.mark.parametrize("normalize", ["2", "-1"])
def test_embeddings_equal_llama_embedding_s(tiny_model: Path, pooling: str, normalize: str) -> None:
    args = ("--pooling", pooling, "--embd-normalize", normalize)
    theirs = llama_embedding_array(tiny_model, *args)
    ours = vectors(tiny_model, *args)
    assert ours.shape == theirs.shape
    assert np.abs(ours - theirs).max() <= 1e-5


@pytest.mark.reference
@pytest.mark.skipif(not LLAMA_EMBEDDING.is_file(), reason="set LLAMA_CPP_BIN to a folder with llama-embedding")
@pytest.mark.parametrize("pooling", ["mean", "cls", "last"])
def test_served_embeddings_equal_llama_embedding_s(tiny_model: Path, pooling: str) -> None:
    import time

    from fastapi.testclient import TestClient

    from pyllama_cli.core.embed.pooling import pooling_type
    from pyllama_cli.core.model.settings import LoadSettings
    from pyllama_cli.core.serving.embedding_engine import EmbeddingEngine
    from pyllama_cli.server.app import create_app
    from pyllama_cli.server.model_set import OneModel
    from pyllama_cli.server.settings import ServerSettings

    engine = EmbeddingEngine(tiny_model, LoadSettings(n_ctx=512, n_threads=1), pooling=pooling_type(pooling))
    settings = ServerSettings(alias="tiny")
    with TestClient(create_app(OneModel(engine, settings), settings)) as client:
        deadline = time.monotonic() + 60
        while client.get("/health").status_code != 200:
            assert time.monotonic() < deadline, "the model did not load"
            time.sleep(0.02)
        answer = client.post("/v1/embeddings", json={"input": PROMPTS.split("\n")}).json()
    served = np.array([d["embedding"] for d in answer["data"]])
    theirs = llama_embedding_array(tiny_model, "--pooling", pooling)
    assert served.shape == theirs.shape
    assert np.abs(served - theirs).max() <= 1e-5


RANK_PROMPTS = "what is a fox\tthe quick brown fox\nwhat is a fox\thello world\nhello\thello world"


@pytest.fixture(scope="module")
def reranker(models_dir: Path) -> Path:
    from tests.fixtures.make_reranker import write_reranker_gguf

    return write_reranker_gguf(models_dir / "embed-reranker.gguf")


def test_rank_pooling_prints_the_head_s_scores(reranker: Path) -> None:
    result = embed(reranker, "--pooling", "rank", "--embd-normalize", "-1", prompt=RANK_PROMPTS)
    assert result.exit_code == 0, result.stderr
    rows = np.array([[float(x) for x in line.split(" ")] for line in result.stdout.splitlines()])
    assert rows.shape == (3, 2)  # one line per pair, one column per label ("yes", "no")
    assert np.allclose(rows.sum(axis=1), 1.0, atol=1e-6)  # qwen3's head ends in a softmax
    assert len(set(rows[:, 0])) == 3


@pytest.mark.reference
@pytest.mark.skipif(not LLAMA_EMBEDDING.is_file(), reason="set LLAMA_CPP_BIN to a folder with llama-embedding")
def test_rank_scores_equal_llama_embedding_s(reranker: Path) -> None:
    args = ("--pooling", "rank", "--embd-normalize", "-1")
    ours = vectors(reranker, *args, prompt=RANK_PROMPTS)
    theirs = None
    for _ in range(20):  # see llama_embedding_array
        proc = subprocess.run([str(LLAMA_EMBEDDING), "-m", str(reranker), *FAST, "-p", RANK_PROMPTS, *args,
                               "--embd-output-format", "array"], capture_output=True, timeout=120)
        # llama-embedding writes n_embd columns, only the head's n_cls_out (2) of which are scores (the
        # rest is whatever memory follows them: not JSON numbers at times), so the first two are read.
        rows = proc.stdout.decode(errors="replace").strip().removeprefix("[[").split("],[")
        if len(rows) == 3 and rows[-1].endswith("]]"):
            theirs = np.array([[float(x) for x in row.split(",")[:2]] for row in rows])
            break
    assert theirs is not None, "llama-embedding cut its output 20 times in a row"
    assert np.abs(ours - theirs).max() <= 1e-5


def test_serve_reads_llama_servers_embedding_variables() -> None:
    import typer

    from pyllama_cli import cli

    serve = typer.main.get_command(cli.build_app("serve")).get_command(None, "serve")  # type: ignore[attr-defined]
    envvars = {p.name: p.envvar for p in serve.params}
    assert [envvars[name] for name in ("embeddings_flag", "pooling", "rerank")] == [
        "LLAMA_ARG_EMBEDDINGS", "LLAMA_ARG_POOLING", "LLAMA_ARG_RERANKING"]


def test_ollama_embed_stays_l2_normalised_under_the_server_s_embd_normalize(tiny_model: Path,
                                                                           reranker: Path) -> None:
    import time

    from fastapi.testclient import TestClient

    from pyllama_cli.core.embed.pooling import RANK
    from pyllama_cli.core.model.settings import LoadSettings
    from pyllama_cli.core.serving.embedding_engine import EmbeddingEngine
    from pyllama_cli.server.app import create_app
    from pyllama_cli.server.model_set import OneModel
    from pyllama_cli.server.settings import ServerSettings

    def answers(path: Path, pooling: int, normalize: int) -> tuple[Any, Any]:
        engine = EmbeddingEngine(path, LoadSettings(n_ctx=512, n_threads=1), pooling=pooling, embd_normalize=normalize)
        settings = ServerSettings(alias="tiny", pooling=pooling, embd_normalize=normalize)
        with TestClient(create_app(OneModel(engine, settings), settings)) as client:
            deadline = time.monotonic() + 60
            while client.get("/health").status_code != 200:
                assert time.monotonic() < deadline, "the model did not load"
                time.sleep(0.02)
            return (client.post("/api/embed", json={"model": "tiny", "input": ["hello world"]}),
                    client.post("/v1/embeddings", json={"input": ["hello world"]}))

    ollama, openai = answers(tiny_model, -1, -1)  # --embd-normalize -1: /v1/embeddings gives raw vectors
    assert ollama.status_code == 200 and openai.status_code == 200
    assert abs(float(np.linalg.norm(ollama.json()["embeddings"][0])) - 1.0) < 1e-5
    assert abs(float(np.linalg.norm(openai.json()["data"][0]["embedding"])) - 1.0) > 1e-3
    ollama, _ = answers(reranker, RANK, -1)
    assert ollama.status_code == 400 and ollama.json()["error"] == (
        "this server's pooling gives no vector per input: restart it with --pooling mean, cls or last")
