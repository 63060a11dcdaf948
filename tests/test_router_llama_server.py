"""Router mode as llama-server's router answers: GET /props without a model is the router's own,
--no-models-autoload leaves a model unloaded until POST /models/load, and /tokenize, /detokenize,
/apply-template and the token counters read the model from the body."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import httpx
import pytest

from tests.fixtures.make_gguf import TINY, write_llama_gguf
from tests.test_serve import Server, spawn_serve

HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("router-ls")
    alpha = write_llama_gguf(folder / "alpha.gguf", TINY)
    beta = write_llama_gguf(folder / "beta.gguf", replace(TINY, seed=1))
    server = spawn_serve(folder / "stderr.log", ["-m", str(alpha), "-m", str(beta), "-c", "512", "--models-max", "2",
                                                 "--no-models-autoload"], timeout=60)
    yield server
    server.stop()


def _post(server: Server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=60)


def test_props_without_a_model_are_the_routers_own(router: Server) -> None:
    props = httpx.get(f"{router.url}/props", timeout=30).json()
    assert {key: props[key] for key in ("role", "max_instances", "models_autoload")} == {
        "role": "router", "max_instances": 2, "models_autoload": False}
    assert props["build_info"].startswith("b0-")


def test_a_model_not_loaded_is_400_until_it_is_loaded(router: Server) -> None:
    refused = _post(router, "/v1/chat/completions", {"model": "alpha", "messages": HELLO, "max_tokens": 1})
    assert refused.status_code == 400
    assert (refused.json()["error"]["code"], refused.json()["error"]["param"]) == ("model_not_loaded", "model")
    assert _post(router, "/models/load", {"model": "alpha"}).json() == {"success": True}
    answer = _post(router, "/v1/chat/completions", {"model": "alpha", "messages": HELLO, "max_tokens": 1})
    assert (answer.status_code, answer.json()["model"]) == (200, "alpha")


def test_token_routes_read_the_model_from_the_body(router: Server) -> None:
    # beta is not loaded: a route that read no model from the body would ask for one (model_required)
    for path, body in (("/tokenize", {"content": "hello"}), ("/detokenize", {"tokens": [300]}),
                       ("/apply-template", {"messages": HELLO}), ("/chat/completions/input_tokens", {"messages": HELLO})):
        response = _post(router, path, {**body, "model": "beta"})
        assert (response.status_code, response.json()["error"]["code"]) == (400, "model_not_loaded"), path
        response = _post(router, path, body)
        assert (response.status_code, response.json()["error"]["code"]) == (400, "model_required"), path
    _post(router, "/models/load", {"model": "beta"})
    tokens = _post(router, "/tokenize", {"content": "hello", "model": "beta"}).json()["tokens"]
    assert _post(router, "/detokenize", {"tokens": tokens, "model": "beta"}).json() == {"content": "hello"}
    prompt = _post(router, "/apply-template", {"messages": HELLO, "model": "beta"}).json()["prompt"]
    assert prompt == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
