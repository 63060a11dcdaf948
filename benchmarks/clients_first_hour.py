"""Issue #42's first hour, again: real third-party clients against a local `pyllama serve`, before and after.

Each client talks only to a server on 127.0.0.1 that runs a synthetic model (tests/fixtures/make_gguf.py:
the tiny shape, trained for 32768 tokens so that an agent's prompt fits "at the model's context"):

- `llm -m <openai-compatible model>` (extra-openai-models.yaml in a temporary LLM_USER_PATH);
- litellm's `completion()` through its `openai/` and `anthropic/` providers with `api_base`, once plainly
  and once with a required tool and `max_tokens=12` (the call is cut: finish_reason / stop_reason);
- the OpenAI Agents SDK (`OpenAIChatCompletionsModel` and `OpenAIResponsesModel` on
  `AsyncOpenAI(base_url=...)`, run and streamed) with `tool_choice="required"` and `max_tokens=12`: a cut
  call must not come back as the agent's answer;
- `opencode run` with the server as an OpenAI-compatible provider, HOME and XDG folders temporary. A
  small proxy in front of the server keeps opencode's first request with tools (the agent's turn), which
  is then replayed with `max_tokens: 1` to read its prompt tokens from `usage`.

For each client: what it printed or raised (shortened), its exit status and the server's stderr lines
written meanwhile (the access log where the server has one). A client that is not installed is skipped.

    python benchmarks/clients_first_hour.py [--before TREE] [--client-python PY] [--opencode BIN]
        [--clients llm,litellm,agents,opencode] [--timeout 300] [--json OUT]

`--before TREE` also runs everything against the pyllama in TREE (e.g. a worktree of main at 79ba998,
`git worktree add /tmp/base-42 79ba998`), each server started with `python -m pyllama_cli` from its tree.
`--client-python` is the interpreter that has llm, litellm and openai-agents (a virtualenv keeps them
off the project's environment); `llm` is looked for beside it.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

import _common as common

N_CTX = 32768
N_PREDICT = 32
ALL_CLIENTS = ("llm", "litellm", "agents", "opencode")

LITELLM_CODE = r"""
import os, litellm
litellm.suppress_debug_info = True
url = os.environ["URL"]
msgs = [{"role": "user", "content": "Say hello"}]
tool = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
def show(label, **kw):
    try:
        r = litellm.completion(messages=msgs, api_key="none", timeout=120, **kw)
        c = r.choices[0]
        calls = [(t.function.name, t.function.arguments) for t in (c.message.tool_calls or [])]
        print(f"{label}: ok finish_reason={c.finish_reason} content={(c.message.content or '')[:60]!r} "
              f"tool_calls={calls}")
    except Exception as exc:
        print(f"{label}: FAILED {type(exc).__name__}: {str(exc)[:200]}")
show("openai plain", model="openai/m", api_base=url + "/v1", max_tokens=8)
show("openai tool required max_tokens=12", model="openai/m", api_base=url + "/v1", max_tokens=12,
     tools=[tool], tool_choice="required")
show("anthropic plain", model="anthropic/m", api_base=url, max_tokens=8)
show("anthropic tool any max_tokens=12", model="anthropic/m", api_base=url, max_tokens=12,
     tools=[tool], tool_choice="required")
"""

AGENTS_CODE = r"""
import asyncio, os
from openai import AsyncOpenAI
from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner, function_tool,
                    set_tracing_disabled)
set_tracing_disabled(True)

@function_tool
def get_weather(city: str) -> str:
    "The weather of a city."
    return f"sunny in {city}"

async def main():
    client = AsyncOpenAI(base_url=os.environ["URL"] + "/v1", api_key="none", timeout=120, max_retries=0)
    models = {"chat": OpenAIChatCompletionsModel(model="m", openai_client=client),
              "responses": OpenAIResponsesModel(model="m", openai_client=client)}
    for label in ("chat run", "chat run_streamed", "responses run", "responses run_streamed"):
        agent = Agent(name="a", instructions="Answer with the tool.", tools=[get_weather],
                      model=models[label.split()[0]], reset_tool_choice=True,
                      model_settings=ModelSettings(tool_choice="required", max_tokens=12))
        try:
            if label.endswith(" run"):
                result = await Runner.run(agent, "Weather in Paris?", max_turns=3)
            else:
                result = Runner.run_streamed(agent, "Weather in Paris?", max_turns=3)
                async for _event in result.stream_events():
                    pass
            print(f"{label}: final_output={str(result.final_output)[:120]!r}")
        except Exception as exc:
            print(f"{label}: FAILED {type(exc).__name__}: {str(exc)[:240]}")
asyncio.run(main())
"""


def make_model(folder: Path) -> Path:
    from tests.fixtures.make_gguf import TINY, write_llama_gguf

    return write_llama_gguf(folder / "tiny-32k.gguf", replace(TINY, n_ctx_train=N_CTX, name="pyllama-tiny-32k"))


class Server:
    """`python -m pyllama_cli serve` from `tree`, its stderr in a file read piece by piece."""

    def __init__(self, tree: Path, model: Path, log: Path) -> None:
        self.port, self.log = common.free_port(), log
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [sys.executable, "-m", "pyllama_cli", "serve", "-m", str(model), "--host", "127.0.0.1",
                    "--port", str(self.port), "-c", str(N_CTX), "-n", str(N_PREDICT), "-a", "m"]
        self._err = open(log, "wb")
        self.proc = subprocess.Popen(self.cmd, cwd=tree, stdout=subprocess.DEVNULL, stderr=self._err)
        self._seen = 0
        common.wait_healthy(self.url, self.proc, timeout=120, see=f" (see {log})")

    def new_lines(self) -> list[str]:
        time.sleep(0.3)  # the last request's log line follows its response
        with open(self.log, "rb") as f:
            f.seek(self._seen)
            data = f.read()
        self._seen += len(data)
        return data.decode(errors="replace").splitlines()

    def stop(self) -> None:
        common.stop_server(self.proc)
        self._err.close()


def run_client(cmd: list[str], env: dict[str, str], timeout: float, cwd: Path | None = None) -> dict:
    start = time.monotonic()
    try:
        done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
        rc, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out, err = "timeout", (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) \
            else (exc.stdout or ""), ""
    return {"rc": rc, "seconds": round(time.monotonic() - start, 1), "stdout": out.strip()[-1500:],
            "stderr": err.strip()[-600:]}


def try_llm(server: Server, args, tmp: Path) -> dict | None:
    llm = Path(args.client_python).parent / "llm"
    if not llm.exists():
        return None
    home = tmp / "llm-home"
    home.mkdir(exist_ok=True)
    (home / "extra-openai-models.yaml").write_text(
        f'- model_id: pyllama\n  model_name: m\n  api_base: "{server.url}/v1"\n')
    env = {**os.environ, "LLM_USER_PATH": str(home)}
    return run_client([str(llm), "-m", "pyllama", "-o", "max_tokens", "8", "--no-log", "Say hello"], env,
                      args.timeout)


def _has_module(python: str, name: str) -> bool:
    code = f"import importlib.util,sys; sys.exit(importlib.util.find_spec({name!r}) is None)"
    return subprocess.run([python, "-c", code], capture_output=True, timeout=60).returncode == 0


def try_litellm(server: Server, args, tmp: Path) -> dict | None:
    if not _has_module(args.client_python, "litellm"):
        return None
    env = {**os.environ, "URL": server.url, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    return run_client([args.client_python, "-c", LITELLM_CODE], env, args.timeout)


def try_agents(server: Server, args, tmp: Path) -> dict | None:
    if not _has_module(args.client_python, "agents"):
        return None
    return run_client([args.client_python, "-c", AGENTS_CODE], {**os.environ, "URL": server.url}, args.timeout)


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Forwards each request to the server and keeps the body of the first chat request with tools."""

    upstream = ""
    first_chat: bytes | None = None

    def log_message(self, *_args) -> None:  # the server's own log is what the report shows
        pass

    def _forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) or None
        if body and self.path.endswith("/chat/completions") and _Recorder.first_chat is None \
                and json.loads(body).get("tools"):  # the agent's turn, not the title generator's
            _Recorder.first_chat = body
        headers = {k: v for k, v in self.headers.items() if k.lower() in ("content-type", "authorization")}
        request = urllib.request.Request(self.upstream + self.path, data=body, headers=headers,
                                         method=self.command)
        try:
            with urllib.request.urlopen(request, timeout=600) as response:
                status, kind, data = response.status, response.headers.get("Content-Type", ""), response.read()
        except urllib.error.HTTPError as exc:
            status, kind, data = exc.code, exc.headers.get("Content-Type", ""), exc.read()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _forward


def _opencode_bin(args) -> str | None:
    return args.opencode or shutil.which("opencode")


def _prompt_tokens(url: str, body: bytes) -> int | str:
    request = json.loads(body)
    request.update(stream=False, max_tokens=1)
    request.pop("stream_options", None)
    try:
        with urllib.request.urlopen(urllib.request.Request(
                url + "/v1/chat/completions", data=json.dumps(request).encode(),
                headers={"Content-Type": "application/json"}), timeout=600) as response:
            return json.loads(response.read())["usage"]["prompt_tokens"]
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}: {exc.read()[:200].decode(errors='replace')}"


def try_opencode(server: Server, args, tmp: Path) -> dict | None:
    binary = _opencode_bin(args)
    if not binary:
        return None
    _Recorder.upstream, _Recorder.first_chat = server.url, None
    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    project, home = tmp / "oc-project", tmp / "oc-home"
    project.mkdir(exist_ok=True)
    home.mkdir(exist_ok=True)
    (project / "opencode.json").write_text(json.dumps({
        "$schema": "https://opencode.ai/config.json",
        "provider": {"pyllama": {"npm": "@ai-sdk/openai-compatible", "name": "pyllama",
                                 "options": {"baseURL": f"http://127.0.0.1:{proxy.server_port}/v1"},
                                 "models": {"m": {"name": "m", "limit": {"context": N_CTX, "output": N_PREDICT}}}}},
        "model": "pyllama/m", "share": "disabled", "autoupdate": False}))
    env = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
           "XDG_DATA_HOME": str(home / ".local/share"), "XDG_CACHE_HOME": str(home / ".cache"),
           "XDG_STATE_HOME": str(home / ".local/state"), "OPENCODE_DISABLE_AUTOUPDATE": "1",
           "PWD": str(project)}  # opencode finds its project from $PWD, not from the working directory
    try:
        result = run_client([binary, "run", "-m", "pyllama/m", "Say hello"], env, args.timeout, cwd=project)
    finally:
        proxy.shutdown()
        proxy.server_close()
    body = _Recorder.first_chat
    result["first_request"] = None if body is None else {
        "bytes": len(body), "tools": len(json.loads(body).get("tools") or []),
        "prompt_tokens": _prompt_tokens(server.url, body)}
    return result


TRIES = {"llm": try_llm, "litellm": try_litellm, "agents": try_agents, "opencode": try_opencode}


def run_all(label: str, tree: Path, model: Path, args, tmp: Path) -> dict:
    print(f"== {label}: {tree}", file=sys.stderr)
    server = Server(tree, model, tmp / f"serve-{label}.log")
    results = {"startup": server.new_lines()}
    try:
        for name in args.clients:
            print(f"-- {label} / {name}", file=sys.stderr)
            result = TRIES[name](server, args, tmp)
            if result is None:
                print(f"   skipped: {name} is not installed", file=sys.stderr)
                continue
            result["server_log"] = server.new_lines()
            results[name] = result
            print(json.dumps(result, indent=1), file=sys.stderr)
    finally:
        server.stop()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="a pyllama tree to compare with (e.g. main at 79ba998)")
    parser.add_argument("--client-python", default=sys.executable,
                        help="the Python that has llm, litellm and openai-agents")
    parser.add_argument("--opencode", help="the opencode binary (default: the one on PATH)")
    parser.add_argument("--clients", default=",".join(ALL_CLIENTS))
    parser.add_argument("--timeout", type=float, default=300, help="seconds for each client run")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    args.clients = [c for c in args.clients.split(",") if c]
    if unknown := set(args.clients) - set(TRIES):
        sys.exit(f"unknown clients: {', '.join(sorted(unknown))}")
    with tempfile.TemporaryDirectory(prefix="pyllama-clients-") as folder:
        tmp = Path(folder)
        model = make_model(tmp)
        report = {}
        if args.before:
            report["before"] = run_all("before", args.before.resolve(), model, args, tmp)
        report["after"] = run_all("after", common.REPO_ROOT, model, args, tmp)
    text = json.dumps(report, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
