"""The same load over ollama's /api/chat and OpenAI's /v1/chat/completions of one `pyllama serve --parallel 4`.

Both routes reach the same engine; this measures what ollama's shape costs (NDJSON lines, its
request mapping) against OpenAI's (SSE chunks). The server is driven with the same bounded load
on each route in turn, with the same seeds, so both generate the same tokens:
  phase 1: 4 concurrent streaming clients share 16 requests of 64 tokens;
  phase 2: 1 client sends 4 requests of 64 tokens.
Reported per phase: aggregate generated tokens/s on each route and their ratio (target: /api/chat
>= 0.97x /v1/chat/completions), p50 time to first token, errors.

    python benchmarks/bench_ollama.py [-m MODEL.gguf] [-t THREADS] [--repeat 3]

Each round starts the server afresh and alternates the routes A,B then B,A, LOADS_PER_ROUND times,
so that paired runs are seconds apart; the table gives medians, and paired ratios are printed beside it.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import time

import _common as common

MESSAGES = [{"role": "user", "content": "Write a short story about a lighthouse keeper who finds a message in "
                                        "a bottle. Once upon a time"}]
N_TOKENS = 64
LOADS_PER_ROUND = 3
PHASES = (("4 clients", 4, 16), ("1 client", 1, 4))
ROUTES = ("openai", "ollama")


def _request(route: str, seed: int) -> tuple[str, dict]:
    if route == "ollama":
        return "/api/chat", {"model": "m", "messages": MESSAGES, "stream": True, "options": {
            "num_predict": N_TOKENS, "temperature": 0.8, "seed": seed, "ignore_eos": True}}
    return "/v1/chat/completions", {"model": "m", "messages": MESSAGES, "stream": True, "max_tokens": N_TOKENS,
                                    "temperature": 0.8, "seed": seed, "ignore_eos": True,
                                    "stream_options": {"include_usage": True}}


def _tokens_and_text(route: str, line: str) -> tuple[int | None, bool]:
    """(the generated tokens this line reports at the end, whether it carries text)."""
    if route == "ollama":
        data = json.loads(line)
        return (data["eval_count"] if data.get("done") else None), bool(data.get("message", {}).get("content"))
    if not line.startswith("data: ") or line == "data: [DONE]":
        return None, False
    data = json.loads(line[6:])
    usage = data.get("usage")
    text = bool(data.get("choices") and data["choices"][0].get("delta", {}).get("content"))
    return (usage["completion_tokens"] if usage else None), text


async def one_request(client, url: str, route: str, seed: int) -> tuple[int, float, bool]:
    path, body = _request(route, seed)
    start, ttft, tokens = time.perf_counter(), None, 0
    try:
        async with client.stream("POST", url + path, json=body, timeout=300) as resp:
            if resp.status_code != 200:
                return 0, 0.0, False
            async for line in resp.aiter_lines():
                if not line:
                    continue
                count, text = _tokens_and_text(route, line)
                if text and ttft is None:
                    ttft = time.perf_counter() - start
                tokens = count if count is not None else tokens
    except Exception:  # noqa: BLE001 - counted as an error
        return 0, 0.0, False
    return tokens, ttft or 0.0, tokens == N_TOKENS


async def phase(url: str, route: str, clients: int, requests: int) -> dict[str, float]:
    import httpx

    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(i)
    results: list[tuple[int, float, bool]] = []

    async def worker(client) -> None:
        while not queue.empty():
            results.append(await one_request(client, url, route, queue.get_nowait()))

    async with httpx.AsyncClient() as client:
        start = time.perf_counter()
        await asyncio.gather(*[worker(client) for _ in range(clients)])
        wall = time.perf_counter() - start
    ok = [r for r in results if r[2]]
    return {"tps": sum(r[0] for r in results) / wall, "p50_ttft": statistics.median(r[1] for r in ok) if ok else 0.0,
            "errors": len(results) - len(ok)}


def one_round(cmd: list[str], url: str, round_index: int) -> dict[str, list[dict[str, dict[str, float]]]]:
    runs: dict[str, list[dict[str, dict[str, float]]]] = {route: [] for route in ROUTES}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        common.wait_healthy(url, proc)
        for route in ROUTES:
            asyncio.run(phase(url, route, 1, 1))  # warm-up
        for k in range(LOADS_PER_ROUND):
            loads: dict[str, dict[str, dict[str, float]]] = {route: {} for route in ROUTES}
            for name, clients, requests in PHASES:
                for route in common.turn_order(round_index + k, ROUTES):
                    loads[route][name] = asyncio.run(phase(url, route, clients, requests))
            for route in ROUTES:
                runs[route].append(loads[route])
    finally:
        common.stop_server(proc)
    return runs


def main() -> None:
    args = common.base_parser(__doc__.splitlines()[0]).parse_args()
    model = args.model or common.bench_model("Q4_0")
    port, n_ctx, t = common.free_port(), 4096, str(args.threads)
    cmd = [*common.pyllama_cmd(), "serve", "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
           "-c", str(n_ctx), "-t", t, "--parallel", "4"]
    url = f"http://127.0.0.1:{port}"
    print(f"model {model.name}, n_ctx {n_ctx}, threads {t}, {N_TOKENS} tokens per request, "
          f"{args.repeat} rounds of {LOADS_PER_ROUND} alternating loads", file=sys.stderr)
    runs: dict[str, list[dict[str, dict[str, float]]]] = {route: [] for route in ROUTES}
    for i in range(args.repeat):
        got = one_round(cmd, url, i)
        for route in ROUTES:
            runs[route] += got[route]
        print(f"round {i + 1}: " + "; ".join(
            f"{name} /v1/chat/completions {common.load_speeds(got['openai'], name)} t/s, /api/chat "
            f"{common.load_speeds(got['ollama'], name)} t/s" for name, _, _ in PHASES), file=sys.stderr)
    openai, ollama = common.summarise_loads(runs["openai"]), common.summarise_loads(runs["ollama"])
    print(f"{'metric':<28} {'/v1/chat':>12} {'/api/chat':>12} {'ratio':>8}  target")
    for name, _, _ in PHASES:
        a, b = openai[name]["tps"], ollama[name]["tps"]
        print(f"{name + ': gen tokens/s':<28} {a:>12.3f} {b:>12.3f} {b / a if a else float('nan'):>8.3f}  >= 0.97")
    print("(ratio = /api/chat / /v1/chat/completions; higher is better)")
    for name, _, _ in PHASES:
        paired = statistics.median(b[name]["tps"] / a[name]["tps"] for a, b in zip(runs["openai"], runs["ollama"]))
        print(f"{name}: /v1/chat/completions {openai[name]['tps']:.1f} t/s, /api/chat {ollama[name]['tps']:.1f} t/s, "
              f"median paired ratio {paired:.3f}; p50 TTFT {openai[name]['p50_ttft']:.3f} s vs "
              f"{ollama[name]['p50_ttft']:.3f} s; errors {openai[name]['errors']:.0f} vs {ollama[name]['errors']:.0f}")


if __name__ == "__main__":
    main()
