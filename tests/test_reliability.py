"""Reliability and security, short versions: hostile requests, schema fuzzing, GGUF fuzzing, faults, defaults.

The long versions are benchmarks/fuzz_long.py (more fuzz cases) and benchmarks/soak_serve.py (5 minutes of load).
Every server here is a real `pyllama serve` process on 127.0.0.1 with the tiny model.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import resource
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fixtures import fuzzing
from tests.fixtures.fake_hf import FakeHub
from tests.helpers import REPO_ROOT, run_cli, run_process
from tests.test_serve import Server, _start

API_KEY = "k3y-that-must-not-leak"


@pytest.fixture(scope="module")
def rserver(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("reliability")
    (folder / "slots").mkdir()
    srv = _start(tiny_model, folder / "stderr.log", "-np", "4", "--slot-save-path", str(folder / "slots"))
    yield srv
    srv.stop()


def _alive(server: Server) -> bool:
    return server.proc.poll() is None and httpx.get(f"{server.url}/health", timeout=10).status_code == 200


# ---------------------------------------------------------------- hostile requests and schema fuzzing


GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")
ROUTER_IDS = ("red", "green", "blue")


@pytest.fixture(scope="module")
def router_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Router mode over three copies of the tiny model, at most two loaded."""
    folder = tmp_path_factory.mktemp("reliability-router")
    red, green, blue = (shutil.copyfile(tiny_model, folder / f"{name}.gguf") for name in ROUTER_IDS)
    srv = _start(red, folder / "stderr.log", "-m", str(green), "-m", str(blue), "--models-max", "2")
    yield srv
    srv.stop()


def _check_hostile_answer(response: httpx.Response, case: fuzzing.Hostile, model: str) -> None:
    assert response.status_code == case.status, response.text[:500]
    if case.status >= 400:
        assert fuzzing.error_shape_problem(response.status_code, response.content, case.path) is None, response.text
        assert case.expect in response.json()["error"]["message"], response.text[:500]
    elif case.path in GENERATION_PATHS:
        assert response.json()["choices"][0]["finish_reason"] in ("stop", "length")
        assert response.json()["model"] == model
    else:
        assert case.expect in response.text, response.text[:500]


@pytest.mark.parametrize("case", fuzzing.hostile_requests(), ids=lambda c: c.name)
def test_hostile_request_gets_a_clear_answer(rserver: Server, case: fuzzing.Hostile) -> None:
    with httpx.Client(timeout=60) as client:
        response = case.send(client, rserver.url)
    _check_hostile_answer(response, case, "tiny")


@pytest.mark.parametrize("case", fuzzing.router_hostile_requests(ROUTER_IDS), ids=lambda c: c.name)
def test_hostile_request_to_a_router_gets_a_clear_answer(router_server: Server, case: fuzzing.Hostile) -> None:
    with httpx.Client(timeout=60) as client:
        response = case.send(client, router_server.url)
    _check_hostile_answer(response, case, case.body.get("model") if isinstance(case.body, dict) else None)


def test_three_first_requests_under_models_max_2_are_all_answered(tiny_model: Path, tmp_path: Path) -> None:
    """Once, each of the three loads waited for room that one of the other two waiting loads held: none ever ran."""
    paths = [shutil.copyfile(tiny_model, tmp_path / f"{name}.gguf") for name in ROUTER_IDS]
    srv = _start(paths[0], tmp_path / "stderr.log", "-m", str(paths[1]), "-m", str(paths[2]), "--models-max", "2")
    try:
        async def ask_all() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=30) as client:
                return await asyncio.gather(*(client.post(f"{srv.url}/v1/completions", json=_completion_body(m))
                                              for m in ROUTER_IDS))

        answers = asyncio.run(ask_all())
        assert [(a.status_code, a.json()["model"]) for a in answers] == [(200, m) for m in ROUTER_IDS]
        states = [card["status"]["value"] for card in httpx.get(f"{srv.url}/v1/models").json()["data"]]
        assert sorted(states) == ["loaded", "loaded", "unloaded"]
        assert srv.stderr.count("(to make room for ") == 1
    finally:
        srv.stop()
    assert "Traceback" not in srv.stderr


def _completion_body(model: str) -> dict[str, object]:
    return {"model": model, "prompt": "hi", "max_tokens": 2}


def test_schema_fuzz_of_a_router_finds_no_server_error(router_server: Server) -> None:
    # One case per operation and mode (71 in all, 7 answered 200 by a model); fuzz_long.py runs 60.
    report = fuzzing.schema_fuzz(router_server.url, examples_per_operation=1, model_ids=ROUTER_IDS)
    assert report.cases >= 40
    assert report.problems == []
    assert report.statuses.get(200, 0) >= 3  # some cases reached a model, not only 404s
    assert _alive(router_server)
    loaded = [card["id"] for card in httpx.get(f"{router_server.url}/v1/models").json()["data"]
              if card["status"]["value"] != "unloaded"]
    assert len(loaded) <= 2, loaded
    assert "Traceback (most recent call last)" not in router_server.stderr  # paths the fuzzer sent are in the access log


def test_schema_fuzz_finds_no_server_error(rserver: Server) -> None:
    # 2 cases per operation and mode keep the suite short (hypothesis' generation is most of the cost);
    # `python benchmarks/fuzz_long.py --only schema` runs 60.
    report = fuzzing.schema_fuzz(rserver.url, examples_per_operation=2)
    assert report.cases >= 100
    assert report.problems == []
    assert _alive(rserver)
    assert "Traceback (most recent call last)" not in rserver.stderr  # paths the fuzzer sent are in the access log


def test_streaming_load_with_hang_ups_leaves_no_slot_busy(rserver: Server) -> None:
    """A 3-second version of the soak: 16 streaming clients on 4 slots, every 10th request hangs up mid-stream."""

    async def client(i: int, url: str, results: list[str]) -> None:
        deadline = time.monotonic() + 3
        async with httpx.AsyncClient(timeout=60) as http:
            n = 0
            while time.monotonic() < deadline:
                n += 1
                hang_up = (i + n) % 10 == 0
                body = {"prompt": f"hello {i} {n}", "max_tokens": 24, "stream": True, "ignore_eos": True}
                async with http.stream("POST", f"{url}/v1/completions", json=body) as resp:
                    lines = []
                    async for line in resp.aiter_lines():
                        lines.append(line)
                        if hang_up and len(lines) > 4:
                            break
                    results.append("hung up" if hang_up else ("ok" if resp.status_code == 200 and
                                                              lines[-2:] == ["data: [DONE]", ""] else repr(lines[-3:])))

    results: list[str] = []

    async def main() -> None:
        await asyncio.gather(*(client(i, rserver.url, results) for i in range(16)))

    asyncio.run(main())
    assert set(results) <= {"ok", "hung up"}, [r for r in results if r not in ("ok", "hung up")][:3]
    assert results.count("hung up") >= 5
    deadline = time.monotonic() + 5
    while True:
        state = httpx.get(f"{rserver.url}/slots", timeout=10).json()
        if not any(s["is_processing"] for s in state) and "queue_depth 0" in httpx.get(f"{rserver.url}/metrics").text:
            break
        assert time.monotonic() < deadline, state
        time.sleep(0.1)


# Hostile constraints on the command line: each once aborted, crashed or tracebacked `complete`.
CLI_CASES = [
    (["--grammar", 'root ::= "a"', "--ignore-eos"], 0, "a"),  # grammar done, EOS banned: llama.cpp threw
    (["--grammar", "root ::= <[99999]>"], 1, "Error: grammar: token <[99999]> is past the model's vocabulary "
                                             "(ids 0..1023) at line 1, column 10"),  # once: llama.cpp threw
    (["-j", '{"type": "string", "maxLength": 600}'], 0, None),  # deep grammar: RecursionError
    (["-j", '{"type": "string", "minLength": 100000000}'], 1, "Error: -j/--json-schema: minLength 100000000 is "
                                                              "more than the 10000 a grammar can spell out"),
    (["--grammar", "root ::= " + "(" * 50_000 + '"a"' + ")" * 50_000], 1,
     "Error: --grammar: groups are nested more than 2048 deep at line 1, column 2058"),  # llama.cpp segfaulted
    (["--grammar", 'root ::= ("")*'], 1, "Error: --grammar: a repeated item can match the empty string, which makes "
                                         "the repetition left-recursive for llama.cpp at line 1, column 14"),
]


@pytest.mark.parametrize(("flags", "code", "expect"), CLI_CASES, ids=[" ".join(c[0])[:40] for c in CLI_CASES])
def test_complete_survives_hostile_constraints(tiny_model: Path, flags: list[str], code: int, expect: str | None
                                               ) -> None:
    # A real process, not a fork: llama.cpp's compute threads (OpenMP) do not survive fork() in a process
    # that already decoded, and a crash then shows as a negative exit code instead of killing pytest.
    result = run_process("complete", "-m", str(tiny_model), "-p", "hi", "-n", "4", "-s", "1", "-t", "1", *flags,
                         timeout=60)
    assert result.exit_code == code, result.stderr
    if code == 1:
        assert result.first_stderr_line == expect
    elif expect is not None:
        assert result.stdout == expect
    assert "Traceback" not in result.stderr


# ---------------------------------------------------------------- GGUF fuzzing


def test_gguf_fuzz_info_and_tokenize_never_crash(tiny_model: Path, tmp_path: Path) -> None:
    """Mutated and truncated headers of the tiny model: a clean error or a result, each in a forked child.
    llama.cpp alone reads every case (quick); pyllama's info and tokenize (slower) get each case llama.cpp dies
    on and every third of the others. `python benchmarks/fuzz_long.py --only gguf` gives them every case."""
    code = ("import json, sys; from pathlib import Path; from tests.fixtures import fuzzing; "
            "print(json.dumps(fuzzing.gguf_fuzz_summary(Path(sys.argv[1]), Path(sys.argv[2]), 40, 1, 3)))")
    run = subprocess.run([sys.executable, "-c", code, str(tiny_model), str(tmp_path)], capture_output=True,
                         text=True, cwd=REPO_ROOT, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(run.stdout.splitlines()[-1])
    assert summary["cases"] > 300
    # llama.cpp itself aborts on some of these; pyllama must catch every one of them first.
    assert summary["llama_crashes"] >= 5
    assert summary["problems"] == []
    assert summary["caught"] == summary["llama_crashes"]


def test_vocab_check_names_the_broken_token(tiny_model: Path, tmp_path: Path) -> None:
    image = fuzzing.GGUFImage.read(tiny_model)
    tokens = image.get("tokenizer.ggml.tokens")
    tokens.value[1][7] = tokens.value[1][3]
    path = image.write(tmp_path / "dup.gguf")
    result = run_cli("tokenize", "-m", str(path), "hello")
    assert result.exit_code == 1
    assert result.first_stderr_line == (f"Error: {path} has a broken tokenizer: tokens 3 and 7 are both '<0x00>' "
                                        "(token texts must be unique)")


def test_quantize_does_not_need_a_working_tokenizer(tiny_model: Path, tmp_path: Path) -> None:
    # llama-quantize never loads the vocabulary, so pyllama neither decodes nor checks it there.
    image = fuzzing.GGUFImage.read(tiny_model)
    image.get("tokenizer.ggml.tokens").value[1][7] = image.get("tokenizer.ggml.tokens").value[1][3]
    path = image.write(tmp_path / "dup.gguf")
    result = run_cli("quantize", str(path), str(tmp_path / "dup-q8.gguf"), "Q8_0")
    assert result.exit_code == 0, result.stderr
    assert result.stdout == f"{tmp_path / 'dup-q8.gguf'}\n"


def test_quantize_reports_a_header_cut_inside_the_vocabulary(tiny_model: Path, tmp_path: Path) -> None:
    # Stepping over the token texts without decoding them still checks every length against the file.
    data = tiny_model.read_bytes()
    cut = data.index(b"<0x41>") + 3
    path = tmp_path / "cut-vocab.gguf"
    path.write_bytes(data[:cut])
    for command in (["quantize", str(path), str(tmp_path / "out.gguf"), "Q8_0"], ["info", "-m", str(path)]):
        result = run_cli(*command)
        assert result.exit_code == 1
        assert result.first_stderr_line.startswith(f"Error: {path} is not a valid GGUF file: ")
        assert "Traceback" not in result.stderr
    assert not (tmp_path / "out.gguf").exists()


def _with_merges(tiny_model: Path, path: Path, bad_length: int | None = None) -> Path:
    """The tiny model with a BPE-style merges array of three strings; `bad_length` replaces the second's length."""
    image = fuzzing.GGUFImage.read(tiny_model)
    texts = [b"a b", b"c d", b"e f"]
    merges = fuzzing.KV("tokenizer.ggml.merges", fuzzing.ARRAY, (fuzzing.STRING, [t.decode() for t in texts]))
    if bad_length is not None:
        lengths = [len(texts[0]), bad_length, len(texts[2])]
        merges.raw = struct.pack("<IIQ", fuzzing.ARRAY, fuzzing.STRING, len(texts)) + b"".join(
            struct.pack("<Q", n) + t for n, t in zip(lengths, texts))
    tensor_bytes = image.file_size - image.data_offset()
    image.kvs.append(merges)
    return image.write(path, size=image.data_offset() + tensor_bytes)  # the tensors, after a longer header


def test_the_tokenizer_check_decodes_only_the_token_texts(tiny_model: Path, tmp_path: Path) -> None:
    # A BPE vocabulary's merges often outnumber its tokens two to one; the check before a load reads
    # none of them (~0.1 s for 280k merges), only the texts it checks.
    from pyllama_cli.core.gguf.reader import UnreadStrings, read_gguf
    from pyllama_cli.core.gguf.vocab_check import VOCAB_KEYS

    path = _with_merges(tiny_model, tmp_path / "merges.gguf")
    header = read_gguf(path, strings=VOCAB_KEYS)
    assert header.get("tokenizer.ggml.merges") == UnreadStrings(3)
    assert header.get("tokenizer.ggml.tokens")[:4] == ["<unk>", "<s>", "</s>", "<0x00>"]
    assert read_gguf(path).get("tokenizer.ggml.merges") == ["a b", "c d", "e f"]
    assert run_cli("tokenize", "-m", str(path), "hello", "--ids").exit_code == 0


def test_a_damaged_merges_array_reads_as_a_full_read_words_it(tiny_model: Path, tmp_path: Path) -> None:
    # Stepped over, not decoded, a string that runs past the end is still named by its length.
    path = _with_merges(tiny_model, tmp_path / "bad-merges.gguf", bad_length=1 << 40)
    expected = f"Error: {path} is not a valid GGUF file: string length {1 << 40} runs past the end of the file"
    for command in (["tokenize", "-m", str(path), "hello"], ["info", "-m", str(path)]):  # info decodes every array
        result = run_cli(*command)
        assert result.exit_code == 1
        assert result.first_stderr_line == expected, command


# ---------------------------------------------------------------- faults


def _stream_in_background(url: str, n: int, results: dict[int, str], max_tokens: int = 100_000) -> list[threading.Thread]:
    def stream(i: int) -> None:
        events, last = 0, ""
        try:
            body = {"prompt": f"story {i}", "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as resp:
                for line in resp.iter_lines():
                    if line.startswith("data: "):
                        events, last = events + 1, line
            results[i] = f"{events} events, last {last[:40]!r}"
        except Exception as exc:  # noqa: BLE001 - the test reads what happened
            results[i] = f"{type(exc).__name__}: {exc}"

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    return threads


def test_deleted_model_keeps_serving_and_sigterm_ends_requests_and_exits_0(tiny_model: Path, tmp_path: Path) -> None:
    model = Path(shutil.copy(tiny_model, tmp_path / "served.gguf"))
    srv = _start(model, tmp_path / "stderr.log", "-np", "2", "-c", "32768")
    results: dict[int, str] = {}
    threads = _stream_in_background(srv.url, 3, results)  # two generate, one waits for a slot
    time.sleep(1.0)
    model.unlink()  # mmap'd: the mapping keeps the data
    reply = httpx.post(f"{srv.url}/tokenize", json={"content": "still here"}, timeout=10)
    assert reply.status_code == 200
    start = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    code = srv.proc.wait(timeout=10)
    elapsed = time.monotonic() - start
    for t in threads:
        t.join(10)
    assert code == 0 and elapsed < 5, (code, elapsed, srv.stderr[-2000:])
    assert all(r.endswith("last 'data: [DONE]'") for r in results.values()), results
    assert "Traceback" not in srv.stderr
    assert srv.stderr.rstrip().endswith("pyllama serve: stopped (SIGTERM)")


def test_truncated_model_fails_requests_cleanly(tiny_model: Path, tmp_path: Path) -> None:
    model = Path(shutil.copy(tiny_model, tmp_path / "served.gguf"))
    srv = _start(model, tmp_path / "stderr.log", "-c", "1024")
    try:
        body = {"prompt": "hello", "max_tokens": 3}
        assert httpx.post(f"{srv.url}/v1/completions", json=body, timeout=30).status_code == 200
        os.truncate(model, 30_000)  # touching the lost pages of the mapping would be SIGBUS
        for _ in range(2):
            reply = httpx.post(f"{srv.url}/v1/completions", json=body, timeout=30)
            assert reply.status_code == 500
            assert reply.json()["error"]["message"] == (f"{model} was truncated while in use "
                                                        f"(30000 of {tiny_model.stat().st_size} bytes left)")
        assert _alive(srv)
    finally:
        srv.stop()
    assert srv.proc.returncode == 0


def test_taken_port_is_one_line_error(tiny_model: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_process("serve", "-m", str(tiny_model), "--port", str(port), timeout=60)
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [f"Error: cannot listen on 127.0.0.1:{port}: Address already in use",
                                          "Hint: pick another --port (0 = any free port) or --host"]


def _mount_tmpfs(path: Path, size: str, read_only: bool = False) -> bool:
    """Mount a small tmpfs (root only); False when the machine does not allow it."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    path.mkdir(parents=True, exist_ok=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=False,
                      capture_output=True).returncode != 0:
        return False
    if read_only:
        (path / "hf").mkdir()
        subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True, capture_output=True)
    return True


def _umount(path: Path) -> None:
    subprocess.run(["umount", str(path)], check=True, capture_output=True)


def test_read_only_hf_cache_is_one_line_error(tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                              ) -> None:
    cache = tmp_path / "ro"
    mounted = _mount_tmpfs(cache, "1m", read_only=True)
    if not mounted:
        if os.geteuid() == 0:
            pytest.skip("root cannot be denied writes without a read-only mount, and mount is not permitted")
        (cache / "hf").mkdir(parents=True)
        cache.chmod(0o555)
        (cache / "hf").chmod(0o555)
    try:
        with FakeHub() as hub:
            hub.add_repo("org/tiny-GGUF", {"tiny-Q8_0.gguf": tiny_model})
            monkeypatch.setenv("HF_ENDPOINT", hub.url)
            monkeypatch.setenv("HF_HOME", str(cache / "hf"))
            result = run_cli("info", "-hf", "org/tiny-GGUF:Q8_0")
    finally:
        if mounted:
            _umount(cache)
    assert result.exit_code == 1
    assert re.fullmatch(r"Error: cannot write to the Hugging Face cache: \S+ \((Read-only file system|Permission "
                        r"denied)\)\nHint: set HF_HUB_CACHE to a writable directory\n", result.stderr), result.stderr


def test_disk_full_during_quantize_leaves_no_partial_output(tiny_model: Path, tmp_path: Path) -> None:
    """A 1 MiB tmpfs when mounting is allowed, else a 1 MiB file-size limit (RLIMIT_FSIZE) on the process."""
    out_dir = tmp_path / "small"
    mounted = _mount_tmpfs(out_dir, "1m")
    out_dir.mkdir(exist_ok=True)

    def limit() -> None:
        if not mounted:
            resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    try:
        proc = subprocess.run([sys.executable, "-m", "pyllama_cli", "quantize", str(tiny_model),
                               str(out_dir / "out.gguf"), "Q8_0"], check=False, capture_output=True, text=True,
                              timeout=120, cwd=REPO_ROOT, preexec_fn=limit)
        left = sorted(p.name for p in out_dir.iterdir())
    finally:
        if mounted:
            _umount(out_dir)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith("Error: ") and "Traceback" not in proc.stderr
    assert ("the disk is full" if mounted else "could not write the output") in proc.stderr
    assert left == []


# ---------------------------------------------------------------- HTTP limits (raw sockets on a real server)


@pytest.fixture(scope="module")
def limited(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server with short timeouts and a small connection cap, so the limits show within a second."""
    srv = _start(tiny_model, tmp_path_factory.mktemp("limits") / "stderr.log", "--header-timeout", "1",
                 "--body-timeout", "1", "--max-connections", "4")
    yield srv
    srv.stop()


def _connect(server: Server) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def _answer(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines)
    return int(status_line.split()[1]), headers, body


@pytest.mark.parametrize(("head", "status", "code"), [
    (b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * 32768 + b"\r\n\r\n", 431, "request_header_fields_too_large"),
    (b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * (1 << 20), 431, "request_header_fields_too_large"),
    (b"GET /health HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(101)) + b"\r\n", 431,
     "request_header_fields_too_large"),
    (b"GET /health?q=" + b"a" * 9000 + b" HTTP/1.1\r\nHost: localhost\r\n\r\n", 414, "uri_too_long"),
], ids=["32KiB header", "1MiB unfinished header", "101 headers", "9000-byte URL"])
def test_oversized_head_is_refused_and_server_keeps_serving(limited: Server, head: bytes, status: int, code: str
                                                           ) -> None:
    with _connect(limited) as sock:
        try:
            sock.sendall(head)
        except (BrokenPipeError, ConnectionResetError):  # refused before all of it was sent
            pass
        got, headers, body = _answer(_read_all(sock))
    assert (got, headers["connection"]) == (status, "close")
    assert fuzzing.error_shape_problem(got, body) is None
    assert json.loads(body)["error"]["code"] == code
    assert httpx.get(f"{limited.url}/health", timeout=10).status_code == 200


def test_stalled_request_head_is_closed(limited: Server) -> None:
    with _connect(limited) as half, _connect(limited) as silent:
        start = time.monotonic()
        half.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-")
        status, _, body = _answer(_read_all(half))
        assert status == 408 and json.loads(body)["error"]["code"] == "request_timeout"
        assert _read_all(silent) == b""  # a connection that never sent a byte is closed without an answer
        assert 0.9 < time.monotonic() - start < 5
    assert _alive(limited)


def test_trickled_body_gets_408(limited: Server) -> None:
    with _connect(limited) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000000\r\n\r\n")
        start = time.monotonic()
        sock.settimeout(0.2)
        answer = b""
        while time.monotonic() - start < 5:
            try:
                sock.sendall(b" ")  # one byte each 0.2 s
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
            if not chunk:
                break
            answer += chunk
    status, headers, body = _answer(answer)
    assert (status, headers.get("connection")) == (408, "close"), answer
    assert json.loads(body)["error"]["message"] == "the request body did not arrive within 1 s"
    assert time.monotonic() - start < 3


def test_connections_beyond_the_cap_get_503(limited: Server) -> None:
    kept = [_connect(limited) for _ in range(4)]
    try:
        for sock in kept:  # four kept-alive connections: the cap
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
            assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
        with _connect(limited) as extra:
            extra.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
            status, headers, body = _answer(_read_all(extra))
        assert (status, headers["retry-after"]) == (503, "1")
        assert json.loads(body)["error"]["code"] == "too_many_connections"
    finally:
        for sock in kept:
            sock.close()
    deadline = time.monotonic() + 5
    while httpx.get(f"{limited.url}/health", timeout=10).status_code != 200:  # the closes take a moment to land
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_a_cut_stream_ends_in_each_api_shape() -> None:
    from pyllama_cli.errors import ServerShutdown
    from pyllama_cli.server import sse

    assert sse.error_event(ServerShutdown()) == (b'data: {"error":{"message":"the server is shutting down",'
                                                 b'"type":"server_shutdown","param":null,"code":"server_shutdown"}}\n\n')
    assert sse.anthropic_error_event(ServerShutdown()) == (b'event: error\ndata: {"type":"error","error":{"type":'
                                                           b'"overloaded_error","message":"the server is shutting '
                                                           b'down"}}\n\n')


def test_sigterm_cuts_streams_with_an_error_event_and_exits_0(tiny_model: Path, tmp_path: Path) -> None:
    # Two OpenAI chat streams, one Anthropic Messages stream and one Responses stream: each cut stream ends
    # with its API's own error event, never as a finished answer.
    srv = _start(tiny_model, tmp_path / "stderr.log", "-np", "4", "-c", "65536", "--shutdown-grace", "1",
                 "--ignore-eos")
    messages = [{"role": "user", "content": "tell a story"}]
    body = {"messages": messages, "max_tokens": 100_000}
    requests = [("/v1/chat/completions", body), ("/v1/chat/completions", body), ("/v1/messages", body),
                ("/v1/responses", {"input": "tell a story", "max_output_tokens": 100_000})]
    streams: dict[int, list[str]] = {}
    whole: dict[str, httpx.Response] = {}

    def stream(i: int) -> None:
        path, fields = requests[i]
        with httpx.stream("POST", f"{srv.url}{path}", json={**fields, "stream": True}, timeout=30) as r:
            streams[i] = [line for line in r.iter_lines() if line]

    def wait_whole() -> None:  # a fifth request waits for a slot, unstreamed
        whole["reply"] = httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=30)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(4)] + [threading.Thread(target=wait_whole)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while sum(s["state"] == "generating" for s in httpx.get(f"{srv.url}/slots", timeout=10).json()) < 4:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    srv.proc.send_signal(signal.SIGTERM)
    code = srv.proc.wait(timeout=15)
    for t in threads:
        t.join(15)
    assert code == 0, srv.stderr[-2000:]
    assert sorted(streams) == [0, 1, 2, 3]
    for lines in (streams[0], streams[1]):
        data = [line.removeprefix("data: ") for line in lines]
        assert data[-1] == "[DONE]", data[-3:]
        assert json.loads(data[-2]).get("error") == {"message": "the server is shutting down", "type": "server_shutdown",
                                                 "param": None, "code": "server_shutdown"}
        # The cut stream never says it finished (the tiny model's tokens may all be empty text: no count).
        assert {c["finish_reason"] for line in data[:-2] for c in json.loads(line)["choices"]} == {None}
    anthropic = streams[2]
    assert anthropic[-2:] == ["event: error", 'data: {"type":"error","error":{"type":"overloaded_error",'
                              '"message":"the server is shutting down"}}'], anthropic[-4:]
    assert "event: message_delta" not in anthropic and "event: message_stop" not in anthropic
    responses = streams[3]
    assert responses[-2] == "event: error", responses[-4:]
    assert json.loads(responses[-1].removeprefix("data: "))["code"] == "server_shutdown"
    assert "event: response.completed" not in responses
    reply = whole["reply"]
    assert (reply.status_code, reply.headers.get("retry-after")) == (503, "5"), (reply.headers, reply.text)
    assert reply.json()["error"]["type"] == "server_shutdown"
    assert "Traceback" not in srv.stderr


# ---------------------------------------------------------------- security defaults


def _stderr_until(proc: subprocess.Popen, pattern: str, timeout: float = 60) -> str:
    """Read the process's stderr until a line matches `pattern`; return everything read."""
    text = ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        text += line
        if re.search(pattern, line) or not line:
            return text
    return text


def _serve_process(model: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    environ = {k: v for k, v in os.environ.items() if k != "PYLLAMA_API_KEY"}
    return subprocess.Popen([sys.executable, "-m", "pyllama_cli", "serve", "-m", str(model), "--port", "0", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT,
                            env={**environ, **(env or {})})


def test_binds_loopback_by_default_and_warns_on_a_public_bind_without_key(tiny_model: Path) -> None:
    default = _serve_process(tiny_model)
    public = _serve_process(tiny_model, "--host", "0.0.0.0")
    keyed = _serve_process(tiny_model, "--host", "0.0.0.0", env={"PYLLAMA_API_KEY": API_KEY})
    try:
        lines = {name: _stderr_until(p, "listening on").splitlines()
                 for name, p in (("default", default), ("public", public), ("keyed", keyed))}
    finally:
        for p in (default, public, keyed):
            p.kill()
            p.wait()
    assert re.fullmatch(r"pyllama serve: listening on http://127\.0\.0\.1:\d+ - loading tiny\.gguf .*",
                        lines["default"][0])
    warning, listening = lines["public"]
    port = re.search(r"0\.0\.0\.0:(\d+)", listening).group(1)
    assert warning == (f"Warning: http://0.0.0.0:{port} is reachable from other machines and there is no "
                       "--api-key: anyone who can reach it can use the model")
    assert len(lines["keyed"]) == 1 and lines["keyed"][0].startswith("pyllama serve: listening on http://0.0.0.0:")


def test_api_key_never_appears_in_logs_or_metrics(tiny_model: Path, tmp_path: Path) -> None:
    srv = _start(tiny_model, tmp_path / "stderr.log", "--verbose", env={"PYLLAMA_API_KEY": API_KEY})
    try:
        good = {"Authorization": f"Bearer {API_KEY}"}
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        assert httpx.post(f"{srv.url}/v1/chat/completions", json=body, headers=good, timeout=30).status_code == 200
        wrong = httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=30,
                           headers={"Authorization": f"Bearer {API_KEY}x"})
        assert wrong.status_code == 401 and API_KEY not in wrong.text
        metrics = httpx.get(f"{srv.url}/metrics", headers={"X-Api-Key": API_KEY}, timeout=30)
        assert metrics.status_code == 200 and "pyllama_requests_total" in metrics.text
        for query in ("api_key", "key", "token"):  # a key in the URL is refused, and still not logged
            for path in ("/v1/chat/completions", "/no/such/route"):
                reply = httpx.post(f"{srv.url}{path}?{query}={API_KEY}&x=1", json=body, timeout=30)
                assert reply.status_code == 401 and API_KEY not in reply.text
        assert httpx.post(f"{srv.url}/v1/chat/completions", json=body, headers={"X-Api-Key": API_KEY},
                          timeout=30).status_code == 200
    finally:
        srv.stop()
    assert "POST /v1/chat/completions" in srv.stderr  # --verbose logs every request...
    assert "POST /v1/chat/completions?api_key=[REDACTED]&x=1" in srv.stderr
    assert API_KEY not in srv.stderr and API_KEY not in metrics.text  # ...but never the key


def test_no_request_reaches_a_file(rserver: Server, tmp_path: Path) -> None:
    """No field or route takes a path: slot files are plain names in --slot-save-path, names and templates are
    not files."""
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET")
    url = rserver.url
    with httpx.Client(timeout=30) as client:
        for method, path, body in (
            ("POST", "/slots/0?action=save", {"filename": "../../../../tmp/pwned.bin"}),
            ("POST", "/slots/0?action=restore", {"filename": str(secret)}),
            ("POST", "/slots", {"action": "save", "filename": "/etc/passwd"}),
            ("GET", f"/v1/models/..%2F..%2F{secret}", None),
            ("GET", "/static/../../etc/passwd", None),
        ):
            reply = client.request(method, url + path, json=body)
            assert 400 <= reply.status_code < 500, (path, reply.status_code)
            assert fuzzing.error_shape_problem(reply.status_code, reply.content) is None
            assert "TOP-SECRET" not in reply.text
        templated = client.post(f"{url}/apply-template", json={
            "messages": [{"role": "user", "content": "hi"}], "chat_template": str(secret),
            "template": str(secret)}).json()
        assert "TOP-SECRET" not in templated["prompt"]
        grammar = client.post(f"{url}/v1/completions", json={"prompt": "hi", "grammar": str(secret)})
        assert grammar.status_code == 400 and "TOP-SECRET" not in grammar.text
    assert not Path("/tmp/pwned.bin").exists()


def test_cors_is_off_unless_configured(rserver: Server) -> None:
    preflight = httpx.options(f"{rserver.url}/v1/chat/completions", headers={
        "Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
    plain = httpx.get(f"{rserver.url}/v1/models", headers={"Origin": "https://evil.example"})
    for reply in (preflight, plain):
        assert not any(h.startswith("access-control-") for h in reply.headers), reply.headers
    assert json.loads(plain.text)["data"][0]["id"] == "tiny"
