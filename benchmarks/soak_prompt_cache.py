"""The prompt cache's RAM budget holds: RSS stays within --cache-ram plus the model and context.

    python benchmarks/soak_prompt_cache.py [--cache-ram 256] [--requests 400] [-m MODEL.gguf]

Starts `pyllama serve -np 2 --cache-ram N` (the tiny test model unless -m), sends distinct prompts
of about 1,500 tokens two at a time (each leaves a state in the RAM tier as the slots move on) and,
every 50 requests, one that comes back to an early prompt. Samples the server's RSS throughout. The
baseline is the RSS after the first two requests (model, context and runtime loaded, nothing cached
yet). Passes when every request succeeds and the largest RSS is at most baseline + N MiB + 32 MiB
(the slack: Python's own allocations under load), and /metrics' RAM bytes stay within N MiB.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

SLACK_MIB = 32


def _rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.M).group(1)) / 1024


def _prompt(i: int) -> str:
    return f"Request {i}. " + " ".join(f"word{i % 97}_{k} and line {k}" for k in range(110))


async def _load(url: str, n: int, failures: list[str]) -> None:
    import httpx

    queue = list(range(n))
    async with httpx.AsyncClient() as client:
        async def worker() -> None:
            while queue:
                i = queue.pop(0)
                prompt = _prompt(i if i % 50 else max(i - 40, 0))
                r = await client.post(f"{url}/completion", json={"prompt": prompt, "n_predict": 4}, timeout=300)
                if r.status_code != 200:
                    failures.append(f"{i}: {r.status_code} {r.text[:200]}")

        await asyncio.gather(worker(), worker())


def main() -> None:
    import httpx

    from tests.fixtures.make_gguf import TINY, write_llama_gguf
    from tests.test_serve import spawn_serve

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-ram", type=int, default=256)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("-m", "--model", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or write_llama_gguf(Path(tmp) / "tiny.gguf", TINY)
        srv = spawn_serve(Path(tmp) / "serve.log", ["-m", str(model), "-c", "4096", "-np", "2",
                                                    "--cache-ram", str(args.cache_ram)])
        try:
            failures: list[str] = []
            asyncio.run(_load(srv.url, 2, failures))
            baseline, peak, done = _rss_mib(srv.proc.pid), 0.0, threading.Event()

            def sample() -> None:
                nonlocal peak
                while not done.is_set():
                    peak = max(peak, _rss_mib(srv.proc.pid))
                    time.sleep(0.05)

            sampler = threading.Thread(target=sample)
            sampler.start()
            started = time.perf_counter()
            asyncio.run(_load(srv.url, args.requests, failures))
            done.set()
            sampler.join()
            metrics = httpx.get(f"{srv.url}/metrics", timeout=10).text
        finally:
            srv.stop()
    held = float(re.search(r'^pyllama_prompt_cache_bytes\{tier="ram"\} (\S+)$', metrics, re.M).group(1)) / 2 ** 20
    evictions = re.search(r'^pyllama_prompt_cache_evictions_total\{tier="ram"\} (\S+)$', metrics, re.M).group(1)
    bound = baseline + args.cache_ram + SLACK_MIB
    print(f"{args.requests} requests in {time.perf_counter() - started:.1f} s, {len(failures)} failed; RSS baseline "
          f"{baseline:.0f} MiB, peak {peak:.0f} MiB (bound {bound:.0f}); RAM tier holds {held:.0f} MiB, "
          f"{evictions} evictions")
    for failure in failures[:5]:
        print("failed:", failure)
    ok = not failures and peak <= bound and held <= args.cache_ram
    print("PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
