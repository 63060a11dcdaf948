"""llama.cpp's RPC backend: `pyllama rpc-server` processes on 127.0.0.1 lend their devices to `--rpc`.

Every client runs as a process of its own: RPC servers added to libggml's registry stay for the life
of a process, and the test process must go on loading models on its own CPU.
"""

from __future__ import annotations

import ctypes
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT, free_port, run_cli, run_process
from tests.test_serve import _start as start_serve

PROMPT = "Hello world"
TEMP0 = ("--temp", "0", "-n", "24", "-t", "1")


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the test process dies, so no server outlives a killed run."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG (Linux)
    except (AttributeError, OSError):
        pass


class RpcServer:
    """`pyllama rpc-server` on 127.0.0.1 and a free port; stopped (SIGTERM, then SIGKILL) by stop()."""

    def __init__(self, log: Path, *args: str):
        self.port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.log = log
        with open(log, "wb") as sink:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pyllama_cli", "rpc-server", "-p", str(self.port), "-t", "1", *args],
                stdout=subprocess.DEVNULL, stderr=sink, cwd=REPO_ROOT, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"rpc-server exited with {self.proc.returncode}:\n{self.stderr}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"rpc-server did not start:\n{self.stderr}")

    @property
    def stderr(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def rss_kib(self) -> int:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+)", status).group(1))

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RpcServer]]:
    folder = tmp_path_factory.mktemp("rpc")
    started = [RpcServer(folder / "a.log"), RpcServer(folder / "b.log")]
    yield started
    for server in started:
        server.stop()


def _rpc(servers: list[RpcServer]) -> str:
    return ",".join(server.endpoint for server in servers)


def _long_generation(model: Path, rpc: str) -> subprocess.Popen:
    """A completion over `rpc` that runs until stopped; its first text has already arrived on return."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "pyllama_cli", "complete", "-m", str(model), "-p", PROMPT, "-n", "100000", "-c", "2048",
         "--ignore-eos", "-t", "1", "--rpc", rpc],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO_ROOT)
    assert proc.stdout.read(8), proc.stderr.read().decode()
    return proc


# ---------------------------------------------------------------- results as a local run's


def test_complete_over_rpc_gives_the_local_text_and_the_servers_hold_the_weights(
        tiny_model: Path, tmp_path: Path) -> None:
    own = [RpcServer(tmp_path / "a.log"), RpcServer(tmp_path / "b.log")]  # fresh: no client has used them yet
    try:
        # The servers' own memory holds the weights while a client runs ...
        before = [server.rss_kib() for server in own]
        proc = _long_generation(tiny_model, _rpc(own))
        try:
            grown = [server.rss_kib() - kib for server, kib in zip(own, before)]
        finally:
            proc.kill()
            proc.wait()
        # ... and the text is the local run's.
        local = run_process("complete", "-m", str(tiny_model), "-p", PROMPT, *TEMP0)
        remote = run_process("complete", "-m", str(tiny_model), "-p", PROMPT, *TEMP0, "--rpc", _rpc(own), "-v")
    finally:
        for server in own:
            server.stop()
    assert local.exit_code == remote.exit_code == 0, remote.stderr
    assert remote.stdout == local.stdout and local.stdout.strip()
    # llama.cpp put a model buffer on each server (tiny: 4.5 MiB of layers, then the 1 MiB output layer)
    sizes = [float(re.search(rf"RPC\d+\[{re.escape(server.endpoint)}\] model buffer size = +([\d.]+) MiB",
                             remote.stderr).group(1)) for server in own]
    assert all(size >= 1 for size in sizes), sizes
    assert all(kib >= 1024 * size for kib, size in zip(grown, sizes)), (grown, sizes)


def test_perplexity_over_rpc_gives_the_local_ppl(tiny_model: Path, servers: list[RpcServer], tmp_path: Path) -> None:
    text = tmp_path / "text.txt"
    words = "the quick brown fox jumps over the lazy dog while the cat sleeps in the sun".split()
    text.write_text(" ".join(words[(i * 7) % len(words)] for i in range(1500)))
    args = ("perplexity", "-m", str(tiny_model), "-f", str(text), "-c", "128", "--chunks", "3", "-t", "1")
    local, remote = run_process(*args), run_process(*args, "--rpc", _rpc(servers))
    assert local.exit_code == remote.exit_code == 0, remote.stderr
    ppl = [re.search(r"PPL = ([\d.]+ \+/- [\d.]+)", r.stdout + r.stderr).group(1) for r in (local, remote)]
    assert ppl[0] == ppl[1]


def test_serve_over_rpc_answers_the_openai_client(tiny_model: Path, servers: list[RpcServer], tmp_path: Path) -> None:
    local = run_process("complete", "-m", str(tiny_model), "-p", PROMPT, *TEMP0)
    server = start_serve(tiny_model, tmp_path / "serve.log", "--rpc", _rpc(servers))
    try:
        answer = server.client().completions.create(model="tiny", prompt=PROMPT, max_tokens=24, temperature=0)
    finally:
        server.stop()
    assert answer.choices[0].text == local.stdout


def test_dev_and_ts_choose_the_servers(tiny_model: Path, servers: list[RpcServer]) -> None:
    rpc = _rpc(servers)
    listed = run_process("complete", "--list-devices", "--rpc", rpc)
    assert listed.exit_code == 0, listed.stderr
    names = re.findall(rf"^  (RPC\d+): ({'|'.join(map(re.escape, rpc.split(',')))}) \(\d+ MiB, \d+ MiB free\)$",
                       listed.stdout, re.MULTILINE)
    assert [endpoint for _, endpoint in names] == rpc.split(","), listed.stdout
    second = names[1][0]
    only = run_process("complete", "-m", str(tiny_model), "-p", PROMPT, *TEMP0, "--rpc", rpc, "-dev", second, "-v")
    assert only.exit_code == 0, only.stderr
    assert re.search(rf"using device {second} ", only.stderr) and f"using device {names[0][0]} " not in only.stderr
    split = run_process("complete", "-m", str(tiny_model), "-p", PROMPT, *TEMP0, "--rpc", rpc, "-ts", "0,1", "-v")
    assert split.exit_code == 0, split.stderr
    assert not re.search(rf"assigned to device {names[0][0]}\b", split.stderr)
    bad = run_process("complete", "-m", str(tiny_model), "-p", PROMPT, "--rpc", rpc, "-dev", "RPC99")
    assert bad.exit_code == 1
    assert bad.first_stderr_line.startswith("Error: -dev 'RPC99' is not a device to offload to")


def test_bench_over_rpc_reports_the_rpc_backend_and_the_devices(tiny_model: Path, servers: list[RpcServer]) -> None:
    import json

    args = ("bench", "-m", str(tiny_model), "-p", "16", "-n", "4", "-r", "1", "-t", "1", "--rpc", _rpc(servers))
    result = run_process(*args, "-dev", "RPC0/RPC1", "-ts", "3/1", "-o", "json")
    assert result.exit_code == 0, result.stderr
    rows = json.loads(result.stdout)
    assert {(r["backends"], r["devices"], r["tensor_split"]) for r in rows} == {("RPC", "RPC0/RPC1", "3.00/1.00")}
    assert all(r["avg_ts"] > 0 for r in rows)
    table = run_process(*args, "-ts", "1/1")
    assert table.exit_code == 0, table.stderr
    header, _, *body = table.stdout.splitlines()[:4]
    assert [c.strip() for c in header.strip("|").split("|")][3:5] == ["backend", "ngl"] and "| ts " in header
    assert all("| RPC " in line and "| 1.00/1.00 " in line for line in body[:2]), body
    sweep = run_process(*args, "-ts", "1/0,0/1", "-o", "json")  # two configurations, as llama-bench reads them
    assert sweep.exit_code == 0, sweep.stderr
    assert [(r["tensor_split"], r["n_gen"]) for r in json.loads(sweep.stdout)] == [
        ("1.00", 0), ("1.00", 4), ("0.00/1.00", 0), ("0.00/1.00", 4)]


# ---------------------------------------------------------------- failures: one line, never a hang


def test_killing_a_server_mid_generation_is_one_error_line_and_a_non_zero_exit(
        tiny_model: Path, tmp_path: Path) -> None:
    own = [RpcServer(tmp_path / "a.log"), RpcServer(tmp_path / "b.log")]
    try:
        proc = _long_generation(tiny_model, _rpc(own))
        own[0].proc.kill()
        started = time.monotonic()
        _, err = proc.communicate(timeout=30)
        elapsed = time.monotonic() - started
    finally:
        for server in own:
            server.stop()
    stderr = err.decode()
    assert proc.returncode == 1, stderr
    assert elapsed < 5
    assert [line for line in stderr.splitlines() if "Error" in line] == \
        [f"Error: RPC server {own[0].endpoint} is gone (Remote RPC server crashed or returned malformed response)"]
    assert "Traceback" not in stderr and "#0" not in stderr  # neither Python's nor gdb's backtrace


def test_serve_answers_the_requests_of_a_dead_server_with_an_error_and_keeps_running(
        tiny_model: Path, tmp_path: Path) -> None:
    import httpx

    own = [RpcServer(tmp_path / "a.log"), RpcServer(tmp_path / "b.log")]
    server = start_serve(tiny_model, tmp_path / "serve.log", "--rpc", _rpc(own))
    try:
        body = {"prompt": PROMPT, "max_tokens": 100000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=30) as response:
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))  # generating
            own[0].proc.kill()
            started = time.monotonic()
            rest = [line for line in lines if line]
        assert time.monotonic() - started < 5
        assert "RPC server" in rest[-2] and "is gone" in rest[-2] and rest[-1] == "data: [DONE]"
        assert server.proc.poll() is None  # still running ...
        health = httpx.get(f"{server.url}/health", timeout=10)
        later = httpx.post(f"{server.url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 4}, timeout=10)
        assert health.status_code == later.status_code == 503  # ... and a load balancer takes it out
        assert f"RPC server {own[0].endpoint} is gone" in later.json()["error"]["message"]
        assert server.stderr.count("Error:") == 1
    finally:
        server.stop()
        for rpc_server in own:
            rpc_server.stop()
    assert server.proc.returncode == 0  # SIGTERM still stops it cleanly


def test_a_refused_address_fails_at_once(tiny_model: Path) -> None:
    port = free_port()
    started = time.monotonic()
    result = run_process("complete", "-m", str(tiny_model), "-p", PROMPT, "--rpc", f"127.0.0.1:{port}")
    assert time.monotonic() - started < 10
    assert result.exit_code == 1
    assert result.first_stderr_line == f"Error: RPC server 127.0.0.1:{port} cannot be reached: Connection refused"


def test_a_server_that_never_answers_fails_within_the_timeout(tiny_model: Path) -> None:
    from pyllama_cli.core.model.rpc import CONNECT_TIMEOUT_S

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)  # accepts connections (the kernel does) and never says a word
    endpoint = f"127.0.0.1:{silent.getsockname()[1]}"
    try:
        started = time.monotonic()
        result = run_process("serve", "-m", str(tiny_model), "--port", "0", "--rpc", endpoint, timeout=60)
        elapsed = time.monotonic() - started
    finally:
        silent.close()
    assert result.exit_code == 1
    assert result.first_stderr_line == f"Error: RPC server {endpoint} accepted the connection but did not answer " \
        f"within {CONNECT_TIMEOUT_S:g} s"
    assert elapsed < CONNECT_TIMEOUT_S + 10


@pytest.mark.parametrize("args", [("rpc-server",), ("complete", "-p", "x", "--rpc", "127.0.0.1:50052")],
                         ids=["rpc-server", "complete --rpc"])
def test_a_library_without_rpc_gives_the_rebuild_hint(monkeypatch: pytest.MonkeyPatch, tiny_model: Path,
                                                      args: tuple[str, ...]) -> None:
    from pyllama_cli.core.model import library, rpc

    # libggml-base: a real ggml library, without the backend registry that holds the RPC backend.
    base = sorted(Path(library._ggml()._name).parent.glob("libggml-base.*"))[0]
    monkeypatch.setattr(rpc, "rpc_library", lambda: ctypes.CDLL(str(base)))
    if args[0] == "complete":
        args = (*args, "-m", str(tiny_model))
    result = run_cli(*args)
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        "Error: the loaded llama.cpp library has no RPC backend",
        'Hint: this llama-cpp-python was built without -DGGML_RPC=on; rebuild it with: '
        'CMAKE_ARGS="-DGGML_RPC=on" pip install --force-reinstall --no-cache-dir llama-cpp-python']


# ---------------------------------------------------------------- rpc-server itself


def test_rpc_server_says_what_it_lends_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    server = RpcServer(tmp_path / "s.log")
    assert server.stop() == 0
    lines = server.stderr.splitlines()
    assert re.fullmatch(r"lending CPU \(.+\): \d+ MiB free of \d+ MiB", lines[0]), lines
    assert lines[1] == f"RPC server on {server.endpoint}; Ctrl-C stops it"
    assert "RPC server stopped" in lines[2:]  # ggml's own lines (banner, connections) may come in between


def test_rpc_server_on_a_port_in_use_is_one_error_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = run_process("rpc-server", "-p", str(port), timeout=30)
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [f"Error: port {port} on 127.0.0.1 is in use",
                                          "Hint: stop what uses it, or choose another with -p"]


def test_rpc_server_off_loopback_warns_that_the_protocol_is_open(tmp_path: Path) -> None:
    server = RpcServer(tmp_path / "s.log", "-H", "0.0.0.0")
    server.stop()
    first = server.stderr.splitlines()[0]
    assert first.startswith("Warning: listening on 0.0.0.0: ggml's RPC protocol has no authentication or encryption")
    assert "SSH/WireGuard tunnel" in server.stderr


def test_rpc_server_lists_its_devices() -> None:
    result = run_process("rpc-server", "--list-devices")
    assert result.exit_code == 0
    assert result.stdout.splitlines()[0] == "Available devices:"
    assert re.match(r"  CPU: .+ \(\d+ MiB, \d+ MiB free\)$", result.stdout.splitlines()[1])


def test_bad_rpc_values_are_usage_errors(tiny_model: Path) -> None:
    result = run_cli("complete", "-m", str(tiny_model), "-p", "x", "--rpc", "no-port")
    assert result.exit_code == 1
    assert result.first_stderr_line == "Error: --rpc 'no-port' is not HOST:PORT"
    result = run_cli("complete", "-m", str(tiny_model), "-p", "x", "-ts", "a,b")
    assert result.first_stderr_line == "Error: -ts 'a,b' is not a list of numbers"



def test_a_server_killed_while_the_engine_waits_for_its_logits_is_an_error_event_not_a_deadlock(
        models_dir: Path, tmp_path: Path) -> None:
    """A model slow enough on the RPC server that the engine spends most of each token waiting for the
    logits (the graph runs asynchronously there): the kill lands in that wait, whose abort report
    runs Python on ggml's RPC thread. The wait must not hold the GIL, or nothing runs again."""
    import httpx

    from tests.fixtures.make_gguf import TINY, write_llama_gguf

    slow = write_llama_gguf(models_dir / "rpc-slow.gguf", replace(TINY, n_embd=512, n_layer=8, n_ff=1024, ftype="F16", seed=7))
    own = [RpcServer(tmp_path / "a.log")]
    server = start_serve(slow, tmp_path / "serve.log", "--rpc", _rpc(own), "-c", "512")
    try:
        body = {"prompt": PROMPT, "max_tokens": 100000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=20) as response:
            lines = response.iter_lines()
            for _ in range(3):  # a few tokens in: the engine is in its token loop
                next(line for line in lines if line.startswith("data: "))
            own[0].proc.send_signal(signal.SIGKILL)
            started = time.monotonic()
            rest = [line for line in lines if line]
        assert time.monotonic() - started < 5
        assert f"RPC server {own[0].endpoint} is gone" in rest[-2] and rest[-1] == "data: [DONE]"
        health = httpx.get(f"{server.url}/health", timeout=10)
        assert health.status_code == 503
        assert f"RPC server {own[0].endpoint} is gone" in health.json()["error"]["message"]
    finally:
        server.stop()
        for rpc_server in own:
            rpc_server.stop()
    assert server.proc.returncode == 0  # SIGTERM, not the SIGKILL that stop() falls back to


def _stream_outcome(url: str, prompt: str, timeout: float) -> str:
    """How one streamed completion ended: its error (an SSE error event or an HTTP error body), or why it did not."""
    import httpx

    body = {"prompt": prompt, "max_tokens": 8, "stream": True}
    try:
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=timeout) as response:
            if response.status_code != 200:
                return f"HTTP {response.status_code}: {response.read().decode()}"
            lines = [line for line in response.iter_lines() if line]
    except httpx.HTTPError as exc:
        return f"no answer: {type(exc).__name__}"
    errors = [line for line in lines if line.startswith("data: {") and '"error"' in line]
    return f"error event: {errors[-1]}" if errors and lines[-1] == "data: [DONE]" else f"no error event: {lines[-3:]}"


def test_a_server_killed_while_a_slot_saves_its_cache_fails_every_request_not_a_deadlock(
        tiny_model: Path, tmp_path: Path) -> None:
    """Several requests start on -np 3 while the server is frozen (SIGSTOP), then it is killed: the
    first start saves a slot's cells to the prompt cache (a read from the rpc-server), the others
    queue. ggml reports the dead server on its RPC thread, which must get the engine's lock: the
    scheduler may not hold it while it waits for ggml, or the server hangs for good."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    own = [RpcServer(tmp_path / "a.log")]
    server = start_serve(tiny_model, tmp_path / "serve.log", "--rpc", _rpc(own), "-np", "3")
    story = "once upon a time there was a cat that sat on the mat"
    try:
        # Slot 0 holds a long prompt; the next requests share its start, so the first of them takes
        # slot 0 and saves its other 40-odd cells before it runs.
        warm = httpx.post(f"{server.url}/v1/completions", timeout=30,
                          json={"prompt": f"{story} " + "and the dog ran in the park " * 8, "max_tokens": 2})
        assert warm.status_code == 200, warm.text
        own[0].proc.send_signal(signal.SIGSTOP)
        with ThreadPoolExecutor(4) as pool:
            outcomes = [pool.submit(_stream_outcome, server.url, f"{story} {n}", 15) for n in range(4)]
            time.sleep(1.5)  # the first start now waits for the frozen server
            own[0].proc.send_signal(signal.SIGKILL)
            started = time.monotonic()
            ended = [outcome.result() for outcome in outcomes]
        elapsed = time.monotonic() - started
        gone = f"RPC server {own[0].endpoint} is gone"
        assert all(gone in outcome for outcome in ended), ended
        assert elapsed < 10
        health = httpx.get(f"{server.url}/health", timeout=10)
        later = httpx.post(f"{server.url}/v1/completions", json={"prompt": story, "max_tokens": 4}, timeout=10)
        assert health.status_code == later.status_code == 503
        assert gone in health.json()["error"]["message"] and gone in later.json()["error"]["message"]
        stopping = time.monotonic()
    finally:
        server.stop()
        for rpc_server in own:
            rpc_server.stop()
    assert server.proc.returncode == 0 and time.monotonic() - stopping < 5  # SIGTERM, not stop()'s SIGKILL
