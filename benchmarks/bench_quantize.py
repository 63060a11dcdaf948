"""`pyllama quantize` vs llama.cpp's `llama-quantize` on the realistic-shape F16 model.

First a byte-identity check: both tools quantize the same input to Q8_0, Q4_0, Q4_K_M, Q6_K and F16
(and Q4_K_M with an importance matrix); every pair of outputs must have the same sha256.
Then whole-process wall time (and CPU time, which noise from other work barely moves) for the timed
types, each run from a synced, empty output folder. A round runs each tool twice, mirrored (A,B,B,A,
then B,A,A,B), and takes the mean of each tool's two runs, so a drift in the machine's speed that is
steady across the round cancels out of its ratio. The table reports the medians of the rounds and
their ratio, and a line per type gives the median of each round's ratio. Target: pyllama within 1.05x
of llama-quantize.

    python benchmarks/bench_quantize.py [--llama-cpp-bin DIR] [-m MODEL.gguf] [-t N] [--repeat 3]
        [--types Q4_K_M,Q8_0] [--skip-identity] [--preset bench|bench-1b]

F16 -> Q8_0 of the 246M-parameter model takes about a second, so pyllama's fixed cost (the
Python interpreter, its imports and exit: ~55 ms more than llama-quantize) weighs ~5% there; the
last line measures that cost in the same run (both tools on the tiny test model) and gives its
share of each timed job. --preset bench-1b times the same on TinyLlama-1.1B's shape.
"""

from __future__ import annotations

import functools
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

from _common import (
    BENCH_DIR,
    SETTLE_S,
    base_parser,
    bench_model,
    llama_cpp_bin,
    median,
    mirrored_round,
    print_ratio_table,
    pyllama_cmd,
    run_cpu_timed,
    run_timed,
    sha256,
    turn_order,
)

IDENTITY_TYPES = ["Q8_0", "Q4_0", "Q4_K_M", "Q6_K", "F16"]


def commands(tool: str, model: Path, out: Path, qtype: str, threads: int, flags: list[str]) -> tuple[list, list]:
    ref = [tool, *flags, str(model), str(out.with_name("ref.gguf")), qtype, str(threads)]
    ours = [*pyllama_cmd(), "quantize", *flags, str(model), str(out.with_name("ours.gguf")), qtype, str(threads)]
    return ref, ours


def clean(folder: Path) -> None:
    for path in folder.glob("*.gguf"):
        path.unlink()


def timed_from_clean(folder: Path, cmd: list) -> tuple[float, float]:
    """(wall, CPU) seconds of `cmd`, started from an empty folder with no dirty pages, so neither tool
    pays for flushing the other's output."""
    clean(folder)
    os.sync()
    time.sleep(SETTLE_S)
    return run_cpu_timed(cmd)[:2]


def check_identity(tool: str, model: Path, folder: Path, threads: int, preset: str) -> None:
    cases = [(t, []) for t in IDENTITY_TYPES]
    cases.append(("Q4_K_M", ["--imatrix", str(bench_imatrix(preset))]))
    for qtype, flags in cases:
        clean(folder)
        ref_cmd, our_cmd = commands(tool, model, folder / "x.gguf", qtype, threads, flags)
        run_timed(ref_cmd)
        run_timed(our_cmd)
        ref, ours = sha256(folder / "ref.gguf"), sha256(folder / "ours.gguf")
        label = qtype + (" + imatrix" if flags else "")
        print(f"{label:<18} llama-quantize {ref[:16]}  pyllama {ours[:16]}  "
              f"{'identical' if ref == ours else 'DIFFERENT'}", file=sys.stderr)
        if ref != ours:
            sys.exit(f"{label}: outputs differ")
    clean(folder)


def bench_imatrix(preset: str) -> Path:
    """An imatrix for the realistic-shape model in llama-imatrix's GGUF format (made once)."""
    from tests.fixtures.make_gguf import PRESETS
    from tests.test_quantize import write_imatrix

    path = BENCH_DIR / f"{preset}-imatrix.gguf"
    if not path.exists():
        write_imatrix(path.with_suffix(".tmp"), PRESETS[preset]).rename(path)
    return path


def time_types(tool: str, model: Path, folder: Path, threads: int, types: list[str], repeat: int) -> list[tuple]:
    rows = []
    for qtype in types:
        ref_cmd, our_cmd = commands(tool, model, folder / "x.gguf", qtype, threads, [])
        runs: dict[str, list[tuple[float, float]]] = {"ref": [], "ours": []}
        for i in range(repeat):
            this_round = mirrored_round(i, {"ref": ref_cmd, "ours": our_cmd}, functools.partial(timed_from_clean, folder))
            for who, pair in this_round.items():
                runs[who].append((statistics.fmean(w for w, _ in pair), statistics.fmean(c for _, c in pair)))
        clean(folder)
        ref_runs, our_runs = runs["ref"], runs["ours"]
        print(f"{qtype}: wall/cpu (s) llama.cpp {[(round(w, 2), round(c, 2)) for w, c in ref_runs]} "
              f"pyllama {[(round(w, 2), round(c, 2)) for w, c in our_runs]}", file=sys.stderr)
        paired = [o / r for (o, _), (r, _) in zip(our_runs, ref_runs)]
        print(f"{qtype}: median of per-round wall ratios {median(paired):.3f} "
              f"(rounds: {', '.join(f'{x:.3f}' for x in paired)})")
        rows.append((f"F16 -> {qtype} wall (s)", median([w for w, _ in ref_runs]), median([w for w, _ in our_runs]),
                     "<= 1.05"))
        rows.append((f"F16 -> {qtype} cpu (s)", median([c for _, c in ref_runs]), median([c for _, c in our_runs]),
                     "(info)"))
    return rows


def tiny_model() -> Path:
    """The tests' tiny model (1024-token vocab, 2 layers, F32), made once."""
    from tests.fixtures.make_gguf import TINY, write_llama_gguf

    path = BENCH_DIR / "tiny.gguf"
    if not path.exists():
        write_llama_gguf(path.with_suffix(".tmp"), TINY).rename(path)
    return path


def time_fixed_cost(tool: str, folder: Path, threads: int, runs: int = 30) -> tuple[float, float]:
    """Median whole-process wall time of each tool quantizing the tiny model to Q8_0.

    The job itself takes a few milliseconds, so this is what each tool costs to start and stop: for
    pyllama, the interpreter, typer, llama-cpp-python's bindings and pyllama's own modules. It is the
    same on every model, so on a short job it alone can decide the ratio.
    """
    tiny = tiny_model()
    ref_cmd, our_cmd = commands(tool, tiny, folder / "x.gguf", "Q8_0", threads, [])
    times: dict[str, list[float]] = {"ref": [], "ours": []}
    for i in range(runs):
        for who in turn_order(i, ("ref", "ours")):
            clean(folder)
            times[who].append(run_timed(ref_cmd if who == "ref" else our_cmd)[0])
    clean(folder)
    return median(times["ref"]), median(times["ours"])


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--types", default="Q4_K_M,Q8_0", help="types to time, comma-separated (default Q4_K_M,Q8_0)")
    p.add_argument("--skip-identity", action="store_true", help="only time; skip the sha256 comparison")
    p.add_argument("--preset", choices=("bench", "bench-1b"), default="bench",
                   help="the model to make and time: bench (246M parameters, default) or bench-1b "
                        "(TinyLlama-1.1B's shape, 2.2 GB in F16)")
    args = p.parse_args()
    tool = str(llama_cpp_bin(args.llama_cpp_bin) / "llama-quantize")
    model = args.model or bench_model("F16", args.preset)
    folder = BENCH_DIR / "quantize-out"
    folder.mkdir(parents=True, exist_ok=True)
    need = 3 * model.stat().st_size
    if shutil.disk_usage(folder).free < need:
        sys.exit(f"need {need >> 20} MiB free in {folder} for two outputs")
    print(f"input {model} ({model.stat().st_size >> 20} MiB), {args.threads} threads", file=sys.stderr)
    if not args.skip_identity:
        check_identity(tool, model, folder, args.threads, args.preset)
    rows = time_types(tool, model, folder, args.threads, args.types.split(","), args.repeat)
    print_ratio_table(rows, higher_is_better=False)
    ref_start, our_start = time_fixed_cost(tool, folder, args.threads)
    print(f"fixed cost (tiny model to Q8_0, 30 runs each): llama-quantize {ref_start * 1e3:.1f} ms, "
          f"pyllama {our_start * 1e3:.1f} ms; pyllama's extra {(our_start - ref_start) * 1e3:.1f} ms is "
          + ", ".join(f"{(our_start - ref_start) / ref * 100:.1f}% of llama-quantize's {name.split(' wall')[0]}"
                      for name, ref, _, _ in rows if " wall" in name))


if __name__ == "__main__":
    main()
