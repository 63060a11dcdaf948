"""`pyllama gguf-split` vs llama.cpp's `llama-gguf-split` on the realistic-shape F16 model (~490 MB).

Both split it with --split-max-size (default 200M, three parts); the parts must have the same
sha256. Then whole-process wall time of the split, interleaved A,B,B,A,..., each run into an empty,
synced folder after a pause (freed pages and trimmed blocks settle), and the median of each
round's ratio (pyllama / llama-gguf-split). Target: at least 0.95x llama-gguf-split's speed. A
merge of the parts is timed the same way, for information.

    python benchmarks/bench_gguf_split.py [--llama-cpp-bin DIR] [-m MODEL.gguf] [--repeat 3] [--size 200M]
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from _common import (BENCH_DIR, SETTLE_S, base_parser, bench_model, llama_cpp_bin, median, print_ratio_table, pyllama_cmd,
                     run_timed, sha256, turn_order)


def clean(folder: Path) -> None:
    for path in folder.glob("*.gguf"):
        path.unlink()
    os.sync()
    time.sleep(SETTLE_S)


def timed(cmds: dict[str, list[str]], folder: Path, repeat: int, before: object = None) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"ref": [], "ours": []}
    for i in range(repeat):
        for who in turn_order(i, ("ref", "ours")):
            clean(folder)
            if callable(before):
                before()
            times[who].append(run_timed(cmds[who])[0])
    return times


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--size", default="200M", help="--split-max-size for both tools (default 200M)")
    args = p.parse_args()
    tool = str(llama_cpp_bin(args.llama_cpp_bin) / "llama-gguf-split")
    model = args.model or bench_model("F16")
    out = BENCH_DIR / "split-out"
    out.mkdir(parents=True, exist_ok=True)
    split = {"ref": [tool, "--split-max-size", args.size, str(model), str(out / "ref")],
             "ours": [*pyllama_cmd(), "gguf-split", "--split-max-size", args.size, str(model), str(out / "ours")]}
    clean(out)
    run_timed(split["ref"])
    run_timed(split["ours"])
    ref_parts, our_parts = sorted(out.glob("ref-*.gguf")), sorted(out.glob("ours-*.gguf"))
    same = len(ref_parts) == len(our_parts) and all(sha256(a) == sha256(b) for a, b in zip(ref_parts, our_parts))
    print(f"{len(ref_parts)} parts: {'identical' if same else 'DIFFERENT'} bytes", file=sys.stderr)
    if not same:
        sys.exit("the parts differ")
    times = timed(split, out, args.repeat)
    paired = [o / r for o, r in zip(times["ours"], times["ref"])]
    print(f"split: median of per-round wall ratios (pyllama / llama-gguf-split) {median(paired):.3f} "
          f"(rounds: {', '.join(f'{x:.3f}' for x in paired)}); speed ratio {1 / median(paired):.3f} (target >= 0.95)")
    rows = [("split wall (s)", median(times["ref"]), median(times["ours"]), "<= 1.053")]
    # The merge reads the reference parts (made again before each run: clean() empties the folder).
    first = out / ref_parts[0].name
    merge = {"ref": [tool, "--merge", str(first), str(out / "merged-ref.gguf")],
             "ours": [*pyllama_cmd(), "gguf-split", "--merge", str(first), str(out / "merged-ours.gguf")]}
    times = timed(merge, out, args.repeat, before=lambda: run_timed(split["ref"]))
    rows.append(("merge wall (s)", median(times["ref"]), median(times["ours"]), "(info)"))
    clean(out)
    print_ratio_table(rows, higher_is_better=False)


if __name__ == "__main__":
    main()
