"""The agents' APIs under load: streamed `/v1/messages` and `/v1/responses`, pyllama against llama-server.

Both servers run the same model, context and threads with 4 slots, and are driven in turn (A,B then
B,A) by 4 concurrent streaming clients sharing 8 requests of up to 48 tokens, once per API.
Reported per API: generated tokens/s (the output tokens the streams' usage reports / wall time)
and p50 time to the first text delta. Target: pyllama >= 1.0x llama-server.

    python benchmarks/bench_agents.py [--llama-cpp-bin DIR] [-m MODEL.gguf] [-t THREADS] [--repeat 3] [--ref-cache-ram N]
    python benchmarks/bench_agents.py --replay distinct|shared [-t 1] [--repeat 2] [--ref-cache-ram N]

--replay runs _agent_replay.py's workload instead (an agent's turns over 4 conversations, -c 32768
-np 2), one server at a time (each started afresh, in alternating order), and reports prompt tokens
evaluated, wall time and the median time to first token of turns >= 2. Targets on `distinct`:
wall and TTFT <= 0.8x llama-server's, tokens evaluated <= llama-server's.

llama-server keeps the KV state of prompts a slot has moved on from in RAM (`--cache-ram`, 8192 MiB by
default) and restores it when one comes back; pyllama reuses only what a slot still holds. The 8 prompts
here share a prefix and come back every load, so that cache saves llama-server a part of each prefill;
`--ref-cache-ram 0` turns it off to compare the servers' streaming paths alone.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _common as common
from bench_serve_parallel import start_server

N_TOKENS = 48
CLIENTS, REQUESTS = 4, 8
LOADS_PER_ROUND = 2


def _request(api: str, i: int) -> tuple[str, dict]:
    text = f"Write a short story about a robot, number {i}."
    if api == "messages":
        return "/v1/messages", {"model": "m", "max_tokens": N_TOKENS, "stream": True,
                                "messages": [{"role": "user", "content": text}]}
    return "/v1/responses", {"model": "m", "max_output_tokens": N_TOKENS, "stream": True, "input": text}


def _read(api: str, data: dict) -> tuple[bool, int | None]:
    """(whether the event carries text, the output tokens it reports if it is the last)."""
    kind = data.get("type")
    if api == "messages":
        delta = data.get("delta") or {}
        return kind == "content_block_delta" and delta.get("type") == "text_delta", \
            (data.get("usage") or {}).get("output_tokens") if kind == "message_delta" else None
    usage = (data.get("response") or {}).get("usage") or {}
    last = kind in ("response.completed", "response.incomplete")  # incomplete: max_output_tokens cut it
    return kind == "response.output_text.delta", usage.get("output_tokens") if last else None


async def _stream(client, url: str, api: str, i: int) -> tuple[int, float]:
    """(output tokens, seconds to the first text); (0, 0.0) for a request that failed."""
    import httpx

    path, body = _request(api, i)
    start, first, tokens = time.perf_counter(), 0.0, 0
    try:
        async with client.stream("POST", url + path, json=body, timeout=600) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                text, used = _read(api, json.loads(line[6:]))
                if text and not first:
                    first = time.perf_counter() - start
                tokens = used if used is not None else tokens
    except httpx.HTTPError as exc:
        print(f"{url}{path}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 0, 0.0
    return tokens, first


async def load(url: str, api: str) -> dict[str, float]:
    import httpx

    queue = list(range(REQUESTS))
    results: list[tuple[int, float]] = []
    async with httpx.AsyncClient() as client:
        async def worker() -> None:
            while queue:
                results.append(await _stream(client, url, api, queue.pop()))

        start = time.perf_counter()
        await asyncio.gather(*[worker() for _ in range(CLIENTS)])
        wall = time.perf_counter() - start
    ok = [f for t, f in results if t]
    return {"tps": sum(t for t, _ in results) / wall, "ttft": statistics.median(ok) if ok else 0.0,
            "errors": len(results) - len(ok)}


def main() -> None:
    parser = common.base_parser(__doc__.splitlines()[0])
    parser.add_argument("--ref-cache-ram", type=int, default=None, metavar="MIB",
                        help="llama-server's --cache-ram (default: its own, 8192)")
    parser.add_argument("--replay", choices=("distinct", "shared"), default=None,
                        help="replay an agent's turns (_agent_replay.py) instead of the streaming load")
    parser.add_argument("--ours-args", default="", help="extra pyllama serve flags (e.g. '--cache-ram 0')")
    args = parser.parse_args()
    ref_extra = [] if args.ref_cache_ram is None else ["--cache-ram", str(args.ref_cache_ram)]
    if args.replay:
        return replay_main(args, ref_extra)
    bin_dir = common.llama_cpp_bin(args.llama_cpp_bin)
    model = args.model or common.bench_model("Q4_0")
    t, ports = str(args.threads), {"ref": common.free_port(), "ours": common.free_port()}
    cmds = {
        "ref": [str(bin_dir / "llama-server"), "-m", str(model), "--host", "127.0.0.1", "--port", str(ports["ref"]),
                "-c", "4096", "-t", t, "-np", "4", "--no-webui", *ref_extra],
        "ours": [*common.pyllama_cmd(), "serve", "-m", str(model), "--host", "127.0.0.1", "--port",
                 str(ports["ours"]), "-c", "4096", "-t", t, "--parallel", "4"],
    }
    apis = ("messages", "responses")
    runs: dict[str, dict[str, list[dict[str, float]]]] = {who: {api: [] for api in apis} for who in cmds}
    print(f"model {model.name}, threads {t}, {CLIENTS} clients x {REQUESTS} requests of {N_TOKENS} tokens, "
          f"{args.repeat} rounds of {LOADS_PER_ROUND} alternating loads", file=sys.stderr)
    for r in range(args.repeat):
        procs = {who: start_server(cmd, ports[who]) for who, cmd in cmds.items()}
        try:
            for k in range(LOADS_PER_ROUND):
                for api in apis:
                    for who in common.turn_order(r + k, tuple(cmds)):
                        runs[who][api].append(asyncio.run(load(f"http://127.0.0.1:{ports[who]}", api)))
        finally:
            for proc in procs.values():
                common.stop_server(proc)
        print(f"round {r + 1} done", file=sys.stderr)
    rows = []
    for api in apis:
        ref, ours = runs["ref"][api], runs["ours"][api]
        rows.append((f"{api}: gen tokens/s", common.median([x["tps"] for x in ref]),
                     common.median([x["tps"] for x in ours]), ">= 1.00"))
    common.print_ratio_table(rows, higher_is_better=True)
    for api in apis:
        ref, ours = runs["ref"][api], runs["ours"][api]
        paired = statistics.median(o["tps"] / f["tps"] for f, o in zip(ref, ours))
        print(f"{api}: median paired ratio {paired:.3f}; p50 time to first text llama-server "
              f"{common.median([x['ttft'] for x in ref]):.3f} s, pyllama {common.median([x['ttft'] for x in ours]):.3f} s; "
              f"failed requests llama-server {sum(x['errors'] for x in ref):.0f}, "
              f"pyllama {sum(x['errors'] for x in ours):.0f}")


def replay_main(args: Any, ref_extra: list[str]) -> None:
    import _agent_replay as agent_replay

    bin_dir = common.llama_cpp_bin(args.llama_cpp_bin)
    model = args.model or common.bench_model("Q4_0")
    t, port = str(args.threads), common.free_port()
    flags = ["-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c", "32768", "-t", t, "-np", "2"]
    cmds = {"ref": [str(bin_dir / "llama-server"), *flags, "--no-webui", *ref_extra],
            "ours": [*common.pyllama_cmd(), "serve", *flags, *args.ours_args.split()]}
    runs: dict[str, list[dict[str, float]]] = {who: [] for who in cmds}
    print(f"replay {args.replay}: model {model.name}, threads {t}, {args.repeat} rounds, load "
          f"{os.getloadavg()[0]:.2f}", file=sys.stderr)
    for r in range(args.repeat):
        for who in common.turn_order(r, tuple(cmds)):
            log = Path(tempfile.gettempdir()) / f"bench_agents_replay_{who}.log"
            with open(log, "wb") as sink:
                proc = subprocess.Popen(cmds[who], stdout=subprocess.DEVNULL, stderr=sink)
            try:
                common.wait_healthy(f"http://127.0.0.1:{port}", proc, name=who, see=f"; see {log}")
                runs[who].append(agent_replay.run(f"http://127.0.0.1:{port}", args.replay))
            except Exception:
                print(f"{who} failed; its log: {log}", file=sys.stderr)
                raise
            finally:
                common.stop_server(proc)
            print(f"round {r + 1} {who}: {runs[who][-1]}", file=sys.stderr)
    rows = [(name, common.median([x[key] for x in runs["ref"]]), common.median([x[key] for x in runs["ours"]]), target)
            for name, key, target in (("prompt tokens evaluated", "evaluated", "<= 1.00"), ("wall s", "wall", "<= 0.80"),
                                      ("median TTFT turns>=2 s", "ttft", "<= 0.80"))]
    common.print_ratio_table(rows, higher_is_better=False)
    floors = sorted({int(x["floor"]) for x in runs["ref"] + runs["ours"]})
    print(f"floor (tokens a server keeping every earlier prompt and answer must evaluate): "
          f"{', '.join(map(str, floors))}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
