"""`pyllama serve`: real server processes on 127.0.0.1, driven by the official `openai` client and raw httpx."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import httpx
import numpy as np
import openai
import pytest
from openai import OpenAI

from tests.fixtures.make_gguf import TINY, write_llama_gguf
from tests.helpers import REPO_ROOT, run_cli

N_CTX = 4096
API_KEY = "s3cret-key"
ORIGIN = "https://app.example"
HELLO = [{"role": "user", "content": "hello"}]
HELLO_PROMPT = "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["Paris", "London"]}, "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
NOTE = {
    "type": "function",
    "function": {"name": "take_note", "parameters": {
        "type": "object", "properties": {"urgent": {"type": "boolean"}}, "required": ["urgent"],
        "additionalProperties": False}},
}
# A schema whose every answer is short, so the random tiny model finishes it well within max_tokens.
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "color": {"enum": ["red", "green", "blue"]},
                   "n": {"enum": [1, 2, 3]}},
    "required": ["ok", "color", "n"],
    "additionalProperties": False,
}


# ---------------------------------------------------------------- server processes


@dataclass
class Server:
    proc: subprocess.Popen
    url: str
    log: Path

    @property
    def stderr(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def client(self, api_key: str = "unused") -> OpenAI:
        return OpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, timeout=60)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=15)


def _start(model: Path, log: Path, *args: str, env: dict[str, str] | None = None) -> Server:
    """Start `pyllama serve` on a free port (--port 0; the URL is read from stderr) and wait until ready."""
    return spawn_serve(log, ["-m", str(model), "-c", str(N_CTX), *args], env=env)


S = TypeVar("S", bound=Server)


def spawn_serve(log: Path, args: list[str], env: dict[str, str] | None = None, kind: type[S] = Server,
                timeout: float = 90) -> S:
    """`pyllama serve ARGS` on 127.0.0.1 and a free port, with its own HF and pyllama homes and no Hub,
    once it says it is ready (its URL is read from that line on stderr)."""
    home = log.parent / "home"
    environ = {k: v for k, v in os.environ.items() if k != "PYLLAMA_API_KEY"}
    environ.update({"HF_HOME": str(home / "hf"), "PYLLAMA_HOME": str(home / "pyllama"),
                    "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_DISABLE_TELEMETRY": "1", **(env or {})})
    with open(log, "wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pyllama_cli", "serve", "--host", "127.0.0.1", "--port", "0", "-t", "1", *args],
            stdout=subprocess.DEVNULL, stderr=sink, env=environ, cwd=REPO_ROOT,
        )
    server = kind(proc, "", log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"pyllama serve exited with {proc.returncode}:\n{server.stderr}")
        found = re.search(r"ready at (http://127\.0\.0\.1:\d+)/v1", server.stderr)
        if found:
            server.url = found.group(1)
            return server
        time.sleep(0.05)
    server.stop()
    raise RuntimeError(f"pyllama serve did not become ready:\n{server.stderr}")


@pytest.fixture(scope="session")
def key_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server whose key comes from PYLLAMA_API_KEY, with CORS for one origin."""
    srv = _start(tiny_model, tmp_path_factory.mktemp("serve-key") / "stderr.log", "--cors-origin", ORIGIN,
                 env={"PYLLAMA_API_KEY": API_KEY})
    yield srv
    srv.stop()


def _metric(server: Server, name: str) -> float:
    text = httpx.get(f"{server.url}/metrics").text
    return float(re.search(rf"^pyllama_{name} (\S+)$", text, re.MULTILINE).group(1))


def _error(response: httpx.Response, status: int) -> dict:
    """The error object of an OpenAI-shaped error response, after checking its status and shape."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert {"message", "type", "param", "code"} <= set(body["error"])
    return body["error"]


# ---------------------------------------------------------------- startup, health, models


def test_startup_prints_the_url_the_model_and_the_context(server: Server) -> None:
    lines = server.stderr.splitlines()
    port = server.url.rsplit(":", 1)[1]
    # As llama.cpp warns: before, -c 65536 on a model trained for 2048 was taken without a word.
    assert lines.pop(0) == (f"Warning: a context of {N_CTX} tokens per request is more than the 2048 tokens the "
                            "model was trained on: past them its output may degrade (possible training context "
                            "overflow)")
    assert lines[0] == (f"pyllama serve: listening on http://127.0.0.1:{port} - loading tiny.gguf "
                        "(/health answers 503 until ready)")
    assert lines[1] == (f"pyllama serve: ready at http://127.0.0.1:{port}/v1 - model 'tiny' (tiny.gguf), "
                        f"context {N_CTX} tokens per request, chat and completions, 1 slot")


def test_health_is_200_once_loaded(server: Server) -> None:
    response = httpx.get(f"{server.url}/health")
    assert (response.status_code, response.json()) == (200, {"status": "ok"})


def test_health_is_503_while_the_model_loads(tiny_model: Path) -> None:
    from fastapi.testclient import TestClient

    from pyllama_cli.core.serving.scheduler import ParallelEngine
    from pyllama_cli.core.model.settings import LoadSettings
    from pyllama_cli.server.app import create_app
    from pyllama_cli.server.model_set import OneModel
    from pyllama_cli.server.settings import ServerSettings

    # Without the lifespan (no `with`), the engine never starts loading: the state while loading.
    settings = ServerSettings(alias="tiny")
    client = TestClient(create_app(OneModel(ParallelEngine(tiny_model, LoadSettings()), settings), settings))
    response = client.get("/health")
    assert _error(response, 503) == {"message": "Loading model", "type": "unavailable_error", "param": None,
                                     "code": "model_loading"}
    _error(client.post("/v1/chat/completions", json={"messages": HELLO}), 503)


def test_models_list_names_the_alias(server: Server) -> None:
    [card] = server.client().models.list().data
    assert (card.id, card.object, card.owned_by) == ("tiny", "model", "pyllama")
    assert card.meta["n_ctx"] == N_CTX and card.meta["n_vocab"] == TINY.n_vocab  # type: ignore[attr-defined]
    assert server.client().models.retrieve("tiny").id == "tiny"


def test_models_list_has_the_router_contract_fields(server: Server, tiny_model: Path) -> None:
    card = httpx.get(f"{server.url}/v1/models").json()["data"][0]
    assert (card["path"], card["size"], card["aliases"]) == (str(tiny_model), tiny_model.stat().st_size, [])
    assert card["status"] == {"value": "loaded"}
    assert card["runtime"]["n_ctx"] == N_CTX and card["runtime"]["slots_total"] == 1
    assert card["runtime"]["memory_bytes"] > card["meta"]["size"]


def test_a_one_model_server_does_not_unload(server: Server) -> None:
    response = httpx.post(f"{server.url}/models/unload", json={"model": "tiny"})
    assert _error(response, 400)["code"] == "not_router"
    assert httpx.post(f"{server.url}/models/load", json={"model": "tiny"}).json() == {"success": True}


def test_docs_and_openapi_schema(server: Server) -> None:
    assert httpx.get(f"{server.url}/docs").status_code == 404  # Swagger UI only with --docs
    paths = httpx.get(f"{server.url}/openapi.json").json()["paths"]
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models", "/health", "/metrics",
                 "/tokenize", "/detokenize", "/apply-template"):
        assert path in paths


# ---------------------------------------------------------------- chat and completions


def test_chat_completion_shape_and_usage(server: Server) -> None:
    prompt_ids = httpx.post(f"{server.url}/tokenize", json={"content": HELLO_PROMPT, "add_special": True}).json()
    result = server.client().chat.completions.create(
        model="tiny", messages=HELLO, max_tokens=8, temperature=0, seed=1,
        extra_body={"user": "ignored", "some_future_field": {"x": 1}},  # unknown fields are ignored
    )
    [choice] = result.choices
    assert result.object == "chat.completion" and result.id.startswith("chatcmpl-") and result.model == "tiny"
    assert (choice.index, choice.finish_reason, choice.message.role) == (0, "length", "assistant")
    assert choice.message.content and choice.message.tool_calls is None
    assert (result.usage.prompt_tokens, result.usage.completion_tokens, result.usage.total_tokens) == (
        len(prompt_ids["tokens"]), 8, len(prompt_ids["tokens"]) + 8)


def test_chat_stream_matches_the_whole_answer(server: Server) -> None:
    client = server.client()
    whole = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=12, temperature=0)
    chunks = list(client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=12, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0] is chunks[-2] and finish[0].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert len({c.id for c in chunks}) == 1 and {c.object for c in chunks} == {"chat.completion.chunk"}


def test_completion_of_text_and_of_token_ids(server: Server) -> None:
    client = server.client()
    text = client.completions.create(model="tiny", prompt="hello world", max_tokens=6, temperature=0)
    ids = client.completions.create(model="tiny", prompt=[1, 263, 264], max_tokens=6, temperature=0)
    assert text.object == "text_completion" and text.choices[0].finish_reason == "length"
    assert (text.usage.prompt_tokens, text.usage.completion_tokens) == (3, 6)  # <s> ▁hello ▁world
    assert ids.choices[0].text == text.choices[0].text
    streamed = list(client.completions.create(model="tiny", prompt="hello world", max_tokens=6, temperature=0,
                                              stream=True))
    assert "".join(c.choices[0].text for c in streamed) == text.choices[0].text
    assert streamed[-1].choices[0].finish_reason == "length"


def test_completion_of_a_prompt_list_gives_one_choice_each(server: Server) -> None:
    client = server.client()
    both = client.completions.create(model="tiny", prompt=["hello world", "the quick"], max_tokens=4, temperature=0)
    alone = client.completions.create(model="tiny", prompt="the quick", max_tokens=4, temperature=0)
    assert [c.index for c in both.choices] == [0, 1]
    assert both.choices[1].text == alone.choices[0].text
    assert both.usage.completion_tokens == 8


def test_stop_strings_end_the_answer_and_are_not_returned(server: Server) -> None:
    client = server.client()
    free = client.completions.create(model="tiny", prompt="hello world", max_tokens=12, temperature=0).choices[0]
    stop = free.text[3:6]
    stopped = client.completions.create(model="tiny", prompt="hello world", max_tokens=12, temperature=0,
                                        stop=[stop]).choices[0]
    assert stopped.finish_reason == "stop"
    assert stopped.text == free.text[:free.text.index(stop)]


def test_completion_logprobs(server: Server) -> None:
    result = server.client().completions.create(model="tiny", prompt="hello world", max_tokens=5, temperature=0,
                                                logprobs=2)
    lp = result.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert "".join(lp.tokens) == result.choices[0].text
    assert all(len(top) == 2 for top in lp.top_logprobs) and all(x <= 0 for x in lp.token_logprobs)
    # Greedy: the chosen token is the most likely one.
    assert [max(top.values()) for top in lp.top_logprobs] == pytest.approx(lp.token_logprobs)
    assert lp.text_offset[0] == 0


def test_chat_logprobs(server: Server) -> None:
    result = server.client().chat.completions.create(model="tiny", messages=HELLO, max_tokens=3, temperature=0,
                                                     logprobs=True, top_logprobs=2)
    content = result.choices[0].logprobs.content
    assert len(content) == 3
    for entry in content:
        assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token
        assert len(entry.top_logprobs) == 2 and entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob)


def test_default_max_tokens_is_the_rest_of_the_context(server: Server) -> None:
    prompt = "hello " * (N_CTX - 40)
    n_prompt = len(httpx.post(f"{server.url}/tokenize", json={"content": prompt, "add_special": True}).json()["tokens"])
    result = server.client().completions.create(model="tiny", prompt=prompt, temperature=0,
                                                extra_body={"ignore_eos": True})
    assert result.choices[0].finish_reason == "length"
    assert (result.usage.prompt_tokens, result.usage.total_tokens) == (n_prompt, N_CTX)


# ---------------------------------------------------------------- constrained output and tools


def test_response_format_json_schema_is_enforced(server: Server) -> None:
    result = server.client().chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Answer in JSON."}], max_tokens=300, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA}},
    )
    assert result.choices[0].finish_reason == "stop"
    answer = json.loads(result.choices[0].message.content)
    assert set(answer) == {"ok", "color", "n"}
    assert isinstance(answer["ok"], bool) and answer["color"] in ("red", "green", "blue")
    assert answer["n"] in (1, 2, 3)


def test_grammar_constrained_output_obeys_max_tokens(server: Server) -> None:
    result = server.client().chat.completions.create(model="tiny", messages=HELLO, max_tokens=16, temperature=0,
                                                     response_format={"type": "json_object"})
    assert result.choices[0].message.content.lstrip().startswith("{")
    assert result.usage.completion_tokens <= 16


def test_llama_server_grammar_field(server: Server) -> None:
    result = server.client().completions.create(model="tiny", prompt="hello", max_tokens=8, temperature=0,
                                                extra_body={"grammar": 'root ::= "yes" | "no"'})
    assert result.choices[0].text in ("yes", "no") and result.choices[0].finish_reason == "stop"


def _check_weather_args(arguments: str) -> None:
    args = json.loads(arguments)
    assert set(args) == {"city", "unit"} and args["city"] in ("Paris", "London") and args["unit"] in ("c", "f")


def test_forced_tool_call_matches_the_function_schema(server: Server) -> None:
    result = server.client().chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Weather in Paris?"}], max_tokens=300, temperature=0,
        tools=[WEATHER, NOTE], tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    [choice] = result.choices
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "get_weather"
    _check_weather_args(call.function.arguments)


def test_required_tool_call_streamed(server: Server) -> None:
    chunks = list(server.client().chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Weather?"}], max_tokens=300, temperature=0,
        tools=[WEATHER], tool_choice="required", stream=True,
    ))
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or ()]
    assert [(tc.index, tc.type, tc.function.name) for tc in calls] == [(0, "function", "get_weather")]
    _check_weather_args(calls[0].function.arguments)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tools_reach_a_template_without_tool_support_as_a_system_message(server: Server) -> None:
    prompt = httpx.post(f"{server.url}/apply-template", json={"messages": HELLO, "tools": [WEATHER]}).json()["prompt"]
    assert prompt.startswith("<|im_start|>system\nYou can call these functions")
    assert 'get_weather(city: "Paris" | "London", unit: "c" | "f")\n  The weather in a city.' in prompt
    assert prompt.endswith(HELLO_PROMPT)


def test_tool_choice_auto_and_none(server: Server) -> None:
    # The random model does not write a call, so "auto" answers with text; "none" hides the tools.
    result = server.client().chat.completions.create(model="tiny", messages=HELLO, max_tokens=6, temperature=0,
                                                     tools=[WEATHER], tool_choice="auto")
    assert result.choices[0].message.tool_calls is None and result.choices[0].message.content
    streamed = list(server.client().chat.completions.create(model="tiny", messages=HELLO, max_tokens=6,
                                                            temperature=0, tools=[WEATHER], stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == result.choices[0].message.content
    prompt = httpx.post(f"{server.url}/apply-template",
                        json={"messages": HELLO, "tools": [WEATHER], "tool_choice": "none"}).json()["prompt"]
    assert prompt == HELLO_PROMPT


@pytest.mark.parametrize(("text", "calls"), [
    ('{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}',
     [("get_weather", {"city": "Paris", "unit": "c"})]),
    ('<tool_call>\n{"name": "take_note", "arguments": {"urgent": true}}\n</tool_call>',
     [("take_note", {"urgent": True})]),
    (('```json\n[{"name": "take_note", "arguments": "{\\"urgent\\": false}"}, '
     '{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]\n```'),
     [("take_note", {"urgent": False}), ("get_weather", {})]),
    ('{"name": "delete_everything", "arguments": {}}', None),
    ('{"name": "take_note", "arguments": {"urgent": true}} and some words', None),
    ("It is sunny.", None),
])
def test_tool_calls_are_read_from_the_answer(text: str, calls: list | None) -> None:
    from pyllama_cli.core.constrain.tools import parse_tool_calls, plan_tools

    parsed = parse_tool_calls(text, plan_tools([WEATHER, NOTE], "auto"))
    if calls is None:
        assert parsed is None
    else:
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed] == calls
        assert all(c["type"] == "function" and c["id"].startswith("call_") for c in parsed)


def test_without_parallel_tool_calls_an_answer_holds_the_first_call() -> None:
    from pyllama_cli.core.constrain.tools import parse_tool_calls, plan_tools

    text = '[{"name": "take_note", "arguments": {"urgent": true}}, {"name": "get_weather", "arguments": {}}]'
    parsed = parse_tool_calls(text, plan_tools([WEATHER, NOTE], "auto", parallel=False))
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in parsed] == [("take_note", '{"urgent": true}')]


def test_tool_call_history_round_trips(server: Server) -> None:
    messages = [
        *HELLO,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                              "arguments": '{"city": "Paris", "unit": "c"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
    ]
    prompt = httpx.post(f"{server.url}/apply-template", json={"messages": messages}).json()["prompt"]
    assert prompt == (HELLO_PROMPT + '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}'
                      "<|im_end|>\n<|im_start|>tool\n18 C<|im_end|>\n<|im_start|>assistant\n")
    result = server.client().chat.completions.create(model="tiny", messages=messages, max_tokens=2, temperature=0)
    assert result.choices[0].finish_reason == "length"


# ---------------------------------------------------------------- raw HTTP: SSE, tokenize, metrics


def test_sse_framing(server: Server) -> None:
    body = {"messages": HELLO, "max_tokens": 3, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.text.endswith("\n\ndata: [DONE]\n\n")
    events = response.text.split("\n\n")[:-1]
    assert all(e.startswith("data: ") and "\n" not in e for e in events)
    chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}  # as llama-server's
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None] * (len(chunks) - 2) + ["length"]
    assert chunks[-2]["choices"][0]["delta"] == {}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3


def test_tokenize_and_detokenize(server: Server) -> None:
    def post(path: str, body: dict) -> dict:
        response = httpx.post(f"{server.url}{path}", json=body)
        assert response.status_code == 200, response.text
        return response.json()

    assert post("/tokenize", {"content": "hello world"}) == {"tokens": [263, 264]}
    assert post("/tokenize", {"content": "hello world", "add_special": True}) == {"tokens": [1, 263, 264]}
    assert post("/tokenize", {"content": "hello", "with_pieces": True}) == {"tokens": [{"id": 263, "piece": " hello"}]}
    assert post("/detokenize", {"tokens": [263, 264]}) == {"content": "hello world"}
    assert post("/apply-template", {"messages": HELLO}) == {"prompt": HELLO_PROMPT}
    assert _error(httpx.post(f"{server.url}/detokenize", json={"tokens": [5000]}), 400)["param"] == "tokens"


def test_metrics_count_requests_tokens_and_errors(server: Server) -> None:
    generated, errors = _metric(server, "generated_tokens_total"), _metric(server, "request_errors_total")
    server.client().completions.create(model="tiny", prompt="hello", max_tokens=5, temperature=0)
    httpx.post(f"{server.url}/v1/completions", json={"prompt": "hello", "n": 3})
    response = httpx.get(f"{server.url}/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    assert "# TYPE pyllama_requests_total counter" in response.text
    assert 'pyllama_requests_total{endpoint="/v1/completions",status="200"}' in response.text
    assert _metric(server, "generated_tokens_total") == generated + 5
    assert _metric(server, "request_errors_total") == errors + 1
    assert _metric(server, "queue_depth") == 0 and _metric(server, "requests_processing") == 0
    assert _metric(server, "generated_tokens_per_second") > 0 and _metric(server, "prompt_tokens_per_second") > 0
    assert _metric(server, "context_size") == N_CTX


def test_client_disconnect_stops_the_generation(server: Server) -> None:
    generated, cancelled = _metric(server, "generated_tokens_total"), _metric(server, 'jobs_total{outcome="cancelled"}')
    body = {"messages": HELLO, "max_tokens": 4000, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body) as response:
        events = 0
        for line in response.iter_lines():
            events += line.startswith("data: ")
            if events == 3:
                break
    deadline = time.monotonic() + 10
    while _metric(server, 'jobs_total{outcome="cancelled"}') == cancelled and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _metric(server, 'jobs_total{outcome="cancelled"}') == cancelled + 1
    assert _metric(server, "generated_tokens_total") - generated < 1000  # of the 4000 asked for
    result = server.client().chat.completions.create(model="tiny", messages=HELLO, max_tokens=4, temperature=0)
    assert (result.choices[0].finish_reason, result.usage.completion_tokens) == ("length", 4)


# ---------------------------------------------------------------- errors


def _post(server: Server, path: str, body: object, **kwargs: object) -> httpx.Response:
    if not isinstance(body, (dict, list)):
        return httpx.post(f"{server.url}{path}", content=body, headers={"content-type": "application/json"},
                          **kwargs)
    return httpx.post(f"{server.url}{path}", json=body, **kwargs)


def test_invalid_json_is_400(server: Server) -> None:
    error = _error(_post(server, "/v1/chat/completions", b'{"messages": [}'), 400)
    assert error["message"].startswith("the request body is not valid JSON: ")
    assert error["type"] == "invalid_request_error"


def test_json_sent_as_plain_text_is_400_naming_the_content_type(server: Server) -> None:
    response = httpx.post(f"{server.url}/v1/completions", content=b'{"prompt": "hi", "max_tokens": 2}',
                          headers={"content-type": "text/plain"})
    assert _error(response, 400)["message"] == (
        "the request body must be a JSON object, sent with Content-Type: application/json")


@pytest.mark.parametrize(("body", "param", "message"), [
    ({}, "messages", "messages: this field is required"),
    ({"messages": HELLO, "temperature": "hot"}, "temperature",
     "temperature: Input should be a valid number, unable to parse string as a number"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role", None),
    ({"messages": HELLO, "n": 17}, "n", "n: Input should be less than or equal to 16"),
    ({"messages": HELLO, "n": 2, "stream": True, "tools": [WEATHER]}, "n",
     "n > 1 with tools is answered whole: send it without stream"),
    ({"messages": HELLO, "top_logprobs": 2}, "top_logprobs", "top_logprobs needs logprobs: true"),
    ({"messages": HELLO, "tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice", "tool_choice names the function 'nope', which is not among the tools (get_weather)"),
    ({"messages": HELLO, "logit_bias": {"5000": 1}}, "logit_bias",
     "logit_bias token id 5000 is out of range: the vocabulary has ids 0..1023"),
    ({"messages": HELLO, "tools": [WEATHER, WEATHER]}, "tools", "two tools are named 'get_weather'"),
    # Not forced, the schema was never turned into a grammar: the request was served as if it were fine.
    ({"messages": HELLO, "tools": [{"type": "function", "function": {
        "name": "pick", "parameters": {"type": "object", "properties": {"color": {"enum": []}}}}}]},
     "tools", 'the parameters of tool \'pick\' at /properties/color: "enum" must list at least one value'),
    ({"messages": HELLO, "tool_choice": "none", "tools": [{"type": "function", "function": {
        "name": "pick", "parameters": {"type": "object", "properties": {"color": {"enum": []}}}}}]},
     "tools", 'the parameters of tool \'pick\' at /properties/color: "enum" must list at least one value'),
    ({"messages": [{"role": "user", "content": [{"foo": 1}]}]}, "messages[0].content[0]",
     'messages[0].content[0]: a text part needs its "text"'),
    ({"messages": HELLO, "max_tokens": 0}, "max_tokens", None),
    ({"messages": HELLO, "parallel_tool_calls": "x"}, "parallel_tool_calls", None),
    ({"messages": HELLO, "response_format": {"type": "json_schema"}}, "response_format.json_schema",
     "response_format of type json_schema needs a json_schema object"),
])
def test_invalid_fields_are_400(server: Server, body: dict, param: str, message: str | None) -> None:
    error = _error(_post(server, "/v1/chat/completions", body), 400)
    assert error["param"] == param
    if message is not None:
        assert error["message"] == message


@pytest.mark.parametrize(("field", "message"), [
    ({"echo": True}, "echo is not supported: the answer holds the generated text only"),
    ({"suffix": "end"}, "suffix (fill-in-the-middle) is not supported"),
    ({"best_of": 3}, "best_of must be 1: this server generates one choice per request (got 3)"),
])
def test_legacy_completion_fields_that_change_the_answer_are_refused(server: Server, field: dict,
                                                                     message: str) -> None:
    # Served as if absent, they gave an answer the client did not ask for (no echoed prompt).
    error = _error(_post(server, "/v1/completions", {"prompt": "hi", "max_tokens": 2, **field}), 400)
    assert (error["param"], error["message"]) == (next(iter(field)), message)


def test_grammar_that_does_not_parse_is_400_with_its_position(server: Server) -> None:
    error = _error(_post(server, "/v1/completions", {"prompt": "hi", "grammar": 'root ::= "a" | [a-'}), 400)
    assert error == {"message": "grammar: unterminated character class at line 1, column 16",
                     "type": "invalid_request_error", "param": "grammar", "code": "invalid_grammar"}


def test_prompt_longer_than_the_context_is_400_with_both_numbers(server: Server) -> None:
    prompt = " ".join(["hello"] * (N_CTX + 100))
    with pytest.raises(openai.BadRequestError) as caught:
        server.client().completions.create(model="tiny", prompt=prompt, max_tokens=1)
    error = caught.value.body
    assert error["message"] == (f"the request ({N_CTX + 101} tokens) exceeds the available context size ({N_CTX} "
                                "tokens): shorten the prompt, or restart the server with a larger -c")
    assert (error["code"], error["n_prompt_tokens"], error["n_ctx"]) == ("context_length_exceeded", N_CTX + 101, N_CTX)


def test_a_one_model_server_answers_to_any_model_name_with_its_real_id(server: Server) -> None:
    # As llama-server does: the OpenAI client's examples and many tools send names such as "gpt-4o-mini".
    answer = server.client().chat.completions.create(model="gpt-4o-mini", messages=HELLO, max_tokens=2,
                                                     temperature=0)
    assert answer.model == "tiny"
    assert answer.choices[0].message.content
    with pytest.raises(openai.NotFoundError) as caught:
        server.client().models.retrieve("gpt-4o")
    assert caught.value.body == {"message": "the model 'gpt-4o' is not served here; this server serves 'tiny'",
                                 "type": "not_found_error", "param": "model", "code": "model_not_found"}
    assert _error(httpx.get(f"{server.url}/v1/nothing-here"), 404)["message"] == "no such endpoint: GET /v1/nothing-here"


def test_body_over_the_limit_is_413(server: Server) -> None:
    big = b'{"prompt": "' + b"a" * (8 * 1024 * 1024) + b'"}'
    error = _error(_post(server, "/v1/completions", big), 413)
    assert error["message"] == f"the request body ({len(big)} bytes) is larger than the server's limit of 8388608 bytes"

    def chunked() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        yield big[:1000]
        yield big[1000:]

    _error(_post(server, "/v1/completions", chunked()), 413)


def test_embeddings_on_a_generation_server_is_400(server: Server) -> None:
    error = _error(_post(server, "/v1/embeddings", {"input": "hello"}), 400)
    assert error["code"] == "not_supported"
    assert error["message"] == "this server does not compute embeddings: start it with --embeddings"


def test_the_server_survives_bad_requests(server: Server) -> None:
    for body in (b"\x00\xff", b"[]", b'"text"', b'{"messages": null}', b'{"prompt": [1, "a"]}'):
        assert _post(server, "/v1/completions", body).status_code == 400
    assert httpx.get(f"{server.url}/health").status_code == 200


# ---------------------------------------------------------------- auth and CORS


def test_api_key_is_required_except_for_health(key_server: Server) -> None:
    url = key_server.url
    missing = _error(httpx.get(f"{url}/v1/models"), 401)
    assert missing == {"message": "missing API key: send it as 'Authorization: Bearer KEY'",
                       "type": "authentication_error", "param": None, "code": "invalid_api_key"}
    wrong = _error(httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer nope"}), 401)
    assert wrong["message"] == "invalid API key"
    with pytest.raises(openai.AuthenticationError):
        key_server.client("nope").chat.completions.create(model="tiny", messages=HELLO, max_tokens=1)
    # Greedy: the tiny model samples its end-of-generation token at random often enough to flake CI.
    result = key_server.client(API_KEY).chat.completions.create(model="tiny", messages=HELLO, max_tokens=2,
                                                                temperature=0)
    assert result.usage.completion_tokens == 2
    assert httpx.get(f"{url}/health").status_code == 200
    assert httpx.get(f"{url}/metrics", headers={"X-Api-Key": API_KEY}).status_code == 200


def test_cors_headers_only_when_an_origin_is_given(server: Server, key_server: Server) -> None:
    plain = httpx.get(f"{server.url}/health", headers={"Origin": ORIGIN})
    assert "access-control-allow-origin" not in plain.headers
    preflight = httpx.options(f"{key_server.url}/v1/chat/completions", headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type"})
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == ORIGIN
    other = httpx.get(f"{key_server.url}/health", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in other.headers


# ---------------------------------------------------------------- embeddings


def test_embeddings(embedding_server: Server) -> None:
    client = embedding_server.client()
    result = client.embeddings.create(model="tiny-embed", input=["hello", "hello world", "hello"])
    vectors = [np.array(d.embedding) for d in result.data]
    assert [d.index for d in result.data] == [0, 1, 2] and all(v.shape == (TINY.n_embd,) for v in vectors)
    assert [float(np.linalg.norm(v)) for v in vectors] == pytest.approx([1.0] * 3, abs=1e-5)
    assert np.array_equal(vectors[0], vectors[2]) and not np.allclose(vectors[0], vectors[1])
    assert (result.usage.prompt_tokens, result.usage.total_tokens) == (7, 7)  # 2 + 3 + 2 tokens with BOS
    raw = httpx.post(f"{embedding_server.url}/v1/embeddings", json={"input": "hello", "encoding_format": "base64"})
    decoded = np.frombuffer(base64.b64decode(raw.json()["data"][0]["embedding"]), dtype="<f4")
    assert np.allclose(decoded, vectors[0])


def test_an_embedding_server_refuses_generation(embedding_server: Server) -> None:
    error = _error(_post(embedding_server, "/v1/chat/completions", {"messages": HELLO}), 400)
    assert error["message"] == "this server was started with --embeddings: it serves /v1/embeddings only"


# ---------------------------------------------------------------- command-line errors


def test_a_taken_port_is_a_one_line_error(tiny_model: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("serve", "-m", str(tiny_model), "--port", str(port))
    assert result.exit_code == 1
    assert result.first_stderr_line == f"Error: cannot listen on 127.0.0.1:{port}: Address already in use"


@pytest.mark.parametrize("text", ["hi", 'quote " backslash \\ newline \n', "é 😀 \u2028 \x00", ""])
def test_token_chunks_from_the_template_are_the_bytes_of_the_full_encoding(text: str) -> None:
    from pyllama_cli.server.openai import bodies as r
    from pyllama_cli.server.sse import TextEvents, event

    header = r.Header.new("cmpl", "m")
    completion = TextEvents(r.text_chunk(header, 2, TextEvents.MARK))
    chat = TextEvents(r.chat_chunk(header, {"content": TextEvents.MARK}))
    assert completion.event(text) == event(r.text_chunk(header, 2, text))
    assert chat.event(text) == event(r.chat_chunk(header, {"content": text}))
    assert json.loads(completion.event(text)[6:])["choices"][0]["text"] == text


@pytest.mark.parametrize(("headers", "inline"), [
    ([(b"content-length", b"120")], True),
    ([(b"content-length", b"8192")], True),
    ([(b"content-length", b"8193")], False),
    ([(b"transfer-encoding", b"chunked")], False),  # size unknown until read: never on the event loop
])
def test_small_requests_are_prepared_on_the_event_loop_large_ones_in_the_pool(headers: list, inline: bool) -> None:
    from starlette.requests import Request

    from pyllama_cli.server.spine import off_loop

    async def prepared_on_the_loop_thread() -> bool:
        request = Request({"type": "http", "method": "POST", "headers": headers})
        return await off_loop(request, threading.current_thread) is threading.current_thread()

    assert asyncio.run(prepared_on_the_loop_thread()) is inline


# ---------------------------------------------------------------- llama-server compatibility


def test_v1_health_answers_like_health(key_server: Server) -> None:
    # llama-server serves /v1/health too, and without the API key, as /health.
    response = httpx.get(f"{key_server.url}/v1/health")
    assert (response.status_code, response.json()) == (200, {"status": "ok"})


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_n_predict_is_llama_servers_max_tokens(server: Server, path: str) -> None:
    # Ignored, it let a llama-server client's n_predict: 3 run to the end of the context.
    body = {"prompt": "hello", "messages": HELLO, "n_predict": 3, "temperature": 0, "ignore_eos": True}
    usage = _post(server, path, body).json()["usage"]
    assert usage["completion_tokens"] == 3
    assert _post(server, path, {**body, "max_tokens": 5}).json()["usage"]["completion_tokens"] == 3  # as llama-server
    # -1: the rest of the context. A prompt that leaves 40 tokens of it: the whole 4096 took seconds (more
    # than httpx's default 5 s on a loaded machine), and the test stays short.
    long = "hello " * (N_CTX - 60)
    whole = _post(server, path, {**body, "prompt": long, "messages": [{"role": "user", "content": long}],
                                 "n_predict": -1}, timeout=300).json()["usage"]
    assert whole["total_tokens"] == N_CTX and whole["completion_tokens"] >= 30
    error = _error(_post(server, path, {**body, "n_predict": 0}), 400)
    assert (error["param"], error["message"]) == (
        "n_predict", "n_predict must be -1 (the rest of the context) or at least 1 (got 0)")


@pytest.mark.parametrize(("bias", "message"), [
    ([[5, float("nan")]], "logit_bias: the bias of token 5 must be a finite number or false (got NaN)"),
    ([[5, float("inf")]], "logit_bias: the bias of token 5 must be a finite number or false (got Infinity)"),
    ([[5, float("-inf")]], "logit_bias: the bias of token 5 must be a finite number or false (got -Infinity)"),
    ([[1.5, 1]], "logit_bias: 1.5 is not a token id"),
    ([[True, 1]], "logit_bias: true is not a token id"),
])
def test_logit_bias_pairs_with_odd_values_are_400(server: Server, bias: list, message: str) -> None:
    # Before: a NaN or infinite bias went to llama.cpp as it was, and 1.5 or true were read as token 1.
    body = json.dumps({"prompt": "hi", "max_tokens": 1, "logit_bias": bias}).encode()  # NaN as Python writes it
    error = _error(_post(server, "/v1/completions", body), 400)
    assert (error["param"], error["message"]) == ("logit_bias", message)


def test_logit_bias_of_a_string_biases_its_tokens(server: Server) -> None:
    # llama-server tokenizes a string given instead of a token id ("hello" is the one token 263 here).
    banned = {"prompt": [263], "max_tokens": 1, "logprobs": 1, "temperature": 0}
    favoured = _post(server, "/v1/completions", {**banned, "logit_bias": [["hello", 100]]}).json()
    assert favoured["choices"][0]["text"] == " hello"
    without = _post(server, "/v1/completions", {**banned, "logit_bias": [["hello", 100], ["hello", False]]}).json()
    assert without["choices"][0]["text"] != " hello"


def test_apply_template_names_the_tools_field_in_its_errors(server: Server) -> None:
    bad_tool = {"type": "function", "function": {
        "name": "pick", "parameters": {"type": "object", "properties": {"color": {"enum": []}}}}}
    error = _error(_post(server, "/apply-template", {"messages": HELLO, "tools": [bad_tool]}), 400)
    assert (error["param"], error["code"]) == ("tools", "invalid_value")
    unknown = {"messages": HELLO, "tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}}
    error = _error(_post(server, "/apply-template", unknown), 400)
    assert (error["param"], error["code"]) == ("tool_choice", "invalid_value")


def test_an_empty_grammar_means_none(server: Server) -> None:
    # llama-server reads "grammar": "" as no grammar; it was a 400 ("the grammar has no 'root' rule").
    body = {"prompt": "hello", "max_tokens": 3, "temperature": 0, "ignore_eos": True}
    free = _post(server, "/v1/completions", body).json()["choices"][0]["text"]
    response = _post(server, "/v1/completions", {**body, "grammar": ""})
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["text"] == free
    schema = _post(server, "/v1/completions", {**body, "max_tokens": 20, "grammar": "", "json_schema": {"enum": ["yes"]}})
    assert schema.json()["choices"][0]["text"] == '"yes"'


def test_openai_routes_answer_without_v1_too(server: Server) -> None:
    # As llama-server's do: OpenAI clients whose base URL lacks /v1 call these paths.
    body = {"messages": HELLO, "max_tokens": 3, "temperature": 0}
    bare, v1 = _post(server, "/chat/completions", body).json(), _post(server, "/v1/chat/completions", body).json()
    assert bare["choices"][0]["message"] == v1["choices"][0]["message"]
    bare_list, v1_list = httpx.get(f"{server.url}/models").json(), httpx.get(f"{server.url}/v1/models").json()
    for listing in (bare_list, v1_list):
        listing["data"][0]["runtime"].pop("idle_s")  # seconds since the last request: moves between the two
    assert bare_list == v1_list
    native = _post(server, "/completions", {"prompt": "hi", "n_predict": 1, "temperature": 0}).json()  # native API
    assert native["stop"] is True and native["tokens_predicted"] == 1


def test_props_tells_slots_context_defaults_and_template(server: Server, tiny_model: Path) -> None:
    props = httpx.get(f"{server.url}/props").json()
    assert set(props) == {"default_generation_settings", "total_slots", "model_alias", "model_path", "modalities",
                          "chat_template", "bos_token", "eos_token", "build_info", "is_sleeping"}
    assert (props["model_alias"], props["bos_token"], props["eos_token"]) == ("tiny", "<s>", "</s>")
    assert props["is_sleeping"] is False and re.fullmatch(r"b0-\S+ \(pyllama \S+\)", props["build_info"])
    assert (props["total_slots"], props["model_path"]) == (1, str(tiny_model))
    assert props["default_generation_settings"]["n_ctx"] == N_CTX
    params = props["default_generation_settings"]["params"]
    assert (params["temperature"], params["top_k"], params["top_p"], params["n_predict"]) == (0.8, 40, 0.95, -1)
    assert "<|im_start|>" in props["chat_template"]


@pytest.mark.parametrize(("field", "value"), [("top_k", 2**31), ("repeat_last_n", 2**32 + 1)])
def test_sampling_integers_past_int32_are_400(server: Server, field: str, value: int) -> None:
    # They reached llama.cpp as 32-bit ints and wrapped: top_k 2**32 ran as top_k 0.
    error = _error(_post(server, "/v1/completions", {"prompt": "hi", "max_tokens": 1, field: value}), 400)
    assert error["param"] == field


def test_logit_bias_keys_are_plain_token_ids(server: Server) -> None:
    for key in ("1_0", " 10", "\u0661\u0660"):  # int() reads each as 10
        error = _error(_post(server, "/v1/completions", {"prompt": "hi", "max_tokens": 1, "logit_bias": {key: 1}}), 400)
        assert error["message"] == f"logit_bias: {json.dumps(key)} is not a token id"


# ---------------------------------------------------------------- /tokenize and /apply-template, as llama-server answers

# A Jinja template that writes BOS itself, as many models' own templates do.
BOS_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
                "{% if add_generation_prompt %}<assistant>{% endif %}")
CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"},
                {"role": "assistant", "content": "hi there"}, {"role": "user", "content": "bye"}]
# (content, add_special, parse_special) -> the ids llama-server gives for TINY (<s> is BOS, id 1).
TOKENIZE_CASES = {
    ("<s>hello", True, True): [1, 1, 263],  # the BOS add_special adds, then the one the text writes
    ("<s>hello", False, True): [1, 263],
    ("<s>hello", True, False): [1, 739, 378, 674, 392, 598, 814],  # "<s>" as text: " <", "s", ">", ...
    ("<s>hello", False, False): [739, 378, 674, 392, 598, 814],
    ("hello", True, True): [1, 263],
    ("hello", False, True): [263],
    ("hello", True, False): [1, 263],
    ("hello", False, False): [263],
}
# "<s>héllo 😀 \x01" with add_special: text pieces are strings, a piece that is not whole UTF-8 the list
# of its bytes (é and 😀 are split into byte tokens by this vocabulary).
PIECES = [{"id": 1, "piece": "<s>"}, {"id": 1, "piece": "<s>"}, {"id": 411, "piece": " h"}, {"id": 198, "piece": [195]},
          {"id": 172, "piece": [169]}, {"id": 598, "piece": "l"}, {"id": 814, "piece": "lo"}, {"id": 261, "piece": " "},
          {"id": 243, "piece": [240]}, {"id": 162, "piece": [159]}, {"id": 155, "piece": [152]},
          {"id": 131, "piece": [128]}, {"id": 261, "piece": " "}, {"id": 4, "piece": "\x01"}]


@pytest.fixture(scope="session")
def no_bos_model(models_dir: Path) -> Path:
    """TINY with a vocabulary that does not add BOS."""
    return write_llama_gguf(models_dir / "tiny-no-bos.gguf", replace(TINY, add_bos=False))


@contextmanager
def _in_process(model: Path, template: str | None) -> Iterator[Any]:
    """A TestClient of `pyllama serve -m MODEL --chat-template TEMPLATE`, once the model is loaded."""
    from fastapi.testclient import TestClient

    from pyllama_cli.core.model.settings import LoadSettings
    from pyllama_cli.core.serving.scheduler import ParallelEngine
    from pyllama_cli.server.app import create_app
    from pyllama_cli.server.model_set import OneModel
    from pyllama_cli.server.settings import ServerSettings

    engine = ParallelEngine(model, LoadSettings(n_ctx=512, n_threads=1))
    settings = ServerSettings(alias="tiny", chat_template=template)
    with TestClient(create_app(OneModel(engine, settings), settings)) as client:
        deadline = time.monotonic() + 60
        while client.get("/health").status_code != 200:
            assert time.monotonic() < deadline, "the model did not load"
            time.sleep(0.02)
        yield client


def test_tokenize_gives_llama_cpp_s_tokens_without_dropping_a_bos(server: Server) -> None:
    for (content, add_special, parse_special), ids in TOKENIZE_CASES.items():
        body = {"content": content, "add_special": add_special, "parse_special": parse_special}
        assert httpx.post(f"{server.url}/tokenize", json=body).json() == {"tokens": ids}, body
    assert httpx.post(f"{server.url}/tokenize", json={"content": "hello"}).json() == {"tokens": [263]}
    body = {"content": "<s>héllo 😀 \x01", "add_special": True, "with_pieces": True}
    assert httpx.post(f"{server.url}/tokenize", json=body).json() == {"tokens": PIECES}


@pytest.mark.parametrize(("piece", "shaped"), [
    (b" hello", " hello"), (b"\xc3", [195]), (b"\xf0\x9f\x98", [240, 159, 152]), (b"\x80", [128]),
    # llama-server's check sees only lead and continuation bytes: a UTF-16 surrogate passes it, and its
    # JSON writer replaces each byte it cannot encode.
    (b"\xed\xa0\x80", "\ufffd\ufffd\ufffd"),
])
def test_pieces_are_shaped_as_llama_server_shapes_them(piece: bytes, shaped: object) -> None:
    from pyllama_cli.server.llama_server.tokens import piece_text

    assert piece_text(piece) == shaped


@pytest.mark.parametrize(("model", "template", "prompts"), [
    # Built-in templates: llama.cpp's never write BOS (the tokenizer adds it, or nothing does).
    ("tiny", "llama3", ["<|start_header_id|>user<|end_header_id|>\n\nhello<|eot_id|>"
                        "<|start_header_id|>assistant<|end_header_id|>\n\n"]),
    ("tiny", "gemma", ["<start_of_turn>user\nhello<end_of_turn>\n<start_of_turn>model\n"]),
    ("tiny", "llama2", ["[INST] hello [/INST]"]),
    ("no-bos", "llama3", ["<|start_header_id|>user<|end_header_id|>\n\nhello<|eot_id|>"
                          "<|start_header_id|>assistant<|end_header_id|>\n\n"]),
    # A Jinja template's BOS text goes only when the vocabulary adds BOS itself.
    pytest.param("tiny", BOS_TEMPLATE, ["<user>hello</user><assistant>",
                                        "<system>Be brief.</system><user>hello</user><assistant>hi there</assistant>"
                                        "<user>bye</user><assistant>"], id="tiny-bos_token-jinja"),
    pytest.param("no-bos", BOS_TEMPLATE, ["<s><user>hello</user><assistant>"], id="no-bos-bos_token-jinja"),
])
def test_apply_template_drops_the_bos_text_where_llama_server_does(tiny_model: Path, no_bos_model: Path, model: str,
                                                                   template: str, prompts: list[str]) -> None:
    with _in_process(tiny_model if model == "tiny" else no_bos_model, template) as client:
        for messages, prompt in zip((HELLO, CONVERSATION), prompts):
            assert client.post("/apply-template", json={"messages": messages}).json() == {"prompt": prompt}
        # A chat is fed the prompt with one BOS, the one the vocabulary adds (if it does).
        n_prompt = len(client.post("/tokenize", json={"content": prompts[0], "add_special": True}).json()["tokens"])
        answer = client.post("/v1/chat/completions", json={"messages": HELLO, "max_tokens": 1}).json()
        assert answer["usage"]["prompt_tokens"] == n_prompt


# ---------------------------------------------------------------- against llama-server itself

LLAMA_SERVER = Path(os.environ.get("LLAMA_CPP_BIN", "/nonexistent")) / "llama-server"
reference = pytest.mark.skipif(not LLAMA_SERVER.is_file(), reason="set LLAMA_CPP_BIN to a folder with llama-server")


@contextmanager
def _llama_server(model: Path, log: Path, *args: str) -> Iterator[str]:
    """llama-server for `model` on 127.0.0.1 (a free port), once it answers /health: its URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with open(log, "wb") as sink:
        proc = subprocess.Popen([str(LLAMA_SERVER), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
                                 "-c", "512", "-t", "1", *args], stdout=subprocess.DEVNULL, stderr=sink)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[-2000:]
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=15)


@pytest.mark.reference
@reference
def test_tokenize_equals_llama_server_s(tiny_model: Path, server: Server, tmp_path: Path) -> None:
    bodies = [{"content": content, "add_special": add, "parse_special": parse}
              for content in ("<s>hello", "<s><s>hello", "hello", "<s>", "", "<|im_start|>hello")
              for add in (True, False) for parse in (True, False)]
    bodies += [{"content": "hello"}, {"content": "<s>hello"},
               {"content": "<s>héllo 😀 \x01", "add_special": True, "with_pieces": True},
               {"content": "<s>héllo 😀 \x01", "parse_special": False, "with_pieces": True}]
    with _llama_server(tiny_model, tmp_path / "llama-server.log") as url:
        for body in bodies:
            theirs = httpx.post(f"{url}/tokenize", json=body).json()
            assert httpx.post(f"{server.url}/tokenize", json=body).json() == theirs, body


@pytest.mark.reference
@reference
@pytest.mark.parametrize(("model", "template", "n_conversations"), [
    ("tiny", None, 2),  # the model's own (ChatML) template, through llama-server's Jinja path
    pytest.param("tiny", BOS_TEMPLATE, 2, id="tiny-bos_token-jinja"),  # a Jinja template that writes BOS
    pytest.param("no-bos", BOS_TEMPLATE, 2, id="no-bos-bos_token-jinja"),
    # Built-in templates, which llama-server renders without Jinja.
    ("tiny", "chatml", 2), ("tiny", "llama3", 2), ("tiny", "gemma", 2), ("tiny", "phi3", 2), ("no-bos", "llama3", 2),
    ("tiny", "llama2", 2), ("tiny", "llama2-sys", 2), ("tiny", "llama2-sys-bos", 2), ("tiny", "llama2-sys-strip", 2),
    ("tiny", "zephyr", 2),
])
def test_apply_template_equals_llama_server_s(tiny_model: Path, no_bos_model: Path, tmp_path: Path, model: str,
                                              template: str | None, n_conversations: int) -> None:
    path = tiny_model if model == "tiny" else no_bos_model
    if template is None:
        args: tuple[str, ...] = ()
    elif template == BOS_TEMPLATE:
        (tmp_path / "bos.jinja").write_text(template)
        args = ("--chat-template-file", str(tmp_path / "bos.jinja"))
    else:
        args = ("--no-jinja", "--chat-template", template)
    conversations = [HELLO, CONVERSATION][:n_conversations]
    with _llama_server(path, tmp_path / "llama-server.log", *args) as url:
        theirs = [httpx.post(f"{url}/apply-template", json={"messages": m}).json() for m in conversations]
    with _in_process(path, template) as client:
        assert [client.post("/apply-template", json={"messages": m}).json() for m in conversations] == theirs
