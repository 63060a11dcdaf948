"""Router mode of `pyllama serve`: what loading on first use costs, and what routing costs a warm model.

Two measures, on the realistic-shape model:
  1. cold: a request for an unloaded model, its time to first token, against what it is made of: the
     load alone (POST /models/load) plus a warm request's time to first token. Target: cold <= 1.05x.
  2. warm: 4 streaming clients share 16 requests of 64 tokens on one loaded model, in router mode
     (two models served, one used) and on a one-model server. Target: router >= 0.97x tokens/s.

    python benchmarks/bench_router.py [-m MODEL.gguf] [-t THREADS] [--repeat 3]

Each repeat measures the router and the one-model server in turn, A,B then B,A; medians are reported.
Each request's prompt starts with its own number, so that no slot reuses a cached prefix.
"""

from __future__ import annotations

import asyncio
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _common as common

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle. Once upon a time"
N_TOKENS = 64
CLIENTS, REQUESTS = 4, 16
MODEL_ID = "bench"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def stream(client, url: str, n: int, max_tokens: int = N_TOKENS) -> tuple[int, float]:
    """One streamed completion: (completion tokens, seconds to the first token)."""
    body = {"model": MODEL_ID, "prompt": f"{n} {PROMPT}", "max_tokens": max_tokens, "temperature": 0.8, "seed": n,
            "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}}
    start, ttft, tokens = time.perf_counter(), None, 0
    async with client.stream("POST", url + "/v1/completions", json=body, timeout=300) as resp:
        if resp.status_code != 200:
            raise SystemExit(f"{url}: {resp.status_code} {(await resp.aread()).decode()[:300]}")
        async for line in resp.aiter_lines():
            if not line.startswith("data: {"):
                continue
            data = json.loads(line[6:])
            if ttft is None and data.get("choices") and data["choices"][0].get("text"):
                ttft = time.perf_counter() - start
            if data.get("usage"):
                tokens = data["usage"]["completion_tokens"]
    return tokens, ttft or 0.0


async def throughput(url: str, first: int) -> float:
    """Generated tokens per second of CLIENTS clients sharing REQUESTS requests."""
    import httpx

    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(REQUESTS):
        queue.put_nowait(first + i)
    tokens = 0

    async def worker(client) -> None:
        nonlocal tokens
        while not queue.empty():
            tokens += (await stream(client, url, queue.get_nowait()))[0]

    async with httpx.AsyncClient() as client:
        start = time.perf_counter()
        await asyncio.gather(*[worker(client) for _ in range(CLIENTS)])
        return tokens / (time.perf_counter() - start)


async def _one(url: str) -> None:
    import httpx

    async with httpx.AsyncClient() as client:
        await stream(client, url, 10_000, max_tokens=4)


async def cold_and_parts(url: str, first: int) -> tuple[float, float, float]:
    """(cold TTFT, load time, warm TTFT) of one model, unloaded before each cold measure."""
    import httpx

    async with httpx.AsyncClient(timeout=300) as client:
        await _unload(client, url)
        _, cold = await stream(client, url, first, max_tokens=1)
        await _unload(client, url)
        start = time.perf_counter()
        (await client.post(url + "/models/load", json={"model": MODEL_ID})).raise_for_status()
        load = time.perf_counter() - start
        _, warm = await stream(client, url, first + 1, max_tokens=1)
    return cold, load, warm


async def _unload(client, url: str) -> None:
    cards = (await client.get(url + "/v1/models")).json()["data"]
    if any(c["id"] == MODEL_ID and c["status"]["value"] == "loaded" for c in cards):
        (await client.post(url + "/models/unload", json={"model": MODEL_ID})).raise_for_status()


def start(cmd: list[str], url: str) -> subprocess.Popen:
    import httpx

    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited early with {proc.returncode}: {' '.join(cmd)}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                asyncio.run(_one(url))  # warm-up: loads the router's model too
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise SystemExit("server did not become ready")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


def main() -> None:
    args = common.base_parser(__doc__.splitlines()[0]).parse_args()
    model = (args.model or common.bench_model("Q4_0")).resolve()
    folder = Path(tempfile.mkdtemp(prefix="bench-router-"))
    (folder / f"{MODEL_ID}.gguf").symlink_to(model)
    (folder / "twin.gguf").symlink_to(model)  # a second model, never used: the router serves two
    flags = ["--host", "127.0.0.1", "-c", "4096", "-t", str(args.threads), "-np", str(CLIENTS)]
    ports = {"router": free_port(), "single": free_port()}
    urls = {who: f"http://127.0.0.1:{port}" for who, port in ports.items()}
    cmds = {"router": [*common.pyllama_cmd(), "serve", "--models-dir", str(folder), "--port", str(ports["router"]),
                       *flags],
            "single": [*common.pyllama_cmd(), "serve", "-m", str(folder / f"{MODEL_ID}.gguf"), "--alias", MODEL_ID,
                       "--port", str(ports["single"]), *flags]}
    print(f"model {model.name}, threads {args.threads}, {args.repeat} repeats", file=sys.stderr)
    procs: dict[str, subprocess.Popen] = {}
    tps: dict[str, list[float]] = {"router": [], "single": []}
    colds: list[tuple[float, float, float]] = []
    try:
        for who, cmd in cmds.items():
            procs[who] = start(cmd, urls[who])
        for i in range(args.repeat):
            for who in common.turn_order(i, ("router", "single")):
                tps[who].append(asyncio.run(throughput(urls[who], 1000 * (i + 1))))
            colds.append(asyncio.run(cold_and_parts(urls["router"], 100_000 + 10 * i)))
            print(f"repeat {i + 1}: router {tps['router'][-1]:.1f} t/s, single {tps['single'][-1]:.1f} t/s; "
                  f"cold TTFT {colds[-1][0]:.3f} s, load {colds[-1][1]:.3f} s + warm TTFT {colds[-1][2]:.3f} s",
                  file=sys.stderr)
    finally:
        for proc in procs.values():
            stop(proc)
    cold = statistics.median(c[0] for c in colds)
    parts = statistics.median(c[1] + c[2] for c in colds)
    print(f"{'metric':<40} {'baseline':>10} {'router':>10} {'ratio':>7}  target")
    print(f"{'cold TTFT vs load + warm TTFT (s)':<40} {parts:>10.3f} {cold:>10.3f} {cold / parts:>7.3f}  <= 1.05")
    single, router = statistics.median(tps["single"]), statistics.median(tps["router"])
    print(f"{'4 clients, warm model (tokens/s)':<40} {single:>10.1f} {router:>10.1f} {router / single:>7.3f}  >= 0.97")
    paired = statistics.median(r / s for r, s in zip(tps["router"], tps["single"]))
    print(f"paired ratio (median): {paired:.3f}; load {statistics.median(c[1] for c in colds):.3f} s, "
          f"warm TTFT {statistics.median(c[2] for c in colds):.3f} s (medians)")


if __name__ == "__main__":
    main()
