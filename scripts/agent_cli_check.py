"""Claude Code, installed from npm, runs three `-p` turns against `pyllama serve`, cache on and off.

    npm i --prefix /tmp/cc @anthropic-ai/claude-code
    python scripts/agent_cli_check.py --claude /tmp/cc/node_modules/.bin/claude [-m MODEL.gguf] [-c 16384] [--tools ""]

For each mode (the default --cache-ram, then --cache-ram 0) a fresh server starts; Claude Code runs
one `claude -p` turn, then two more with `--continue`, in a scratch folder with a scratch HOME (no
login, telemetry and update checks off), the server with a fixed seed (and its end token favoured, so the
random test model's answers stay short), so both modes sample the same conversation. Between turns two other conversations take both slots (unless
--alone), as an agent's sub-agents do, so a turn finds its prefix only in the cache. A small proxy between them times every streamed
`/v1/messages` call: time to the first text or tool delta, and the usage of its final
`message_delta` (`input_tokens`: evaluated, `cache_read_input_tokens`: from the cache). Per turn it
prints the calls and the turn's main call (the longest prompt). Without -m it writes the tiny test
model (tests/fixtures/make_gguf.py), whose byte-level vocabulary makes Claude Code's prompt long.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from tests.fixtures.make_gguf import TINY, write_llama_gguf  # noqa: E402
from tests.test_serve import spawn_serve  # noqa: E402

TURNS = ("Reply with one word: ready?", "Now say one more word.", "And a last word, please.")
QUIET_ENV = {"CLAUDE_CODE_MAX_OUTPUT_TOKENS": "4096", "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1", "DISABLE_AUTOUPDATER": "1",
             "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_BUG_COMMAND": "1"}


class Proxy:
    """HTTP proxy (uvicorn + httpx) that records each streamed /v1/messages call."""

    def __init__(self, upstream: str):
        self.upstream, self.calls, self.port = upstream, [], _free_port()
        self._server: Any = None

    def app(self) -> Any:
        import httpx
        from starlette.requests import Request
        from starlette.responses import StreamingResponse

        client = httpx.AsyncClient(base_url=self.upstream, timeout=None)

        async def forward(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                return
            request = Request(scope, receive)
            body = await request.body()
            started = time.perf_counter()
            headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
            upstream = await client.send(client.build_request(request.method, request.url.path, params=request.query_params,
                                                              headers=headers, content=body), stream=True)
            call = {"path": request.url.path, "status": upstream.status_code, "ttft_ms": None, "usage": {}}
            if request.url.path.endswith("/messages"):
                self.calls.append(call)

            async def chunks() -> Any:
                tail = b""
                async for chunk in upstream.aiter_raw():
                    if call["ttft_ms"] is None and (b"text_delta" in chunk or b"input_json_delta" in chunk):
                        call["ttft_ms"] = round(1000 * (time.perf_counter() - started))
                    tail = (tail + chunk)[-4096:]
                    yield chunk
                await upstream.aclose()
                call["usage"] = _final_usage(tail)
                call["total_ms"] = round(1000 * (time.perf_counter() - started))

            kept = {k: v for k, v in upstream.headers.items() if k.lower() not in ("content-length", "transfer-encoding",
                                                                                  "content-encoding", "connection")}
            await StreamingResponse(chunks(), status_code=upstream.status_code, headers=kept)(scope, receive, send)

        return forward

    def __enter__(self) -> Proxy:
        import uvicorn

        self._server = uvicorn.Server(uvicorn.Config(self.app(), host="127.0.0.1", port=self.port, log_level="warning"))
        threading.Thread(target=self._server.run, daemon=True).start()
        while not self._server.started:
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True


def _final_usage(tail: bytes) -> dict[str, Any]:
    """The usage of the stream's last `message_delta` (or a plain JSON answer's)."""
    for line in reversed(tail.decode(errors="replace").splitlines()):
        if line.startswith("data:") and '"usage"' in line:
            try:
                return json.loads(line[5:]).get("usage") or {}
            except ValueError:
                continue
    try:
        return json.loads(tail).get("usage") or {}
    except ValueError:
        return {}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _other_conversations(url: str) -> None:
    """Two other conversations at once (a sub-agent, a title generator): they take both slots."""
    import httpx

    def one(i: int) -> None:
        body = {"prompt": f"Conversation {i}. " + "Another agent's tool output, line by line. " * 40,
                "n_predict": 4, "temperature": 0}
        httpx.post(f"{url}/completion", json=body, timeout=300)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def run_mode(claude: str, model: Path, n_ctx: int, extra: list[str], folder: Path, timeout: float,
             tools: str, interleave: bool) -> list[dict]:
    work, home = folder / "work", folder / "claude-home"  # spawn_serve uses folder / "home"
    work.mkdir()
    home.mkdir()
    # Claude Code sends no temperature or seed: the server's fixed seed makes both modes sample the same
    # conversation, and a bias on the end token keeps the random model's answers short.
    server = spawn_serve(folder / "serve.log", ["-m", str(model), "-c", str(n_ctx), "-np", "2", "--seed", "42",
                                                "--logit-bias", "2+1", *extra], timeout=300)
    turns = []
    try:
        with Proxy(server.url) as proxy:
            env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE"))}
            env.update(QUIET_ENV, HOME=str(home), ANTHROPIC_BASE_URL=f"http://127.0.0.1:{proxy.port}",
                       ANTHROPIC_API_KEY="x")
            for i, text in enumerate(TURNS):
                if i and interleave:
                    _other_conversations(server.url)
                before = len(proxy.calls)
                cmd = [claude, "-p", text, "--model", "local", "--tools", tools, *(["--continue"] if i else [])]
                started = time.perf_counter()
                done = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
                calls = proxy.calls[before:]
                turns.append({"turn": i + 1, "exit": done.returncode, "wall_s": round(time.perf_counter() - started, 1),
                              "answer": done.stdout.strip()[:80], "stderr": done.stderr.strip()[-300:], "calls": calls})
    finally:
        server.stop()
    return turns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claude", default=shutil.which("claude"), help="the claude binary (npm's bin)")
    parser.add_argument("-m", "--model", type=Path, default=None, help="default: the tiny test model")
    parser.add_argument("-c", "--ctx-size", type=int, default=0, help="context (default: the model's)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per turn")
    parser.add_argument("--tools", default="", help='Claude Code\'s --tools ("": none, its own system prompt only; '
                        '"default": all of them, a prompt 11x longer)')
    parser.add_argument("--alone", action="store_true", help="no other conversations between the turns")
    args = parser.parse_args()
    if not args.claude:
        sys.exit("no claude binary: npm i @anthropic-ai/claude-code, then pass --claude")
    report = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or write_llama_gguf(Path(tmp) / "tiny.gguf", TINY)
        for mode, extra in (("cache on", []), ("cache off", ["--cache-ram", "0"])):
            folder = Path(tmp) / mode.replace(" ", "-")
            folder.mkdir()
            report[mode] = run_mode(args.claude, model, args.ctx_size, extra, folder, args.timeout, args.tools,
                                    not args.alone)
            for turn in report[mode]:
                main_call = max(turn["calls"], key=lambda c: sum(c["usage"].get(k) or 0 for k in
                                                                 ("input_tokens", "cache_read_input_tokens")),
                                default=None)
                print(f"{mode} turn {turn['turn']}: exit {turn['exit']}, {turn['wall_s']} s, {len(turn['calls'])} calls; "
                      f"main call: {json.dumps(main_call)}", flush=True)
                if turn["exit"]:
                    print(f"  stderr: {turn['stderr']}", flush=True)
    print(json.dumps(report, indent=1), file=sys.stderr)


if __name__ == "__main__":
    main()
