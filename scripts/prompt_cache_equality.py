"""Answers with the prompt cache equal answers without it, token for token, over random interleavings.

    python scripts/prompt_cache_equality.py [--interleavings 50] [--llama-server PATH] [--routes messages]

Replays tests/cache_replay.py's 6 conversations over 2 slots at temperature 0 in N seeded orders, on
the chat, Messages and Responses routes, against `pyllama serve` with the cache (the default
--cache-ram) and with --cache-ram 0, on the tiny test model; prints the share of identical replays
per route. With --llama-server, the same for llama-server (its default --cache-ram against
--cache-ram 0), side by side. A replay can differ where a prompt is evaluated in another split (a
restored prefix and its rest): llama.cpp's CPU kernels round differently and flip near-ties of the
random test model. Exits 1 when pyllama's share on a route is below llama-server's (without
--llama-server: below 100%).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from tests.cache_replay import APIS, replay_sync  # noqa: E402
from tests.fixtures.make_gguf import TINY, write_llama_gguf  # noqa: E402
from tests.test_serve import spawn_serve  # noqa: E402


def _llama_server(binary: str, model: Path, port: int, *extra: str) -> subprocess.Popen:
    import httpx

    proc = subprocess.Popen([binary, "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c", "2048",
                             "-np", "2", "-t", "1", "--no-webui", *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    sys.exit("llama-server did not start")


def _shares(on_url: str, off_url: str, n: int, apis: list[str]) -> dict[str, float]:
    shares = {}
    for api in apis:
        same = sum(replay_sync(on_url, api, seed)["answers"] == replay_sync(off_url, api, seed)["answers"]
                   for seed in range(n))
        shares[api] = same / n
        print(f"  {api}: {same}/{n} identical", flush=True)
    return shares


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interleavings", type=int, default=50)
    parser.add_argument("--llama-server", default=None, help="also measure this llama-server binary")
    parser.add_argument("--routes", default=",".join(APIS), help=f"comma-separated, of {', '.join(APIS)}")
    args = parser.parse_args()
    apis = [api for api in args.routes.split(",") if api]
    if not apis or set(apis) - set(APIS):
        parser.error(f"--routes takes {', '.join(APIS)}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model = write_llama_gguf(folder / "tiny.gguf", TINY)
        common = ["-m", str(model), "-c", "2048", "-np", "2"]
        on = spawn_serve(folder / "on.log", common)
        off = spawn_serve(folder / "off.log", [*common, "--cache-ram", "0"])
        try:
            print("pyllama serve, cache on vs --cache-ram 0:")
            ours = _shares(on.url, off.url, args.interleavings, apis)
        finally:
            on.stop()
            off.stop()
        if args.llama_server:
            import socket

            ports = []
            for _ in range(2):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0))
                    ports.append(s.getsockname()[1])
            ref_on = _llama_server(args.llama_server, model, ports[0])
            ref_off = _llama_server(args.llama_server, model, ports[1], "--cache-ram", "0")
            try:
                print("llama-server, cache on vs --cache-ram 0:")
                ref = _shares(f"http://127.0.0.1:{ports[0]}", f"http://127.0.0.1:{ports[1]}", args.interleavings,
                              apis)
            finally:
                ref_on.terminate()
                ref_off.terminate()
        else:
            ref = {api: 1.0 for api in apis}
    sys.exit(0 if all(ours[api] >= ref[api] for api in apis) else 1)


if __name__ == "__main__":
    main()
