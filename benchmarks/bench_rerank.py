"""Reranking throughput: `pyllama serve --rerank` vs `llama-server --rerank`, 100 documents a request.

A reranker of a realistic size (tests/fixtures/make_reranker.py's qwen3 layout with a two-label
head, as wide as bge-reranker-base: 768 wide, 6 layers, 32k vocabulary, F32; made once) is served
by each tool in turn on 127.0.0.1. Each round sends the same POST /v1/rerank (one query, 100
documents of 20 to 60 words) to both, in alternating order, and times the answers; the row compares
documents per second (target: pyllama >= 0.97 x llama-server). The two answers' order and scores
are compared too.

    python benchmarks/bench_rerank.py [--llama-cpp-bin DIR] [-t THREADS] [--repeat 5] [--documents 100]
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from _common import (
    BENCH_DIR,
    REPO_ROOT,
    base_parser,
    free_port,
    llama_cpp_bin,
    median,
    print_ratio_table,
    pyllama_cmd,
    stop_server,
    turn_order,
    wait_healthy,
)

WORDS = ("the river market town traders north south spring wool salt iron centuries city history people "
         "bridge road king church school water field harvest winter summer stone house family").split()


def bench_reranker() -> Path:
    from tests.fixtures.make_gguf import BENCH
    from tests.fixtures.make_reranker import RERANKER, write_reranker_gguf

    path = BENCH_DIR / "bench-reranker-F32.gguf"
    if not path.exists():
        print(f"writing the benchmark reranker to {path} (once)...", file=sys.stderr)
        spec = replace(RERANKER, n_vocab_pieces=BENCH.n_vocab_pieces, n_embd=768, n_layer=6, n_head=12,
                       n_head_kv=4, n_ff=2048, n_ctx_train=4096)
        write_reranker_gguf(path.with_suffix(".tmp"), spec).rename(path)
    return path


def documents(n: int) -> list[str]:
    rng = random.Random(7)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 60))) for _ in range(n)]


def start(cmd: list[str], name: str, port: int, log: Path) -> subprocess.Popen:
    with open(log, "wb") as sink:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=sink, cwd=REPO_ROOT)
    wait_healthy(f"http://127.0.0.1:{port}", proc, name=name, see=f" (see {log})")
    return proc


def main() -> None:
    import httpx

    p = base_parser(__doc__.splitlines()[0])
    p.set_defaults(repeat=5)
    p.add_argument("--documents", type=int, default=100)
    args = p.parse_args()
    model = str(args.model or bench_reranker())
    body = {"query": "the history of the market town on the river", "documents": documents(args.documents)}
    common = ["-m", model, "-c", "8192", "-t", str(args.threads), "--rerank", "--host", "127.0.0.1"]
    ports = {"ref": free_port(), "our": free_port()}
    commands = {"ref": [str(llama_cpp_bin(args.llama_cpp_bin) / "llama-server"), *common, "--port", str(ports["ref"])],
                "our": [*pyllama_cmd(), "serve", *common, "--port", str(ports["our"])]}
    rates: dict[str, list[float]] = {"ref": [], "our": []}
    answers: dict[str, dict] = {}
    for i in range(args.repeat):
        for who in turn_order(i, ("ref", "our")):
            proc = start(commands[who], who, ports[who], BENCH_DIR / f"bench-rerank-{who}.log")
            try:
                url = f"http://127.0.0.1:{ports[who]}/v1/rerank"
                httpx.post(url, json={**body, "documents": body["documents"][:2]}, timeout=600)  # warm-up
                started = time.perf_counter()
                answer = httpx.post(url, json=body, timeout=600)
                rates[who].append(args.documents / (time.perf_counter() - started))
                answers[who] = answer.json()
            finally:
                stop_server(proc)
    same = [r["index"] for r in answers["ref"]["results"]] == [r["index"] for r in answers["our"]["results"]]
    gap = max(abs(a["relevance_score"] - b["relevance_score"])
              for a, b in zip(answers["ref"]["results"], answers["our"]["results"]))
    print(f"runs (documents/s): llama-server {[round(x, 2) for x in rates['ref']]}  "
          f"pyllama {[round(x, 2) for x in rates['our']]}", file=sys.stderr)
    print(f"same order as llama-server: {same}; largest score difference {gap:.2e}", file=sys.stderr, flush=True)
    print_ratio_table([(f"rerank documents/s ({args.documents})", median(rates["ref"]), median(rates["our"]),
                        ">= 0.97")], higher_is_better=True)


if __name__ == "__main__":
    main()
