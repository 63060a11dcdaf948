"""serve with LoRA adapters: /lora-adapters, a request's `lora` scales, and requests of different sets at once."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.fixtures.make_adapters import write_lora_gguf
from tests.test_serve import Server, _llama_server, spawn_serve

PROMPT = "hello world"
SETS = [[], [{"id": 0, "scale": 1.0}], [{"id": 0, "scale": 0.5}], [{"id": 0, "scale": 1.0}, {"id": 1, "scale": 1.0}]]


@pytest.fixture(scope="module")
def loras(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folder = tmp_path_factory.mktemp("loras")
    return [write_lora_gguf(folder / "a.gguf", seed=1), write_lora_gguf(folder / "b.gguf", seed=3)]


@pytest.fixture(scope="module")
def lora_server(tiny_model: Path, loras: list[Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("serve-lora") / "stderr.log"
    srv = spawn_serve(log, ["-m", str(tiny_model), "-c", "1024", "-np", "4", "--lora", f"{loras[0]},{loras[1]}",
                            "--lora-init-without-apply"])
    yield srv
    srv.stop()


def _complete(url: str, lora: list[dict] | None = None, path: str = "/completion") -> httpx.Response:
    body: dict = {"prompt": PROMPT, "n_predict": 12, "temperature": 0}
    if path != "/completion":
        body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0}
    if lora is not None:
        body["lora"] = lora
    return httpx.post(f"{url}{path}", json=body, timeout=60)


def _text(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    body = response.json()
    return body["content"] if "content" in body else body["choices"][0]["text"]


def test_lora_adapters_round_trip(lora_server: Server, loras: list[Path]) -> None:
    listed = httpx.get(f"{lora_server.url}/lora-adapters").json()
    assert [(a["id"], a["path"], a["scale"]) for a in listed] == [(0, str(loras[0]), 0.0), (1, str(loras[1]), 0.0)]
    base = _text(_complete(lora_server.url))
    assert httpx.post(f"{lora_server.url}/lora-adapters", json=[{"id": 1, "scale": 0.5}]).json() == {"success": True}
    listed = httpx.get(f"{lora_server.url}/lora-adapters").json()
    assert [a["scale"] for a in listed] == [0.0, 0.5]
    # The global scales are what a request without `lora` gets, and equal the same scales asked per request.
    assert _text(_complete(lora_server.url)) == _text(_complete(lora_server.url, [{"id": 1, "scale": 0.5}])) != base
    assert httpx.post(f"{lora_server.url}/lora-adapters", json=[]).json() == {"success": True}
    assert [a["scale"] for a in httpx.get(f"{lora_server.url}/lora-adapters").json()] == [0.0, 0.0]
    assert _text(_complete(lora_server.url)) == base


def test_each_adapter_set_gets_its_own_answer_when_run_together(lora_server: Server) -> None:
    alone = [_text(_complete(lora_server.url, s)) for s in SETS]
    assert len(set(alone)) == len(SETS), alone
    with ThreadPoolExecutor(len(SETS)) as pool:
        for _ in range(2):
            together = list(pool.map(lambda s: _text(_complete(lora_server.url, s)), SETS))
            assert together == alone


@pytest.mark.parametrize("path", ["/completion", "/v1/completions"])
def test_the_lora_field_on_every_completion_route(lora_server: Server, path: str) -> None:
    assert _text(_complete(lora_server.url, SETS[1], path)) == _text(_complete(lora_server.url, SETS[1]))
    assert _text(_complete(lora_server.url, SETS[1], path)) != _text(_complete(lora_server.url, [], path))


def test_chat_takes_lora(lora_server: Server) -> None:
    def chat(lora: list[dict]) -> str:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0, "lora": lora}
        answer = httpx.post(f"{lora_server.url}/v1/chat/completions", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        return answer.json()["choices"][0]["message"]["content"]

    assert chat(SETS[1]) != chat(SETS[0])


@pytest.mark.parametrize(("lora", "message"), [
    ([{"id": 2, "scale": 1.0}], "lora: no LoRA adapter with id 2 (loaded: ids 0..1)"),
    ([{"id": -1, "scale": 1.0}], "lora: no LoRA adapter with id -1 (loaded: ids 0..1)"),
    ({"id": 0}, "lora must be an array of objects with 'id' and 'scale' fields"),
    ([{"id": 0, "scale": "big"}], "lora must be an array of objects with 'id' and 'scale' fields"),
])
@pytest.mark.parametrize("path", ["/completion", "/v1/completions"])
def test_a_bad_lora_field_is_a_400(lora_server: Server, lora: object, message: str, path: str) -> None:
    answer = _complete(lora_server.url, lora, path)  # type: ignore[arg-type]
    assert answer.status_code == 400
    assert answer.json()["error"] | {"message": message, "param": "lora"} == answer.json()["error"]


def test_setting_an_unknown_adapter_is_a_400(lora_server: Server) -> None:
    answer = httpx.post(f"{lora_server.url}/lora-adapters", json=[{"id": 5, "scale": 1}])
    assert answer.status_code == 400
    assert answer.json()["error"]["message"] == "body: no LoRA adapter with id 5 (loaded: ids 0..1)"
    answer = httpx.post(f"{lora_server.url}/lora-adapters", json={"id": 0})
    assert (answer.status_code, answer.json()["error"]["message"]) == (400, "Request body must be an array")


# ---------------------------------------------------------------- against llama-server itself

LLAMA_SERVER = Path(os.environ.get("LLAMA_CPP_BIN", "/nonexistent")) / "llama-server"


@pytest.mark.reference
@pytest.mark.skipif(not LLAMA_SERVER.is_file(), reason="set LLAMA_CPP_BIN to a folder with llama-server")
def test_per_request_scales_equal_llama_server_s(lora_server: Server, tiny_model: Path, loras: list[Path],
                                                 tmp_path: Path) -> None:
    with _llama_server(tiny_model, tmp_path / "llama-server.log", "--lora", f"{loras[0]},{loras[1]}",
                       "--lora-init-without-apply") as url:
        # Lists that name an adapter: the two servers' global scales differ (see docs/server.md, LoRA).
        for lora in [[{"id": 0, "scale": 0.0}], *SETS[1:], [{"id": 1, "scale": 0.25}]]:
            assert _text(_complete(lora_server.url, lora)) == _text(_complete(url, lora)), lora


def test_router_presets_take_lora_and_a_reranker_is_one_more_model(tiny_model: Path, loras: list[Path],
                                                                    tmp_path: Path) -> None:
    from tests.fixtures.make_reranker import write_reranker_gguf

    reranker = write_reranker_gguf(tmp_path / "reranker.gguf")
    preset = tmp_path / "presets.ini"
    preset.write_text(f"[tiny]\nlora = {loras[0]}\n")
    srv = spawn_serve(tmp_path / "stderr.log", ["-m", str(tiny_model), "-m", str(reranker), "-c", "512",
                                                "--models-preset", str(preset)])
    try:
        body = {"model": "tiny", "prompt": PROMPT, "n_predict": 12, "temperature": 0}
        adapted = _text(httpx.post(f"{srv.url}/completion", json=body, timeout=60))
        plain = _text(httpx.post(f"{srv.url}/completion", json={**body, "lora": [{"id": 0, "scale": 0}]}, timeout=60))
        assert adapted != plain
        listed = httpx.get(f"{srv.url}/lora-adapters", params={"model": "tiny"}).json()
        assert [(a["id"], a["path"], a["scale"]) for a in listed] == [(0, str(loras[0]), 1.0)]
        ranked = httpx.post(f"{srv.url}/v1/rerank", json={"model": "reranker", "query": "fox",
                                                          "documents": ["a fox", "hello"]}, timeout=60)
        assert ranked.status_code == 200, ranked.text
        assert sorted(r["index"] for r in ranked.json()["results"]) == [0, 1]
    finally:
        srv.stop()
