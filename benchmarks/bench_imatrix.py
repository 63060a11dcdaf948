"""`pyllama imatrix` vs llama.cpp's `llama-imatrix`: 8 chunks of 512 tokens on the realistic-shape F16 model.

First a byte-identity check: both tools write a matrix from the same text with the same flags; the
two files must have the same sha256. Then whole-process wall time, interleaved A,B,B,A,... with the
median of each round's ratio (pyllama / llama-imatrix). Target: pyllama's time at most 1/0.95 of
llama-imatrix's (at least 0.95x its speed). The risk is the evaluation callback's Python cost;
`pyllama imatrix` does the per-tensor work with numpy on the tensor's memory.

    python benchmarks/bench_imatrix.py [--llama-cpp-bin DIR] [-m MODEL.gguf] [-t N] [--repeat 3]
        [--chunks 8] [-c 512] [--skip-identity]
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from _common import (BENCH_DIR, base_parser, bench_model, llama_cpp_bin, median, print_ratio_table, pyllama_cmd,
                     run_cpu_timed, sha256, turn_order)


def corpus(n_words: int = 20000) -> Path:
    """A text of common English words (over 8 chunks of 512 tokens with the bench vocabulary), made once."""
    from tests.fixtures.make_gguf import english_pieces

    path = BENCH_DIR / "imatrix-corpus.txt"
    if not path.exists():
        words = [w.lstrip("▁") for w in english_pieces() if w.lstrip("▁").isalpha()]
        rng = random.Random(0)
        BENCH_DIR.mkdir(parents=True, exist_ok=True)
        path.write_text(" ".join(rng.choice(words) for _ in range(n_words)) + "\n")
    return path


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--chunks", type=int, default=8)
    p.add_argument("-c", "--ctx-size", type=int, default=512)
    p.add_argument("--skip-identity", action="store_true", help="only time; skip the sha256 comparison")
    args = p.parse_args()
    tool = str(llama_cpp_bin(args.llama_cpp_bin) / "llama-imatrix")
    model = args.model or bench_model("F16")
    text = corpus()
    out = BENCH_DIR / "imatrix-out"
    out.mkdir(parents=True, exist_ok=True)
    flags = ["-m", str(model), "-f", str(text), "--chunks", str(args.chunks), "-c", str(args.ctx_size),
             "-t", str(args.threads)]
    cmds = {"ref": [tool, *flags, "-o", str(out / "ref.gguf")],
            "ours": [*pyllama_cmd(), "imatrix", *flags, "-o", str(out / "ours.gguf")]}
    print(f"model {model}, {args.chunks} chunks of {args.ctx_size}, {args.threads} threads", file=sys.stderr)
    runs: dict[str, list[tuple[float, float]]] = {"ref": [], "ours": []}
    for i in range(args.repeat):
        for who in turn_order(i, ("ref", "ours")):
            wall, cpu, _ = run_cpu_timed(cmds[who])
            runs[who].append((wall, cpu))
            print(f"round {i + 1} {who}: {wall:.2f} s wall, {cpu:.2f} s cpu", file=sys.stderr)
        if i == 0 and not args.skip_identity:
            same = sha256(out / "ref.gguf") == sha256(out / "ours.gguf")
            print(f"matrix: {'identical' if same else 'DIFFERENT'} bytes", file=sys.stderr)
            if not same:
                sys.exit("the matrices differ")
    paired = [o / r for (o, _), (r, _) in zip(runs["ours"], runs["ref"])]
    print(f"median of per-round wall ratios (pyllama / llama-imatrix) {median(paired):.3f} "
          f"(rounds: {', '.join(f'{x:.3f}' for x in paired)}); speed ratio {1 / median(paired):.3f} (target >= 0.95)")
    print_ratio_table([("imatrix wall (s)", median([w for w, _ in runs["ref"]]), median([w for w, _ in runs["ours"]]),
                        "<= 1.053"),
                       ("imatrix cpu (s)", median([c for _, c in runs["ref"]]), median([c for _, c in runs["ours"]]),
                        "(info)")], higher_is_better=False)


if __name__ == "__main__":
    main()
