"""The long fuzz run: schemathesis against `pyllama serve`, hostile requests, and mutated GGUF headers.

The same checks as tests/test_reliability.py, with many more cases:

  * schema: every operation of the live server's /openapi.json, valid and invalid cases
    (--examples per operation and mode), against each server of SCHEMA_SERVERS (a generation
    server with -np 4, an --embeddings one): no 5xx, every error in OpenAI's error shape, the
    server alive afterwards and no traceback in its log. A route a server adds to its schema is
    fuzzed with no change here; a new way to start the server (a router) is one table entry;
  * hostile: the hand-written list (nesting, 10 MB strings, bad UTF-8, bad numbers and ids,
    bad grammars and schemas), each with the answer it must get;
  * limits: the raw-socket heads of LIMIT_CASES (huge headers, a huge URL, too many fields), each
    with the status it must get, then /health; one entry per case;
  * gguf: every targeted mutation of the tiny model's header plus --gguf-random blind ones, each
    given to `pyllama info` and `pyllama tokenize` in a forked child: a clean error or a result,
    never a signal or a hang; whatever makes llama.cpp itself crash must be refused by pyllama first.

Only 127.0.0.1 is used. Exit status 1 when anything is found.

    python benchmarks/fuzz_long.py [--examples 60] [--gguf-random 2000] [--seed 0]
                                   [--only schema|hostile|limits|gguf]
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import _common  # noqa: F401 - puts the repository on sys.path

from tests.fixtures import fuzzing
from tests.fixtures.make_gguf import TINY, write_llama_gguf


# Servers the schema part fuzzes: name -> (the model: "generation" or "embedding", serve's flags).
SCHEMA_SERVERS = {
    "generation": ("generation", ("-np", "4")),
    "embeddings": ("embedding", ("--embeddings",)),
}
# Raw request heads and the status each must get (the server must answer /health after each).
LIMIT_CASES = {
    "64 KiB header": (b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 65536 + b"\r\n\r\n", 431),
    "16 MiB header, unfinished": (b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (16 << 20), 431),
    "1000 header fields": (b"GET /health HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(1000)) + b"\r\n",
                           431),
    "64 KiB URL": (b"GET /health?q=" + b"a" * 65536 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
    "1 MiB URL, unfinished": (b"GET /" + b"a" * (1 << 20), 414),
    "16 KiB key in a query": (b"POST /v1/chat/completions?api_key=" + b"k" * 16384 + b" HTTP/1.1\r\nHost: x\r\n"
                              b"Content-Length: 2\r\n\r\n{}", 414),
}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--examples", type=int, default=60, help="schemathesis cases per operation and mode (60)")
    p.add_argument("--gguf-random", type=int, default=2000, help="blind GGUF header mutations (2000)")
    p.add_argument("--seed", type=int, default=0, help="seed of the GGUF mutations (schema cases are random)")
    p.add_argument("--only", choices=("schema", "hostile", "limits", "gguf"), action="append",
                   help="run only these parts")
    return p.parse_args()


def serve(model: Path, log: Path, *args: str) -> Any:
    """A `pyllama serve -np 4` (or with ARGS) on 127.0.0.1 (tests/test_serve.py's starter)."""
    from tests.test_serve import _start

    return _start(model, log, *(args or ("-np", "4")))


def schema_part(model: Path, tmp: Path, examples: int, *args: str) -> list[str]:
    import httpx

    server = serve(model, tmp / f"schema{'-'.join(args)}.log", *args)
    try:
        start = time.perf_counter()
        report = fuzzing.schema_fuzz(server.url, examples, seed=None)
        alive = httpx.get(f"{server.url}/health", timeout=10).status_code == 200
        routes = sorted(httpx.get(f"{server.url}/openapi.json", timeout=10).json()["paths"])
        print(f"schema{' ' + ' '.join(args) if args else ''}: routes {', '.join(routes)}")
        print(f"schema{' ' + ' '.join(args) if args else ''}: {report.cases} cases in "
              f"{time.perf_counter() - start:.0f} s, statuses {dict(sorted(report.statuses.items()))}, "
              f"server alive: {alive}")
    finally:
        server.stop()
    problems = list(report.problems)
    if not alive:
        problems.append("schema: the server did not answer /health afterwards")
    if "Traceback" in server.stderr:
        where = server.stderr.index("Traceback")
        problems.append("schema: a traceback in the server log:\n" + server.stderr[where:where + 2000])
    return problems


def hostile_part(model: Path, tmp: Path) -> list[str]:
    import httpx

    server = serve(model, tmp / "hostile.log")
    problems = []
    try:
        with httpx.Client(timeout=120) as client:
            for case in fuzzing.hostile_requests():
                reply = case.send(client, server.url)
                status = reply.status_code
                shape = fuzzing.error_shape_problem(status, reply.content) if status >= 400 else None
                # The message as written, not as JSON escapes it (an expected '"not"' is '\"not\"' there).
                said = reply.json()["error"]["message"] if status >= 400 and not shape else reply.text
                if reply.status_code != case.status or shape or case.expect not in said:
                    problems.append(f"hostile {case.name}: {reply.status_code} {reply.text[:300]}")
            alive = client.get(f"{server.url}/health").status_code == 200
        print(f"hostile: {len(fuzzing.hostile_requests())} requests, {len(problems)} unexpected answers, "
              f"server alive: {alive}")
    finally:
        server.stop()
    return problems if alive else [*problems, "hostile: the server died"]


def limits_part(model: Path, tmp: Path) -> list[str]:
    import httpx

    server = serve(model, tmp / "limits.log")
    host, port = server.url.removeprefix("http://").split(":")
    problems = []
    try:
        for name, (head, status) in LIMIT_CASES.items():
            with socket.create_connection((host, int(port)), timeout=30) as sock:
                try:
                    sock.sendall(head)
                except OSError:  # refused before all of it was sent: the answer is still there to read
                    pass
                answer = b""
                while chunk := sock.recv(65536):
                    answer += chunk
            got = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else None
            body = answer.partition(b"\r\n\r\n")[2]
            shape = fuzzing.error_shape_problem(got or 0, body) if got else "no answer"
            if got != status or shape:
                problems.append(f"limits {name}: {got} {shape or ''} {answer[:200]!r}")
            if httpx.get(f"{server.url}/health", timeout=10).status_code != 200:
                problems.append(f"limits {name}: /health did not answer 200 afterwards")
        print(f"limits: {len(LIMIT_CASES)} raw heads, {len(problems)} unexpected answers")
    finally:
        server.stop()
    return problems


def gguf_part(model: Path, tmp: Path, n_random: int, seed: int) -> list[str]:
    base = fuzzing.GGUFImage.read(model)
    fuzzing.warm_up(model)
    cases = fuzzing.gguf_cases(base, n_random, seed)
    start, problems, crashers = time.perf_counter(), [], []
    for i, case in enumerate(cases, 1):
        verdict = fuzzing.check_gguf_case(case, base, tmp / "fuzz.gguf")
        if verdict.problem:
            problems.append(f"gguf {case.name}: {verdict.problem}")
        if verdict.llama_crashes:
            crashers.append(case.name)
        if i % 500 == 0:
            print(f"  gguf: {i}/{len(cases)} cases, {len(problems)} problems", file=sys.stderr)
    print(f"gguf: {len(cases)} cases in {time.perf_counter() - start:.0f} s, {len(problems)} problems; "
          f"{len(crashers)} of them crash llama.cpp when it loads them unchecked"
          + (f" ({', '.join(crashers[:12])}{', ...' if len(crashers) > 12 else ''})" if crashers else ""))
    return problems


def main() -> int:
    args = parse_args()
    parts = args.only or ["hostile", "limits", "schema", "gguf"]
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        model = write_llama_gguf(tmp / "tiny.gguf", TINY)
        os.environ.pop("PYLLAMA_API_KEY", None)
        problems: list[str] = []
        if "hostile" in parts:
            problems += hostile_part(model, tmp)
        if "limits" in parts:
            problems += limits_part(model, tmp)
        if "schema" in parts:
            models = {"generation": model,
                      "embedding": write_llama_gguf(tmp / "tiny-embed.gguf", replace(TINY, embedding_only=True))}
            for kind, flags in SCHEMA_SERVERS.values():
                problems += schema_part(models[kind], tmp, args.examples, *flags)
        if "gguf" in parts:
            problems += gguf_part(model, tmp, args.gguf_random, args.seed)
    for problem in problems[:50]:
        print(f"PROBLEM {problem}")
    print(f"{'FAIL' if problems else 'PASS'}: {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
