"""llama-server's native API on `pyllama serve`: /completion, /infill, /slots, chat extras, keys and CORS.

One server for the module: the tiny model with fill-in-the-middle tokens, 2 slots, a key, slot
files, `--cors-origin '*'`, and a template that shows a `chat_template_kwargs` variable.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from pyllama_cli.server.http.middleware import CorsMiddleware
from tests.fixtures.make_gguf import CHATML_TEMPLATE, TINY_FIM, write_llama_gguf
from tests.test_serve import Server, _start

KEY = "llama-api-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
PROMPT = "the quick brown fox"
TEMPLATE = CHATML_TEMPLATE + "{%- if greeting is defined -%}{{- greeting -}}{%- endif -%}"


@pytest.fixture(scope="module")
def fim_model(models_dir: Path) -> Path:
    return write_llama_gguf(models_dir / "tiny-fim.gguf", TINY_FIM)


@pytest.fixture(scope="module")
def srv(fim_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("llama-api")
    model = fim_model
    (folder / "slots").mkdir()
    (folder / "template.jinja").write_text(TEMPLATE)
    server = _start(model, folder / "stderr.log", "-np", "2", "-c", "1024", "-b", "128", "--api-key", KEY,
                    "--slot-save-path", str(folder / "slots"), "--cors-origin", "*",
                    "--chat-template", str(folder / "template.jinja"))
    yield server
    server.stop()


def _post(srv: Server, path: str, body: dict[str, Any], status: int = 200) -> Any:
    response = httpx.post(srv.url + path, json=body, headers=AUTH, timeout=60)
    assert response.status_code == status, response.text
    return response.json()


def _events(srv: Server, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    response = httpx.post(srv.url + path, json={**body, "stream": True}, headers=AUTH, timeout=60)
    assert response.status_code == 200 and response.text.endswith("data: [DONE]\n\n"), response.text
    return [json.loads(e[len("data: "):]) for e in response.text.split("\n\n")[:-2]]


def _tokens(srv: Server, text: str) -> list[int]:
    return _post(srv, "/tokenize", {"content": text, "add_special": True})["tokens"]


# ---------------------------------------------------------------- /completion


def test_completion_answers_in_llama_servers_shape(srv: Server) -> None:
    body = _post(srv, "/completion", {"prompt": PROMPT, "n_predict": 4, "temperature": 0, "return_tokens": True})
    n_prompt = len(_tokens(srv, PROMPT))
    assert {"content", "tokens", "stop", "model", "tokens_predicted", "tokens_evaluated", "generation_settings",
            "prompt", "has_new_line", "truncated", "stop_type", "stopping_word", "tokens_cached",
            "timings"} <= set(body)
    assert len(body["tokens"]) == 4 and body["tokens_predicted"] == 4 and body["tokens_evaluated"] == n_prompt
    assert (body["stop"], body["stop_type"], body["stopping_word"], body["model"]) == (True, "limit", "", "tiny-fim")
    assert body["tokens_cached"] == n_prompt + 3
    assert body["prompt"] == "<s> " + PROMPT
    assert body["timings"]["predicted_n"] == 4 and body["timings"]["prompt_n"] + body["timings"]["cache_n"] == n_prompt
    assert body["generation_settings"]["n_predict"] == 4 and body["generation_settings"]["temperature"] == 0
    # /detokenize drops the word-start space of a first piece; the answer's text keeps it.
    assert _post(srv, "/detokenize", {"tokens": body["tokens"]})["content"] == body["content"].removeprefix(" ")


def test_completion_stream_sends_each_token_then_the_whole_answer(srv: Server) -> None:
    request = {"prompt": PROMPT, "n_predict": 5, "temperature": 0}
    whole = _post(srv, "/completion", {**request, "return_tokens": True})
    chunks = _events(srv, "/completion", request)
    assert [c["stop"] for c in chunks] == [False] * 5 + [True]
    assert [c["tokens"] for c in chunks[:-1]] == [[t] for t in whole["tokens"]]
    assert "".join(c["content"] for c in chunks) == whole["content"]
    assert chunks[-1]["tokens_predicted"] == 5 and chunks[-1]["generation_settings"]["stream"] is True


def test_token_id_prompts_mixed_prompts_and_prompt_lists(srv: Server) -> None:
    ids = _tokens(srv, PROMPT)
    request = {"n_predict": 3, "temperature": 0}
    expected = _post(srv, "/completion", {**request, "prompt": PROMPT})["content"]
    assert _post(srv, "/completion", {**request, "prompt": ids})["content"] == expected
    assert _post(srv, "/completion", {**request, "prompt": {"prompt_string": PROMPT}})["content"] == expected
    # One sequence of ids and text: the text is tokenized without a BOS in the middle.
    mixed = _post(srv, "/completion", {**request, "prompt": ids[:3] + [PROMPT.split(" ", 2)[2]],
                                       "return_tokens": True})
    assert mixed["tokens_evaluated"] == len(ids) and mixed["content"] == expected
    several = _post(srv, "/completions", {**request, "prompt": [ids, PROMPT, {"prompt_string": PROMPT}]})
    assert [(b["index"], b["content"]) for b in several] == [(0, expected), (1, expected), (2, expected)]
    error = _post(srv, "/completion", {**request, "prompt": [ids, [5000]]}, status=400)["error"]
    assert error["param"] == "prompt" and "5000" in error["message"]


def test_n_probs_and_post_sampling_probs(srv: Server) -> None:
    body = _post(srv, "/completion", {"prompt": PROMPT, "n_predict": 3, "temperature": 0, "n_probs": 4,
                                      "return_tokens": True})
    probs = body["completion_probabilities"]
    assert [p["id"] for p in probs] == body["tokens"]
    for p in probs:
        top = p["top_logprobs"]
        assert len(top) == 4 and top[0]["id"] == p["id"] and top[0]["logprob"] == pytest.approx(p["logprob"])
        assert [t["logprob"] for t in top] == sorted((t["logprob"] for t in top), reverse=True)
        assert all(t["logprob"] < 0 and bytes(t["bytes"]).decode(errors="replace") == t["token"] for t in top)
    greedy = _post(srv, "/completion", {"prompt": PROMPT, "n_predict": 2, "temperature": 0, "n_probs": 4,
                                        "post_sampling_probs": True})["completion_probabilities"]
    assert [(p["prob"], [(t["id"], t["prob"]) for t in p["top_probs"]]) for p in greedy] == \
        [(1.0, [(p["id"], 1.0)]) for p in greedy]
    sampled = _post(srv, "/completion", {"prompt": PROMPT, "n_predict": 2, "temperature": 1, "top_k": 5,
                                         "n_probs": 10, "post_sampling_probs": True})["completion_probabilities"]
    for p in sampled:  # top-k 5 leaves five candidates, whose probabilities add up to 1
        assert len(p["top_probs"]) == 5 and sum(t["prob"] for t in p["top_probs"]) == pytest.approx(1.0)
        assert p["prob"] == pytest.approx(next(t["prob"] for t in p["top_probs"] if t["id"] == p["id"]))


def test_samplers_choose_the_stages_of_the_chain(srv: Server) -> None:
    request = {"prompt": PROMPT, "n_predict": 1, "temperature": 1, "seed": 5, "top_k": 3, "n_probs": 10,
               "post_sampling_probs": True}
    only_k = _post(srv, "/completion", {**request, "samplers": ["top_k", "temperature"]})
    assert len(only_k["completion_probabilities"][0]["top_probs"]) == 3
    assert only_k["generation_settings"]["samplers"] == ["top_k", "temperature"]
    no_k = _post(srv, "/completion", {**request, "samplers": "t"})  # llama-server's letters: t = temperature
    assert len(no_k["completion_probabilities"][0]["top_probs"]) == 10
    assert _post(srv, "/completion", {**request, "samplers": ["mystery"]}, status=400)["error"]["param"] == "samplers"


def test_t_max_predict_ms_ends_a_long_answer(srv: Server) -> None:
    body = _post(srv, "/completion", {"prompt": PROMPT, "n_predict": 400, "ignore_eos": True,
                                      "t_max_predict_ms": 1})
    assert body["stop_type"] == "limit" and 1 <= body["tokens_predicted"] < 400


def test_streamed_n_probs_come_with_their_token(srv: Server) -> None:
    chunks = _events(srv, "/completion", {"prompt": PROMPT, "n_predict": 3, "temperature": 0, "n_probs": 2})
    assert [[p["id"] for p in c["completion_probabilities"]] for c in chunks[:-1]] == [c["tokens"] for c in chunks[:-1]]


def test_a_prompt_past_the_slot_is_llama_servers_context_error(srv: Server) -> None:
    error = _post(srv, "/completion", {"prompt": "hello " * 600}, status=400)["error"]
    assert (error["type"], error["n_ctx"]) == ("exceed_context_size_error", 512) and error["n_prompt_tokens"] > 512
    chat = _post(srv, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hello " * 600}]},
                 status=400)["error"]
    assert chat["type"] == "exceed_context_size_error" and chat["n_ctx"] == 512


# ---------------------------------------------------------------- /infill, /slots, /props


@pytest.mark.parametrize("path", ["/completion", "/infill"])
def test_a_huge_prompt_is_tokenized_off_the_event_loop(srv: Server, path: str) -> None:
    # 1 MiB of prompt takes the tokenizer a while; meanwhile every other connection is still answered
    # at once (the prompt is prepared in a worker thread, as on every route that generates).
    text = "the quick brown fox jumps over the lazy dog " * (2**20 // 44)
    body = {"prompt": text} if path == "/completion" else {"input_prefix": text, "input_suffix": "x"}
    payload = json.dumps({**body, "n_predict": 1}).encode()  # encoded now: the client's own work is not timed
    answered: list[httpx.Response] = []
    took: list[float] = []

    def send_big() -> None:
        started = time.perf_counter()
        answered.append(httpx.post(srv.url + path, content=payload,
                                   headers={**AUTH, "Content-Type": "application/json"}, timeout=120))
        took.append(time.perf_counter() - started)

    big = threading.Thread(target=send_big)
    latencies = []
    with httpx.Client(base_url=srv.url, timeout=30) as client:
        assert client.get("/health").status_code == 200  # the connection is open before the big request
        big.start()
        time.sleep(0.05)  # its body is on the way
        while big.is_alive():
            started = time.perf_counter()
            assert client.get("/health").status_code == 200
            latencies.append(time.perf_counter() - started)
            time.sleep(0.01)
    big.join()
    [response] = answered
    assert len(latencies) >= 3, latencies  # /health was asked several times while the prompt was tokenized
    # Tokenized on the event loop, one /health would wait for most of the big request (the tokenizing is most
    # of its work); a loaded machine delays any answer now and then, by 0.2 s here, so the bound is relative.
    assert max(latencies) < max(0.1, took[0] / 4), (took, latencies)
    if path == "/completion":  # more tokens than the context holds: the prompt was read to the end
        assert (response.status_code, response.json()["error"]["code"]) == (400, "context_length_exceeded")
    else:  # infill keeps the end of the prefix that fits
        assert response.status_code == 200, response.text


def test_infill_lays_out_prefix_suffix_and_middle(srv: Server) -> None:
    body = _post(srv, "/infill", {"input_prefix": "def f", "input_suffix": "return", "prompt": "the",
                                  "n_predict": 2, "temperature": 0})
    # Each text is tokenized alone, so each gets the vocabulary's word-start space.
    assert body["prompt"] == "<s><|fim_prefix|> def f the<|fim_suffix|> return<|fim_middle|>"
    assert body["tokens_predicted"] == 2
    extra = _post(srv, "/infill", {"input_prefix": "a", "input_suffix": "b", "n_predict": 1,
                                   "input_extra": [{"filename": "x.py", "text": "hello"}]})
    assert extra["prompt"] == "\n\n--- snippet ---\n\n hello<s><|fim_prefix|> a<|fim_suffix|> b<|fim_middle|>"
    assert _post(srv, "/infill", {"input_extra": [{"filename": 123, "text": "x"}]}, status=400)["error"]["param"] \
        == "input_extra[0].filename"


def test_slot_save_erase_restore_round_trip(srv: Server) -> None:
    prompt = "hello world " * 20
    first = _post(srv, "/completion", {"prompt": prompt, "n_predict": 2, "id_slot": 0, "temperature": 0})
    saved = _post(srv, "/slots/0?action=save", {"filename": "zero.bin"})
    assert first["id_slot"] == 0
    assert (saved["id_slot"], saved["filename"], saved["n_saved"]) == (0, "zero.bin", first["tokens_cached"])
    assert _post(srv, "/slots/1?action=erase", {}) ["id_slot"] == 1
    assert next(s for s in httpx.get(srv.url + "/slots", headers=AUTH).json() if s["id"] == 1)["n_cached"] == 0
    restored = _post(srv, "/slots/1?action=restore", {"filename": "zero.bin"})
    assert (restored["n_restored"], restored["n_read"]) == (saved["n_saved"], saved["n_written"])
    again = _post(srv, "/completion", {"prompt": prompt, "n_predict": 2, "id_slot": 1, "temperature": 0})
    assert again["timings"]["cache_n"] == first["tokens_evaluated"] - 1 and again["content"] == first["content"]
    assert again["id_slot"] == 1
    for name in ("../zero.bin", "/etc/passwd", "a/b"):
        assert _post(srv, "/slots/0?action=save", {"filename": name}, status=400)["error"]["param"] == "filename"
    assert _post(srv, "/slots/0?action=restore", {"filename": "missing.bin"}, status=400)["error"]
    assert _post(srv, "/slots/5?action=erase", {}, status=400)["error"]["param"] == "id_slot"


def test_slots_and_props_show_what_llama_server_shows(srv: Server) -> None:
    slots = httpx.get(srv.url + "/slots", headers=AUTH).json()
    assert [(s["id"], s["n_ctx"], s["is_processing"]) for s in slots] == [(0, 512, False), (1, 512, False)]
    props = httpx.get(srv.url + "/props", headers=AUTH).json()
    assert (props["total_slots"], props["default_generation_settings"]["n_ctx"]) == (2, 512)
    assert props["modalities"] == {"vision": False, "audio": False} and props["model_path"].endswith("tiny-fim.gguf")


# ---------------------------------------------------------------- chat extras


def _verbose_prompt(srv: Server, messages: list[dict[str, Any]], **fields: Any) -> str:
    body = _post(srv, "/v1/chat/completions", {"messages": messages, "max_tokens": 1, "verbose": True, **fields})
    return body["__verbose"]["prompt"]


def test_a_last_assistant_message_is_continued(srv: Server) -> None:
    talk = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello the"}]
    opened = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert _verbose_prompt(srv, talk) == opened + "Hello the"
    assert _verbose_prompt(srv, talk, continue_final_message=True, add_generation_prompt=False) == opened + "Hello the"
    assert _verbose_prompt(srv, talk[:1], add_generation_prompt=False) == "<|im_start|>user\nhi<|im_end|>\n"
    both = {"messages": talk, "continue_final_message": True, "add_generation_prompt": True}
    assert _post(srv, "/v1/chat/completions", both, status=400)["error"]["param"] == "continue_final_message"
    twice = {"messages": [*talk, {"role": "assistant", "content": "again"}]}
    assert _post(srv, "/v1/chat/completions", twice, status=400)["error"]["param"] == "messages"


def test_chat_template_kwargs_reach_the_template(srv: Server) -> None:
    talk = [{"role": "user", "content": "hi"}]
    assert _verbose_prompt(srv, talk, chat_template_kwargs={"greeting": "HOWDY"}).endswith("assistant\nHOWDY")
    assert _verbose_prompt(srv, talk, chat_template_kwargs={"messages": []}).startswith("<|im_start|>user\nhi")


def test_n_choices_each_answer(srv: Server) -> None:
    body = _post(srv, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 3,
                                               "max_tokens": 4, "seed": 11, "temperature": 1, "ignore_eos": True})
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert all(c["finish_reason"] == "length" for c in body["choices"])
    assert len({c["message"]["content"] for c in body["choices"]}) > 1  # seeds 11, 12, 13
    assert body["usage"]["completion_tokens"] == 12 and body["timings"]["predicted_n"] == 4


def test_n_choices_stream_together(srv: Server) -> None:
    # Greedy, so that each choice's text is known: a chunk given to the wrong choice shows.
    request = {"messages": [{"role": "user", "content": "hi"}], "n": 3, "max_tokens": 4, "temperature": 0,
               "ignore_eos": True}
    whole = _post(srv, "/v1/chat/completions", request)
    chunks = _events(srv, "/v1/chat/completions", {**request, "stream_options": {"include_usage": True}})
    texts = ["".join(c["choices"][0]["delta"].get("content") or "" for c in chunks
                     if c["choices"] and c["choices"][0]["index"] == i) for i in range(3)]
    assert texts == [c["message"]["content"] for c in whole["choices"]]
    finishes = [c["choices"][0]["index"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert sorted(finishes) == [0, 1, 2] and chunks[-1]["usage"] == whole["usage"]


def test_chat_stream_reports_progress_and_timings_per_token(srv: Server) -> None:
    chunks = _events(srv, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hello world " * 30}], "max_tokens": 3, "temperature": 0,
        "return_progress": True, "timings_per_token": True, "stream_options": {"include_usage": True},
        "cache_prompt": False})
    progress = [c["prompt_progress"] for c in chunks if "prompt_progress" in c]
    assert progress[0]["processed"] == progress[0]["cache"] == 0
    assert [p["processed"] for p in progress] == sorted({p["processed"] for p in progress})
    assert progress[-1]["processed"] == progress[-1]["total"] and len(progress) >= 2
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    content = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    # The tokens generated so far: one more per chunk as a rule, but a token's text may be held back (a part of a
    # character, a possible stop string) and sent with a later one's, or flushed after the last token.
    counted = [c["timings"]["predicted_n"] for c in content]
    assert counted == sorted(counted) and 1 <= counted[0] and counted[-1] <= 3, counted
    assert chunks[-1]["usage"]["completion_tokens"] == 3 and chunks[-1]["timings"]["predicted_n"] == 3


@pytest.mark.parametrize(("seed", "expected"), [(0, [1, 2, 3]), (10, [1, 3]), (63, [1, 3])])
def test_timings_per_token_count_tokens_not_chunks(srv: Server, seed: int, expected: list[int]) -> None:
    # On the fixture model these seeds sample, in turn: three whole pieces; a half character completed by the
    # next token (one chunk for tokens 2 and 3); and two half characters, the one that max_tokens cuts dropped (as
    # llama-server drops it), not flushed as a chunk of U+FFFD.
    chunks = _events(srv, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hello world " * 30}], "max_tokens": 3, "seed": seed,
        "temperature": 1.5, "timings_per_token": True, "cache_prompt": False})
    content = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert [c["timings"]["predicted_n"] for c in content] == expected


def test_input_tokens_counts_the_rendered_prompt(srv: Server) -> None:
    counted = _post(srv, "/v1/chat/completions/input_tokens", {"messages": [{"role": "user", "content": "hi"}]})
    rendered = _post(srv, "/apply-template", {"messages": [{"role": "user", "content": "hi"}]})["prompt"]
    assert counted == {"input_tokens": len(_tokens(srv, rendered)), "object": "response.input_tokens"}


# ---------------------------------------------------------------- keys and CORS


@pytest.mark.parametrize("headers", [{"Authorization": f"Bearer {KEY}"}, {"X-Api-Key": KEY}, {"x-api-key": KEY}])
def test_the_key_is_taken_from_each_header(srv: Server, headers: dict[str, str]) -> None:
    assert httpx.post(srv.url + "/completion", json={"prompt": "hi", "n_predict": 1}, headers=headers).status_code \
        == 200


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer nope"}, {"X-Api-Key": "nope"}])
def test_a_missing_or_wrong_key_is_401(srv: Server, headers: dict[str, str]) -> None:
    response = httpx.post(srv.url + "/completion", json={"prompt": "hi"}, headers=headers)
    assert response.status_code == 401 and response.json()["error"]["type"] == "authentication_error"


def test_cors_star_reflects_any_origin_and_says_so(srv: Server) -> None:
    preflight = httpx.options(srv.url + "/completion", headers={
        "Origin": "https://elsewhere.example", "Access-Control-Request-Method": "POST"})
    assert preflight.status_code == 200
    assert (preflight.headers["access-control-allow-origin"], preflight.headers["access-control-allow-credentials"]) \
        == ("https://elsewhere.example", "true")
    assert "--cors-origin '*': any web page" in srv.stderr


def test_cors_header_names_are_written_as_llama_server_writes_them(srv: Server) -> None:
    # Some clients (llama-server's test suite) look them up case-sensitively in a plain dict.
    import socket

    host, port = srv.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(b"OPTIONS /completion HTTP/1.1\r\nHost: localhost\r\nOrigin: http://localhost:5173\r\n"
                     b"Access-Control-Request-Method: POST\r\nConnection: close\r\n\r\n")
        head = b""
        while b"\r\n\r\n" not in head:
            head += conn.recv(4096)
    assert b"\r\nAccess-Control-Allow-Origin: http://localhost:5173\r\n" in head
    assert b"\r\nAccess-Control-Allow-Credentials: true\r\n" in head


def _cors_client(*origins: str) -> TestClient:
    app = Starlette(routes=[Route("/", lambda _: PlainTextResponse("ok"))])
    return TestClient(CorsMiddleware(app, origins=origins))


@pytest.mark.parametrize("origin", ["http://localhost", "http://localhost:8080", "https://127.0.0.1:3000",
                                    "http://[::1]", "http://[::1]:5173", "https://app.example"])
def test_cors_reflects_loopback_origins_and_the_named_ones(origin: str) -> None:
    response = _cors_client("https://app.example").get("/", headers={"Origin": origin})
    assert response.headers["access-control-allow-origin"] == origin and response.text == "ok"


@pytest.mark.parametrize("origin", ["http://evil.com", "http://localhost.evil.com", "http://notlocalhost",
                                    "http://127.0.0.1.evil.com", "file://localhost"])
def test_cors_leaves_other_origins_without_headers(origin: str) -> None:
    client = _cors_client("https://app.example")
    plain = client.get("/", headers={"Origin": origin})
    preflight = client.options("/", headers={"Origin": origin, "Access-Control-Request-Method": "POST"})
    for response in (plain, preflight):
        assert not any(h.startswith("access-control-") for h in response.headers), response.headers


def test_several_hosts_are_served_on_one_port(fim_model: Path, tmp_path: Path) -> None:
    import socket

    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    server = _start(fim_model, tmp_path / "stderr.log", "--host", "127.0.0.1,::1")
    try:
        port = server.url.rsplit(":", 1)[1]
        assert f"listening on http://127.0.0.1:{port}, http://[::1]:{port}" in server.stderr
        for host in ("127.0.0.1", "[::1]"):
            assert httpx.get(f"http://{host}:{port}/health").json() == {"status": "ok"}
    finally:
        server.stop()
