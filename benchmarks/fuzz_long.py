"""The long fuzz run: schemathesis against `pyllama serve`, hostile requests, and mutated GGUF headers.

The same checks as tests/test_reliability.py, with many more cases:

  * schema: every operation of the live server's /openapi.json, valid and invalid cases
    (--examples per operation and mode), against each server of SCHEMA_SERVERS (a generation
    server with -np 4, an --embeddings one, a router of three models with --models-max 2, whose
    generated `model` fields mostly name its models): no 5xx, every error in OpenAI's error shape,
    the server alive afterwards and no traceback in its log; a router never more models loaded than
    its limit. A route a server adds to its schema is fuzzed with no change here; a new way to start
    the server is one table entry;
  * hostile: the hand-written lists (nesting, 10 MB strings, bad UTF-8, bad numbers and ids,
    bad grammars and schemas, llama-server's /completion, /infill and /slots actions, Anthropic's
    /v1/messages (errors in its own shape), /v1/responses, /render's Markdown; on a router: unknown
    ids on every route, bad keep_alive, /models/*), each with the answer it must get;
  * probe: the classes of input an independent probe broke the server with (tests/fixtures/probe_inputs.py):
    a lone surrogate on every route, huge Responses metadata, huge JSON-schema enums, symlinked and
    cut-short slot files, a foreign Host header, and a router of models whose names need escaping in
    /metrics' labels (every line must parse as Prometheus' text format);
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

from tests.fixtures import fuzzing, probe_inputs
from tests.fixtures.make_gguf import TINY, write_llama_gguf


# Servers the schema part fuzzes: name -> (its models, each "generation", "embedding" or a router's id
# (a tiny model of its own), serve's flags). More than one model is router mode.
ROUTER_IDS = ("red", "green", "blue")
SCHEMA_SERVERS = {
    "generation": (("generation",), ("-np", "4")),
    "embeddings": (("embedding",), ("--embeddings",)),
    "router": (ROUTER_IDS, ("--models-max", "2")),
}
# Raw request heads and the status each must get (the server must answer /health after each).
LIMIT_CASES = {
    "64 KiB header": (b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * 65536 + b"\r\n\r\n", 431),
    "16 MiB header, unfinished": (b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * (16 << 20), 431),
    "1000 header fields": (b"GET /health HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(1000)) + b"\r\n",
                           431),
    "64 KiB URL": (b"GET /health?q=" + b"a" * 65536 + b" HTTP/1.1\r\nHost: localhost\r\n\r\n", 414),
    "1 MiB URL, unfinished": (b"GET /" + b"a" * (1 << 20), 414),
    "16 KiB key in a query": (b"POST /v1/chat/completions?api_key=" + b"k" * 16384 + b" HTTP/1.1\r\nHost: localhost\r\n"
                              b"Content-Length: 2\r\n\r\n{}", 414),
}


TRACEBACK = "Traceback (most recent call last)"


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


def serve_router(models: dict[str, Path], log: Path, *args: str) -> Any:
    """Router mode over ROUTER_IDS' models (`-m` each), with ARGS."""
    first, *others = (models[model_id] for model_id in ROUTER_IDS)
    return serve(first, log, *(arg for path in others for arg in ("-m", str(path))), *args)


def loaded_models(url: str) -> list[str]:
    import httpx

    cards = httpx.get(f"{url}/v1/models", timeout=10).json()["data"]
    return [card["id"] for card in cards if card.get("status", {}).get("value", "loaded") != "unloaded"]


def schema_part(models: dict[str, Path], kinds: tuple[str, ...], tmp: Path, examples: int, *args: str) -> list[str]:
    import httpx

    log = tmp / f"schema{'-'.join((*kinds, *args))}.log"
    router = len(kinds) > 1
    server = serve_router(models, log, *args) if router else serve(models[kinds[0]], log, *args)
    label = "schema" + (" router" if router else "") + (" " + " ".join(args) if args else "")
    try:
        start = time.perf_counter()
        report = fuzzing.schema_fuzz(server.url, examples, seed=None, model_ids=kinds if router else ())
        alive = httpx.get(f"{server.url}/health", timeout=10).status_code == 200
        loaded = loaded_models(server.url)
        routes = sorted(httpx.get(f"{server.url}/openapi.json", timeout=10).json()["paths"])
        print(f"{label}: routes {', '.join(routes)}")
        print(f"{label}: {report.cases} cases in {time.perf_counter() - start:.0f} s, statuses "
              f"{dict(sorted(report.statuses.items()))}, server alive: {alive}"
              + (f", loaded at the end: {', '.join(loaded) or 'none'}" if router else ""))
    finally:
        server.stop()
    problems = list(report.problems)
    if not alive:
        problems.append("schema: the server did not answer /health afterwards")
    if router and len(loaded) > 2:
        problems.append(f"schema: {len(loaded)} models loaded under --models-max 2: {loaded}")
    # The access log echoes request paths, and the fuzzer may send one with "Traceback" in it: what counts
    # is Python's own header line.
    if TRACEBACK in server.stderr:
        where = server.stderr.index(TRACEBACK)
        problems.append("schema: a traceback in the server log:\n" + server.stderr[where:where + 2000])
    return problems


def hostile_part(models: dict[str, Path], tmp: Path) -> list[str]:
    """The one-model list on a one-model server, the router's list on a router of ROUTER_IDS."""
    problems = []
    (tmp / "slots").mkdir(exist_ok=True)
    probe_inputs.plant_slot_files(tmp / "slots", tmp / "outside.txt")
    one = serve(models["generation"], tmp / "hostile.log", "-np", "4", "--slot-save-path", str(tmp / "slots"))
    try:
        problems += send_hostile(one.url, fuzzing.hostile_requests(), "hostile")
        problems += send_hostile(one.url, probe_inputs.probe_requests(), "probe")
        problems += foreign_host_problems(one.url)
    finally:
        one.stop()
    if (tmp / "outside.txt").read_text() != "must stay as it is":
        problems.append("probe: a save through a symlinked slot file overwrote its target")
    problems += labels_part(models, tmp)
    router = serve_router(models, tmp / "hostile-router.log", "--models-max", "2")
    try:
        problems += send_hostile(router.url, fuzzing.router_hostile_requests(ROUTER_IDS), "hostile router")
        loaded = loaded_models(router.url)
        if len(loaded) > 2:
            problems.append(f"hostile router: {len(loaded)} models loaded under --models-max 2: {loaded}")
    finally:
        router.stop()
    return problems


def foreign_host_problems(url: str) -> list[str]:
    import httpx

    reply = httpx.get(f"{url}/v1/models", headers={"Host": "evil.example"}, timeout=10)
    print(f"probe: Host evil.example on a loopback server: {reply.status_code}")
    return [] if reply.status_code == 403 else [f"probe: Host evil.example got {reply.status_code}, not 403"]


def labels_part(models: dict[str, Path], tmp: Path) -> list[str]:
    """A router of models named with a quote, a backslash and a newline: /metrics must still parse."""
    import httpx

    folder = tmp / "hostile-names"
    folder.mkdir(exist_ok=True)
    for name in probe_inputs.HOSTILE_MODEL_NAMES:
        (folder / f"{name}.gguf").write_bytes(models["generation"].read_bytes())
    router = serve(models["generation"], tmp / "labels.log", "--models-dir", str(folder))
    try:
        problems = ["probe " + p for p in probe_inputs.label_problems(httpx.get(f"{router.url}/metrics").text)]
    finally:
        router.stop()
    print(f"probe: /metrics of models named {probe_inputs.HOSTILE_MODEL_NAMES}: {len(problems)} problems")
    return problems


def send_hostile(url: str, cases: list[fuzzing.Hostile], label: str) -> list[str]:
    import httpx

    problems = []
    with httpx.Client(timeout=120) as client:
        for case in cases:
            reply = case.send(client, url)
            status = reply.status_code
            shape = fuzzing.error_shape_problem(status, reply.content, case.path) if status >= 400 else None
            # The message as written, not as JSON escapes it (an expected '"not"' is '\"not\"' there).
            said = reply.json()["error"]["message"] if status >= 400 and not shape else reply.text
            if reply.status_code != case.status or shape or case.expect not in said:
                problems.append(f"{label} {case.name}: {reply.status_code} {reply.text[:300]}")
        alive = client.get(f"{url}/health").status_code == 200
    print(f"{label}: {len(cases)} requests, {len(problems)} unexpected answers, server alive: {alive}")
    return problems if alive else [*problems, f"{label}: the server died"]


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
        models = {"generation": model,
                  "embedding": write_llama_gguf(tmp / "tiny-embed.gguf", replace(TINY, embedding_only=True)),
                  **{model_id: write_llama_gguf(tmp / f"{model_id}.gguf", replace(TINY, seed=i))
                     for i, model_id in enumerate(ROUTER_IDS, 1)}}
        os.environ.pop("PYLLAMA_API_KEY", None)
        problems: list[str] = []
        if "hostile" in parts:
            problems += hostile_part(models, tmp)
        if "limits" in parts:
            problems += limits_part(model, tmp)
        if "schema" in parts:
            for kinds, flags in SCHEMA_SERVERS.values():
                problems += schema_part(models, kinds, tmp, args.examples, *flags)
        if "gguf" in parts:
            problems += gguf_part(model, tmp, args.gguf_random, args.seed)
    for problem in problems[:50]:
        print(f"PROBLEM {problem}")
    print(f"{'FAIL' if problems else 'PASS'}: {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
