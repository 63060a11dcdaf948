"""docs/scaling.md's recipe, run: 2 `pyllama serve` replicas behind nginx, 16 streaming clients through it.

Everything listens on 127.0.0.1 with free ports: the two replicas (`--port 0`, the URL read from
their stderr) and nginx (Debian's package: `apt-get install nginx`), started with a config written
to a temporary folder the way docs/scaling.md writes it (least_conn, proxy_buffering off, HTTP/1.1
keep-alive to the replicas, 503 retried elsewhere). nginx is started only once both replicas answer
`GET /health` with 200, as a deployment script would wait for readiness. 16 clients then stream
chat completions through nginx at the same time.

Reported: aggregate generated tokens per second (all streams' tokens / wall time of the whole
run), errors (must be 0), whole streams (every `data:` chunk parses, one finish_reason, usage, then
`data: [DONE]`; must be all 16), and how many streams each replica served. On a 2-core machine the
two replicas share the same two cores, so the figure is no speed-up over one replica: the point is
that the recipe is correct (SSE flows through nginx unbuffered, nothing is lost or cut).

    python benchmarks/replicas_nginx.py [-m MODEL] [--clients 16] [--max-tokens 64] [-np 4] [-t 1]

Exit status: 0 when every stream was whole and there were no errors, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _common import bench_model, free_port, pyllama_cmd

MODEL_ID = "pyllama"  # both replicas serve the model under this id (--alias)

NGINX_CONF = """\
daemon off;
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 256; }}
http {{
    access_log {tmp}/access.log;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    upstream pyllama {{
        least_conn;
{servers}
        keepalive 32;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://pyllama;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_cache off;
            proxy_read_timeout 600s;
            proxy_next_upstream error timeout http_503 non_idempotent;
            add_header X-Upstream $upstream_addr always;
        }}
    }}
}}
"""


def start_replica(model: Path, log: Path, args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    with open(log, "wb") as sink:
        proc = subprocess.Popen([*pyllama_cmd(), "serve", "-m", str(model), "--host", "127.0.0.1", "--port", "0",
                                 "-np", str(args.parallel), "-t", str(args.threads), "-c", str(args.ctx),
                                 "-a", MODEL_ID, "--allowed-hosts", "pyllama"],  # nginx's Host: the upstream
                                stdout=subprocess.DEVNULL, stderr=sink)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        if proc.poll() is not None:
            sys.exit(f"a replica exited with {proc.returncode}:\n{text}")
        found = re.search(r"listening on (http://127\.0\.0\.1:\d+)", text)
        if found:
            return proc, found.group(1)
        time.sleep(0.1)
    sys.exit("a replica did not start listening")


def wait_healthy(url: str, timeout: float = 300) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    sys.exit(f"{url}/health never answered 200")


def start_nginx(replicas: list[str], tmp: Path) -> tuple[subprocess.Popen, str]:
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(nginx).exists():
        sys.exit("nginx not found: apt-get update && apt-get install -y nginx")
    port = free_port()
    servers = "\n".join(f"        server {url.removeprefix('http://')} max_fails=1 fail_timeout=5s;"
                        for url in replicas)
    conf = tmp / "nginx.conf"
    conf.write_text(NGINX_CONF.format(tmp=tmp, servers=servers, port=port))
    proc = subprocess.Popen([nginx, "-c", str(conf), "-p", str(tmp), "-e", str(tmp / "error.log")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"nginx exited with {proc.returncode}: {proc.stderr.read().decode()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, url
        except OSError:
            time.sleep(0.05)
    sys.exit("nginx did not start")


class Stream:
    """One streaming chat completion through nginx, checked chunk by chunk."""

    def __init__(self, index: int):
        self.index = index
        self.tokens = 0
        self.whole = False
        self.error: str | None = None
        self.upstream = "?"
        self.first_chunk_s: float | None = None
        self.end_s: float | None = None

    def run(self, url: str, max_tokens: int, start: float) -> None:
        import httpx

        body = {"model": MODEL_ID, "stream": True, "max_tokens": max_tokens, "temperature": 0.8, "seed": self.index,
                "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": f"Tell story number {self.index} about a lighthouse."}]}
        try:
            with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as response:
                self.upstream = response.headers.get("x-upstream", "?")
                if response.status_code != 200:
                    self.error = f"HTTP {response.status_code}: {response.read()[:200]!r}"
                    return
                self._read(response.iter_lines(), start)
                self.end_s = time.perf_counter() - start
        except Exception as exc:  # noqa: BLE001 - any failure of a stream is an error to count
            self.error = f"{type(exc).__name__}: {exc}"

    def _read(self, lines, start: float) -> None:
        finish, usage, done, after_done = None, None, False, False
        for line in lines:
            if not line:
                continue
            if not line.startswith("data: "):
                self.error = f"not an SSE data line: {line[:80]!r}"
                return
            data = line[len("data: "):]
            if done:
                after_done = True
            if data == "[DONE]":
                done = True
                continue
            chunk = json.loads(data)
            for choice in chunk.get("choices", []):
                finish = choice.get("finish_reason") or finish
                if self.first_chunk_s is None and (choice.get("delta") or {}).get("content"):
                    self.first_chunk_s = time.perf_counter() - start  # the first generated text through nginx
            usage = chunk.get("usage") or usage
        if usage:
            self.tokens = usage["completion_tokens"]
        self.whole = done and not after_done and finish is not None and usage is not None
        if not self.whole:
            self.error = f"stream cut: [DONE]={done} finish_reason={finish} usage={usage is not None}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-m", "--model", type=Path, default=None, help="GGUF to serve (default: the realistic-shape Q4_0)")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("-np", "--parallel", type=int, default=4, help="slots per replica")
    p.add_argument("-t", "--threads", type=int, default=1, help="threads per replica")
    p.add_argument("-c", "--ctx", type=int, default=4096, help="context per replica (shared by its slots)")
    args = p.parse_args()
    model = args.model or bench_model("Q4_0")
    tmp = Path(tempfile.mkdtemp(prefix="pyllama-nginx-"))
    procs: list[subprocess.Popen] = []
    try:
        replicas = []
        for i in range(2):
            proc, url = start_replica(model, tmp / f"replica{i}.log", args)
            procs.append(proc)
            replicas.append(url)
        for url in replicas:
            wait_healthy(url)
        nginx, front = start_nginx(replicas, tmp)
        procs.append(nginx)
        streams = [Stream(i) for i in range(args.clients)]
        start = time.perf_counter()
        threads = [threading.Thread(target=s.run, args=(front, args.max_tokens, start)) for s in streams]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - start
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
    report(streams, wall, replicas, front, model, args)
    if not os.environ.get("KEEP_TMP"):
        shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(0 if all(s.whole for s in streams) and not any(s.error for s in streams) else 1)


def report(streams: list[Stream], wall: float, replicas: list[str], front: str, model: Path,
           args: argparse.Namespace) -> None:
    tokens = sum(s.tokens for s in streams)
    errors = [s for s in streams if s.error]
    per_replica = {url.removeprefix("http://"): sum(1 for s in streams if s.upstream == url.removeprefix("http://"))
                   for url in replicas}
    firsts = sorted(s.first_chunk_s for s in streams if s.first_chunk_s is not None)
    # Unbuffered: a stream's first text reaches the client well before the stream ends.
    early = sum(1 for s in streams if s.first_chunk_s is not None and s.end_s is not None
                and s.end_s - s.first_chunk_s >= 0.25 * s.end_s)
    print(f"model {model.name}; 2 replicas ({', '.join(replicas)}), -np {args.parallel} -t {args.threads} each; "
          f"nginx on {front} (least_conn, proxy_buffering off)")
    print(f"{len(streams)} streaming clients, max_tokens {args.max_tokens}, all started at once")
    print(f"aggregate: {tokens} tokens in {wall:.2f} s = {tokens / wall:.1f} t/s")
    if firsts:
        print(f"first text: earliest {firsts[0]:.2f} s, median {firsts[len(firsts) // 2]:.2f} s, last "
              f"{firsts[-1]:.2f} s after the start; streams whose text flowed while generating (first text in "
              f"the first 3/4 of the stream): {early}/{len(streams)}")
    print(f"errors: {len(errors)}")
    print(f"whole streams: {sum(s.whole for s in streams)}/{len(streams)}")
    print("streams per replica: " + ", ".join(f"{k} {v}" for k, v in per_replica.items()))
    for s in errors:
        print(f"  stream {s.index}: {s.error}")
    print(f"(on {os.cpu_count()} cores the replicas share the CPU: the figure checks the recipe, not a speed-up)")


if __name__ == "__main__":
    main()
