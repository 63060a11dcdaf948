"""Speculative decoding on the realistic-shape model: what --spec-type and -md buy, against llama-server.

The synthetic models repeat themselves at temperature 0, so their output is the repeating text that
n-gram drafts are made for. Four figures, each a median of interleaved rounds (A,B then B,A):

  1. `pyllama complete` generation t/s with --spec-type ngram-simple against none (target >= 1.5x);
  2. the same request through `pyllama serve` and `llama-server`, both with --spec-type ngram-simple:
     single requests (target >= 1.0x), then 1 and 4 streaming clients on -np 4 servers (>= 1.0x);
  3. -md: a Q4_0 draft of the Q8_0 target's own weights, acceptance rate and speed-up against none,
     in `pyllama complete` and in llama-server (reported as measured: on a CPU a draft of the
     same shape reads half the target's bytes per token, so it may not pay).

    python benchmarks/bench_speculative.py [--llama-cpp-bin DIR] [-t THREADS] [--repeat 3] [-n 256]
        [--requests-per-client 2] [--skip-draft]
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import _common as common
from bench_serve_parallel import start_server

PROMPT = "def fibonacci(n):"  # the synthetic model soon loops on it at temperature 0
SPEC = ["--spec-type", "ngram-simple"]


def complete_tps(model: str, extra: list[str], args) -> tuple[float, dict]:
    """`pyllama complete` at temperature 0: its generation t/s and --json statistics."""
    cmd = [*common.pyllama_cmd(), "complete", "-m", model, "-p", PROMPT, "-n", str(args.n), "--temp", "0",
           "--ignore-eos", "-c", "2048", "-t", str(args.threads), "--json", *extra]
    _, proc = common.run_timed(cmd)
    stats = json.loads(proc.stderr.decode().strip().splitlines()[-1])
    return stats["generation_tps"], {**stats, "text": proc.stdout}


def server_cmds(model: str, args, extra: list[str], parallel: int, ports: dict[str, int]) -> dict[str, list[str]]:
    shared = ["-m", model, "-c", str(2048 * parallel), "-t", str(args.threads), "-np", str(parallel),
              "--host", "127.0.0.1", *extra]
    ref = [str(common.llama_cpp_bin(args.llama_cpp_bin) / "llama-server"), *shared, "--no-webui", "--log-disable",
           "--port", str(ports["llama-server"])]
    return {"llama-server": ref, "pyllama": [*common.pyllama_cmd(), "serve", *shared, "--port", str(ports["pyllama"])]}


async def _one(client, url: str, n: int) -> tuple[int, dict]:
    body = {"prompt": PROMPT, "max_tokens": n, "temperature": 0, "ignore_eos": True}
    answer = (await client.post(f"{url}/v1/completions", json=body, timeout=600)).json()
    return answer["usage"]["completion_tokens"], answer.get("timings", {})


async def clients_tps(url: str, clients: int, requests: int, n: int) -> float:
    """Aggregate generated tokens per second of `clients` clients sharing `requests` requests."""
    import httpx

    queue = list(range(requests))
    tokens = 0

    async def worker(client) -> None:
        nonlocal tokens
        while queue:
            queue.pop()
            tokens += (await _one(client, url, n))[0]

    async with httpx.AsyncClient(timeout=600) as client:
        await _one(client, url, 8)  # warm-up
        start = time.perf_counter()
        await asyncio.gather(*[worker(client) for _ in range(clients)])
    return tokens / (time.perf_counter() - start)


async def single_tps(url: str, n: int) -> tuple[float, dict]:
    """One request's decode speed as its server measured it (timings.predicted_per_second)."""
    import httpx

    async with httpx.AsyncClient(timeout=600) as client:
        await _one(client, url, 8)
        _, timings = await _one(client, url, n)
    return timings["predicted_per_second"], timings


def serve_rounds(model: str, args, extra: list[str], parallel: int, loads: list[tuple[str, int]]) -> dict:
    """Per load, per server, the figures of each round (servers started once, loads interleaved)."""
    ports = {name: common.free_port() for name in ("llama-server", "pyllama")}
    cmds = server_cmds(model, args, extra, parallel, ports)
    procs = {}
    try:
        for name, cmd in cmds.items():
            procs[name] = start_server(cmd, ports[name])  # waits until ready, and warms it up
        runs: dict = {load: {name: [] for name in cmds} for load, _ in loads}
        for r in range(args.repeat):
            for load, clients in loads:
                for name in common.turn_order(r, list(cmds)):
                    url = f"http://127.0.0.1:{ports[name]}"
                    if clients == 0:
                        tps, timings = asyncio.run(single_tps(url, args.n))
                        runs[load][name].append((tps, timings.get("draft_n", 0), timings.get("draft_n_accepted", 0)))
                    else:
                        requests = args.requests_per_client * clients
                        runs[load][name].append((asyncio.run(clients_tps(url, clients, requests, args.n)), 0, 0))
        return runs
    finally:
        for proc in procs.values():
            common.stop_server(proc)


def report_serve(title: str, runs: dict) -> None:
    print(f"\n{title}")
    print(f"{'load':<26} {'llama-server':>13} {'pyllama':>10} {'ratio':>7}  target")
    for load, by_name in runs.items():
        ref = common.median([x[0] for x in by_name["llama-server"]])
        ours = common.median([x[0] for x in by_name["pyllama"]])
        print(f"{load:<26} {ref:>13.2f} {ours:>10.2f} {ours / ref:>7.3f}  >= 1.0")
        for name, values in by_name.items():
            drafted, accepted = sum(v[1] for v in values), sum(v[2] for v in values)
            if drafted:
                print(f"  {name}: drafted {drafted}, accepted {accepted} ({accepted / drafted:.1%})")


def complete_rounds(model: str, args, variants: dict[str, list[str]]) -> dict[str, list[tuple[float, dict]]]:
    runs: dict[str, list[tuple[float, dict]]] = {name: [] for name in variants}
    for r in range(args.repeat):
        for name in common.turn_order(r, list(variants)):
            runs[name].append(complete_tps(model, variants[name], args))
    return runs


def report_complete(title: str, runs: dict[str, list[tuple[float, dict]]], target: str) -> None:
    base = common.median([tps for tps, _ in runs["none"]])
    print(f"\n{title}")
    texts = {stats["text"] for values in runs.values() for _, stats in values}
    for name, values in runs.items():
        tps = common.median([t for t, _ in values])
        stats = values[-1][1]
        extra = (f", drafted {stats['draft_tokens']}, accepted {stats['draft_accepted']} "
                 f"({stats['draft_acceptance']:.1%})") if stats["draft_tokens"] else ""
        print(f"  {name:<14} {tps:8.2f} t/s  x{tps / base:.3f}{extra}")
    print(f"  same text in every run: {len(texts) == 1}   target: {target}")


def main() -> None:
    parser = common.base_parser(__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=256, help="tokens to generate per request")
    parser.add_argument("--requests-per-client", type=int, default=2, help="requests each client sends per round")
    parser.add_argument("--skip-draft", action="store_true", help="leave out the -md figures")
    args = parser.parse_args()
    model = str(args.model or common.bench_model("Q4_0"))

    ngram = complete_rounds(model, args, {"none": [], "ngram-simple": SPEC, "ngram-map-k": ["--spec-type",
                                                                                          "ngram-map-k"]})
    report_complete(f"1. pyllama complete, {args.n} tokens, n-gram drafts vs none", ngram, "ngram-simple >= 1.5x")
    single = serve_rounds(model, args, SPEC, 1, [("single request (-np 1)", 0)])
    report_serve("2a. ngram-simple, one request, decode t/s as each server times it", single)
    clients = serve_rounds(model, args, SPEC, 4, [("1 client (-np 4)", 1), ("4 clients (-np 4)", 4)])
    report_serve("2b. ngram-simple through the servers, aggregate t/s", clients)
    if args.skip_draft:
        return
    target, draft = str(common.bench_model("Q8_0")), str(common.bench_model("Q4_0"))
    md = complete_rounds(target, args, {"none": [], "-md Q4_0": ["-md", draft, "--spec-draft-n-max", "16"]})
    report_complete("3a. pyllama complete, Q8_0 target, -md Q4_0 of the same weights", md, "reported as measured")
    md_serve = serve_rounds(target, args, ["-md", draft, "--spec-draft-n-max", "16"], 1,
                            [("single request, -md Q4_0", 0)])
    report_serve("3b. -md Q4_0 through the servers, one request", md_serve)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(130)
    except subprocess.CalledProcessError as exc:
        sys.exit(f"failed: {exc}")
