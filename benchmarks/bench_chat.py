"""`pyllama chat` vs llama.cpp's `llama-server`: per-turn latency over a 10-turn conversation.

Both keep the KV cache between turns (pyllama re-renders the conversation and reuses the common
prefix; llama-server's slot does the same with cache_prompt). Each tool gets the same model,
threads, context, greedy sampling and 32 answer tokens per turn (--ignore-eos), and the same ten
user messages (about 60 tokens each), interleaved A,B,A,B over --repeat conversations. Time to
first token (TTFT) is measured from outside: from writing the message (pyllama: a line on stdin;
llama-server: a streamed /v1/chat/completions request) to the first byte of the answer.

Targets: pyllama's TTFT of turn 10 within 1.5x of turn 1 (the cache is reused), and pyllama's
per-turn latency within 1.1x of llama-server's. For contrast, one conversation through
llama-server with cache_prompt=false shows what re-evaluating the whole conversation costs.

    python benchmarks/bench_chat.py [--llama-cpp-bin DIR] [-m MODEL] [-t THREADS] [--repeat 3]
"""

from __future__ import annotations

import http.client
import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from _common import base_parser, bench_model, llama_cpp_bin, median, print_ratio_table, pyllama_cmd

N_PREDICT = 32
N_CTX = 2048
TOPICS = ["the river", "the old bridge", "the winter market", "the harbour", "the library", "the mill",
          "the railway", "the town hall", "the orchards", "the lighthouse"]


def user_message(i: int) -> str:
    """The i-th user message: about 60 tokens of ordinary English."""
    return (f"Tell me more about {TOPICS[i % len(TOPICS)]}. I would like to know who built it, when it was "
            "built, what it was used for over the years, how the people of the town felt about it, and "
            "whether anything of it can still be seen today when visiting in the spring or the autumn.")


def system_prompt(session: int) -> str:
    # The session number comes first so that a new conversation never reuses the last one's cache.
    return f"Session {session}. You are a helpful assistant who answers questions about a small town."


class PyllamaChat:
    """A `pyllama chat` process driven line by line; a turn ends with its stats line on stderr."""

    def __init__(self, model: Path, threads: int, session: int):
        cmd = [*pyllama_cmd(), "chat", "-m", str(model), "-c", str(N_CTX), "-t", str(threads), "-n", str(N_PREDICT),
               "--temp", "0", "--ignore-eos", "--no-history"]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     bufsize=0)
        self.out: queue.Queue[float] = queue.Queue()
        self.err: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump_out, daemon=True).start()
        threading.Thread(target=self._pump_err, daemon=True).start()
        # Warm up as llama-server is (weights paged in, compute graphs built), then start the
        # conversation afresh: its system prompt differs from the first token on, so nothing is reused.
        self.turn("Hello.")
        self.send(f"/clear\n/system {system_prompt(session)}")

    def send(self, text: str) -> None:
        self.proc.stdin.write(text.encode() + b"\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]

    def _pump_out(self) -> None:
        fd = self.proc.stdout.fileno()  # type: ignore[union-attr]
        while os.read(fd, 65536):
            self.out.put(time.perf_counter())
        self.out.put(-1.0)

    def _pump_err(self) -> None:
        for line in iter(self.proc.stderr.readline, b""):  # type: ignore[union-attr]
            self.err.put(line.decode("utf-8", "replace"))
        self.err.put("")

    def turn(self, message: str) -> tuple[float, float]:
        """Send one message; (TTFT, whole turn) in seconds."""
        time.sleep(0.05)  # let the reader thread collect the previous answer's last bytes
        start = time.perf_counter()
        self.send(message)
        first = self.out.get(timeout=600)
        while 0 <= first < start:  # bytes of the previous answer
            first = self.out.get(timeout=600)
        if first < 0:
            sys.exit("pyllama chat ended early:\n" + "".join(self.err.queue))
        while True:
            line = self.err.get(timeout=600)
            if not line:
                sys.exit("pyllama chat ended early:\n" + self.proc.stderr.read().decode(errors="replace"))
            if line.startswith("[ Prompt:"):
                return first - start, time.perf_counter() - start
            if line.startswith("Error"):
                sys.exit(f"pyllama chat: {line}")

    def close(self) -> None:
        self.proc.stdin.close()  # type: ignore[union-attr]
        self.proc.wait(timeout=60)


class LlamaServer:
    """One llama-server process (one slot) and a client that streams chat turns to it."""

    def __init__(self, bin_dir: Path, model: Path, threads: int):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        env = {**os.environ, "LD_LIBRARY_PATH": f"{bin_dir}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
        self.proc = subprocess.Popen(
            [str(bin_dir / "llama-server"), "-m", str(model), "-c", str(N_CTX), "-t", str(threads), "-np", "1",
             "--host", "127.0.0.1", "--port", str(self.port), "--log-disable"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        self._wait_ready()

    def _wait_ready(self, timeout: float = 300) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                sys.exit(f"llama-server exited with {self.proc.returncode}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        sys.exit("llama-server did not become ready")

    def turn(self, messages: list[dict], cache: bool = True) -> tuple[float, float, str]:
        """Stream one answer to `messages`; (TTFT, whole turn, answer text)."""
        body = json.dumps({"messages": messages, "max_tokens": N_PREDICT, "temperature": 0, "ignore_eos": True,
                           "stream": True, "cache_prompt": cache})
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        start = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        first, parts = None, []
        for raw in response:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:]).get("choices", []):
                text = (choice.get("delta") or {}).get("content") or ""
                if text and first is None:
                    first = time.perf_counter()
                parts.append(text)
        end = time.perf_counter()
        conn.close()
        return (first or end) - start, end - start, "".join(parts)

    def conversation(self, session: int, turns: int, cache: bool = True) -> list[tuple[float, float]]:
        messages = [{"role": "system", "content": system_prompt(session)}]
        times = []
        for i in range(turns):
            messages.append({"role": "user", "content": user_message(i)})
            ttft, total, text = self.turn(messages, cache)
            messages.append({"role": "assistant", "content": text})
            times.append((ttft, total))
        return times

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def pyllama_conversation(model: Path, threads: int, session: int, turns: int) -> list[tuple[float, float]]:
    chat = PyllamaChat(model, threads, session)
    try:
        return [chat.turn(user_message(i)) for i in range(turns)]
    finally:
        chat.close()


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--turns", type=int, default=10)
    args = p.parse_args()
    bin_dir = llama_cpp_bin(args.llama_cpp_bin)
    model = args.model or bench_model("Q4_0")
    server = LlamaServer(bin_dir, model, args.threads)
    ours: list[list[tuple[float, float]]] = []
    ref: list[list[tuple[float, float]]] = []
    try:
        server.conversation(0, 1)  # warm-up
        for rep in range(args.repeat):  # interleaved: pyllama, llama-server, pyllama, ...
            print(f"conversation {rep + 1}/{args.repeat}...", file=sys.stderr)
            ours.append(pyllama_conversation(model, args.threads, 100 + rep, args.turns))
            ref.append(server.conversation(200 + rep, args.turns))
        print("one conversation through llama-server without the cache, for contrast...", file=sys.stderr)
        no_cache = server.conversation(300, args.turns, cache=False)
    finally:
        server.close()
    report(ours, ref, no_cache, args.turns)


def report(ours: list, ref: list, no_cache: list, turns: int) -> None:
    def per_turn(runs: list, k: int) -> list[float]:
        return [median([run[t][k] for run in runs]) for t in range(turns)]

    ours_ttft, ref_ttft = per_turn(ours, 0), per_turn(ref, 0)
    ours_total, ref_total = per_turn(ours, 1), per_turn(ref, 1)
    print(f"\nper-turn median over {len(ours)} conversations (seconds; {N_PREDICT} answer tokens per turn)")
    print(f"{'turn':>4} {'pyllama TTFT':>13} {'llama-server TTFT':>18} {'no-cache TTFT':>14} "
          f"{'pyllama turn':>13} {'llama-server turn':>18}")
    for t in range(turns):
        print(f"{t + 1:>4} {ours_ttft[t]:>13.3f} {ref_ttft[t]:>18.3f} {no_cache[t][0]:>14.3f} "
              f"{ours_total[t]:>13.3f} {ref_total[t]:>18.3f}")
    print()
    print_ratio_table([
        ("TTFT turn 1 (s)", ref_ttft[0], ours_ttft[0], "<= 1.10"),
        (f"TTFT turn {turns} (s)", ref_ttft[-1], ours_ttft[-1], "<= 1.10"),
        ("median turn latency (s)", median(ref_total), median(ours_total), "<= 1.10"),
    ], higher_is_better=False)
    print()
    print(f"TTFT turn {turns} / turn 1: pyllama {ours_ttft[-1] / ours_ttft[0]:.2f}x (target <= 1.5), "
          f"llama-server {ref_ttft[-1] / ref_ttft[0]:.2f}x, "
          f"re-evaluating the whole conversation {no_cache[-1][0] / no_cache[0][0]:.2f}x")


if __name__ == "__main__":
    main()
