"""Does `pyllama serve` give memory back after one huge request? RSS before, right after, and settled.

Starts the server on the tiny test model, warms it with a few small requests, reads its resident
memory (VmRSS), sends one huge request, and reads it again at once and after --settle seconds:

  * `prompt`: a 7.9 MiB prompt under the body limit, refused with 400 (longer than the context)
    after it was parsed and tokenized, the case issue 27 measured;
  * `body`: a 9 MiB body over the 8 MiB limit, refused with 413 before it is parsed.

Run it with glibc's knobs to tell the allocator's keeping from what the process holds, e.g.
`MALLOC_ARENA_MAX=1`, or against another checkout (`--repo`) for before/after figures.

    python benchmarks/memory_big_body.py [--kind prompt|body] [--repeat 3] [--settle 3] [--repo DIR]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from _common import REPO_ROOT


def rss_mib(pid: int) -> float:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", text).group(1)) / 1024


def post(url: str, body: bytes) -> int:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            reply.read()
            return reply.status
    except urllib.error.HTTPError as exc:
        exc.read()
        return exc.code


def huge_body(kind: str) -> bytes:
    size = int(7.9 * 2**20) if kind == "prompt" else 9 * 2**20
    words = "hello world " * (size // 12)
    return json.dumps({"prompt": words, "max_tokens": 1}).encode()


def one_run(args: argparse.Namespace, model: Path) -> tuple[float, float, float, int]:
    log = Path(tempfile.mkstemp(suffix=".log")[1])
    with open(log, "wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "pyllama_cli", "serve", "-m", str(model), "--port", "0",
                                 "-t", "1", "-c", "4096"], stdout=subprocess.DEVNULL, stderr=sink, cwd=args.repo)
    try:
        deadline = time.monotonic() + 90
        while not (found := re.search(r"ready at (http://\S+)/v1", log.read_text(errors="replace"))):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the server did not start:\n{log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.05)
        url = found.group(1) + "/v1/completions"
        for _ in range(5):
            post(url, json.dumps({"prompt": "hello", "max_tokens": 4}).encode())
        time.sleep(1)
        before = rss_mib(proc.pid)
        status = post(url, huge_body(args.kind))
        right_after = rss_mib(proc.pid)
        time.sleep(args.settle)
        post(url, json.dumps({"prompt": "hello", "max_tokens": 4}).encode())
        settled = rss_mib(proc.pid)
        return before, right_after, settled, status
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        log.unlink()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kind", choices=["prompt", "body"], default="prompt")
    p.add_argument("--repeat", type=int, default=3, help="server runs (the median is printed)")
    p.add_argument("--settle", type=float, default=3.0, help="seconds before the last reading")
    p.add_argument("--repo", type=Path, default=REPO_ROOT, help="the checkout whose pyllama_cli serves")
    args = p.parse_args()
    sys.path.insert(0, str(REPO_ROOT))
    from soak_serve import tiny_model

    runs = [one_run(args, tiny_model()) for _ in range(args.repeat)]
    before, after, settled = (statistics.median(r[i] for r in runs) for i in range(3))
    print(f"{args.kind}: HTTP {runs[0][3]}; RSS before {before:.1f} MiB, right after {after:.1f} MiB, "
          f"settled {settled:.1f} MiB (+{settled - before:.1f} MiB kept), median of {len(runs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
