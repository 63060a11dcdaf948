"""`pyllama bench` vs llama.cpp's `llama-bench`: the t/s each reports for the same tests.

Both tools measure pp and tg on the realistic-shape model with the same threads and options
(`-p 256 -n 64 -r 5` by default), each writing `-o json`. A round runs each tool twice, mirrored
(A,B,B,A, then B,A,A,B), and a tool's figure for the round is the mean of its two runs' avg_ts, so
a drift in the machine's speed that is steady across the round cancels out of the round's ratio.
The table compares the median of each tool's round figures; then come the median of per-round
ratios and the ratio of each tool's best round (the least disturbed one on a shared machine). Target: pyllama's
pp t/s at least 1.0x llama-bench's and tg at least 0.97x (the same native decodes on the same
thread pools: the wrapper must add no measurable cost). The load average is printed before and
after: run it alone on the machine.

    python benchmarks/bench_bench.py [--llama-cpp-bin DIR] [-m MODEL] [-t THREADS] [--repeat 3]
        [-p 256] [-n 64] [-r 5]
"""

from __future__ import annotations

import json
import statistics
import sys

from _common import (
    base_parser,
    bench_model,
    llama_cpp_bin,
    load_note,
    print_pp_tg_report,
    pyllama_cmd,
    run_timed,
    mirrored_round,
    pair_text,
)


def avg_ts(stdout: bytes) -> dict[str, float]:
    """avg_ts per test kind ("pp" or "tg") from a `-o json` run."""
    rows = json.loads(stdout)
    return {("pp" if r["n_gen"] == 0 else "tg"): float(r["avg_ts"]) for r in rows}


def same_model(ref: bytes, ours: bytes) -> None:
    keys = ("model_type", "model_size", "model_n_params", "n_threads", "n_prompt", "n_gen")
    a = [{k: r[k] for k in keys} for r in json.loads(ref)]
    b = [{k: r[k] for k in keys} for r in json.loads(ours)]
    if a != b:
        sys.exit(f"the two tools measured different things:\n  llama-bench {a}\n  pyllama     {b}")


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("-p", "--n-prompt", type=int, default=256)
    p.add_argument("-n", "--n-gen", type=int, default=64)
    p.add_argument("-r", "--repetitions", type=int, default=5)
    args = p.parse_args()
    tool = str(llama_cpp_bin(args.llama_cpp_bin) / "llama-bench")
    model = str(args.model or bench_model("Q4_0"))
    common = ["-m", model, "-t", str(args.threads), "-p", str(args.n_prompt), "-n", str(args.n_gen),
              "-r", str(args.repetitions), "-o", "json"]
    runs: dict[str, dict[str, list[float]]] = {"ref": {"pp": [], "tg": []}, "ours": {"pp": [], "tg": []}}
    print(f"before: {load_note()}")
    commands = {"ref": [tool, *common], "ours": [*pyllama_cmd(), "bench", *common]}
    for i in range(args.repeat):
        outputs = mirrored_round(i, commands, lambda cmd: run_timed(cmd)[1].stdout)
        for ref, ours in zip(outputs["ref"], outputs["ours"]):
            same_model(ref, ours)
        parsed = {name: [avg_ts(out) for out in outs] for name, outs in outputs.items()}
        this_round = {name: {kind: [ts[kind] for ts in rows] for kind in ("pp", "tg")} for name, rows in parsed.items()}
        for name, kinds in this_round.items():
            for kind, values in kinds.items():
                runs[name][kind].append(statistics.fmean(values))
        print(f"round {i + 1}: llama-bench pp {pair_text(this_round['ref']['pp'])} tg {pair_text(this_round['ref']['tg'])} | "
              f"pyllama pp {pair_text(this_round['ours']['pp'])} tg {pair_text(this_round['ours']['tg'])} t/s",
              file=sys.stderr)
    print_pp_tg_report(runs, (f"pp{args.n_prompt} t/s ({args.threads} threads)",
                              f"tg{args.n_gen} t/s ({args.threads} threads)"), (">= 1.00", ">= 0.97"))
    print(f"after: {load_note()}")


if __name__ == "__main__":
    main()
