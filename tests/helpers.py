"""Run pyllama in-process or as a real process and capture what it prints."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import urllib.request
from contextlib import ExitStack
from dataclasses import dataclass
from unittest import mock

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_API_KEY = "sk-test-shared"  # the key of conftest.py's keyed_server


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str

    @property
    def first_stderr_line(self) -> str:
        return self.stderr.strip().splitlines()[0] if self.stderr.strip() else ""


def _text_stream(data: bytes = b"") -> io.TextIOWrapper:
    return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", newline="", write_through=True)


def run_cli(*args: str, stdin: str = "") -> CliResult:
    """Run `pyllama ARGS` in this process through cli.run, with fresh stdio streams."""
    from pyllama_cli.cli import run

    out, err, inp = _text_stream(), _text_stream(), _text_stream(stdin.encode())
    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(sys, "stdout", out))
        stack.enter_context(mock.patch.object(sys, "stderr", err))
        stack.enter_context(mock.patch.object(sys, "stdin", inp))
        code = run(list(args))
    return CliResult(code, _read(out), _read(err))


def _read(stream: io.TextIOWrapper) -> str:
    stream.flush()
    return stream.buffer.getvalue().decode("utf-8", errors="replace")  # type: ignore[attr-defined]


def run_process(*args: str, stdin: str | bytes = b"", env: dict[str, str] | None = None,
                timeout: float = 120) -> CliResult:
    """Run `python -m pyllama_cli ARGS` as a real process (exit codes, signals, tracebacks)."""
    data = stdin.encode() if isinstance(stdin, str) else stdin
    proc = subprocess.run(
        [sys.executable, "-m", "pyllama_cli", *args], input=data, capture_output=True,
        env={**os.environ, **(env or {})}, timeout=timeout, cwd=REPO_ROOT,
    )
    return CliResult(proc.returncode, proc.stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace"))


def hang_up_after(url: str, body: dict, delta_line: str, headers: dict[str, str] | None = None,
                  deltas: int = 3) -> None:
    """POST a streamed request, read `deltas` lines equal to `delta_line`, then hang up."""
    import httpx

    with httpx.stream("POST", url, json=body, headers=headers, timeout=60) as response:
        seen = 0
        for line in response.iter_lines():
            seen += line == delta_line
            if seen == deltas:
                return


def wait_slots_idle(server_url: str, headers: dict[str, str] | None = None, timeout: float = 10) -> list[dict]:
    """Poll llama-server's /slots list until every slot is idle; the slots then."""
    import time

    import httpx

    deadline = time.monotonic() + timeout
    while True:
        slots = httpx.get(f"{server_url}/slots", headers=headers, timeout=10).json()
        if all(s["state"] == "idle" for s in slots):
            return slots
        assert time.monotonic() < deadline, slots
        time.sleep(0.05)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a server that takes --port N)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def post_json(url: str, body: dict, timeout: float = 60) -> dict:
    """POST `body` as JSON and return the JSON answer (urllib: no client library between us and the server)."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return json.loads(answer.read())


def default_sigint() -> None:
    """preexec_fn for a child a test sends SIGINT: a runner started with SIGINT ignored (nohup, some CI)
    passes that on to its children, and Python then installs no Ctrl-C handler in them."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
