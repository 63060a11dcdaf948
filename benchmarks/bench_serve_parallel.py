"""`pyllama serve --parallel 4` against `llama-server -np 4` under the same bounded load.

Each server in turn, on the same model, context and threads, bound to 127.0.0.1 on a free port:
  phase 1: 4 concurrent streaming clients share 16 requests of 64 tokens;
  phase 2: 1 client sends 4 requests of 64 tokens.
Reported per phase: aggregate generated tokens/s (all completion tokens / phase wall time), p50
time to first token, errors. Targets: pyllama >= 1.0x llama-server at 4 clients, >= 0.95x at 1.

    python benchmarks/bench_serve_parallel.py [--llama-cpp-bin DIR] [-m MODEL.gguf] [-t THREADS] [--repeat 3]

Each round starts both servers in turn (alternating which goes first) and runs the bounded load
three times on each; the table gives medians over all of them.
"""

from __future__ import annotations

import asyncio
import json
import socket
import statistics
import subprocess
import sys
import time

import _common as common

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle. Once upon a time"
N_TOKENS = 64


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def one_request(client, url: str, seed: int) -> tuple[int, float, bool]:
    """Stream one completion; return (completion tokens, seconds to first token, ok).

    A kept-alive connection that the server closed before answering is retried once on a new one,
    as OpenAI's client does: llama-server's HTTP library closes a connection after a few requests,
    and a request that never reached the server says nothing about its speed.
    """
    import httpx

    for attempt in (1, 2):
        try:
            return await _stream(client, url, seed)
        except httpx.RemoteProtocolError:
            if attempt == 2:
                return 0, 0.0, False
    return 0, 0.0, False


async def _stream(client, url: str, seed: int) -> tuple[int, float, bool]:
    import httpx

    body = {"prompt": PROMPT, "max_tokens": N_TOKENS, "temperature": 0.8, "seed": seed, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    start, ttft, tokens = time.perf_counter(), None, 0
    try:
        async with client.stream("POST", url + "/v1/completions", json=body, timeout=300) as resp:
            if resp.status_code != 200:
                return 0, 0.0, False
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                data = json.loads(line[6:])
                if data.get("choices") and data["choices"][0].get("text") and ttft is None:
                    ttft = time.perf_counter() - start
                if data.get("usage"):
                    tokens = data["usage"]["completion_tokens"]
    except httpx.RemoteProtocolError:
        if ttft is None and tokens == 0:
            raise  # closed before any answer: one_request retries it
        return 0, 0.0, False
    except Exception:  # noqa: BLE001 - counted as an error
        return 0, 0.0, False
    return tokens, ttft or 0.0, tokens == N_TOKENS


async def phase(url: str, clients: int, requests: int) -> dict[str, float]:
    import httpx

    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(i)
    results: list[tuple[int, float, bool]] = []

    async def worker(client) -> None:
        while not queue.empty():
            seed = queue.get_nowait()
            results.append(await one_request(client, url, seed))

    async with httpx.AsyncClient() as client:
        start = time.perf_counter()
        await asyncio.gather(*[worker(client) for _ in range(clients)])
        wall = time.perf_counter() - start
    ok = [r for r in results if r[2]]
    return {"tps": sum(r[0] for r in results) / wall, "p50_ttft": statistics.median(r[1] for r in ok) if ok else 0.0,
            "errors": len(results) - len(ok), "wall": wall}


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    import httpx

    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited early with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit("server did not become ready")


LOADS_PER_START = 3  # the bounded load, run this many times per server start (medians kept)


def measure(cmd: list[str], port: int) -> dict[str, dict[str, float]]:
    """Start a server, warm it up, run the bounded load LOADS_PER_START times; medians per phase."""
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(url, proc)
        asyncio.run(phase(url, 1, 1))  # warm-up
        loads = [{"4 clients": asyncio.run(phase(url, 4, 16)), "1 client": asyncio.run(phase(url, 1, 4))}
                 for _ in range(LOADS_PER_START)]
        return summarise(loads)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    args = common.base_parser(__doc__.splitlines()[0]).parse_args()
    bin_dir = common.llama_cpp_bin(args.llama_cpp_bin)
    model = args.model or common.bench_model("Q4_0")
    n_ctx, t = 4096, str(args.threads)
    port = free_port()
    ref_cmd = [str(bin_dir / "llama-server"), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
               "-c", str(n_ctx), "-t", t, "-np", "4", "--no-webui"]
    ours_cmd = [*common.pyllama_cmd(), "serve", "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
                "-c", str(n_ctx), "-t", t, "--parallel", "4"]
    print(f"model {model.name}, n_ctx {n_ctx}, threads {t}, {N_TOKENS} tokens per request, "
          f"{args.repeat} rounds", file=sys.stderr)
    runs: dict[str, list[dict[str, dict[str, float]]]] = {"ref": [], "ours": []}
    for i in range(args.repeat):
        for who in common.turn_order(i, ("ref", "ours")):
            runs[who].append(measure(ref_cmd if who == "ref" else ours_cmd, port))
            print(f"round {i + 1} {who}: " + ", ".join(
                f"{name} {runs[who][-1][name]['tps']:.1f} t/s" for name in ("4 clients", "1 client")), file=sys.stderr)
    ref, ours = summarise(runs["ref"]), summarise(runs["ours"])
    rows = []
    for name, target in (("4 clients", ">= 1.00"), ("1 client", ">= 0.95")):
        rows.append((f"{name}: gen tokens/s", ref[name]["tps"], ours[name]["tps"], target))
    common.print_ratio_table(rows, higher_is_better=True)
    for name in ("4 clients", "1 client"):
        print(f"{name}: p50 TTFT llama-server {ref[name]['p50_ttft']:.3f} s, pyllama {ours[name]['p50_ttft']:.3f} s; "
              f"errors llama-server {ref[name]['errors']:.0f}, pyllama {ours[name]['errors']:.0f}")


def summarise(rounds: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Median tokens/s and TTFT over runs of the load, errors summed."""
    return {name: {"tps": statistics.median(r[name]["tps"] for r in rounds),
                   "p50_ttft": statistics.median(r[name]["p50_ttft"] for r in rounds),
                   "errors": sum(r[name]["errors"] for r in rounds)}
            for name in rounds[0]}


if __name__ == "__main__":
    main()
