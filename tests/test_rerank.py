"""serve --rerank: POST /rerank and its aliases, in llama-server's shapes, against llama-server itself."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.fixtures.make_reranker import write_reranker_gguf
from tests.test_serve import Server, _llama_server, spawn_serve

QUERIES = ["what is a fox", "hello", "the lazy dog", "thank you", "which model answers"]
DOCUMENTS = ["the quick brown fox", "hello world", "yes", "a lazy dog sleeps", "thanks a lot", "the model writes text"]


@pytest.fixture(scope="module")
def reranker(models_dir: Path) -> Path:
    return write_reranker_gguf(models_dir / "reranker.gguf")


@pytest.fixture(scope="module")
def rerank_server(reranker: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = spawn_serve(tmp_path_factory.mktemp("serve-rerank") / "stderr.log",
                      ["-m", str(reranker), "-c", "512", "--rerank"])
    yield srv
    srv.stop()


def _rerank(url: str, body: dict, path: str = "/v1/rerank") -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=60)


def test_results_are_sorted_scores_with_usage(rerank_server: Server) -> None:
    answer = _rerank(rerank_server.url, {"query": QUERIES[0], "documents": DOCUMENTS})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert set(body) == {"model", "object", "usage", "results"} and body["object"] == "list"
    results = body["results"]
    assert sorted(r["index"] for r in results) == list(range(len(DOCUMENTS)))
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True) and all(0 < s < 1 for s in scores)
    assert len(set(scores)) == len(scores)
    n_tokens = body["usage"]["prompt_tokens"]
    assert n_tokens == body["usage"]["total_tokens"] > len(DOCUMENTS)


@pytest.mark.parametrize("path", ["/rerank", "/reranking", "/v1/rerank", "/v1/reranking"])
def test_every_path_answers_alike(rerank_server: Server, path: str) -> None:
    body = {"query": QUERIES[1], "documents": DOCUMENTS, "top_n": 2, "return_text": True}
    answer = _rerank(rerank_server.url, body, path).json()
    assert answer == _rerank(rerank_server.url, body).json()
    assert len(answer["results"]) == 2
    assert all(r["document"] == {"text": DOCUMENTS[r["index"]]} for r in answer["results"])


def test_tei_shape(rerank_server: Server) -> None:
    answer = _rerank(rerank_server.url, {"query": QUERIES[2], "texts": DOCUMENTS[:3], "return_text": True}).json()
    assert [set(r) for r in answer] == [{"index", "score", "text"}] * 3


@pytest.mark.parametrize(("body", "status", "message"), [
    ({"query": "x", "documents": []}, 400, '"documents" must be a non-empty string array'),
    ({"query": "x"}, 400, '"documents" must be a non-empty string array'),
    ({"documents": ["a"]}, 400, '"query" must be provided'),
    ({"query": 3, "documents": ["a"]}, 400, '"query" must be a string'),
    ({"query": "x", "documents": ["a"] * 10_000}, 413, '"documents" has 10000 documents: at most 1000 per request'),
])
def test_bad_requests_name_the_field(rerank_server: Server, body: dict, status: int, message: str) -> None:
    answer = _rerank(rerank_server.url, body)
    assert (answer.status_code, answer.json()["error"]["message"]) == (status, message)


def test_a_generating_server_does_not_rerank(server: Server) -> None:
    answer = _rerank(server.url, {"query": "x", "documents": ["a"]})  # conftest.py's plain tiny.gguf server
    assert answer.status_code == 400
    assert answer.json()["error"]["message"] == \
        "this server does not rerank: start it with --rerank and a reranker model"


def test_inputs_must_fit_the_micro_batch_as_in_llama_server(reranker: Path, tmp_path: Path) -> None:
    # llama-server cuts an embedding server's batch down to -ub: -b 2048 does not let a longer pair in.
    srv = spawn_serve(tmp_path / "stderr.log", ["-m", str(reranker), "-c", "2048", "-ub", "32", "--rerank"])
    try:
        long_document = " ".join(["the quick brown fox"] * 10)
        answer = _rerank(srv.url, {"query": "what is a fox", "documents": ["yes", long_document]})
        assert answer.status_code == 400
        assert re.fullmatch(r"document 1 with the query has \d+ tokens but at most 32 fit",
                            answer.json()["error"]["message"])
        assert _rerank(srv.url, {"query": "what is a fox", "documents": ["yes", "hello world"]}).status_code == 200
    finally:
        srv.stop()


# ---------------------------------------------------------------- against llama-server itself

LLAMA_SERVER = Path(os.environ.get("LLAMA_CPP_BIN", "/nonexistent")) / "llama-server"


@pytest.mark.reference
@pytest.mark.skipif(not LLAMA_SERVER.is_file(), reason="set LLAMA_CPP_BIN to a folder with llama-server")
def test_scores_and_order_equal_llama_server_s(rerank_server: Server, reranker: Path, tmp_path: Path) -> None:
    with _llama_server(reranker, tmp_path / "llama-server.log", "--rerank") as url:
        for query in QUERIES:
            body = {"query": query, "documents": DOCUMENTS}
            ours, theirs = _rerank(rerank_server.url, body).json(), _rerank(url, body).json()
            assert [r["index"] for r in ours["results"]] == [r["index"] for r in theirs["results"]], query
            assert np.allclose([r["relevance_score"] for r in ours["results"]],
                               [r["relevance_score"] for r in theirs["results"]], atol=1e-4, rtol=0)
            assert ours["usage"] == theirs["usage"]
