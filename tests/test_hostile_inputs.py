"""What an independent probe of `pyllama serve` broke, each answered in the API's shape, never a 5xx
or a crash: lone surrogates on every route, huge Responses metadata, slot files that are cut short,
on a full disk or behind symlinks, hostile metric label values, foreign Host headers, /docs."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from pyllama_cli.server.http.hosts import allowed_hosts
from pyllama_cli.server.http.unicode import lone_surrogate
from pyllama_cli.server.responses_api.store import ResponseStore
from tests.fixtures.make_gguf import TINY, write_llama_gguf
from tests.test_serve import Server, _start, spawn_serve

HELLO = [{"role": "user", "content": "hello"}]
LONE = '"\\ud800"'  # JSON text: half a UTF-16 pair


@pytest.fixture(scope="module")
def srv(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("hostile")
    (folder / "slots").mkdir()
    server = _start(tiny_model, folder / "stderr.log", "-c", "2048", "-np", "2", "--slot-save-path", str(folder / "slots"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def flagged(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server with the flags that three tests each look at on their own: --allowed-hosts, --docs and a
    small --max-grammar-size (one start instead of three)."""
    server = _start(tiny_model, tmp_path_factory.mktemp("flagged") / "stderr.log", "--allowed-hosts",
                    "evil.example,other.example", "--docs", "--max-grammar-size", "2048")
    yield server
    server.stop()


def _raw(srv: Server, path: str, body: str, client: httpx.Client | None = None) -> httpx.Response:
    send = client.post if client is not None else httpx.post
    return send(srv.url + path, content=body.encode(), headers={"Content-Type": "application/json"}, timeout=30)


# ---------------------------------------------------------------- lone surrogates

SURROGATE_BODIES = {
    "/apply-template": f'{{"messages": [{{"role": "user", "content": {LONE}}}]}}',
    "/tokenize": f'{{"content": {LONE}}}',
    "/detokenize": f'{{"tokens": [1], "model": {LONE}}}',
    "/completion": f'{{"prompt": {LONE}, "n_predict": 1}}',
    "/infill": f'{{"input_prefix": {LONE}, "input_suffix": "b", "n_predict": 1}}',
    "/v1/completions": f'{{"prompt": "a", "stop": [{LONE}], "max_tokens": 1}}',
    "/v1/chat/completions": f'{{"messages": [{{"role": "user", "content": "hi", "name": {LONE}}}], "max_tokens": 1}}',
    "/v1/messages": f'{{"model": "m", "max_tokens": 1, "messages": [{{"role": "user", "content": {LONE}}}]}}',
    "/v1/responses": f'{{"input": "hi", "metadata": {{"k": {LONE}}}, "max_output_tokens": 1}}',
    "/v1/embeddings": f'{{"input": {LONE}}}',
    "/v1/chat/completions/input_tokens": f'{{"messages": [{{"role": "user", "content": {LONE}}}]}}',
    "/v1/messages/count_tokens": f'{{"model": "m", "messages": [{{"role": "user", "content": {LONE}}}]}}',
    "/render": f'{{"text": {LONE}}}',
    "/slots/0?action=save": f'{{"filename": {LONE}}}',
    "/models/load": f'{{"model": {LONE}}}',
    "/models": f'{{"model": {LONE}}}',
}


@pytest.mark.parametrize("path", sorted(SURROGATE_BODIES))
def test_a_lone_surrogate_is_a_400_in_the_apis_shape_on_every_route(srv: Server, path: str) -> None:
    with httpx.Client() as client:
        response = _raw(srv, path, SURROGATE_BODIES[path], client)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["message"] == "the request holds a lone UTF-16 surrogate ('\\ud800'), which is not valid Unicode"
        if path.startswith("/v1/messages"):
            assert response.json()["type"] == "error" and error["type"] == "invalid_request_error"
        # The keep-alive connection goes on serving.
        assert client.get(srv.url + "/health", timeout=10).status_code == 200
    assert "Traceback" not in srv.stderr


def test_surrogate_pairs_and_escaped_backslashes_pass(srv: Server) -> None:
    pair = _raw(srv, "/apply-template", '{"messages": [{"role": "user", "content": "\\ud83d\\ude00 \\\\ud800"}]}')
    assert pair.status_code == 200, pair.text
    assert "\U0001f600 \\ud800" in pair.json()["prompt"]


def test_lone_surrogate_finds_halves_alone_and_only_those() -> None:
    assert lone_surrogate(b'{"a": "\\ud800"}') == 0xD800
    assert lone_surrogate(b'{"a": "\\udc00x"}') == 0xDC00
    assert lone_surrogate(b'{"a": "\\ud800\\u0041"}') == 0xD800
    assert lone_surrogate(b'{"a": "\\ud800", "b": "\\udc00"}') == 0xD800  # halves in two strings
    assert lone_surrogate(b'{"a": "\\uD83D\\uDE00"}') is None
    assert lone_surrogate(b'{"a": "\\\\ud800"}') is None  # a backslash, then text
    assert lone_surrogate(b'{"a": "\\\\\\ud800"}') == 0xD800


# ---------------------------------------------------------------- Responses: metadata and the store


@pytest.mark.parametrize(("metadata", "message"), [
    ({f"k{i}": "v" for i in range(17)}, "at most 16 key-value pairs (got 17)"),
    ({"k" * 65: "v"}, "a key has at most 64 characters (got 65)"),
    ({"k": "v" * 513}, "the value of 'k' has at most 512 characters (got 513)"),
])
def test_responses_metadata_beyond_openais_limits_is_a_400(srv: Server, metadata: dict, message: str) -> None:
    response = httpx.post(f"{srv.url}/v1/responses", json={"input": "hi", "metadata": metadata,
                                                           "max_output_tokens": 1}, timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["message"] == f"metadata: Value error, {message}"
    assert response.json()["error"]["param"] == "metadata"


def test_responses_metadata_at_openais_limits_is_stored(srv: Server) -> None:
    metadata = {f"{i:02d}" + "k" * 62: "v" * 512 for i in range(16)}
    response = httpx.post(f"{srv.url}/v1/responses", json={"input": "hi", "metadata": metadata,
                                                           "max_output_tokens": 1}, timeout=30)
    assert response.status_code == 200, response.text
    stored = httpx.get(f"{srv.url}/v1/responses/{response.json()['id']}", timeout=30).json()
    assert stored["metadata"] == metadata


def test_the_response_store_is_bounded_by_the_memory_it_holds() -> None:
    limit = 2 * 1024 * 1024
    store = ResponseStore(max_bytes=limit)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n in range(16):  # many small values: a dict of them holds several times its JSON (16 x 0.2 MB of JSON)
            store.put({"id": f"resp_{n}", "metadata": {str(k): "v" for k in range(20000)}},
                      [{"role": "user", "content": "hi"}])
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert store.size <= limit and len(store.items) >= 2
    assert held <= limit * 1.2, held
    assert store.get("resp_15").body["metadata"]["19999"] == "v"


# ---------------------------------------------------------------- slot files


def _fill_slot(srv: Server, words: int = 200) -> dict:
    body = {"prompt": "hello world " * (words // 2), "n_predict": 1, "id_slot": 0, "temperature": 0}
    response = httpx.post(f"{srv.url}/completion", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def _slot(srv: Server, action: str, name: str, slot: int = 0) -> httpx.Response:
    return httpx.post(f"{srv.url}/slots/{slot}?action={action}", json={"filename": name}, timeout=60)


def test_a_cut_short_or_foreign_slot_file_is_refused_and_the_server_lives(srv: Server, tmp_path: Path) -> None:
    folder = _slots_folder(srv)
    _fill_slot(srv)
    assert _slot(srv, "save", "whole.bin").status_code == 200
    whole = (folder / "whole.bin").read_bytes()
    cases = {"cut.bin": whole[:len(whole) // 2], "header.bin": whole[:12], "long.bin": whole + b"\0" * 64,
             "garbage.bin": b"not a slot file at all", "many.bin": whole[:8] + (10**6).to_bytes(4, "little")}
    for name, data in cases.items():
        (folder / name).write_bytes(data)
        response = _slot(srv, "restore", name, slot=1)
        assert response.status_code == 400, (name, response.text)
        assert srv.proc.poll() is None, name
    assert _slot(srv, "restore", "whole.bin", slot=1).json()["n_read"] == len(whole)
    assert "GGML_ASSERT" not in srv.stderr


def test_a_slot_file_of_another_model_is_refused(srv: Server, tmp_path: Path) -> None:
    from dataclasses import replace

    other = write_llama_gguf(tmp_path / "other.gguf", replace(TINY, n_layer=3, seed=5))
    folder = _slots_folder(srv)
    server = _start(other, tmp_path / "other.log", "-c", "1024", "--slot-save-path", str(folder))
    try:
        _fill_slot(server)
        assert _slot(server, "save", "other.bin").status_code == 200
    finally:
        server.stop()
    response = _slot(srv, "restore", "other.bin")
    assert response.status_code == 400, response.text
    assert "no slot state of this model" in response.json()["error"]["message"]


def test_symlinks_in_the_slot_folder_are_refused(srv: Server, tmp_path: Path) -> None:
    folder = _slots_folder(srv)
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    (folder / "link.bin").symlink_to(target)
    _fill_slot(srv)
    for action in ("save", "restore"):
        response = _slot(srv, action, "link.bin")
        assert response.status_code == 400, response.text
        assert response.json()["error"]["message"] == ("'link.bin' is a symbolic link: slot files must be plain "
                                                       "files in --slot-save-path")
    assert target.read_text() == "keep me"


def _slots_folder(srv: Server) -> Path:
    args = Path(f"/proc/{srv.proc.pid}/cmdline").read_bytes().split(b"\0")
    return Path(args[args.index(b"--slot-save-path") + 1].decode())


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs (root only): a disk that fills up."""
    folder = tmp_path / "disk"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)],
                             capture_output=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=False)


def test_a_full_disk_is_a_507_and_leaves_no_partial_file(tiny_model: Path, tiny_disk: Path, tmp_path: Path) -> None:
    server = _start(tiny_model, tmp_path / "stderr.log", "-c", "1024", "--slot-save-path", str(tiny_disk))
    try:
        (tiny_disk / "old.bin").write_bytes(b"x" * 1000)
        _fill_slot(server, words=400)
        response = _slot(server, "save", "old.bin")
        assert response.status_code == 507, response.text
        error = response.json()["error"]
        assert error["code"] == "insufficient_storage" and "(no space left?)" in error["message"]
        assert os.listdir(tiny_disk) == ["old.bin"] and (tiny_disk / "old.bin").read_bytes() == b"x" * 1000
        assert _slot(server, "restore", "old.bin").status_code == 400
        assert server.proc.poll() is None and "Traceback" not in server.stderr
    finally:
        server.stop()


# ---------------------------------------------------------------- /metrics, Host, /docs, frames


def test_metric_label_values_are_escaped(tmp_path: Path) -> None:
    folder = tmp_path / "models"
    folder.mkdir()
    write_llama_gguf(folder / 'q"uote.gguf', TINY)
    write_llama_gguf(folder / "back\\slash.gguf", TINY)
    server = spawn_serve(tmp_path / "stderr.log", ["--models-dir", str(folder), "-c", "512"])
    try:
        text = httpx.get(f"{server.url}/metrics", timeout=30).text
    finally:
        server.stop()
    assert 'pyllama_model_loaded{model="q\\"uote"} 0' in text.splitlines()
    assert 'pyllama_model_loaded{model="back\\\\slash"} 0' in text.splitlines()


def test_a_loopback_server_answers_only_loopback_host_names(srv: Server) -> None:
    port = srv.url.rsplit(":", 1)[1]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "localhost"):
        assert httpx.get(f"{srv.url}/health", headers={"Host": host}).status_code == 200, host
    refused = httpx.get(f"{srv.url}/v1/models", headers={"Host": f"evil.example:{port}"})
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "host_not_allowed"
    assert refused.json()["error"]["message"] == ("the host 'evil.example' is not one this server answers to; "
                                                  "start it with --allowed-hosts evil.example (or '*') to allow it")


def test_allowed_hosts_lets_named_hosts_in(flagged: Server) -> None:
    named = [httpx.get(f"{flagged.url}/health", headers={"Host": host}).status_code
             for host in ("evil.example", "OTHER.example:80", "localhost", "third.example")]
    assert named == [200, 200, 200, 403]


def test_any_host_when_bound_off_loopback_or_given_a_star() -> None:
    assert allowed_hosts("127.0.0.1", []) == ("localhost",)
    assert allowed_hosts("127.0.0.1,::1", ["a.example"]) == ("localhost", "a.example")
    assert allowed_hosts("0.0.0.0", []) == ()  # any
    assert allowed_hosts("127.0.0.1", ["*"]) == ()
    assert allowed_hosts("192.168.1.5", ["a.example"]) == ("localhost", "a.example")


def test_docs_only_with_the_flag_and_the_page_refuses_frames(srv: Server, flagged: Server) -> None:
    assert httpx.get(f"{srv.url}/docs").status_code == 404
    assert httpx.get(f"{srv.url}/redoc").status_code == 404
    assert "/v1/chat/completions" in httpx.get(f"{srv.url}/openapi.json").json()["paths"]
    page = httpx.get(f"{srv.url}/", headers={"Accept": "text/html"})  # a browser: the page, not ollama's reply
    assert page.headers["X-Frame-Options"] == "DENY" and "frame-ancestors 'none'" in page.headers[
        "Content-Security-Policy"]
    assert httpx.get(f"{flagged.url}/docs").status_code == 200


def test_huge_json_bodies_of_many_keys_are_refused_quickly(srv: Server) -> None:
    metadata = json.dumps({str(k): "v" for k in range(150_000)})
    response = _raw(srv, "/v1/responses", f'{{"input": "hi", "metadata": {metadata}}}')
    assert response.status_code == 400


# ---------------------------------------------------------------- huge grammars

HUGE_ENUM = {"enum": [f"value-{i:06d}-abcdefghij" for i in range(13_000)]}  # 349 KB of JSON, as the probe's


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", {"messages": HELLO, "max_tokens": 2, "response_format": {
        "type": "json_schema", "json_schema": {"name": "e", "schema": HUGE_ENUM}}}, "response_format.json_schema.schema"),
    ("/completion", {"prompt": "a", "n_predict": 2, "json_schema": HUGE_ENUM}, "json_schema"),
    ("/v1/responses", {"input": "a", "max_output_tokens": 2, "text": {"format": {
        "type": "json_schema", "name": "e", "schema": HUGE_ENUM}}}, "response_format.json_schema.schema"),
])
def test_a_huge_schema_enum_is_a_400_before_any_grammar_is_built(srv: Server, path: str, body: dict,
                                                                   param: str) -> None:
    started = time.monotonic()
    response = httpx.post(f"{srv.url}{path}", json=body, timeout=30)
    assert response.status_code == 400, response.text
    assert time.monotonic() - started < 2
    size = len(json.dumps(HUGE_ENUM))
    assert response.json()["error"]["message"] == (f"{param} is {size} bytes, more than the server's limit of "
                                                   "131072 bytes for a grammar")


def test_the_grammar_bounds_are_flags(flagged: Server) -> None:
    enum = {"enum": [f"v{i}" for i in range(400)]}
    small = httpx.post(f"{flagged.url}/completion", json={"prompt": "a", "n_predict": 1,
                                                         "json_schema": {"enum": ["a", "b"]}}, timeout=30)
    large = httpx.post(f"{flagged.url}/completion", json={"prompt": "a", "n_predict": 1, "json_schema": enum},
                       timeout=30)
    grammar = httpx.post(f"{flagged.url}/completion", json={"prompt": "a", "n_predict": 1,
                                                           "grammar": "root ::= " + " | ".join(['"x"'] * 600)},
                         timeout=30)
    assert small.status_code == 200, small.text
    assert large.status_code == grammar.status_code == 400
    assert "more than the server's limit of 2048 bytes for a grammar" in large.json()["error"]["message"]
    assert grammar.json()["error"]["param"] == "grammar"


def test_a_grammar_parsed_while_preparing_is_the_one_the_engine_takes(tiny_model: Path) -> None:
    from pyllama_cli.core.generate import grammar_pool
    from pyllama_cli.core.model.native import Model
    from pyllama_cli.core.model.settings import LoadSettings

    model = Model.load(tiny_model, LoadSettings(), vocab_only=True)
    try:
        grammar_pool.prebuild(model, 'root ::= "yes" | "no"')
        assert grammar_pool.take(model, 'root ::= "no"') is None
        assert grammar_pool.take(model, 'root ::= "yes" | "no"') is not None
        assert grammar_pool.take(model, 'root ::= "yes" | "no"') is None  # each is taken once
        for _ in range(grammar_pool.MAX_READY + 3):
            grammar_pool.prebuild(model, 'root ::= "a"')
        assert len(grammar_pool._ready) == grammar_pool.MAX_READY
        while grammar_pool.take(model, 'root ::= "a"') is not None:
            pass
    finally:
        model.close()



# 20,000 numbers (240 KB of GBNF; 449,993 is prime to 9,000,000, so all differ): llama.cpp's parse expands every
# alternative at once (about 1.3 s here), while its sampling follows only those that share the digits so far.
SLOW_TO_BUILD_ENUM = {"enum": [1_000_000 + i * 449_993 % 9_000_000 for i in range(20_000)]}


def _stream_arrivals(url: str, arrivals: list[float], started: threading.Event) -> None:
    """Slot A: a long streamed generation; the time each token's event arrives."""
    body = {"prompt": "a", "n_predict": 15_000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{url}/completion", json=body, timeout=120) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                arrivals.append(time.monotonic())
                if len(arrivals) == 20:
                    started.set()


def test_other_slots_keep_generating_while_a_big_grammar_is_built(tiny_model: Path, tmp_path: Path) -> None:
    """A schema within the (raised) bounds whose grammar is slow to build is built off the engine thread, so slot
    A's tokens keep coming meanwhile. The enum is of numbers so that its sampling is cheap (0.15 s for the first
    token, then milliseconds) and the test sees the build: an enum of strings that share a prefix costs as much
    at every token as at the build (llama.cpp's accept expands every alternative that still matches), on the one
    thread that samples for every slot, as in llama-server; the size bound is what limits that."""
    server = _start(tiny_model, tmp_path / "stderr.log", "-c", "32768", "-np", "2",
                    "--max-grammar-size", str(1 << 20), "--max-grammar-seconds", "60")
    arrivals: list[float] = []
    started = threading.Event()
    reader = threading.Thread(target=_stream_arrivals, args=(server.url, arrivals, started), daemon=True)
    try:
        reader.start()
        assert started.wait(60), server.stderr
        sent = time.monotonic()
        big = httpx.post(f"{server.url}/completion", json={"prompt": "a", "n_predict": 1,
                                                          "json_schema": SLOW_TO_BUILD_ENUM}, timeout=120)
        answered = time.monotonic()
        assert reader.is_alive(), "slot A finished before the big grammar's request: lengthen it"
    finally:
        server.stop()
        reader.join(timeout=30)
    assert big.status_code == 200, big.text
    assert big.json()["content"][:1].isdigit()
    during = [t for t in arrivals if sent <= t <= answered]
    gaps = [later - earlier for earlier, later in zip([sent, *during], [*during, answered])]
    took = answered - sent
    print(f"slot A: {len(during)} tokens, longest gap {max(gaps):.3f} s, while the grammar's request took {took:.3f} s")
    assert max(gaps) < 0.25 * took, f"slot A stalled {max(gaps):.2f} s of the {took:.2f} s the big grammar took"
