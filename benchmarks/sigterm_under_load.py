"""SIGTERM during 4 streams and 3 queued requests, on a loaded machine, N times: how many ended as they must.

Each run starts `pyllama serve -np 4 --shutdown-grace 1` (--shutdown-grace) on the tiny model, opens four streams (two
OpenAI chat streams, an Anthropic Messages stream and a Responses stream) that generate until
stopped, queues three non-streamed chat requests behind them, waits until the load average is at
least --load (busy loops on every core and more raise it; each loop ends by itself after
--busy-seconds), and sends SIGTERM. Counted over the runs:

  * streams that ended with their API's shutdown event (OpenAI: an error of type server_shutdown and
    data: [DONE]; Anthropic: event: error, overloaded_error; Responses: event: error, server_shutdown);
  * queued requests answered 503 with Retry-After;
  * exits with status 0 in under 3 s, and server logs without a traceback.

127.0.0.1 only; exit status 1 unless every count is whole.

    python benchmarks/sigterm_under_load.py [--runs 10] [--load 4] [--busy 6] [--busy-seconds 120]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import _common  # noqa: F401 - puts the repository on sys.path

from tests.fixtures.make_gguf import TINY, write_llama_gguf

STORY = [{"role": "user", "content": "tell a story"}]
STREAMS = [("/v1/chat/completions", {"messages": STORY, "max_tokens": 100_000}),
           ("/v1/chat/completions", {"messages": STORY, "max_tokens": 100_000}),
           ("/v1/messages", {"messages": STORY, "max_tokens": 100_000}),
           ("/v1/responses", {"input": "tell a story", "max_output_tokens": 100_000})]
QUEUED = 3


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=10, help="runs (10)")
    p.add_argument("--load", type=float, default=4.0, help="1-minute load average to reach before SIGTERM (4)")
    p.add_argument("--busy", type=int, default=(os.cpu_count() or 1) + 4,
                   help="busy-loop processes that raise the load (cores + 4)")
    p.add_argument("--busy-seconds", type=float, default=120, help="each busy loop ends by itself after this (120)")
    p.add_argument("--shutdown-grace", default="1", help="serve's --shutdown-grace (1 s: the exit must take under 3)")
    p.add_argument("--load-wait", type=float, default=90, help="most seconds to wait for --load per run (90)")
    return p.parse_args()


def busy_loops(n: int, seconds: float) -> list[subprocess.Popen]:
    loop = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass"
    return [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(n)]


def ended_with_shutdown(path: str, lines: list[str]) -> bool:
    if path == "/v1/messages":
        return lines[-2:] == ["event: error", 'data: {"type":"error","error":{"type":"overloaded_error",'
                                               '"message":"the server is shutting down"}}']
    if path == "/v1/responses":
        return len(lines) >= 2 and lines[-2] == "event: error" and \
            json.loads(lines[-1].removeprefix("data: ")).get("code") == "server_shutdown"
    return len(lines) >= 2 and lines[-1] == "data: [DONE]" and \
        json.loads(lines[-2].removeprefix("data: ")).get("error", {}).get("type") == "server_shutdown"


def one_run(model: Path, folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    from tests.test_serve import _start

    srv = _start(model, folder / "stderr.log", "-np", "4", "-c", "16384", "--shutdown-grace", args.shutdown_grace,
                 "--ignore-eos")
    streams: dict[int, list[str]] = {}
    replies: dict[int, httpx.Response] = {}

    def stream(i: int) -> None:
        path, body = STREAMS[i]
        try:
            with httpx.stream("POST", f"{srv.url}{path}", json={**body, "stream": True}, timeout=60) as r:
                streams[i] = [line for line in r.iter_lines() if line]
        except httpx.HTTPError as exc:
            streams[i] = [f"{type(exc).__name__}: {exc}"]

    def queued(i: int) -> None:
        try:
            replies[i] = httpx.post(f"{srv.url}/v1/chat/completions", json=STREAMS[0][1], timeout=60)
        except httpx.HTTPError:
            pass

    threads = [threading.Thread(target=stream, args=(i,), daemon=True) for i in range(len(STREAMS))]
    try:
        for t in threads:
            t.start()
        wait_for(srv.url, generating=len(STREAMS), queued=0)
        threads += [threading.Thread(target=queued, args=(i,), daemon=True) for i in range(QUEUED)]
        for t in threads[len(STREAMS):]:
            t.start()
        wait_for(srv.url, generating=len(STREAMS), queued=QUEUED)
        deadline = time.monotonic() + args.load_wait
        while os.getloadavg()[0] < args.load and time.monotonic() < deadline:
            time.sleep(0.5)
        load = os.getloadavg()[0]
        started = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        code = srv.proc.wait(timeout=30)
        exit_s = time.monotonic() - started
        for t in threads:
            t.join(30)
    finally:
        srv.stop()
    return {
        "load": load, "exit_code": code, "exit_s": exit_s,
        "streams_ok": sum(ended_with_shutdown(STREAMS[i][0], lines) for i, lines in streams.items()),
        "queued_ok": sum(r.status_code == 503 and r.headers.get("retry-after") is not None for r in replies.values()),
        "traceback": "Traceback" in srv.stderr,
    }


def wait_for(url: str, *, generating: int, queued: int, timeout: float = 60) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        slots = httpx.get(f"{url}/slots", timeout=10).json()
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        if sum(s["state"] == "generating" for s in slots) >= generating and f"pyllama_queue_depth {queued}" in metrics:
            return
        time.sleep(0.05)
    raise RuntimeError(f"the server never had {generating} streams generating and {queued} queued")


def main() -> int:
    args = parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        model = write_llama_gguf(tmp / "tiny.gguf", TINY)
        for run in range(1, args.runs + 1):
            folder = tmp / f"run{run}"
            folder.mkdir()
            busy = busy_loops(args.busy, args.busy_seconds)
            try:
                result = one_run(model, folder, args)
            finally:
                for proc in busy:
                    proc.kill()
                    proc.wait()
            results.append(result)
            print(f"run {run}: load {result['load']:.1f}, streams {result['streams_ok']}/{len(STREAMS)} with their "
                  f"shutdown event, queued {result['queued_ok']}/{QUEUED} got 503 + Retry-After, exit "
                  f"{result['exit_code']} in {result['exit_s']:.2f} s" + (", TRACEBACK" if result["traceback"] else ""),
                  flush=True)
    n = len(results)
    counts = {
        "streams with their shutdown event": (sum(r["streams_ok"] for r in results), n * len(STREAMS)),
        "queued requests with 503 + Retry-After": (sum(r["queued_ok"] for r in results), n * QUEUED),
        "exits 0 in under 3 s": (sum(r["exit_code"] == 0 and r["exit_s"] < 3 for r in results), n),
        "runs without a traceback": (sum(not r["traceback"] for r in results), n),
        f"runs at load average >= {args.load:g}": (sum(r["load"] >= args.load for r in results), n),
    }
    for name, (got, of) in counts.items():
        print(f"{'PASS' if got == of else 'FAIL'}  {name}: {got}/{of}")
    print(f"exit times: max {max(r['exit_s'] for r in results):.2f} s, loads {min(r['load'] for r in results):.1f}"
          f"-{max(r['load'] for r in results):.1f}")
    return 0 if all(got == of for got, of in counts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
