"""Streams that survive their client (llama-server's replay buffer): real `pyllama serve` processes.

A streamed request with `X-Conversation-Id` keeps generating after its client leaves; /v1/stream
replays its bytes from any offset, /v1/streams/lookup reports the ids named, DELETE stops it.
"""

from __future__ import annotations

import asyncio
import gc
import json
import threading
import weakref
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from pyllama_cli.server.streams.buffer import ReplayBuffer
from pyllama_cli.server.streams.sessions import Session, StreamSessions
from tests.fixtures.make_gguf import TINY, write_llama_gguf
from tests.helpers import wait_slots_idle
from tests.test_router import Router
from tests.test_router import _start as _start_router
from tests.test_serve import Server, _start

KEY = "sk-streams"
AUTH = {"Authorization": f"Bearer {KEY}"}
BODY = {"model": "tiny", "stream": True, "temperature": 0, "max_tokens": 24, "ignore_eos": True,
        "messages": [{"role": "user", "content": "Tell me a story."}]}
GRACE = 1.0  # the bounded server's seconds a finished stream stays readable
BOUND = 1024 * 1024  # the bounded server's bytes per stream: LONG fits, LONG with 20 logprobs a token does not
LONG = {**BODY, "max_tokens": 3800}  # long enough to be running while a test looks


@pytest.fixture(scope="module")
def server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = _start(tiny_model, tmp_path_factory.mktemp("serve-streams") / "stderr.log", "-np", "2",
                 "--api-key", KEY)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def bounded(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = _start(tiny_model, tmp_path_factory.mktemp("serve-streams-bounded") / "stderr.log", "-np", "3",
                 "--stream-sessions", "2", "--stream-buffer-size", str(BOUND), "--stream-grace", str(GRACE))
    yield srv
    srv.stop()


def _headers(conv: str, auth: dict[str, str] = AUTH) -> dict[str, str]:
    return {**auth, "X-Conversation-Id": conv}


def _text(sse: bytes) -> str:
    """The joined `content` deltas of an OpenAI chat stream."""
    text = ""
    for line in sse.decode().split("\n"):
        if line.startswith("data: {"):
            for choice in json.loads(line[6:]).get("choices", []):
                text += choice["delta"].get("content") or ""
    return text


def _drop_after(url: str, body: dict, headers: dict[str, str], chunks: int = 3) -> bytes:
    """POST a stream, read `chunks` SSE events, hang up; the bytes read."""
    got = b""
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers, timeout=60) as response:
        assert response.status_code == 200, response.read()
        for part in response.iter_raw():
            got += part
            if got.count(b"\n\n") >= chunks:
                break
    return got


def _replay(url: str, conv: str, offset: int = 0, auth: dict[str, str] = AUTH) -> bytes:
    response = httpx.get(f"{url}/v1/stream", params={"conv_id": conv, "from": offset}, headers=auth, timeout=60)
    assert response.status_code == 200, response.text
    return response.content


def _lookup(url: str, ids: list[str], auth: dict[str, str] = AUTH) -> list[dict]:
    response = httpx.post(f"{url}/v1/streams/lookup", json={"conversation_ids": ids}, headers=auth, timeout=10)
    assert response.status_code == 200, response.text
    return response.json()


def _wait_finished(url: str, conv: str, auth: dict[str, str] = AUTH, timeout: float = 30) -> None:
    """Wait until lookup no longer reports the session: it has finished (a finished one is left out)."""
    deadline = time.monotonic() + timeout
    while found := _lookup(url, [conv], auth):
        assert time.monotonic() < deadline, found
        time.sleep(0.05)


def test_a_dropped_stream_replays_to_the_whole_undropped_answer(server: Server) -> None:
    plain = httpx.post(f"{server.url}/v1/chat/completions", json=BODY, headers=AUTH, timeout=60)
    whole = _text(plain.content)
    assert whole and plain.content.endswith(b"data: [DONE]\n\n")
    first = _drop_after(server.url, BODY, _headers("drop-1"))
    replayed = _replay(server.url, "drop-1")
    assert replayed.startswith(first)
    assert _text(replayed) == whole
    assert replayed.endswith(b"data: [DONE]\n\n")
    path_form = httpx.get(f"{server.url}/v1/stream/drop-1", headers=AUTH, timeout=60)  # /v1/stream/ID too
    assert path_form.content == replayed


def test_from_n_resumes_at_byte_n(server: Server) -> None:
    httpx.post(f"{server.url}/v1/chat/completions", json=BODY, headers=_headers("offsets"), timeout=60)
    whole = _replay(server.url, "offsets")
    for offset in (1, 57, len(whole) - 3, len(whole)):
        assert _replay(server.url, "offsets", offset) == whole[offset:]
    bad = httpx.get(f"{server.url}/v1/stream", params={"conv_id": "offsets", "from": "-1"}, headers=AUTH)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "from"


def test_lookup_reports_a_session_while_it_runs_not_after_and_only_the_ids_named(server: Server) -> None:
    _drop_after(server.url, LONG, _headers("look-a"))
    _drop_after(server.url, LONG, _headers("look-b::tiny"))
    [running] = _lookup(server.url, ["look-a", "nobody"])
    assert running["conversation_id"] == "look-a" and running["is_done"] is False
    assert running["completed_at"] is None and running["total_bytes"] > 0
    assert running["started_at"] <= time.time()
    [other] = _lookup(server.url, ["look-b"])  # an id matches its ID::model form, as in llama-server
    assert other["conversation_id"] == "look-b::tiny" and other["is_done"] is False
    assert _lookup(server.url, ["look"]) == []  # a prefix of an id reveals nothing
    assert _lookup(server.url, []) == []
    httpx.delete(f"{server.url}/v1/stream", params={"conv_id": "look-a"}, headers=AUTH)
    httpx.delete(f"{server.url}/v1/stream/look-b::tiny", headers=AUTH)
    httpx.post(f"{server.url}/v1/chat/completions", json=BODY, headers=_headers("look-c"), timeout=60)
    assert _lookup(server.url, ["look-a", "look-b", "look-c"]) == []  # stopped, stopped, finished
    assert _replay(server.url, "look-c").endswith(b"data: [DONE]\n\n")  # the finished one replays in its grace


def test_delete_stops_the_generation_at_once_and_is_idempotent(server: Server) -> None:
    _drop_after(server.url, LONG, _headers("stop-me"))
    assert any(s["is_processing"] for s in httpx.get(f"{server.url}/slots", headers=AUTH).json())
    started = time.monotonic()
    response = httpx.delete(f"{server.url}/v1/stream", params={"conv_id": "stop-me"}, headers=AUTH)
    assert response.status_code == 204
    assert all(s["state"] == "idle" for s in httpx.get(f"{server.url}/slots", headers=AUTH).json())
    assert time.monotonic() - started < 2
    assert httpx.delete(f"{server.url}/v1/stream/stop-me", headers=AUTH).status_code == 204
    gone = httpx.get(f"{server.url}/v1/stream", params={"conv_id": "stop-me"}, headers=AUTH)
    assert gone.status_code == 404 and gone.json()["error"]["message"] == "stream not found or expired"


def test_a_second_post_with_the_same_id_replaces_the_first(server: Server) -> None:
    _drop_after(server.url, LONG, _headers("again"))
    second = {**BODY, "messages": [{"role": "user", "content": "Something else."}]}
    httpx.post(f"{server.url}/v1/chat/completions", json=second, headers=_headers("again"), timeout=60)
    plain = httpx.post(f"{server.url}/v1/chat/completions", json=second, headers=AUTH, timeout=60)
    assert _text(_replay(server.url, "again")) == _text(plain.content)
    wait_slots_idle(server.url, headers=AUTH)  # the first was stopped, not left running


def test_every_stream_route_needs_the_key(server: Server) -> None:
    httpx.post(f"{server.url}/v1/chat/completions", json=BODY, headers=_headers("keyed"), timeout=60)
    calls = [("GET", "/v1/stream?conv_id=keyed", None), ("GET", "/v1/stream/keyed", None),
             ("POST", "/v1/streams/lookup", {"conversation_ids": ["keyed"]}),
             ("DELETE", "/v1/stream?conv_id=keyed", None), ("DELETE", "/v1/stream/keyed", None)]
    for method, path, body in calls:
        for auth in ({}, {"Authorization": "Bearer wrong"}):
            response = httpx.request(method, f"{server.url}{path}", json=body, headers=auth, timeout=10)
            assert response.status_code == 401, (method, path, response.text)
    assert _replay(server.url, "keyed").endswith(b"data: [DONE]\n\n")  # nothing was deleted without the key


def test_with_two_sessions_allowed_a_third_gets_503_while_both_run(bounded: Server) -> None:
    short = {**BODY, "max_tokens": 4}
    first = _drop_after(bounded.url, LONG, _headers("one", {}), chunks=1)
    _drop_after(bounded.url, LONG, _headers("two", {}), chunks=1)
    third = httpx.post(f"{bounded.url}/v1/chat/completions", json=short, headers=_headers("three", {}), timeout=60)
    assert third.status_code == 503
    assert third.json()["error"]["message"].startswith("all 2 stream sessions are still generating (--stream-sessions)")
    assert first
    httpx.delete(f"{bounded.url}/v1/stream/one")
    again = httpx.post(f"{bounded.url}/v1/chat/completions", json=short, headers=_headers("three", {}), timeout=60)
    assert again.status_code == 200 and again.content.endswith(b"data: [DONE]\n\n")
    httpx.delete(f"{bounded.url}/v1/stream/two")


def test_a_finished_stream_is_freed_after_its_grace(bounded: Server) -> None:
    httpx.post(f"{bounded.url}/v1/chat/completions", json=BODY, headers=_headers("brief", {}), timeout=60)
    assert _replay(bounded.url, "brief", auth={}).endswith(b"data: [DONE]\n\n")
    time.sleep(GRACE + 0.3)
    assert _lookup(bounded.url, ["brief"], {}) == []
    assert httpx.get(f"{bounded.url}/v1/stream/brief").status_code == 404


def test_a_session_that_leaves_the_registry_is_freed_at_once_not_after_its_grace() -> None:
    async def scenario() -> tuple[list[bool], int]:
        sessions, left = StreamSessions(max_sessions=1, max_bytes=1024, grace_s=300), []
        for conv in ("evicted", "stopped"):
            session = Session(conv, ReplayBuffer(1024), cancel=lambda: None)
            sessions.make_room(conv)  # the finished "evicted" goes to make room for "stopped"
            sessions.add(session)
            session.buffer.append(b"data: {}\n\n")
            if conv == "stopped":
                sessions.stop(conv)  # DELETE while it runs; its generation ends just after
            sessions.finished(session)
            left.append(weakref.ref(session))
            del session
        gc.collect()
        return [ref() is None for ref in left], len(sessions)  # while the loop (and its timers) still runs

    freed, count = asyncio.run(scenario())
    assert freed == [True, True] and count == 0  # no grace timer holds their buffers


def test_a_buffer_past_its_bound_ends_with_an_error_event(bounded: Server) -> None:
    body = {**LONG, "logprobs": True, "top_logprobs": 20}
    httpx.post(f"{bounded.url}/v1/chat/completions", json=body, headers=_headers("big", {}), timeout=60)
    replayed = _replay(bounded.url, "big", auth={})
    events = replayed.split(b"\n\n")
    error = json.loads(events[-3][len(b"data: "):])["error"]
    assert error["code"] == "stream_buffer_full"
    assert error["message"] == f"the stream passed its buffer of {BOUND} bytes (--stream-buffer-size)"
    assert replayed.endswith(b"data: [DONE]\n\n")
    assert len(replayed) - len(events[-3]) - len(b"\n\ndata: [DONE]\n\n") <= BOUND
    wait_slots_idle(bounded.url)


def _drop_and_replay(url: str, path: str, body: dict, conv: str, auth: dict[str, str]) -> tuple[bytes, bytes]:
    """(the undropped answer's bytes, the replay of the same request dropped after 3 events)."""
    plain = httpx.post(f"{url}{path}", json=body, headers=auth, timeout=60).content
    got = b""
    with httpx.stream("POST", f"{url}{path}", json=body, headers=_headers(conv, auth), timeout=60) as response:
        for part in response.iter_raw():
            got += part
            if got.count(b"\n\n") >= 3:
                break
    _wait_finished(url, conv, auth)
    return plain, _replay(url, conv, auth=auth)


def test_messages_and_completion_streams_detach_too(server: Server) -> None:
    messages = {"model": "m", "max_tokens": 16, "stream": True, "temperature": 0,
                "messages": [{"role": "user", "content": "Tell me a story."}]}
    plain, replayed = _drop_and_replay(server.url, "/v1/messages", messages, "messages-1", AUTH)
    assert replayed.count(b"event: content_block_delta") == plain.count(b"event: content_block_delta") > 3
    assert replayed.endswith(b'event: message_stop\ndata: {"type":"message_stop"}\n\n')

    def texts(sse: bytes) -> str:
        return "".join(json.loads(line[6:])["content"] for line in sse.decode().split("\n")
                       if line.startswith("data: {"))

    native = {"prompt": "Once upon a time", "n_predict": 16, "stream": True, "temperature": 0}
    plain, replayed = _drop_and_replay(server.url, "/completion", native, "native-1", AUTH)
    assert texts(replayed) == texts(plain) and texts(plain)


def test_ollama_ndjson_streams_ignore_the_header(server: Server) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "options": {"num_predict": 4}}
    response = httpx.post(f"{server.url}/api/chat", json=body, headers=_headers("ollama-1"), timeout=60)
    assert response.status_code == 200 and response.headers["content-type"] == "application/x-ndjson"
    assert _lookup(server.url, ["ollama-1"]) == []


def test_sigterm_ends_a_detached_stream_with_the_shutdown_error_event(tiny_model: Path, tmp_path: Path) -> None:
    srv = _start(tiny_model, tmp_path / "stderr.log", "--shutdown-grace", "0.5")
    try:
        _drop_after(srv.url, LONG, _headers("cut", {}))
        with httpx.stream("GET", f"{srv.url}/v1/stream/cut", timeout=30) as reader:
            srv.proc.terminate()
            replayed = reader.read()
        assert srv.proc.wait(timeout=15) == 0
    finally:
        srv.stop()
    error = json.loads(replayed.split(b"\n\n")[-3][len(b"data: "):])["error"]
    assert error["type"] == "server_shutdown"
    assert replayed.endswith(b"data: [DONE]\n\n")


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    """Two models, one loaded at a time, two slots each, two sessions, the byte bound, and a key: every
    router case."""
    folder = tmp_path_factory.mktemp("streams-router")
    write_llama_gguf(folder / "alpha.gguf", TINY)
    write_llama_gguf(folder / "beta.gguf", replace(TINY, seed=1))
    srv = _start_router(folder / "stderr.log", "-m", str(folder / "alpha.gguf"), "-m", str(folder / "beta.gguf"),
                        "-c", "4096", "-np", "2", "--models-max", "1", "--stream-sessions", "2", "--api-key", KEY,
                        "--stream-buffer-size", str(BOUND))
    yield srv
    srv.stop()


def _status(router: Router, model: str) -> str:
    cards = httpx.get(f"{router.url}/v1/models", headers=AUTH, timeout=10).json()["data"]
    return next(card["status"]["value"] for card in cards if card["id"] == model)


def _chat(url: str, body: dict, headers: dict[str, str] = AUTH) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=60)


def test_router_streams_resume_through_the_parent_and_hold_their_model(router: Router) -> None:
    for model in ("alpha", "beta"):
        body = {**BODY, "model": model}
        plain = _chat(router.url, body).content
        _drop_after(router.url, body, _headers(f"r-{model}::{model}"))
        assert _text(_replay(router.url, f"r-{model}::{model}")) == _text(plain)
    _drop_after(router.url, {**LONG, "model": "alpha"}, _headers("held"))
    answered: list[httpx.Response] = []
    other = threading.Thread(target=lambda: answered.append(_chat(router.url, {**BODY, "model": "beta"})))
    other.start()
    time.sleep(0.5)  # the detached generation holds alpha: --models-max 1 keeps beta waiting
    assert _status(router, "alpha") == "loaded" and _status(router, "beta") != "loaded" and not answered
    [held] = _lookup(router.url, ["held"])
    assert held["is_done"] is False
    assert httpx.delete(f"{router.url}/v1/stream/held", headers=AUTH).status_code == 204
    assert _lookup(router.url, ["held", "r-alpha"]) == []  # stopped, finished
    other.join(timeout=30)
    assert answered and answered[0].status_code == 200
    assert _status(router, "beta") == "loaded"


def test_router_streams_resume_from_n_are_replaced_and_need_the_key(router: Router) -> None:
    body = {**BODY, "model": "beta"}
    _chat(router.url, body, _headers("rn::beta"))
    whole = _replay(router.url, "rn::beta")
    for offset in (1, 57, len(whole) - 3, len(whole)):
        assert _replay(router.url, "rn::beta", offset) == whole[offset:]
    _drop_after(router.url, {**LONG, "model": "beta"}, _headers("rn::beta"))
    second = {**body, "messages": [{"role": "user", "content": "Something else."}]}
    _chat(router.url, second, _headers("rn::beta"))
    assert _text(_replay(router.url, "rn::beta")) == _text(_chat(router.url, second).content)
    assert _lookup(router.url, ["rn"]) == []  # the first was stopped by the second, which has finished
    for method, path in (("GET", "/v1/stream?conv_id=rn::beta"), ("GET", "/v1/stream/rn::beta"),
                         ("POST", "/v1/streams/lookup"), ("DELETE", "/v1/stream/rn::beta")):
        response = httpx.request(method, f"{router.url}{path}", json={"conversation_ids": ["rn"]}, timeout=10)
        assert response.status_code == 401, (method, path, response.text)
    assert _replay(router.url, "rn::beta").endswith(b"data: [DONE]\n\n")


def test_router_stream_bounds_and_a_stop_while_the_model_waits(router: Router) -> None:
    for conv in ("b1", "b2"):
        _drop_after(router.url, {**LONG, "model": "alpha"}, _headers(conv), chunks=1)
    third = _chat(router.url, {**BODY, "model": "alpha", "max_tokens": 4}, _headers("b3"))
    assert third.status_code == 503
    assert third.json()["error"]["message"].startswith("all 2 stream sessions are still generating")
    answered: list[httpx.Response] = []  # beta waits: alpha's two sessions hold it under --models-max 1
    waiting = threading.Thread(target=lambda: answered.append(
        _chat(router.url, {**BODY, "model": "beta"}, _headers("w::beta"))))
    waiting.start()
    deadline = time.monotonic() + 10
    while (early := httpx.get(f"{router.url}/v1/stream/w::beta", headers=AUTH, timeout=10)).status_code == 404:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert early.status_code == 503 and early.json()["error"]["message"] == "the stream's model is loading; retry later"
    assert _lookup(router.url, ["w::beta"]) == []  # no session yet
    assert httpx.delete(f"{router.url}/v1/stream/w::beta", headers=AUTH).status_code == 204
    waiting.join(timeout=10)
    assert answered and answered[0].status_code == 400
    assert answered[0].json()["error"]["message"] == "request cancelled by a stop while the model was loading"
    assert httpx.get(f"{router.url}/v1/stream/w::beta", headers=AUTH, timeout=10).status_code == 404
    for conv in ("b1", "b2"):
        assert httpx.delete(f"{router.url}/v1/stream/{conv}", headers=AUTH).status_code == 204


def test_router_a_buffer_past_its_bound_ends_with_an_error_event(router: Router) -> None:
    body = {**LONG, "model": "beta", "logprobs": True, "top_logprobs": 20}
    _chat(router.url, body, _headers("big::beta"))
    replayed = _replay(router.url, "big::beta")
    events = replayed.split(b"\n\n")
    assert json.loads(events[-3][len(b"data: "):])["error"]["code"] == "stream_buffer_full"
    assert replayed.endswith(b"data: [DONE]\n\n")
    assert len(replayed) - len(events[-3]) - len(b"\n\ndata: [DONE]\n\n") <= BOUND
