"""`pyllama serve --parallel 4` against `llama-server -np 4` under the same bounded load.

Both servers run on the same model, context and threads, each bound to 127.0.0.1 on a free port,
and are driven in turn with the same bounded load:
  phase 1: 4 concurrent streaming clients share 16 requests of 64 tokens;
  phase 2: 1 client sends 4 requests of 64 tokens.
Reported per phase: aggregate generated tokens/s (all completion tokens / phase wall time), p50
time to first token, errors. Targets: pyllama >= 1.0x llama-server at 4 clients, >= 0.95x at 1.

    python benchmarks/bench_serve_parallel.py [--llama-cpp-bin DIR] [-m MODEL.gguf] [-t THREADS] [--repeat 3]

Each round starts both servers (an idle server takes no CPU) and alternates the loads between
them, A,B then B,A, LOADS_PER_ROUND times: paired runs seconds apart, since this machine's speed
drifts by 10% over minutes. The table gives medians over all runs; the paired ratios (each run
against its neighbour on the other server) are printed beside it.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import time

import _common as common

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle. Once upon a time"
N_TOKENS = 64


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


LOADS_PER_ROUND = 3  # alternating bounded loads per round (per server start)
PHASES = (("4 clients", 4, 16), ("1 client", 1, 4))


def start_server(cmd: list[str], port: int) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        common.wait_healthy(url, proc)
        asyncio.run(phase(url, 1, 1))  # warm-up
    except BaseException:
        common.stop_server(proc)
        raise
    return proc


def one_round(cmds: dict[str, list[str]], ports: dict[str, int], round_index: int
              ) -> dict[str, list[dict[str, dict[str, float]]]]:
    """Start both servers, run the load on each in alternation; the runs per server, in order."""
    procs: dict[str, subprocess.Popen] = {}
    runs: dict[str, list[dict[str, dict[str, float]]]] = {who: [] for who in cmds}
    try:
        for who in cmds:
            procs[who] = start_server(cmds[who], ports[who])
        for k in range(LOADS_PER_ROUND):
            loads: dict[str, dict[str, dict[str, float]]] = {who: {} for who in cmds}
            for name, clients, requests in PHASES:
                for who in common.turn_order(round_index + k, tuple(cmds)):
                    loads[who][name] = asyncio.run(phase(f"http://127.0.0.1:{ports[who]}", clients, requests))
            for who in cmds:
                runs[who].append(loads[who])
    finally:
        for proc in procs.values():
            common.stop_server(proc)
    return runs


def main() -> None:
    args = common.base_parser(__doc__.splitlines()[0]).parse_args()
    bin_dir = common.llama_cpp_bin(args.llama_cpp_bin)
    model = args.model or common.bench_model("Q4_0")
    n_ctx, t = 4096, str(args.threads)
    ports = {"ref": common.free_port(), "ours": common.free_port()}
    cmds = {
        "ref": [str(bin_dir / "llama-server"), "-m", str(model), "--host", "127.0.0.1", "--port", str(ports["ref"]),
                "-c", str(n_ctx), "-t", t, "-np", "4", "--no-webui"],
        "ours": [*common.pyllama_cmd(), "serve", "-m", str(model), "--host", "127.0.0.1", "--port", str(ports["ours"]),
                 "-c", str(n_ctx), "-t", t, "--parallel", "4"],
    }
    print(f"model {model.name}, n_ctx {n_ctx}, threads {t}, {N_TOKENS} tokens per request, "
          f"{args.repeat} rounds of {LOADS_PER_ROUND} alternating loads", file=sys.stderr)
    runs: dict[str, list[dict[str, dict[str, float]]]] = {"ref": [], "ours": []}
    for i in range(args.repeat):
        got = one_round(cmds, ports, i)
        for who in runs:
            runs[who] += got[who]
        print(f"round {i + 1}: " + "; ".join(
            f"{name} llama-server {common.load_speeds(got['ref'], name)} t/s, pyllama {common.load_speeds(got['ours'], name)} t/s"
            for name, _, _ in PHASES), file=sys.stderr)
    ref, ours = common.summarise_loads(runs["ref"]), common.summarise_loads(runs["ours"])
    rows = []
    for name, target in (("4 clients", ">= 1.00"), ("1 client", ">= 0.95")):
        rows.append((f"{name}: gen tokens/s", ref[name]["tps"], ours[name]["tps"], target))
    common.print_ratio_table(rows, higher_is_better=True)
    for name, _, _ in PHASES:
        paired = statistics.median(o[name]["tps"] / r[name]["tps"] for r, o in zip(runs["ref"], runs["ours"]))
        print(f"{name}: median paired ratio {paired:.3f}; p50 TTFT llama-server {ref[name]['p50_ttft']:.3f} s, "
              f"pyllama {ours[name]['p50_ttft']:.3f} s; errors llama-server {ref[name]['errors']:.0f}, "
              f"pyllama {ours[name]['errors']:.0f}")


if __name__ == "__main__":
    main()
