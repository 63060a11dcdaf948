"""Shared pieces of the side-by-side benchmarks: finding llama.cpp's tools, the realistic-shape
model, timing a process, and printing ratios.

Benchmarks are scripts, not tests: they print figures for a human and exit 0 unless a run failed.
Speed figures are ratios from one run (pyllama vs llama.cpp interleaved), never absolute times
alone, because the machine they run on is shared and noisy.
"""

from __future__ import annotations

import argparse
import compileall
import functools
import hashlib
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

T = TypeVar("T")
R = TypeVar("R")
C = TypeVar("C")

DEFAULT_REF_BIN = Path("~/.cache/pyllama-ref/bin").expanduser()
BENCH_DIR = Path(os.environ.get("PYLLAMA_BENCH_DIR", "~/.cache/pyllama-bench")).expanduser()


def base_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--llama-cpp-bin", type=Path, default=None,
                   help="folder with llama.cpp's tools (default: $LLAMA_CPP_BIN, else ~/.cache/pyllama-ref/bin)")
    p.add_argument("-m", "--model", type=Path, default=None,
                   help="GGUF to run (default: the realistic-shape Q4_0 model, made on first use)")
    p.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--repeat", type=int, default=3, help="interleaved runs of each tool (median reported)")
    return p


def llama_cpp_bin(arg: Path | None) -> Path:
    """The folder holding llama.cpp's tools; exit with a clear message when absent."""
    folder = arg or (Path(os.environ["LLAMA_CPP_BIN"]) if os.environ.get("LLAMA_CPP_BIN") else DEFAULT_REF_BIN)
    if not (folder / "llama-bench").exists() and not any(folder.glob("llama-*")):
        sys.exit(f"llama.cpp tools not found in {folder}: build them with shared/tools/build-llamacpp-ref.sh "
                 "or pass --llama-cpp-bin DIR")
    return folder


@functools.lru_cache(maxsize=1)
def pyllama_cmd() -> tuple[str, ...]:
    """The `pyllama` script of the environment this benchmark runs in, as a user of that environment runs it.

    Not the first `pyllama` on PATH: that may be a version manager's shim (pyenv's runs a chain of
    shell scripts before Python starts, ~50 ms) that is no part of pyllama. The package is
    byte-compiled first, as pip does when it installs it, so that no run compiles sources
    (PYTHONDONTWRITEBYTECODE would otherwise make every run do so).
    """
    compileall.compile_dir(str(REPO_ROOT / "pyllama_cli"), quiet=1)
    script = Path(sys.executable).parent / "pyllama"
    if script.exists():
        return (str(script),)
    exe = shutil.which("pyllama")
    return (exe,) if exe else (sys.executable, "-m", "pyllama_cli")


def bench_model(kind: str = "Q4_0", preset: str = "bench") -> Path:
    """A realistic-shape model, made once and cached: `bench` (1024 wide, 16 layers, 32k vocab,
    246M parameters) or `bench-1b` (TinyLlama-1.1B's shape).

    `kind` is "F16" (the converter output) or a quantization type made from it with llama.cpp.
    """
    from tests.fixtures.make_gguf import PRESETS, write_llama_gguf, write_quantized

    BENCH_DIR.mkdir(parents=True, exist_ok=True)
    f16 = BENCH_DIR / f"{preset}-F16.gguf"
    if not f16.exists():
        print(f"writing the realistic-shape F16 model to {f16} (once)...", file=sys.stderr)
        write_llama_gguf(f16.with_suffix(".tmp"), PRESETS[preset]).rename(f16)
    if kind.upper() == "F16":
        return f16
    out = BENCH_DIR / f"{preset}-{kind.upper()}.gguf"
    if not out.exists():
        print(f"quantizing it to {kind} (once)...", file=sys.stderr)
        tmp = out.with_suffix(".tmp")
        write_quantized(f16, tmp, kind.upper())
        tmp.rename(out)
    return out


def run_timed(cmd: Sequence[str], *, stdin: bytes | None = None, env: dict[str, str] | None = None,
              check: bool = True) -> tuple[float, subprocess.CompletedProcess[bytes]]:
    """Run a command to completion; return its wall time in seconds and the finished process."""
    start = time.perf_counter()
    proc = subprocess.run(list(cmd), input=stdin, capture_output=True, env={**os.environ, **(env or {})})
    elapsed = time.perf_counter() - start
    if check and proc.returncode != 0:
        sys.stderr.write(proc.stderr.decode(errors="replace")[-3000:])
        raise SystemExit(f"command failed ({proc.returncode}): {' '.join(map(str, cmd))}")
    return elapsed, proc


def run_cpu_timed(cmd: Sequence[str], *, stdin: bytes | None = None,
                  env: dict[str, str] | None = None) -> tuple[float, float, subprocess.CompletedProcess[bytes]]:
    """Run a command; return its wall time, its CPU time (user + system, every thread) and the process.

    CPU time hardly moves when other work shares the machine, so it backs up a noisy wall ratio.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall, proc = run_timed(cmd, stdin=stdin, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), proc


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def turn_order(round_index: int, tools: Sequence[T]) -> Sequence[T]:
    """The order the tools run in, round by round: as given, then reversed (A,B then B,A), so that
    drift in the machine's load never favours the one that always goes first or second."""
    return tools if round_index % 2 == 0 else tools[::-1]


def mirrored_order(round_index: int, tools: Sequence[T]) -> list[T]:
    """Each tool twice per round, mirrored (A,B,B,A; the next round B,A,A,B): a tool's mean over its
    two runs then sits at the same mean time as the other's, so a drift that is steady across the
    round (another VM's load rising or falling) cancels out of the round's ratio."""
    first = list(turn_order(round_index, tools))
    return first + first[::-1]


def mirrored_round(round_index: int, commands: Mapping[str, C], run: Callable[[C], R]) -> dict[str, list[R]]:
    """`run(command)` for each tool's command twice, in `mirrored_order`; each tool's two results in
    the order they ran."""
    results: dict[str, list[R]] = {tool: [] for tool in commands}
    for tool in mirrored_order(round_index, list(commands)):
        results[tool].append(run(commands[tool]))
    return results


def pair_text(values: Sequence[float], digits: int = 2) -> str:
    """A round's two figures of one tool, as "a/b"."""
    return "/".join(f"{v:.{digits}f}" for v in values)


def print_ratio_table(rows: Sequence[tuple[str, float, float, str]], *, higher_is_better: bool) -> None:
    """Print `metric | llama.cpp | pyllama | ratio | target` rows; ratio = pyllama / llama.cpp."""
    print(f"{'metric':<28} {'llama.cpp':>12} {'pyllama':>12} {'ratio':>8}  target")
    for name, ref, ours, target in rows:
        ratio = ours / ref if ref else float("nan")
        print(f"{name:<28} {ref:>12.3f} {ours:>12.3f} {ratio:>8.3f}  {target}")
    print("(ratio = pyllama / llama.cpp; " + ("higher is better)" if higher_is_better else "lower is better)"))


def load_note() -> str:
    """The machine's load averages (1, 5, 15 min) and cores, for the report: figures from a busy machine say so."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "load average unknown"
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} CPUs"


def print_pp_tg_report(runs: dict, labels: tuple[str, str], targets: tuple[str, str] = (">= 0.97", ">= 0.97")) -> None:
    """The ratio table of a pp/tg comparison against llama-bench, its per-round ratios and best rounds.

    `runs` holds each tool's ("ref", "ours") t/s per round under "pp" and "tg"; `labels` name the rows.
    """
    rows = [(label, median(runs["ref"][kind]), median(runs["ours"][kind]), target)
            for label, kind, target in zip(labels, ("pp", "tg"), targets)]
    print_ratio_table(rows, higher_is_better=True)
    # Each round's two runs are neighbours in time: their ratio cancels slow drifts in machine load.
    for kind in ("pp", "tg"):
        paired = [o / r for o, r in zip(runs["ours"][kind], runs["ref"][kind])]
        print(f"{kind}: median of per-round ratios {median(paired):.3f} (rounds: {', '.join(f'{x:.3f}' for x in paired)})")
    # Other processes only ever slow a run down, so each tool's best round is its least disturbed one.
    for kind in ("pp", "tg"):
        best_ref, best_ours = max(runs["ref"][kind]), max(runs["ours"][kind])
        print(f"{kind}: best round llama-bench {best_ref:.2f}, pyllama {best_ours:.2f} t/s, ratio {best_ours / best_ref:.3f}")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the server started next binds it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_rpc_server(cmd: Sequence[str], port: int, timeout: float = 30) -> subprocess.Popen:
    """An RPC server (`cmd`: llama.cpp's or `pyllama rpc-server`) on 127.0.0.1:`port`, once it accepts
    connections; exits the benchmark with a message if it does not start."""
    proc = subprocess.Popen([*cmd, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, cwd=REPO_ROOT)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"RPC server {' '.join(cmd)} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            time.sleep(0.2)  # the probe connection is served (and closed) before the first client
            return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    sys.exit("RPC server did not start")


def wait_healthy(url: str, proc: subprocess.Popen, *, timeout: float = 300, name: str = "server",
                 see: str = "") -> None:
    """Return once the server at `url` answers /health with 200; exit the benchmark with a message (`see`
    appended: a log to read, the command) when `proc` ends first or `timeout` seconds pass."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{name} exited early with {proc.returncode}{see}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    sys.exit(f"{name} did not become ready in {timeout:g} s{see}")


def stop_server(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL if the server has not ended within 10 s."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


# ---------------------------------------------------------------- shared by the file tools' and the servers' scripts

# After deleting the last outputs and syncing, a file benchmark waits this long before its next run: a filesystem
# mounted with `discard` trims the freed blocks in the background, and a VM with free page reporting hands the
# freed memory back to its host about 2 s after it is freed. A run that starts inside that window finds part of
# that memory still backed and part not, and its time swings by 0.5 s on a 1 s job (measured: llama-quantize
# F16 -> Q8_0 0.80-1.76 s after a 0-1 s pause, 1.14-1.36 s after 3 s).
SETTLE_S = 3.0


def sha256(path: Path) -> str:
    """The file's SHA-256, read in 16 MiB blocks (outputs of hundreds of MB)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def load_speeds(runs: list[dict[str, dict[str, float]]], name: str) -> str:
    """One load's tokens/s in each run, for the per-round lines."""
    return " ".join(f"{r[name]['tps']:.0f}" for r in runs)


def summarise_loads(rounds: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Median tokens/s and TTFT over runs of each load, errors summed."""
    return {name: {"tps": statistics.median(r[name]["tps"] for r in rounds),
                   "p50_ttft": statistics.median(r[name]["p50_ttft"] for r in rounds),
                   "errors": sum(r[name]["errors"] for r in rounds)}
            for name in rounds[0]}
