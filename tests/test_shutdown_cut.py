"""SIGTERM while the engine's current step outlasts the cut window (the second uvicorn gives the cut
requests' last events): a long prefill, or every core busy with other work. The step is aborted
between graph nodes, so every stream still ends with its API's shutdown event, every queued request
gets 503 with Retry-After, nothing logs a traceback, and the process exits 0 within 3 s."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.test_serve import Server, _start

SHUTDOWN = {"message": "the server is shutting down", "type": "server_shutdown", "param": None,
            "code": "server_shutdown"}
PREFILL_TOKENS = 8000  # several seconds of prefill for the tiny model on one thread: far past the cut window


class Clients:
    """Streams and plain requests sent on threads; what each got back."""

    def __init__(self, srv: Server):
        self.srv = srv
        self.streams: dict[int, list[str]] = {}
        self.replies: dict[int, httpx.Response] = {}
        self.threads: list[threading.Thread] = []

    def stream(self, body: dict) -> None:
        def run(i: int) -> None:
            with httpx.stream("POST", f"{self.srv.url}/v1/completions", json={**body, "stream": True},
                              timeout=30) as response:
                self.streams[i] = [line for line in response.iter_lines() if line]

        self._start(run, len(self.threads))

    def plain(self, body: dict) -> None:
        def run(i: int) -> None:
            self.replies[i] = httpx.post(f"{self.srv.url}/v1/completions", json=body, timeout=30)

        self._start(run, len(self.threads))

    def _start(self, run: object, i: int) -> None:
        thread = threading.Thread(target=run, args=(i,), daemon=True)
        thread.start()
        self.threads.append(thread)

    def join(self) -> None:
        for thread in self.threads:
            thread.join(15)


def _wait_slots(srv: Server, state: str, n: int, queued: int = 0) -> None:
    deadline = time.monotonic() + 30
    while True:
        slots = httpx.get(f"{srv.url}/slots", timeout=10).json()
        metrics = httpx.get(f"{srv.url}/metrics", timeout=10).text
        if sum(s["state"] == state for s in slots) >= n and f"pyllama_queue_depth {queued}" in metrics:
            return
        assert time.monotonic() < deadline, (slots, state)
        time.sleep(0.02)


def _terminate(srv: Server) -> float:
    started = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    code = srv.proc.wait(timeout=20)
    assert code == 0, srv.stderr[-3000:]
    return time.monotonic() - started


def _assert_all_cut(clients: Clients, srv: Server, n_streams: int, n_plain: int) -> None:
    assert len(clients.streams) == n_streams and len(clients.replies) == n_plain, (clients.streams, clients.replies)
    for lines in clients.streams.values():
        data = [line.removeprefix("data: ") for line in lines]
        assert data[-1] == "[DONE]" and json.loads(data[-2]).get("error") == SHUTDOWN, data[-3:]
    for reply in clients.replies.values():
        assert (reply.status_code, reply.headers.get("retry-after")) == (503, "5"), (reply.status_code, reply.text)
        assert reply.json()["error"] == SHUTDOWN
    assert "Traceback" not in srv.stderr and "Cancel" not in srv.stderr


def test_sigterm_during_a_prefill_longer_than_the_cut_window(tiny_model: Path, tmp_path: Path) -> None:
    srv = _start(tiny_model, tmp_path / "stderr.log", "-c", str(PREFILL_TOKENS + 512), "-b",
                 str(PREFILL_TOKENS + 512), "--shutdown-grace", "0")
    clients = Clients(srv)
    try:
        clients.stream({"prompt": [5 + i % 900 for i in range(PREFILL_TOKENS)], "max_tokens": 4})
        _wait_slots(srv, "prefill", 1)
        clients.plain({"prompt": "queued", "max_tokens": 4})
        _wait_slots(srv, "prefill", 1, queued=1)
        elapsed = _terminate(srv)
        clients.join()
    finally:
        srv.stop()
    assert elapsed < 3, elapsed
    _assert_all_cut(clients, srv, 1, 1)


@contextmanager
def _busy_cores(seconds: float) -> Iterator[None]:
    """A busy loop on every core, each ending by itself after `seconds`."""
    import os

    loop = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass"
    procs = [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(os.cpu_count() or 1)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_the_same_with_every_core_busy_and_4_streams_and_3_queued_requests(tiny_model: Path, tmp_path: Path) -> None:
    per_slot = PREFILL_TOKENS + 512
    srv = _start(tiny_model, tmp_path / "stderr.log", "-np", "4", "-c", str(4 * per_slot), "-b", str(per_slot),
                 "--shutdown-grace", "0.5", "--ignore-eos")
    clients = Clients(srv)
    try:
        with _busy_cores(60):
            for _ in range(3):
                clients.stream({"prompt": "tell a story", "max_tokens": 100_000})
            _wait_slots(srv, "generating", 3)
            clients.stream({"prompt": [5 + i % 900 for i in range(PREFILL_TOKENS)], "max_tokens": 4})
            _wait_slots(srv, "prefill", 1)
            for _ in range(3):
                clients.plain({"prompt": "queued", "max_tokens": 4})
            _wait_slots(srv, "prefill", 1, queued=3)
            elapsed = _terminate(srv)
            clients.join()
    finally:
        srv.stop()
    assert elapsed < 3, elapsed
    _assert_all_cut(clients, srv, 4, 3)
