"""`pyllama serve`'s ollama API, driven by the official `ollama` Python client (and the JS one, with node)."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import jsonschema
import ollama
import pytest

from tests.fixtures.fake_hf import FakeHub
from tests.fixtures.make_gguf import TINY, TINY_FIM, write_llama_gguf
from tests.helpers import SHARED_API_KEY
from tests.test_serve import Server, _start, spawn_serve

KEY = SHARED_API_KEY
AUTH = {"Authorization": f"Bearer {KEY}"}
HI = [{"role": "user", "content": "hi"}]
GREEDY = {"temperature": 0, "num_predict": 8}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                   "required": ["city"], "additionalProperties": False}}}
ANSWER = {"type": "object", "properties": {"n": {"type": "integer"}, "word": {"type": "string", "maxLength": 5}},
          "required": ["n", "word"], "additionalProperties": False}


@pytest.fixture(scope="module")
def server(keyed_server: Server) -> Server:
    """conftest.py's server with 4 slots, -c 2048 and PYLLAMA_API_KEY=KEY (test_anthropic's too)."""
    return keyed_server


def _client(server: Server, key: str = KEY) -> ollama.Client:
    return ollama.Client(host=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=60)


def _openai_chat(server: Server, messages: list[dict], **fields: object) -> dict:
    body = {"model": "m", "messages": messages, "temperature": 0, "max_tokens": 8, **fields}
    return httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=AUTH, timeout=60).json()


# ---------------------------------------------------------------- models


def test_list_show_and_ps_describe_the_served_model_from_its_header(server: Server) -> None:
    client = _client(server)
    [entry] = client.list().models
    assert entry.model == "tiny" and entry.size == os.path.getsize(server_model(server))
    assert entry.details.format == "gguf" and entry.details.family == "llama"
    assert entry.details.quantization_level == "F32" and entry.details.parameter_size.endswith("M")
    shown = client.show("llama3.2:latest")  # one model served: any name reaches it
    assert shown.capabilities == ["completion"]
    assert shown.modelinfo["general.architecture"] == "llama" and shown.modelinfo["general.parameter_count"] > 0
    assert "<|im_start|>" in shown.template and "temperature 0.8" in shown.parameters
    assert shown.details == entry.details
    [running] = client.ps().models
    assert running.model == "tiny" and running.context_length == 2048 // 4  # per slot: -c 2048 over -np 4
    assert running.expires_at.year > 2200  # one model never unloads
    assert httpx.get(f"{server.url}/api/version", headers=AUTH).json()["version"].count(".") == 2


def server_model(server: Server) -> str:
    return httpx.get(f"{server.url}/v1/models", headers=AUTH).json()["data"][0]["path"]


def test_root_says_ollama_is_running_to_clients_and_serves_the_page_to_browsers(server: Server) -> None:
    assert httpx.get(server.url).text == "Ollama is running"
    assert httpx.head(server.url).status_code == 200
    page = httpx.get(server.url, headers={"Accept": "text/html"})
    assert page.headers["content-type"].startswith("text/html")


# ---------------------------------------------------------------- chat


def test_chat_at_temperature_0_equals_the_openai_route(server: Server) -> None:
    answer = _client(server).chat(model="any", messages=HI, options=GREEDY)
    openai = _openai_chat(server, HI)
    assert answer.message.role == "assistant"
    assert answer.message.content == openai["choices"][0]["message"]["content"]
    assert answer.done and answer.done_reason == "length" and answer.eval_count == 8
    assert answer.prompt_eval_count == openai["usage"]["prompt_tokens"]
    assert answer.total_duration >= answer.eval_duration > 0 and answer.prompt_eval_duration > 0


def test_chat_stream_joins_into_the_whole_answer_and_ends_with_the_counts(server: Server) -> None:
    client = _client(server)
    whole = client.chat(model="m", messages=HI, options=GREEDY, stream=False)
    chunks = list(client.chat(model="m", messages=HI, options=GREEDY, stream=True))
    assert all(not c.done for c in chunks[:-1]) and chunks[-1].done
    assert "".join(c.message.content for c in chunks) == whole.message.content
    assert chunks[-1].eval_count == 8 and chunks[-1].done_reason == "length"


def test_chat_with_a_format_schema_answers_json_that_validates(server: Server) -> None:
    answer = _client(server).chat(model="m", messages=HI, format=ANSWER, options={"num_predict": 60, "seed": 3})
    jsonschema.validate(json.loads(answer.message.content), ANSWER)
    loose = _client(server).chat(model="m", messages=HI, format="json", options={"num_predict": 60, "seed": 3})
    assert isinstance(json.loads(loose.message.content), dict)


def test_chat_with_a_forced_tool_answers_tool_calls(server: Server) -> None:
    client = _client(server)
    answer = client.chat(model="m", messages=HI, tools=[WEATHER],
                         options={"tool_choice": "required", "num_predict": 80, "temperature": 0})
    [call] = answer.message.tool_calls
    assert call.function.name == "get_weather" and answer.message.content == ""
    jsonschema.validate(dict(call.function.arguments), WEATHER["function"]["parameters"])
    streamed = [c for c in client.chat(model="m", messages=HI, tools=[WEATHER], stream=True,
                                       options={"tool_choice": "required", "num_predict": 80, "temperature": 0})]
    calls = [call for c in streamed for call in c.message.tool_calls or ()]
    assert [c.function.name for c in calls] == ["get_weather"]
    # The call and its result go back as a conversation the template renders.
    turns = [*HI, {"role": "assistant", "content": "", "tool_calls": [call.model_dump()]},
             {"role": "tool", "content": "sunny", "tool_name": "get_weather"}]
    assert client.chat(model="m", messages=turns, tools=[WEATHER], options=GREEDY).done


# ---------------------------------------------------------------- generate


def test_generate_streamed_and_whole_agree_and_equal_the_openai_route(server: Server) -> None:
    client = _client(server)
    whole = client.generate(model="m", prompt="hi", options=GREEDY)
    chunks = list(client.generate(model="m", prompt="hi", options=GREEDY, stream=True))
    assert "".join(c.response for c in chunks) == whole.response and chunks[-1].done
    assert chunks[-1].context == whole.context
    assert whole.response == _openai_chat(server, HI)["choices"][0]["message"]["content"]
    brief = client.generate(model="m", prompt="hi", system="Be brief.", options=GREEDY)
    system = [{"role": "system", "content": "Be brief."}, *HI]
    assert brief.response == _openai_chat(server, system)["choices"][0]["message"]["content"] != whole.response


def test_context_continues_as_one_longer_request_would(server: Server) -> None:
    client = _client(server)
    first = client.generate(model="m", prompt="hello", raw=True, options=GREEDY)
    more = client.generate(model="m", prompt=" world", raw=True, context=first.context, options=GREEDY)
    tail = httpx.post(f"{server.url}/tokenize", json={"content": " world"}, headers=AUTH).json()["tokens"]
    assert more.context[: len(first.context) + len(tail)] == [*first.context, *tail]
    longer = httpx.post(f"{server.url}/v1/completions", headers=AUTH, timeout=60, json={
        "model": "m", "prompt": [*first.context, *tail], "temperature": 0, "max_tokens": 8}).json()
    assert more.response == longer["choices"][0]["text"] and more.prompt_eval_count == len(first.context) + len(tail)


def test_an_empty_generate_loads_and_says_so(server: Server) -> None:
    loaded = _client(server).generate(model="m", prompt="")
    assert loaded.done and loaded.done_reason == "load" and loaded.response == ""


# ---------------------------------------------------------------- thinking, embeddings


@pytest.fixture(scope="module")
def thinker(thinking_server: Server) -> Server:
    """conftest.py's server of a template that opens <think>, --reasoning-budget 3 (test_reasoning's too)."""
    return thinking_server


def test_think_true_answers_thinking_apart_from_content(thinker: Server) -> None:
    answer = _client(thinker).chat(model="m", messages=HI, think=True, options=GREEDY)
    openai = _openai_chat(thinker, HI)["choices"][0]["message"]
    assert answer.message.thinking and answer.message.thinking == openai["reasoning_content"]
    assert answer.message.content == openai["content"]
    assert "<think>" not in answer.message.content and "</think>" not in answer.message.content
    assert _client(thinker).show("m").capabilities == ["completion", "thinking"]
    chunks = list(_client(thinker).chat(model="m", messages=HI, think=True, options=GREEDY, stream=True))
    assert "".join(c.message.thinking or "" for c in chunks) == answer.message.thinking
    assert "".join(c.message.content for c in chunks) == answer.message.content


@pytest.fixture(scope="module")
def embedder(embedding_server: Server) -> Server:
    """The session's embedding server (conftest.py): same model and flags this module would start."""
    return embedding_server


def test_embed_gives_normalised_vectors_equal_to_the_openai_route(embedder: Server) -> None:
    client = ollama.Client(host=embedder.url, timeout=60)
    result = client.embed(model="m", input=["hello", "world"])
    openai = httpx.post(f"{embedder.url}/v1/embeddings", json={"input": ["hello", "world"]}).json()["data"]
    assert len(result.embeddings) == 2 and result.prompt_eval_count > 0
    for ours, theirs in zip(result.embeddings, openai):
        assert ours == pytest.approx(theirs["embedding"], abs=1e-6)
        assert math.fsum(v * v for v in ours) == pytest.approx(1.0, abs=1e-5)
    short = client.embed(model="m", input="hello", dimensions=4).embeddings[0]
    assert len(short) == 4 and math.fsum(v * v for v in short) == pytest.approx(1.0, abs=1e-5)
    legacy = client.embeddings(model="m", prompt="hello").embedding
    assert legacy == pytest.approx(result.embeddings[0], abs=1e-6)


def test_chat_on_an_embeddings_server_is_the_spine_s_400_in_ollamas_shape(embedder: Server) -> None:
    answer = httpx.post(f"{embedder.url}/api/chat", json={"model": "m", "messages": HI}, timeout=60)
    assert answer.status_code == 400
    assert answer.json() == {"error": "this server was started with --embeddings: it serves /v1/embeddings only"}


def test_embed_on_a_generation_server_is_a_400_in_ollamas_shape(server: Server) -> None:
    with pytest.raises(ollama.ResponseError) as caught:
        _client(server).embed(model="m", input="hi")
    assert caught.value.status_code == 400 and "--embeddings" in caught.value.error


# ---------------------------------------------------------------- errors


def test_errors_take_ollamas_shape_and_status(server: Server) -> None:
    with pytest.raises(ollama.ResponseError) as caught:
        _client(server, key="wrong").list()
    assert caught.value.status_code == 401 and caught.value.error == "invalid API key"
    with pytest.raises(ollama.ResponseError) as caught:
        _client(server).create(model="x", from_="tiny")
    assert caught.value.status_code == 501 and "not supported" in caught.value.error
    bad = httpx.post(f"{server.url}/api/chat", headers=AUTH, json={"model": "m", "messages": [{"role": "bot"}]})
    assert bad.status_code == 400 and list(bad.json()) == ["error"] and bad.json()["error"].startswith("messages[0]")
    missing = httpx.post(f"{server.url}/api/show", headers=AUTH, json={})
    assert missing.status_code == 400 and missing.json() == {"error": "model is required"}


HOSTILE = [
    ("POST", "/api/chat", b"{"), ("POST", "/api/chat", b"[]"), ("POST", "/api/chat", b'"x"'),
    ("POST", "/api/chat", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "options": {"num_predict": 0}}),
    ("POST", "/api/chat", {"model": "m", "messages": [{"role": "user", "content": 5}]}),
    ("POST", "/api/chat", {"model": "m", "messages": HI, "options": {"temperature": "hot"}}),
    ("POST", "/api/chat", {"model": "m", "messages": HI, "options": {"mirostat": 7}}),
    ("POST", "/api/chat", {"model": "m", "messages": HI, "options": {"mirostat_tau": "x"}}),
    ("POST", "/api/chat", {"model": "m", "messages": HI, "options": {"stop": [1, 2]}}),
    ("POST", "/api/chat", {"model": "m", "messages": HI, "options": []}),
    ("POST", "/api/chat", {"model": "m", "messages": HI, "format": "xml"}),
    ("POST", "/api/chat", {"model": "m", "messages": HI, "format": {"type": "bogus"}}),
    ("POST", "/api/chat", {"model": "m", "messages": HI, "tools": [{"type": "function"}]}),
    ("POST", "/api/chat", {"model": "m", "messages": HI, "tools": [WEATHER], "tool_choice": {"x": 1}}),
    ("POST", "/api/chat", {"model": "m", "messages": HI, "think": "very"}),
    ("POST", "/api/chat", {"model": "m", "messages": HI, "keep_alive": "forever"}),
    ("POST", "/api/chat", {"model": "m", "messages": [{"role": "user", "content": "hi", "images": ["AAAA"]}]}),
    ("POST", "/api/chat", {"model": "m", "messages": [{"role": "assistant", "content": "",
                                                       "tool_calls": [{"function": {"name": "f", "arguments": 3}}]}]}),
    ("POST", "/api/chat", {"model": "m", "messages": [{"role": "user", "content": "\ud800"}]}),
    ("POST", "/api/chat", {"model": "m", "messages": HI, "options": {"num_predict": 10**30}}),
    ("POST", "/api/chat", {"model": "m", "messages": HI, "options": {"seed": -(10**30)}}),
    ("POST", "/api/generate", {"model": "m", "prompt": "hi", "context": [-1, 10**12]}),
    ("POST", "/api/generate", {"model": "m", "prompt": "hi", "context": "abc"}),
    ("POST", "/api/generate", {"model": "m", "prompt": "hi", "suffix": "end"}),
    ("POST", "/api/generate", {"model": "m", "prompt": "hi", "images": ["AAAA"]}),
    ("POST", "/api/generate", {"model": "m", "prompt": "x" * 20000, "raw": True}),
    ("POST", "/api/generate", {"model": "m", "prompt": "hi", "options": {"top_k": -5, "top_p": 9}}),
    ("POST", "/api/generate", {"model": "", "prompt": "hi"}),
    ("POST", "/api/embed", {"model": "m", "input": [1, 2]}),
    ("POST", "/api/embed", {"model": "m", "input": "hi", "dimensions": -1}),
    ("POST", "/api/embeddings", {"model": "m", "prompt": {"a": 1}}),
    ("POST", "/api/show", {"model": 5}), ("POST", "/api/show", b"null"),
    ("POST", "/api/pull", {"model": "llama3.2:3b"}), ("POST", "/api/pull", {"model": "hf.co/../..:x"}),
    ("POST", "/api/pull", {"model": "hf.co/bad repo"}),
    ("DELETE", "/api/delete", {"model": "llama3.2"}), ("DELETE", "/api/delete", {"model": "hf.co/org/none:Q4_0"}),
    ("POST", "/api/copy", {"source": "", "destination": "x"}), ("POST", "/api/copy", {"source": "m"}),
    ("POST", "/api/push", {"model": "m"}), ("HEAD", "/api/blobs/sha256:00", None), ("POST", "/api/blobs/x", b"abc"),
    ("GET", "/api/chat", None), ("PUT", "/api/tags", None), ("GET", "/api/nothing", None),
]


@pytest.mark.parametrize(("method", "path", "body"), HOSTILE, ids=[f"{m} {p} {i}" for i, (m, p, _) in enumerate(HOSTILE)])
def test_hostile_bodies_get_a_clear_error_in_ollamas_shape(server: Server, method: str, path: str,
                                                           body: object) -> None:
    content = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    response = httpx.request(method, f"{server.url}{path}", content=content, timeout=60,
                             headers={**AUTH, "Content-Type": "application/json"})
    assert response.status_code < 500 or response.status_code == 501, response.text
    if response.status_code >= 400 and method != "HEAD":
        error = response.json()
        assert list(error) == ["error"] and isinstance(error["error"], str) and error["error"]
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200


# ---------------------------------------------------------------- pull and delete


@pytest.fixture(scope="module")
def hub(tiny_model: Path) -> Iterator[FakeHub]:
    with FakeHub() as fake:
        fake.add_repo("org/tiny-GGUF", {"tiny-Q8_0.gguf": tiny_model, "tiny-F32.gguf": tiny_model})
        yield fake


@pytest.fixture(scope="module")
def puller(models_dir: Path, hub: FakeHub, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A verbose server of a model with fill-in-the-middle tokens, whose Hub is the fake one."""
    model = write_llama_gguf(models_dir / "ollama-fim.gguf", TINY_FIM)
    srv = _start(model, tmp_path_factory.mktemp("serve-ollama-pull") / "stderr.log", "-v",
                 env={"HF_ENDPOINT": hub.url})
    yield srv
    srv.stop()


def test_pull_from_the_hub_streams_progress_then_delete_removes_it(puller: Server, tiny_model: Path) -> None:
    client = ollama.Client(host=puller.url, timeout=60)
    progress = list(client.pull("hf.co/org/tiny-GGUF:Q8_0", stream=True))
    statuses = [p.status for p in progress]
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success"
    pulling = [p for p in progress if p.status.startswith("pulling ") and p.digest]
    assert [p.completed for p in pulling] == sorted(p.completed for p in pulling)
    assert pulling and pulling[-1].completed == pulling[-1].total == os.path.getsize(tiny_model)
    cache = puller.log.parent / "home" / "hf" / "hub" / "models--org--tiny-GGUF"
    assert [p.name for p in cache.glob("snapshots/*/*.gguf")] == ["tiny-Q8_0.gguf"]
    assert client.pull("hf.co/org/tiny-GGUF:Q8_0").status == "success"  # cached: nothing to fetch again
    client.delete("hf.co/org/tiny-GGUF:Q8_0")
    assert not list(cache.glob("snapshots/*/*.gguf"))
    with pytest.raises(ollama.ResponseError) as caught:
        client.delete("hf.co/org/tiny-GGUF:Q8_0")
    assert caught.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as caught:
        client.pull("hf.co/org/tiny-GGUF:Q2_K")
    assert "Q2_K" in caught.value.error


def test_a_pull_cut_by_a_killed_server_resumes_where_it_stopped(tiny_model: Path, hub: FakeHub,
                                                                tmp_path: Path) -> None:
    hub.range_headers.clear()
    hub.stall_after = 3 * 2**20  # hold the download after 3 MiB of tiny's 6.5
    first = _start(tiny_model, tmp_path / "first.log", env={"HF_ENDPOINT": hub.url})
    try:
        with httpx.stream("POST", f"{first.url}/api/pull", json={"model": "hf.co/org/tiny-GGUF:F32"},
                          timeout=60) as response:
            for line in response.iter_lines():
                if json.loads(line).get("completed", 0) >= 2 * 2**20:
                    break
    finally:
        first.proc.kill()
        first.proc.wait(timeout=10)
        hub.stall_after = None
    second = _start(tiny_model, tmp_path / "second.log", env={"HF_ENDPOINT": hub.url})  # the same HF cache
    try:
        progress = list(ollama.Client(host=second.url, timeout=60).pull("hf.co/org/tiny-GGUF:F32", stream=True))
    finally:
        second.stop()
    [kept] = [int(h.removeprefix("bytes=").rstrip("-")) for h in hub.range_headers]
    assert kept >= 2 * 2**20
    sizes = [(p.completed, p.total) for p in progress if p.digest]
    assert sizes[0] == (kept, os.path.getsize(tiny_model)) and sizes[-1][0] == sizes[-1][1]
    assert progress[-1].status == "success"


def test_copy_adds_a_name_that_lists_and_answers(puller: Server) -> None:
    client = ollama.Client(host=puller.url, timeout=60)
    client.copy("tiny", "my-copy:latest")
    assert "my-copy:latest" in [m.model for m in client.list().models]
    client.delete("my-copy:latest")
    assert "my-copy:latest" not in [m.model for m in client.list().models]


def test_suffix_fills_the_middle_as_infill_does(puller: Server) -> None:
    client = ollama.Client(host=puller.url, timeout=60)
    middle = client.generate(model="m", prompt="def add(a, b):", suffix="    return c", options=GREEDY)
    infill = httpx.post(f"{puller.url}/infill", timeout=60, json={
        "input_prefix": "def add(a, b):", "input_suffix": "    return c", "temperature": 0, "n_predict": 8}).json()
    assert middle.response == infill["content"] and middle.eval_count == 8
    assert "insert" in client.show("m").capabilities


def test_options_a_server_cannot_honour_are_ignored_and_logged_with_v(puller: Server) -> None:
    answer = ollama.Client(host=puller.url, timeout=60).chat(
        model="m", messages=HI, options={**GREEDY, "num_ctx": 99, "num_thread": 3, "mirostat": 2})
    assert answer.done and answer.eval_count == 8
    assert "options.num_ctx is ignored" in puller.stderr and "options.num_thread is ignored" in puller.stderr
    assert "options.mirostat is ignored" not in puller.stderr  # mirostat is honoured


# ---------------------------------------------------------------- router mode


@pytest.fixture(scope="module")
def router(hub: FakeHub, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """alpha and beta from a folder, and tiny-Q8_0 of org/tiny-GGUF from the Hugging Face cache."""
    from huggingface_hub import hf_hub_download

    folder = tmp_path_factory.mktemp("ollama-router-models")
    write_llama_gguf(folder / "alpha.gguf", TINY)
    write_llama_gguf(folder / "beta.gguf", replace(TINY, seed=1))
    hf_home = tmp_path_factory.mktemp("ollama-router-hf")
    hf_hub_download("org/tiny-GGUF", "tiny-Q8_0.gguf", endpoint=hub.url, cache_dir=hf_home / "hub")
    srv = spawn_serve(tmp_path_factory.mktemp("ollama-router") / "stderr.log",
                      ["--models-dir", str(folder), "--models-cache", "-c", "512", "--sleep-idle-seconds", "300"],
                      env={"HF_HOME": str(hf_home)})
    yield srv
    srv.stop()


def test_router_answers_two_models_by_name_and_ps_shows_expiry(router: Server) -> None:
    client = ollama.Client(host=router.url, timeout=60)
    assert sorted(m.model for m in client.list().models) == ["alpha", "beta", "tiny-Q8_0"]
    a = client.chat(model="alpha:latest", messages=HI, options=GREEDY)
    b = client.chat(model="beta", messages=HI, options=GREEDY)
    assert (a.model, b.model) == ("alpha", "beta") and a.message.content != b.message.content
    running = {m.model: m for m in client.ps().models}
    assert set(running) == {"alpha", "beta"}
    from datetime import datetime, timezone

    left = (running["alpha"].expires_at - datetime.now(timezone.utc)).total_seconds()
    assert 250 < left <= 300
    with pytest.raises(ollama.ResponseError) as caught:
        client.chat(model="gamma", messages=HI)
    assert caught.value.status_code == 404 and caught.value.error == 'model "gamma" not found, try pulling it first'


def test_router_maps_hf_co_names_onto_the_cached_gguf(router: Server) -> None:
    client = ollama.Client(host=router.url, timeout=60)
    for name in ("hf.co/org/tiny-GGUF:Q8_0", "hf.co/org/tiny-GGUF:q8_0", "hf.co/org/tiny-GGUF"):
        assert client.generate(model=name, prompt="hi", options=GREEDY, keep_alive=0).model == "tiny-Q8_0"
    assert client.show("hf.co/org/tiny-GGUF:Q8_0").details.quantization_level == "F32"  # the bytes are tiny's
    with pytest.raises(ollama.ResponseError) as caught:
        client.show("hf.co/org/tiny-GGUF:Q4_K_M")
    assert caught.value.status_code == 404


def test_router_keep_alive_0_unloads_after_the_request(router: Server) -> None:
    client = ollama.Client(host=router.url, timeout=60)
    client.generate(model="beta", prompt="hi", options=GREEDY, keep_alive="10m")
    assert "beta" in [m.model for m in client.ps().models]
    unloading = client.generate(model="beta", prompt="", keep_alive=0)
    assert unloading.done_reason == "unload"
    import time

    deadline = time.monotonic() + 10
    while "beta" in [m.model for m in client.ps().models]:
        assert time.monotonic() < deadline, "beta stayed loaded"
        time.sleep(0.05)


# ---------------------------------------------------------------- the JavaScript client


def _npm_ollama() -> Path:
    """node_modules with the `ollama` package, installed once into a cache folder (skips without npm)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are needed for the JavaScript client")
    where = Path(os.environ.get("PYLLAMA_NPM_CACHE", Path.home() / ".cache" / "pyllama-tests" / "npm-ollama"))
    if not (where / "node_modules" / "ollama" / "package.json").exists():
        where.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["npm", "install", "--prefix", str(where), "--no-audit", "--no-fund", "ollama@0.6"],
                              capture_output=True, text=True, timeout=180)
        if done.returncode != 0:
            pytest.skip(f"npm could not install ollama: {done.stderr.strip()[-200:]}")
    return where / "node_modules"


JS = """
import { Ollama } from 'ollama'
const client = new Ollama({ host: process.env.HOST, headers: { Authorization: 'Bearer ' + process.env.KEY } })
const parts = []
let last
for await (const part of await client.chat({ model: 'm', messages: [{ role: 'user', content: 'hi' }],
                                             stream: true, options: { temperature: 0, num_predict: 8 } })) {
  parts.push(part.message.content); last = part
}
const list = await client.list()
const shown = await client.show({ model: 'm' })
console.log(JSON.stringify({ text: parts.join(''), done: last.done, eval_count: last.eval_count,
  models: list.models.map(m => m.model), family: shown.details.family, capabilities: shown.capabilities }))
"""


def test_the_javascript_client_streams_chat_lists_and_shows(server: Server, tmp_path: Path) -> None:
    modules = _npm_ollama()
    script = tmp_path / "client.mjs"
    script.write_text(JS)
    (tmp_path / "node_modules").symlink_to(modules)
    done = subprocess.run(["node", str(script)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "HOST": server.url, "KEY": KEY})
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    whole = _client(server).chat(model="m", messages=HI, options=GREEDY).message.content
    assert result == {"text": whole, "done": True, "eval_count": 8, "models": ["tiny"], "family": "llama",
                      "capabilities": ["completion"]}
