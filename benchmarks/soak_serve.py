"""Soak `pyllama serve --parallel 4`: 16 streaming clients for 5 minutes, 10% of them hanging up mid-stream.

With --router, the server is in router mode over three models (tiny ones of different depths, made
once) with --models-max 2, and each client's requests rotate over the three, so that models load and
unload throughout; GET /v1/models is polled during the run, and no more than --models-max models may
ever be loaded at once. With --rpc, every layer runs on one local `pyllama rpc-server` (-ngl 99),
which is killed (SIGKILL) half way through (--kill-rpc-at; 0: never). From then on the model cannot
run: the streams in flight must end with an error event and later requests get 503, none may hang,
/health must answer 503 naming the dead server, and SIGTERM must still stop the server with 0 (these
checks replace the others: memory and idle slots do not apply to a server whose model died under it;
a dropped stream read on after the kill must end with its last event or an error event too).

A bounded load (127.0.0.1 only, at most --max-requests requests, at most --duration seconds):
each client sends streaming requests (ROUTES: chat, text completions, llama-server's /completion and
/infill, Anthropic's /v1/messages, OpenAI's /v1/responses) one after another; a request drawn with
probability --disconnect-rate reads a few events and closes the connection. Two routes resume instead of
giving up (docs/streams.md): `resumable` is chat with X-Conversation-Id, read on from the byte where it
was dropped (GET /v1/stream?conv_id=ID&from=N); `background` is a Responses request with background: true,
read on after the last sequence number seen (GET /v1/responses/ID?stream=true&starting_after=N). Checked
at the end:

  * zero failed requests among those that stayed (HTTP 200, no error event, ends with its route's last event);
  * zero lost answers: every dropped resumable or background stream, resumed, ends with its last event,
    and nothing is lost or read twice: a resumable stream's bytes, before the drop and after it, are the
    session's whole stream (GET /v1/stream from=0), and a background response's sequence numbers run
    0, 1, 2, ... across the drop;
  * the server's resident memory at the end within 10% of its value after the first minute (the prompt
    cache gets --cache-ram 16 MiB, full by then; every other store is bounded by count and bytes);
  * no slot busy and no request queued once the load has stopped (router: on each loaded model);
  * router: never more than --models-max models loaded at once (polled every 0.2 s);
  * SIGTERM then stops the server with exit status 0 within 5 s.

Printed: requests (completed, disconnected, failed), RSS after 1 min and at the end, p50/p95
latency of whole requests and of the first token, slots busy after. Exit status 1 if a check fails.

The routes the clients draw from are the ROUTES table: a route is one entry (its path, its streaming
body, and the event that ends a good stream), chosen with --routes.

    python benchmarks/soak_serve.py [-m MODEL.gguf] [--duration 300] [--clients 16] [--max-requests 50000]
                                    [--routes chat,completions] [--router [--models-max 2]] [--rpc [--kill-rpc-at 0.5]]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _common as common
from _common import REPO_ROOT

ROUTER_MODELS = {"red": 2, "green": 3, "blue": 4}  # router mode's models: id -> layers of a tiny model

PROMPTS = ["hello", "Tell me a story about a cat.", "What is the capital of France?", "Write a poem about the sea",
           "Explain how a bicycle works, step by step.", "the quick brown fox jumps over the lazy dog " * 8]


@dataclass(frozen=True)
class Route:
    """A streaming route under soak: where, the body for a prompt and max_tokens, the lines that end it well."""

    path: str
    body: Callable[[str, int], dict[str, Any]]
    done: tuple[str, ...] = ("data: [DONE]",)
    resume: str | None = None  # "stream": X-Conversation-Id and /v1/stream; "background": a background response


RESPONSES_DONE = ("event: response.completed", "event: response.incomplete")
# One entry per route. An error event (a `data:` object with "error", or `event: error`) is a failure.
ROUTES = {
    "chat": Route("/v1/chat/completions", lambda prompt, n: {
        "messages": [{"role": "user", "content": prompt}], "max_tokens": n, "stream_options": {"include_usage": True}}),
    "completions": Route("/v1/completions", lambda prompt, n: {
        "prompt": prompt, "max_tokens": n, "stream_options": {"include_usage": True}}),
    # llama-server's native API: the last event has "stop": true and the counts; the model has FIM tokens.
    "native": Route("/completion", lambda prompt, n: {"prompt": prompt, "n_predict": n}),
    "infill": Route("/infill", lambda prompt, n: {
        "input_prefix": f"def tell(): # {prompt}\n    ", "input_suffix": "\n    return", "n_predict": n}),
    # Anthropic's Messages API and OpenAI's Responses API: named events, the last one says it finished
    # (Responses: response.incomplete when max_output_tokens cut it, as OpenAI's does).
    "messages": Route("/v1/messages", lambda prompt, n: {
        "messages": [{"role": "user", "content": prompt}], "max_tokens": n}, done=("event: message_stop",)),
    "responses": Route("/v1/responses", lambda prompt, n: {
        "input": prompt, "max_output_tokens": n}, done=RESPONSES_DONE),
    # Streams that survive their client: a dropped one is read on where it stopped, never lost.
    "resumable": Route("/v1/chat/completions", lambda prompt, n: {
        "messages": [{"role": "user", "content": prompt}], "max_tokens": n,
        "stream_options": {"include_usage": True}}, resume="stream"),
    "background": Route("/v1/responses", lambda prompt, n: {
        "input": prompt, "max_output_tokens": n, "background": True}, done=RESPONSES_DONE,
        resume="background"),
}
FAILED_EVENTS = ("event: error", "event: response.failed")


@dataclass
class Tally:
    completed: int = 0
    disconnected: int = 0
    resumed: int = 0  # dropped resumable or background streams read on to their end
    lost: list[str] = field(default_factory=list)  # ... that could not be
    failures: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    tokens: int = 0
    cut: int = 0  # --rpc with a kill: streams that ended with an error event once the rpc-server was dead
    refused: int = 0  # ... and requests answered 503 then
    by_route: dict[str, int] = field(default_factory=dict)  # completed requests per route

    @property
    def sent(self) -> int:
        return self.completed + self.disconnected + len(self.failures) + len(self.lost) + self.cut + self.refused

    def count(self, name: str, read: Read, start: float) -> None:
        """Counts one request by how its stream (and its resumption, if it was dropped) ended."""
        if read.cut:
            self.cut += 1
        elif read.resumed and (read.failure or not read.done):
            self.lost.append(read.failure or "the resumed stream ended without its last event")
        elif read.failure:
            self.failures.append(read.failure)
        elif read.hung_up:
            self.disconnected += 1
        elif not read.done:
            self.failures.append("the stream ended without its route's last event")
        else:
            self.resumed += read.resumed  # a dropped answer read to its end counts as completed
            self.add_completed(name, read, start)

    def add_completed(self, name: str, read: Read, start: float) -> None:
        self.completed += 1
        self.by_route[name] = self.by_route.get(name, 0) + 1
        self.latencies.append(time.perf_counter() - start)
        self.ttfts.append((read.first or time.perf_counter()) - start)
        usage = read.usage
        self.tokens += (usage.get("completion_tokens") or usage.get("output_tokens") or 0) if usage else 0


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-m", "--model", type=Path, default=None, help="GGUF to serve (default: the tiny test model)")
    p.add_argument("--duration", type=float, default=300, help="seconds of load (default 300)")
    p.add_argument("--clients", type=int, default=16, help="concurrent streaming clients (default 16)")
    p.add_argument("--parallel", type=int, default=4, help="server slots, -np (default 4)")
    p.add_argument("--max-requests", type=int, default=50000, help="stop after this many requests (default 50000)")
    p.add_argument("--disconnect-rate", type=float, default=0.10, help="share of requests that hang up (0.10)")
    p.add_argument("--max-tokens", type=int, default=96, help="largest max_tokens a request asks for (96)")
    p.add_argument("-c", "--ctx-size", type=int, default=4096, help="server context, shared by the slots (4096)")
    p.add_argument("--cache-ram", type=int, default=16,
                   help="server prompt cache, MiB (16: full within the first minute, so that RSS growth after it "
                        "is a leak; llama-server's 8192 would grow by design through the whole run)")
    p.add_argument("-t", "--threads", type=int, default=1, help="server threads (default 1: the clients need a core)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--routes", default=",".join(ROUTES), help=f"routes to draw from ({','.join(ROUTES)})")
    p.add_argument("--router", action="store_true", help="router mode: requests rotate over three models")
    p.add_argument("--models-max", type=int, default=2, help="router mode's --models-max (default 2)")
    p.add_argument("--rpc", action="store_true",
                   help="offload every layer (-ngl 99) to one local `pyllama rpc-server` (its own process)")
    p.add_argument("--kill-rpc-at", type=float, default=0.5,
                   help="with --rpc: kill the rpc-server (SIGKILL) at this fraction of --duration (0.5; 0 = never)")
    args = p.parse_args()
    if args.router and args.model:
        p.error("--router makes its own three models; leave out -m")
    args.model_ids = tuple(ROUTER_MODELS) if args.router else ()
    args.kill_at = args.duration * args.kill_rpc_at if args.rpc and args.kill_rpc_at > 0 else None
    args.killed = False  # set just before the kill: an error event may follow at once
    args.routes = [name.strip() for name in args.routes.split(",")]
    unknown = [name for name in args.routes if name not in ROUTES]
    if unknown:
        p.error(f"unknown route(s) {', '.join(unknown)}; known: {', '.join(ROUTES)}")
    return args


def tiny_model() -> Path:
    """The tiny test model, with fill-in-the-middle tokens for /infill."""
    from dataclasses import replace

    from tests.fixtures.make_gguf import TINY, write_llama_gguf

    path = Path(tempfile.gettempdir()) / "pyllama-soak-tiny-fim.gguf"
    if not path.exists():
        write_llama_gguf(path.with_suffix(".tmp"), replace(TINY, fim=True)).rename(path)
    return path


def router_models() -> list[Path]:
    """The router's three models: the tiny model's shape with 2, 3 and 4 layers (FIM tokens too), each its own
    weights."""
    from dataclasses import replace

    from tests.fixtures.make_gguf import TINY, write_llama_gguf

    paths = []
    for seed, (model_id, layers) in enumerate(ROUTER_MODELS.items(), 1):
        path = Path(tempfile.gettempdir()) / "pyllama-soak-router-fim" / f"{model_id}.gguf"
        if not path.exists():
            path.parent.mkdir(exist_ok=True)
            spec = replace(TINY, seed=seed, n_layer=layers, fim=True)
            write_llama_gguf(path.with_suffix(".tmp"), spec).rename(path)
        paths.append(path)
    return paths


def start_rpc_server() -> tuple[subprocess.Popen, str]:
    """One `pyllama rpc-server` on a free loopback port, once it accepts connections."""
    port = common.free_port()
    return common.start_rpc_server([sys.executable, "-m", "pyllama_cli", "rpc-server", "-t", "1"], port, 60), \
        f"127.0.0.1:{port}"


def start_server(args: argparse.Namespace, models: list[Path], log: Path) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "pyllama_cli", "serve", *(a for m in models for a in ("-m", str(m))),
           "--host", "127.0.0.1", "--port", "0",
           "-np", str(args.parallel), "-c", str(args.ctx_size), "-t", str(args.threads),
           "--cache-ram", str(args.cache_ram)]
    if args.router:
        cmd += ["--models-max", str(args.models_max)]
    if args.rpc_address:
        cmd += ["--rpc", args.rpc_address, "-ngl", "99"]
    env = {k: v for k, v in os.environ.items() if k != "PYLLAMA_API_KEY"}
    with open(log, "wb") as sink:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=sink, cwd=REPO_ROOT, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        found = re.search(r"listening on (http://127\.0\.0\.1:\d+)", text)
        if found and "ready at" in text:
            return proc, found.group(1)
        if proc.poll() is not None:
            sys.exit(f"the server exited with {proc.returncode}:\n{text}")
        time.sleep(0.1)
    proc.kill()
    sys.exit("the server did not become ready in 120 s")


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


async def one_request(client, url: str, rng: random.Random, tally: Tally, args: argparse.Namespace,
                      model: str | None = None) -> None:
    name = rng.choice(args.routes)
    route = ROUTES[name]
    body = {**route.body(rng.choice(PROMPTS), rng.randint(8, args.max_tokens)), "stream": True,
            "seed": rng.randrange(1 << 30), **({"model": model} if model else {})}
    conversation = f"soak-{rng.randrange(1 << 60):x}"
    headers = {"X-Conversation-Id": conversation} if route.resume == "stream" else {}
    read = Read(hang_up_after=rng.randint(1, 8) if rng.random() < args.disconnect_rate else None)
    timeout = 30 if args.kill_at else 120  # with a kill, a stream the dead model leaves hanging must show up
    start = time.perf_counter()
    try:
        async with client.stream("POST", url + route.path, json=body, headers=headers, timeout=timeout) as resp:
            if resp.status_code != 200:
                return await turned_away(resp, tally, args, tally.failures, "")
            await read.lines(resp, route, args)
        if read.hung_up and route.resume and not read.failure:  # read on where it stopped: not to be lost
            read.hang_up_after, read.hung_up, read.resumed = None, False, True
            async with client.stream("GET", url + resume_path(route, conversation, read), timeout=timeout) as resp:
                if resp.status_code != 200:
                    return await turned_away(resp, tally, args, tally.lost, "resume: ")
                await read.lines(resp, route, args)
            if route.resume == "stream" and read.done and not read.failure:
                await read.same_as_replay(client, f"{url}/v1/stream?conv_id={conversation}&from=0")
    except Exception as exc:  # noqa: BLE001 - every way a request can fail is a failure to count
        tally.failures.append(f"{type(exc).__name__}: {exc}")
        return
    tally.count(name, read, start)


def resume_path(route: Route, conversation: str, read: Read) -> str:
    """Where a dropped stream reads on: the conversation's byte offset, or the response's sequence number."""
    if route.resume == "stream":
        return f"/v1/stream?conv_id={conversation}&from={read.offset}"
    return f"/v1/responses/{read.response_id}?stream=true&starting_after={read.sequence}"


async def turned_away(resp: Any, tally: Tally, args: argparse.Namespace, into: list[str], what: str) -> None:
    """A request answered with an HTTP error: once the rpc-server is dead, 503 is the right answer."""
    if resp.status_code == 503 and args.killed:
        tally.refused += 1
        await asyncio.sleep(0.05)  # a refusal is instant: don't spin the client loop
        return
    into.append(f"{what}HTTP {resp.status_code}: {(await resp.aread())[:200]!r}")


@dataclass
class Read:
    """What one request's stream said so far (across a drop and its resumption)."""

    hang_up_after: int | None
    events: int = 0
    first: float | None = None
    done: bool = False
    hung_up: bool = False
    resumed: bool = False  # dropped, and read on from where it stopped
    failure: str | None = None
    usage: dict[str, Any] | None = None
    offset: int = 0  # bytes of whole lines read: where /v1/stream reads on
    raw: bytearray = field(default_factory=bytearray)  # those bytes, to compare with the session's replay
    sequence: int = -1  # the last sequence_number seen: where a background response reads on
    response_id: str = ""
    cut: bool = False  # ended by an error event once the rpc-server was killed: the right end then

    async def lines(self, resp: Any, route: Route, args: argparse.Namespace) -> None:
        await self.read_lines(resp, route)
        self.cut = self.cut or (self.failure is not None and args.killed)

    async def same_as_replay(self, client: Any, replay_url: str) -> None:
        """A resumed stream lost nothing and read nothing twice: its bytes are the session's from byte 0."""
        whole = (await client.get(replay_url, timeout=30)).content
        if whole != self.raw:
            self.failure = f"the resumed bytes ({len(self.raw)}) differ from the session's replay ({len(whole)})"

    async def read_lines(self, resp: Any, route: Route) -> None:
        async for raw_line in sse_lines(resp):
            self.offset += len(raw_line)
            self.raw += raw_line if route.resume == "stream" else b""
            line = raw_line.removesuffix(b"\n").decode()
            if line in route.done:
                self.done = True  # read on: the data of a named last event follows it
                continue
            if line in FAILED_EVENTS:
                self.failure = f"an error event ({line})"
                return
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            if "error" in data:
                self.failure = f"error event: {data['error']}"
                return
            self.events += 1
            self.first = self.first or time.perf_counter()
            if data.get("sequence_number", self.sequence + 1) != self.sequence + 1:
                self.failure = f"sequence_number {data['sequence_number']} after {self.sequence}: lost or twice"
                return
            self.sequence = data.get("sequence_number", self.sequence)
            self.response_id = (data.get("response") or {}).get("id") or self.response_id
            self.usage = data.get("usage") or (data.get("response") or {}).get("usage") or self.usage
            if data.get("stop") is True:  # llama-server's native last event
                self.usage = {"completion_tokens": data.get("tokens_predicted", 0)}
            if self.hang_up_after is not None and self.events >= self.hang_up_after:
                self.hung_up = True
                return  # leaving the block closes the connection mid-stream


async def sse_lines(resp: Any) -> AsyncIterator[bytes]:
    """The stream's lines, each with its b"\n": SSE ends lines there, while httpx's aiter_lines also splits
    at characters such as U+2028 that JSON leaves raw in a model's text (and the byte offsets would drift)."""
    pending = b""
    async for chunk in resp.aiter_bytes():
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield line + b"\n"
    if pending:
        yield pending  # a last line cut short


async def load(url: str, args: argparse.Namespace, tally: Tally, pid: int, rss: dict[str, float],
               seen: dict[str, int]) -> float:
    import httpx

    deadline = time.monotonic() + args.duration
    budget = [args.max_requests]

    async def client_loop(i: int) -> None:
        rng = random.Random(args.seed * 1000 + i)
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        async with httpx.AsyncClient(limits=limits) as client:
            n = i  # router mode: each client takes the models in turn, starting at its own
            while time.monotonic() < deadline and budget[0] > 0:
                budget[0] -= 1
                model = args.model_ids[n % len(args.model_ids)] if args.model_ids else None
                n += 1
                await one_request(client, url, rng, tally, args, model)

    async def poll_models() -> None:
        """Router mode: the most models loaded, and loading or loaded, at any one poll of GET /v1/models.

        "loading" includes a load still waiting for room (for a loaded model to become idle and unload),
        so loading-or-loaded may exceed the limit while loaded may not."""
        async with httpx.AsyncClient() as client:
            while True:
                cards = (await client.get(url + "/v1/models", timeout=30)).json()["data"]
                states = [card["status"]["value"] for card in cards]
                seen["polls"] += 1
                seen["max_loaded"] = max(seen["max_loaded"], states.count("loaded"))
                seen["max_held"] = max(seen["max_held"], states.count("loaded") + states.count("loading"))
                await asyncio.sleep(0.2)

    async def sample_rss() -> None:
        start, first = time.monotonic(), min(60.0, args.duration / 2)  # short trial runs sample at half time
        while True:
            await asyncio.sleep(1)
            if "1min" not in rss and time.monotonic() - start >= first:
                rss["1min"], rss["first_s"] = rss_mib(pid), first
                print(f"  after {first:.0f} s: {tally.sent} requests, RSS {rss['1min']:.1f} MiB", file=sys.stderr)

    async def kill_rpc() -> None:
        await asyncio.sleep(args.kill_at)
        args.killed = True  # before the kill: the first error event may follow at once
        args.rpc_proc.kill()
        print(f"  after {args.kill_at:.0f} s: killed the rpc-server (SIGKILL), {tally.sent} requests so far",
              file=sys.stderr)

    started = time.monotonic()
    watchers = [asyncio.create_task(sample_rss())] + ([asyncio.create_task(kill_rpc())] if args.kill_at else [])
    watchers += [asyncio.create_task(poll_models())] if args.router else []
    await asyncio.gather(*(client_loop(i) for i in range(args.clients)))
    for watcher in watchers:
        watcher.cancel()
    return time.monotonic() - started


def idle_after(url: str, timeout: float = 5.0) -> tuple[int, int]:
    """Slots still busy and requests still queued (summed over the loaded models: /metrics has them all,
    and reading it loads none), polled until both are zero or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while True:
        busy = int(metric_sum(url, r'pyllama_slots\{(?:[^}]*,)?state="(?:prefill|generating)"\}'))
        queued = int(metric_sum(url, r"pyllama_queue_depth(?:\{[^}]*\})?"))
        if (busy == 0 and queued == 0) or time.monotonic() > deadline:
            return busy, queued
        time.sleep(0.2)


def dead_server_health(url: str, endpoint: str) -> str:
    """What /health says once the rpc-server is dead: "503 naming it" when it does what it must."""
    import httpx

    try:
        reply = httpx.get(url + "/health", timeout=10)
    except httpx.HTTPError as exc:
        return f"no answer: {type(exc).__name__}"
    named = f"RPC server {endpoint} is gone" in reply.text
    return "503 naming it" if reply.status_code == 503 and named else f"{reply.status_code} {reply.text[:200]}"


def metric_sum(url: str, series: str) -> float:
    """The sum of the /metrics samples whose name and labels match the regular expression `series`."""
    import httpx

    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(float(m.group(1)) for m in re.finditer(rf"^{series} (\S+)$", text, re.MULTILINE))


def model_loads(url: str) -> dict[str, int]:
    """Router mode: how many times each model was loaded (from /metrics)."""
    import httpx

    text = httpx.get(url + "/metrics", timeout=10).text
    return {m.group(1): int(float(m.group(2))) for m in
            re.finditer(r'^pyllama_model_loads_total\{model="([^"]+)"\} (\S+)$', text, re.MULTILINE)}


def stop(proc: subprocess.Popen) -> tuple[int, float]:
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
    return code, time.monotonic() - start


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def usual_checks(tally: Tally, growth: float, busy: int, queued: int) -> dict[str, bool]:
    return {
        "zero failed requests": not tally.failures,
        "zero lost answers (dropped resumable/background streams resumed to their end)": not tally.lost,
        "RSS at the end within 10% of 1 min": abs(growth) <= 0.10,
        "no slot busy, no request queued after the load": busy == 0 and queued == 0,
    }


def kill_checks(tally: Tally, health: str | None) -> dict[str, bool]:
    """After the rpc-server's kill: no request hangs or ends silently, and the server says what died."""
    return {
        "0 hangs; every stream ends with a finish or an error event": not tally.failures and not tally.lost,
        f"/health answers 503 naming the dead rpc-server ({health})": health == "503 naming it",
    }


def main() -> int:
    args = parse_args()
    models = router_models() if args.router else [args.model or tiny_model()]
    rpc, args.rpc_address = start_rpc_server() if args.rpc else (None, None)
    args.rpc_proc = rpc
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "serve.log"
        try:
            proc, url = start_server(args, models, log)
        except BaseException:
            if rpc is not None:
                rpc.kill()
            raise
        print(f"soak: {args.clients} streaming clients, {args.duration:.0f} s or {args.max_requests} requests, "
              f"{args.disconnect_rate:.0%} hang up, against {url} -np {args.parallel}, routes "
              f"{', '.join(args.routes)}" + (f"; router over {', '.join(args.model_ids)} with --models-max "
                                            f"{args.models_max}" if args.router else "")
              + (f"; every layer on the rpc-server at {args.rpc_address}" if args.rpc else ""), file=sys.stderr)
        tally, rss, seen, loads = Tally(), {}, {"polls": 0, "max_loaded": 0, "max_held": 0}, {}
        rss["start"] = rss_mib(proc.pid)
        try:
            wall = asyncio.run(load(url, args, tally, proc.pid, rss, seen))
            rss.setdefault("1min", float("nan"))
            try:
                busy, queued = idle_after(url)
                loads = model_loads(url) if args.router else {}
            except Exception as exc:  # noqa: BLE001 - a server that no longer answers is a finding, not a crash
                tally.failures.append(f"after the load, /metrics did not answer: {type(exc).__name__}: {exc}")
                busy, queued = -1, -1
            rss["end"] = rss_mib(proc.pid)
            health = dead_server_health(url, args.rpc_address) if args.killed else None
        finally:
            code, stop_s = stop(proc)
            rpc_alive = rpc is None or rpc.poll() is None
            if rpc is not None:
                stop(rpc)
        log_text = log.read_text(errors="replace")
    growth = (rss["end"] - rss["1min"]) / rss["1min"] if rss["1min"] == rss["1min"] else float("nan")
    checks = {
        **(kill_checks(tally, health) if args.killed else usual_checks(tally, growth, busy, queued)),
        **({f"never more than --models-max {args.models_max} models loaded ({seen['polls']} polls)":
            0 < seen["max_loaded"] <= args.models_max} if args.router else {}),
        "SIGTERM: exit 0 within 5 s": code == 0 and stop_s <= 5,
        "no traceback in the server log": "Traceback" not in log_text,
        **({"the rpc-server still up after the run": rpc_alive} if args.rpc and not args.killed else {}),
    }
    summary = {
        "duration_s": round(wall, 1), "requests": tally.sent, "completed": tally.completed,
        "disconnected": tally.disconnected, "resumed": tally.resumed, "lost": len(tally.lost),
        "failed": len(tally.failures), "tokens": tally.tokens,
        **({"cut_by_the_kill": tally.cut, "refused_after_the_kill": tally.refused} if args.killed else {}),
        "completed_by_route": tally.by_route,
        "rss_start_mib": round(rss["start"], 1), "rss_1min_mib": round(rss["1min"], 1), "rss_end_mib": round(rss["end"], 1),
        "rss_growth_pct": round(growth * 100, 2), "latency_p50_s": round(pct(tally.latencies, 50), 3),
        "latency_p95_s": round(pct(tally.latencies, 95), 3), "ttft_p50_s": round(pct(tally.ttfts, 50), 3),
        "ttft_p95_s": round(pct(tally.ttfts, 95), 3), "slots_busy_after": busy, "queued_after": queued,
        "exit_code": code, "stop_s": round(stop_s, 2),
        **({"models_max": args.models_max, "max_models_loaded": seen["max_loaded"],
            "max_models_loading_or_loaded": seen["max_held"], "model_polls": seen["polls"], "model_loads": loads}
           if args.router else {}),
    }
    print(f"requests      {tally.sent} in {wall:.0f} s: {tally.completed} completed, {tally.disconnected} hung up "
          f"mid-stream, {tally.resumed} dropped and resumed, {len(tally.lost)} lost, {len(tally.failures)} failed "
          f"({tally.tokens} tokens streamed)"
          + (f"; after the rpc-server's kill {tally.cut} streams ended with an error event, {tally.refused} "
             "requests got 503" if args.killed else ""))
    print("by route      " + ", ".join(f"{name} {n}" for name, n in sorted(tally.by_route.items())) + " completed")
    print(f"memory (RSS)  {rss['start']:.1f} MiB at the start, {rss['1min']:.1f} MiB after {rss.get('first_s', 60):.0f} s, {rss['end']:.1f} MiB at the end "
          f"({growth:+.1%})")
    print(f"latency       p50 {summary['latency_p50_s']} s, p95 {summary['latency_p95_s']} s "
          f"(first token p50 {summary['ttft_p50_s']} s, p95 {summary['ttft_p95_s']} s)")
    if args.router:
        print(f"models        at most {seen['max_loaded']} loaded, {seen['max_held']} loading or loaded at once "
              f"(--models-max {args.models_max}, {seen['polls']} polls of /v1/models); loads: "
              + ", ".join(f"{m} {n}" for m, n in loads.items()))
    print(f"after load    {busy} slots busy, {queued} queued; SIGTERM -> exit {code} in {stop_s:.2f} s")
    for failure in tally.failures[:10]:
        print(f"  failure: {failure}")
    for lost in tally.lost[:10]:
        print(f"  lost: {lost}")
    if "Traceback" in log_text:
        print("  server log: " + log_text[log_text.index("Traceback"):][:3000])
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    print(json.dumps(summary))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
