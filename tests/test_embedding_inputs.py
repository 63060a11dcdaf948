"""/v1/embeddings takes every input shape llama-server takes: mixed strings and ids, lists mixing
strings and token lists, {"prompt_string"} and {"content": [parts]} entries. Each shape must give
the vector of the tokens it stands for (checked against plain token-id inputs), and each bad shape a
400 naming `input`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.test_serve import Server, spawn_serve


@pytest.fixture(scope="module")
def server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    # -b 128 (llama-server's bert_bge_small preset): fewer tokens per batch than llama.cpp's 256
    # sequences, which aborted the embedding context before its sequences were capped by the batch.
    log = tmp_path_factory.mktemp("serve-embd-inputs") / "stderr.log"
    srv = spawn_serve(log, ["-m", str(tiny_model), "-c", "512", "-b", "128", "--embeddings", "--pooling", "mean"])
    yield srv
    srv.stop()


def post(server: Server, value: Any) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/embeddings", json={"input": value}, timeout=60)


def rows(server: Server, value: Any) -> tuple[np.ndarray, int]:
    response = post(server, value)
    assert response.status_code == 200, response.text
    body = response.json()
    assert [d["index"] for d in body["data"]] == list(range(len(body["data"])))
    return np.array([d["embedding"] for d in body["data"]]), body["usage"]["prompt_tokens"]


def tokens(server: Server, text: str, add_special: bool) -> list[int]:
    answer = httpx.post(f"{server.url}/tokenize", json={"content": text, "add_special": add_special}, timeout=30)
    return answer.json()["tokens"]


def test_a_mixed_array_is_one_prompt_with_bos_only_before_a_leading_string(server: Server) -> None:
    hello, world = tokens(server, "hello", True), tokens(server, " world", False)
    assert hello[0] == 1 and world[0] != 1  # the tiny model's BOS is id 1
    mixed, n_mixed = rows(server, ["hello", 12, 34, " world"])
    plain, n_plain = rows(server, [*hello, 12, 34, *world])
    assert mixed.shape == (1, 256) and n_mixed == n_plain == len(hello) + 2 + len(world)
    assert np.allclose(mixed, plain, atol=1e-6)
    led_by_id, n_led = rows(server, [12, "hello"])  # no BOS: the string is not first
    assert n_led == 1 + len(tokens(server, "hello", False))
    assert np.allclose(led_by_id, rows(server, [12, *tokens(server, "hello", False)])[0], atol=1e-6)


def test_a_list_may_mix_strings_token_lists_and_mixed_lists(server: Server) -> None:
    ids = tokens(server, "hello world", True)
    assert ids == [1, *tokens(server, "hello world", False)]
    got, n_tokens = rows(server, ["hello world", ids, [1, "hello world"]])
    assert got.shape == (3, 256) and n_tokens == 3 * len(ids)
    assert np.allclose(got[0], got[1], atol=1e-6) and np.allclose(got[1], got[2], atol=1e-6)


def test_prompt_string_and_content_entries_embed_their_text(server: Server) -> None:
    text, n_text = rows(server, "hello world")
    parts = {"content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]}
    for entry in ({"prompt_string": "hello world"}, parts, {"prompt_string": [1, "hello world"]}):
        got, n_tokens = rows(server, entry)
        assert got.shape == (1, 256) and n_tokens == n_text
        assert np.allclose(got, text, atol=1e-6), entry
    listed, n_listed = rows(server, ["the fox", {"prompt_string": "hello world"}, parts])
    assert listed.shape == (3, 256) and np.allclose(listed[1:], np.vstack([text, text]), atol=1e-6)
    assert not np.allclose(listed[0], text[0], atol=1e-3)


@pytest.mark.parametrize("value,message", [
    ([], "input is empty: give a string, token ids, or a list of them"),
    ({"content": "hello"}, 'content must be a list of parts, e.g. [{"type": "text", "text": "..."}]'),
    ({"content": [{"type": "unknown"}]}, "content parts must be {\"type\": \"text\", \"text\": \"...\"}; got type 'unknown'"),
    ({"content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]},
     "a image_url part needs a multimodal model, and this one reads text only"),
    ({"prompt_string": "x", "multimodal_data": ["AAAA"]},
     "multimodal_data needs a multimodal model, and this one reads text only"),
    ([{"text": "hello"}], "each input must be a string, a list of token ids (strings may be mixed in), "
                          '{"prompt_string": ...} or {"content": [{"type": "text", "text": ...}]}'),
    ([["hello", "world"]], "each input must be a string, a list of token ids (strings may be mixed in), "
                           '{"prompt_string": ...} or {"content": [{"type": "text", "text": ...}]}'),
    ([12, "hello", 99999], "token id 99999 is out of range: the vocabulary has ids 0..1023"),
])
def test_a_bad_input_shape_is_a_400_naming_input(server: Server, value: Any, message: str) -> None:
    response = post(server, value)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["message"], error["param"], error["type"]) == (message, "input", "invalid_request_error")
