"""Behaviours llama-server's own test suite showed pyllama lacked (benchmarks/llama_server_suite.py):
llama-server's /metrics series and header, --no-metrics, its generation-rate arithmetic, timings on
prompt-progress chunks, --alias a,b,c with --tags, and ignore_eos as end-of-generation biases."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from tests.fixtures.make_gguf import EOS_ID, IM_END_ID, TINY, write_llama_gguf
from tests.test_serve import Server, spawn_serve

LONG_PROMPT = "the quick brown fox jumps over the lazy dog " * 8  # several batches of -b 32


@pytest.fixture(scope="module")
def server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("parity") / "stderr.log"
    srv = spawn_serve(log, ["-m", str(tiny_model), "-c", "512", "-b", "32", "-np", "1", "--alias", "tiny-b,tiny-a",
                            "--tags", "small, chat,small"])
    yield srv
    srv.stop()


def _complete(server: Server, body: dict) -> dict:
    response = httpx.post(f"{server.url}/completion", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def _llamacpp_series(text: str) -> dict[str, tuple[str, float]]:
    """llama-server's unlabelled series: name -> (type, value); every one must have HELP and TYPE lines."""
    types = dict(re.findall(r"^# TYPE (llamacpp:\S+) (\S+)$", text, re.MULTILINE))
    helps = set(re.findall(r"^# HELP (llamacpp:\S+) \S", text, re.MULTILINE))
    values = dict(re.findall(r"^(llamacpp:[^{\s]+) (\S+)$", text, re.MULTILINE))
    assert set(values) == set(types) == helps
    return {name: (types[name], float(value)) for name, value in values.items()}


def _scrape(server: Server) -> tuple[httpx.Response, dict[str, tuple[str, float]]]:
    response = httpx.get(f"{server.url}/metrics", timeout=30)
    assert response.status_code == 200
    return response, _llamacpp_series(response.text)


def test_metrics_carry_llama_servers_series_beside_pyllamas(server: Server) -> None:
    before = _scrape(server)[1]
    answers = [_complete(server, {"prompt": "one two three four five six", "n_predict": 3, "ignore_eos": True})
               for _ in range(2)]
    response, after = _scrape(server)
    started = int(response.headers["Process-Start-Time-Unix"])
    # in llama-server's case: its own suite reads the header from a plain dict
    assert b"Process-Start-Time-Unix" in [name for name, _ in response.headers.raw]
    assert time.time() - 600 < started <= time.time()
    assert "pyllama_generated_tokens_total" in response.text  # pyllama's own names stay

    counters = ["prompt_tokens_total", "prompt_tokens_cached_total", "prompt_seconds_total", "tokens_predicted_total",
                "tokens_predicted_seconds_total", "n_decode_total", "n_tokens_max",
                "spec_decode_num_draft_tokens_total", "spec_decode_num_accepted_tokens_total",
                "spec_decode_num_drafts_total"]
    gauges = ["prompt_tokens_seconds", "predicted_tokens_seconds", "requests_processing", "requests_deferred",
              "n_busy_slots_per_decode"]
    assert {name: kind for name, (kind, _) in after.items()} == {
        **{f"llamacpp:{n}": "counter" for n in counters}, **{f"llamacpp:{n}": "gauge" for n in gauges}}

    def grew(name: str) -> float:
        return after[f"llamacpp:{name}"][1] - before[f"llamacpp:{name}"][1]

    timings = [answer["timings"] for answer in answers]
    assert answers[1]["timings"]["cache_n"] > 0  # the second prompt was reused
    assert grew("prompt_tokens_total") == sum(t["prompt_n"] for t in timings)
    assert grew("prompt_tokens_cached_total") == sum(t["cache_n"] for t in timings)
    assert grew("tokens_predicted_total") == 6
    # one decode per prompt batch, then one per generated token after the first
    assert grew("n_decode_total") == 2 + 2 * 2
    assert after["llamacpp:n_busy_slots_per_decode"][1] == 1.0  # one slot
    assert after["llamacpp:requests_processing"][1] == 0
    assert after["llamacpp:spec_decode_num_drafts_total"][1] == 0
    assert after["llamacpp:n_tokens_max"][1] >= answers[0]["tokens_evaluated"] + 3
    # the throughput gauges cover the time since the last scrape: nothing ran since this one
    assert _scrape(server)[1]["llamacpp:predicted_tokens_seconds"][1] == 0.0


def test_no_metrics_answers_501_as_llama_server_without_metrics(tiny_model: Path, tmp_path: Path) -> None:
    srv = spawn_serve(tmp_path / "stderr.log", ["-m", str(tiny_model), "-c", "256", "--no-metrics"])
    try:
        response = httpx.get(f"{srv.url}/metrics", timeout=30)
    finally:
        srv.stop()
    assert response.status_code == 501
    assert response.json()["error"]["type"] == "not_supported_error"
    assert "--metrics" in response.json()["error"]["message"]


def test_the_generation_rate_leaves_out_the_first_token(server: Server) -> None:
    # The first token comes from the prompt's last batch: no decode step of its own.
    one = _complete(server, {"prompt": "hello", "n_predict": 1})["timings"]
    assert (one["predicted_n"], one["predicted_per_second"], one["predicted_per_token_ms"]) == (1, 0.0, 0.0)
    eight = _complete(server, {"prompt": "hello there", "n_predict": 8, "ignore_eos": True})["timings"]
    assert eight["predicted_n"] == 8
    assert eight["predicted_per_second"] == pytest.approx(1000 * 7 / eight["predicted_ms"])
    assert eight["predicted_per_token_ms"] == pytest.approx(eight["predicted_ms"] / 7)


def test_progress_chunks_carry_the_prompts_timings_with_timings_per_token(server: Server) -> None:
    body = {"prompt": LONG_PROMPT + "x", "n_predict": 2, "stream": True, "return_progress": True,
            "timings_per_token": True}
    with httpx.stream("POST", f"{server.url}/completion", json=body, timeout=60) as response:
        chunks = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
    progress = [chunk for chunk in chunks if "prompt_progress" in chunk]
    assert len(progress) > 2
    first = progress[0]["timings"]
    assert (first["prompt_n"], first["prompt_ms"], first["predicted_n"], first["predicted_ms"]) == (0, 0.0, 0, 0.0)
    for chunk in progress:
        p = chunk["prompt_progress"]
        assert chunk["timings"]["prompt_n"] == p["processed"] - p["cache"]
    times = [chunk["timings"]["prompt_ms"] for chunk in progress]
    assert times == sorted(times) and times[-1] > 0
    # without timings_per_token, progress chunks stay as they were
    body["timings_per_token"] = False
    with httpx.stream("POST", f"{server.url}/completion", json=body, timeout=60) as response:
        chunks = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
    assert not any("timings" in chunk for chunk in chunks if "prompt_progress" in chunk)


def test_several_aliases_and_tags_are_listed_and_the_id_is_the_first_alias(server: Server) -> None:
    card = httpx.get(f"{server.url}/v1/models", timeout=30).json()["data"][0]
    assert (card["id"], card["aliases"], card["tags"]) == ("tiny-a", ["tiny-a", "tiny-b"], ["chat", "small"])
    answer = httpx.post(f"{server.url}/v1/completions", json={"model": "tiny-b", "prompt": "hi", "max_tokens": 1},
                        timeout=60).json()
    assert answer["model"] == "tiny-a"


def test_ignore_eos_biases_the_end_of_generation_tokens_away(server: Server) -> None:
    settings = _complete(server, {"prompt": "hi", "n_predict": 2, "ignore_eos": True,
                                  "logit_bias": [[300, 1.5]]})["generation_settings"]
    assert settings["logit_bias"] == [{"bias": 1.5, "token": 300}, {"bias": None, "token": EOS_ID},
                                      {"bias": None, "token": IM_END_ID}]
    plain = _complete(server, {"prompt": "hi", "n_predict": 2})["generation_settings"]
    assert plain["logit_bias"] == []


def test_anthropic_messages_may_be_empty(server: Server) -> None:
    # Greedy: sampled at the default temperature, 2 % of answers end on their first token.
    response = httpx.post(f"{server.url}/v1/messages", json={"model": "x", "max_tokens": 2, "messages": [],
                                                             "temperature": 0}, timeout=60)
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["type"], body["role"], body["usage"]["output_tokens"]) == ("message", "assistant", 2)
    # an empty user turn stands in for the missing ones
    counted = httpx.post(f"{server.url}/v1/messages/count_tokens",
                         json={"model": "x", "messages": [{"role": "user", "content": ""}]}, timeout=60).json()
    assert body["usage"]["input_tokens"] + body["usage"]["cache_read_input_tokens"] == counted["input_tokens"]
    missing = httpx.post(f"{server.url}/v1/messages", json={"model": "x", "max_tokens": 2}, timeout=60)
    assert (missing.status_code, missing.json()["error"]["type"]) == (400, "invalid_request_error")


def test_an_image_inside_a_tool_result_is_refused_by_a_text_model(server: Server) -> None:
    """The image becomes an image part of the tool message (llama-server's conversion), which a model
    without a projector refuses as it refuses a user's image: never dropped unseen."""
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    messages = [{"role": "user", "content": "look"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                              "content": [{"type": "text", "text": "here"}, image]}]}]
    response = httpx.post(f"{server.url}/v1/messages", json={"model": "x", "max_tokens": 2, "messages": messages},
                          timeout=60)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["message"] == ("messages[2]: content parts of type 'image_url' are not supported: this model "
                                "cannot see images or hear audio: the server has no multimodal projector "
                                "(start it with --mmproj)")
    document = {"type": "document", "source": {"type": "text", "data": "x"}}
    messages[2]["content"][0]["content"] = [document]
    response = httpx.post(f"{server.url}/v1/messages", json={"model": "x", "max_tokens": 2, "messages": messages},
                          timeout=60)
    assert (response.status_code, response.json()["error"]["message"]) == (
        400, "messages[2].content[0].content[0]: a tool result cannot hold a block of type 'document' here "
             "(this server takes text and image)")


def _responses_events(server: Server, **fields: object) -> list[dict]:
    body = {"input": LONG_PROMPT, "max_output_tokens": 4, "stream": True, **fields}
    with httpx.stream("POST", f"{server.url}/v1/responses", json=body, timeout=60) as response:
        return [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]


def test_responses_stream_progress_and_timings_when_asked(server: Server) -> None:
    events = _responses_events(server, return_progress=True, timings_per_token=True)
    progress = [e for e in events if "prompt_progress" in e]
    assert len(progress) > 2 and {e["type"] for e in progress} == {"response.in_progress"}
    last = progress[-1]["prompt_progress"]
    assert last["processed"] == last["total"] > last["cache"] >= 0
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert deltas and all({"prompt_per_second", "predicted_per_second", "predicted_n"} <= set(e["timings"])
                          for e in deltas)
    final = events[-1]
    assert final["type"] in ("response.completed", "response.incomplete")
    assert final["timings"]["predicted_n"] == final["response"]["usage"]["output_tokens"]
    plain = _responses_events(server)
    assert not any("prompt_progress" in e or "timings" in e for e in plain)


@pytest.fixture(scope="module")
def vertex(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, int]]:
    """A server in Vertex AI's mode: AIP_HTTP_PORT overrides --port, and /ping answers as /health."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    srv = spawn_serve(tmp_path_factory.mktemp("vertex") / "stderr.log", ["-m", str(tiny_model), "-c", "512",
                      "-np", "2"], env={"AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": str(port),
                                        "AIP_HEALTH_ROUTE": "ping"})
    yield srv, port
    srv.stop()


def test_vertex_predict_runs_each_instance_by_its_request_format(vertex: tuple[Server, int]) -> None:
    srv, port = vertex
    assert srv.url == f"http://127.0.0.1:{port}"
    assert httpx.get(f"{srv.url}/ping", timeout=30).json() == {"status": "ok"}
    chat = {"@requestFormat": "chatCompletions", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}],
            "stream": True, "temperature": 0}  # greedy: a sampled end token would make it 1 token
    instances = [chat, {"@requestFormat": "/tokenize", "content": "hello"}, {"@requestFormat": "nowhere"}, 7]
    response = httpx.post(f"{srv.url}/predict", json={"instances": instances}, timeout=60)
    assert response.status_code == 200
    first, tokens, unknown, bad = response.json()["predictions"]
    assert (first["object"], first["choices"][0]["message"]["role"], first["usage"]["completion_tokens"]) == (
        "chat.completion", "assistant", 2)
    assert tokens == httpx.post(f"{srv.url}/tokenize", json={"content": "hello"}, timeout=30).json()
    assert unknown == {"error": {"code": 400, "message": "no route for @requestFormat 'nowhere'",
                                 "type": "invalid_request_error"}}
    assert bad["error"]["message"] == "each instance must be a JSON object"
    missing = httpx.post(f"{srv.url}/predict", json={"inputs": []}, timeout=30)
    assert (missing.status_code, missing.json()["error"]["param"]) == (400, "instances")


def test_a_lone_model_with_sleep_idle_seconds_keeps_its_alias_and_sleeps_without_waking(
        tiny_model: Path, tmp_path: Path) -> None:
    srv = spawn_serve(tmp_path / "stderr.log", ["-m", str(tiny_model), "-c", "256", "--alias", "sleepy",
                                                "--sleep-idle-seconds", "1"])
    try:
        def props() -> dict:
            return httpx.get(f"{srv.url}/props", timeout=30).json()

        _complete(srv, {"prompt": "hi", "n_predict": 3, "ignore_eos": True})
        deadline = time.monotonic() + 20
        while not props()["is_sleeping"]:  # loaded at startup, asleep a second after
            assert time.monotonic() < deadline
            time.sleep(0.1)
        # llama-server's counters outlive the unloaded model; the gauges cover the time since the last scrape
        first, second = _scrape(srv)[1], _scrape(srv)[1]
        assert (first["llamacpp:tokens_predicted_total"][1], second["llamacpp:tokens_predicted_total"][1]) == (3, 3)
        assert first["llamacpp:predicted_tokens_seconds"][1] > 0 == second["llamacpp:predicted_tokens_seconds"][1]
        asleep = props()
        assert (asleep["is_sleeping"], asleep["model_alias"]) == (True, "sleepy")  # asking did not wake it
        assert [card["id"] for card in httpx.get(f"{srv.url}/v1/models", timeout=30).json()["data"]] == ["sleepy"]
        tokens = httpx.post(f"{srv.url}/tokenize", json={"content": "hi"}, timeout=60)
        assert tokens.status_code == 200
        assert _scrape(srv)[1]["llamacpp:tokens_predicted_total"][1] == 3  # the woken model adds to them
        awake = props()
        assert awake["is_sleeping"] is False
        assert {k: v for k, v in awake.items() if k != "is_sleeping"} == {
            k: v for k, v in asleep.items() if k != "is_sleeping"}
    finally:
        srv.stop()


def test_a_sleeping_server_answers_metrics_as_it_fell_asleep_and_counts_requests_once_awake(
        tiny_model: Path, tmp_path: Path) -> None:
    srv = spawn_serve(tmp_path / "stderr.log", ["-m", str(tiny_model), "-c", "256", "--sleep-idle-seconds", "1"])
    try:
        def metrics() -> str:
            response = httpx.get(f"{srv.url}/metrics", timeout=30)
            assert response.status_code == 200
            return response.text

        def sleeping() -> bool:
            return httpx.get(f"{srv.url}/props", timeout=30).json()["is_sleeping"]

        _complete(srv, {"prompt": "hi", "n_predict": 3, "ignore_eos": True})
        metrics()  # closes the throughput window: the next scrape shows empty ones, as the sleeping server will
        awake = metrics()
        deadline = time.monotonic() + 20
        while not sleeping():  # polls that neither count as requests nor keep the model awake
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert metrics() == awake
        assert httpx.get(f"{srv.url}/v1/models", timeout=30).status_code == 200
        assert httpx.get(f"{srv.url}/health", timeout=30).status_code == 200
        assert metrics() == awake and sleeping()  # the listing is counted, not shown yet; nothing woke it
        assert httpx.post(f"{srv.url}/tokenize", json={"content": "hi"}, timeout=60).status_code == 200
        assert not sleeping()
        requests = dict(re.findall(r'^pyllama_requests_total\{endpoint="([^"]+)",status="200"\} (\d+)$', metrics(),
                                   re.MULTILINE))
        assert requests == {"/completion": "1", "/v1/models": "1", "/tokenize": "1"}
        assert _llamacpp_series(awake)["llamacpp:tokens_predicted_total"] == ("counter", 3)
    finally:
        srv.stop()


def test_embeddings_count_their_prompt_and_decodes_in_metrics(models_dir: Path, tmp_path: Path) -> None:
    model = write_llama_gguf(models_dir / "tiny-embed.gguf", replace(TINY, embedding_only=True))
    embedding_server = spawn_serve(tmp_path / "stderr.log", ["-m", str(model), "-c", "512", "--embeddings"])
    try:
        _embed_and_check(embedding_server)
    finally:
        embedding_server.stop()


def _embed_and_check(embedding_server: Server) -> None:
    before = _scrape(embedding_server)[1]
    texts = ["hello world", "goodbye world"]
    response = httpx.post(f"{embedding_server.url}/v1/embeddings", json={"input": texts}, timeout=60)
    assert response.status_code == 200
    after = _scrape(embedding_server)[1]
    n_tokens = response.json()["usage"]["prompt_tokens"]
    assert n_tokens > 0
    assert after["llamacpp:prompt_tokens_total"][1] - before["llamacpp:prompt_tokens_total"][1] == n_tokens
    assert after["llamacpp:n_decode_total"][1] > before["llamacpp:n_decode_total"][1]
    assert after["llamacpp:tokens_predicted_total"][1] == before["llamacpp:tokens_predicted_total"][1] == 0


EURO_GRAMMAR = 'root ::= "€€€"'  # € is three byte tokens in the tiny vocabulary: 4 tokens cut the second


@pytest.mark.parametrize("path, body, read", [
    ("/completion", {"prompt": "x", "n_predict": 4}, lambda b: b["content"]),
    ("/v1/completions", {"prompt": "x", "max_tokens": 4}, lambda b: b["choices"][0]["text"]),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 4},
     lambda b: b["choices"][0]["message"]["content"]),
])
def test_a_character_cut_by_the_budget_is_dropped_not_replaced(server: Server, path: str, body: dict, read) -> None:
    answer = httpx.post(f"{server.url}{path}", json={**body, "grammar": EURO_GRAMMAR}, timeout=60).json()
    assert read(answer) == "€"


def test_a_streamed_character_cut_by_the_budget_is_dropped_too(server: Server) -> None:
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 4, "grammar": EURO_GRAMMAR, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=60) as response:
        chunks = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "€"


def test_responses_input_tokens_counts_the_prompt_a_response_would_have(server: Server) -> None:
    body = {"input": "how many tokens is this", "instructions": "be brief"}
    counted = httpx.post(f"{server.url}/v1/responses/input_tokens", json=body, timeout=60).json()
    answered = httpx.post(f"{server.url}/v1/responses", json={**body, "max_output_tokens": 1, "store": False},
                          timeout=60).json()
    assert counted == {"object": "response.input_tokens", "input_tokens": answered["usage"]["input_tokens"]}


def test_each_request_drafts_afresh_and_reports_its_drafts(tiny_model: Path, tmp_path: Path) -> None:
    srv = spawn_serve(tmp_path / "stderr.log", ["-m", str(tiny_model), "-c", "512", "--model-draft", str(tiny_model),
                                                "--spec-type", "draft-simple", "--spec-draft-n-min", "4",
                                                "--spec-draft-n-max", "8"])
    try:
        body = {"prompt": "I believe the meaning of life is", "temperature": 0.2, "top_k": 5, "seed": 4242,
                "n_predict": 24, "ignore_eos": True}
        first, second = (_complete(srv, body)["timings"] for _ in range(2))
    finally:
        srv.stop()
    assert first["draft_n"] >= 4  # one draft at least, of at least --spec-draft-n-min tokens
    assert (second["draft_n"], second["draft_n_accepted"]) == (first["draft_n"], first["draft_n_accepted"])


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_the_cors_proxy_route_is_refused(server: Server, method: str) -> None:
    response = httpx.request(method, f"{server.url}/cors-proxy", params={"url": f"{server.url}/v1/models"},
                             timeout=30)
    assert response.status_code == 403
    assert response.json()["error"]["type"] == "permission_error"


def test_an_alias_still_names_only_one_model_in_router_mode(tiny_model: Path) -> None:
    from tests.helpers import run_cli

    result = run_cli("serve", "-m", str(tiny_model), "-m", str(tiny_model), "--alias", "x", "--port", "0")
    assert (result.exit_code, result.stderr.splitlines()[0]) == (
        1, "Error: --alias serves one model, and this server has several (router mode)")


def test_the_cors_proxy_fetches_for_the_page_only_when_asked(tiny_model: Path, tmp_path: Path) -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: list[tuple[str, str | None, bytes]] = []

    class Target(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            seen.append((self.path, self.headers.get("X-Probe"), self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    target = ThreadingHTTPServer(("127.0.0.1", 0), Target)
    threading.Thread(target=target.serve_forever, daemon=True).start()
    srv = spawn_serve(tmp_path / "stderr.log", ["-m", str(tiny_model), "-c", "256", "--ui-mcp-proxy"])
    try:
        listed = httpx.get(f"{srv.url}/cors-proxy", params={"url": f"{srv.url}/v1/models"}, timeout=30)
        assert (listed.status_code, listed.json()["data"][0]["id"]) == (200, "tiny")
        posted = httpx.post(f"{srv.url}/cors-proxy", params={"url": f"http://127.0.0.1:{target.server_port}/mcp"},
                            content=b'{"x": 1}', headers={"X-Llama-Server-Proxy-Header-X-Probe": "yes"}, timeout=30)
        assert (posted.status_code, posted.content) == (204, b"")
        assert seen == [("/mcp", "yes", b'{"x": 1}')]
        bad = httpx.get(f"{srv.url}/cors-proxy", params={"url": "file:///etc/passwd"}, timeout=30)
        assert (bad.status_code, bad.json()["error"]["param"]) == (400, "url")
    finally:
        srv.stop()
        target.shutdown()
        target.server_close()
