"""`pyllama complete -ctk q8_0 -ctv q8_0 -fa on` vs `llama-completion` with the same flags: generation speed.

bench_complete.py's measurement with a quantized KV cache: the same model, prompt, seed, threads,
context and cache flags, 128 tokens (--ignore-eos), interleaved A,B,B,A,... Rows (ratio = pyllama /
llama.cpp, medians over the runs): the eval counter (target >= 0.97: both read llama.cpp's own
decode timer) and, for information, pyllama's wall-clock token rate against llama.cpp's. The text
both produce is compared too (a quantized cache must not change which tokens are drawn).

    python benchmarks/bench_kv_types.py [--llama-cpp-bin DIR] [-m MODEL] [-t THREADS] [--repeat 5]
        [--cache-type q8_0] [--ctx 4096]
"""

from __future__ import annotations

import sys

from _common import base_parser, bench_model, llama_cpp_bin, median, print_ratio_table, pyllama_cmd, run_timed, turn_order
from bench_complete import N_PREDICT, PROMPT, SEED, our_rates, ref_rates, same_text_as_ref


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--cache-type", default="q8_0", help="-ctk and -ctv for both tools (default: q8_0)")
    p.add_argument("--ctx", type=int, default=4096, help="context size (default: 4096)")
    p.set_defaults(repeat=5)
    args = p.parse_args()
    tool = str(llama_cpp_bin(args.llama_cpp_bin) / "llama-completion")
    model = str(args.model or bench_model("Q4_0"))
    common = ["-m", model, "-p", PROMPT, "-n", str(N_PREDICT), "-s", str(SEED), "-t", str(args.threads),
              "-c", str(args.ctx), "--ignore-eos", "-ctk", args.cache_type, "-ctv", args.cache_type, "-fa", "on"]
    commands = {"ref": [tool, *common, "-no-cnv", "--no-display-prompt", "--no-warmup"],
                "our": [*pyllama_cmd(), "complete", *common, "--stats", "--json"]}
    ref_tps: list[float] = []
    our_eval: list[float] = []
    our_wall: list[float] = []
    same_text: list[bool] = []
    for i in range(args.repeat):
        done = {who: run_timed(commands[who], stdin=b"")[1] for who in turn_order(i, ("ref", "our"))}
        ref_tps.append(ref_rates(done["ref"].stderr.decode(errors="replace"))[0])
        wall, eval_tps = our_rates(done["our"].stderr.decode(errors="replace"))
        our_eval.append(eval_tps)
        our_wall.append(wall)
        same_text.append(same_text_as_ref(done["ref"].stdout, done["our"].stdout))
    print(f"-ctk/-ctv {args.cache_type} -fa on; same text as llama-completion: {sum(same_text)}/{len(same_text)} runs",
          file=sys.stderr)
    pair_ratio = median([ours / ref for ours, ref in zip(our_eval, ref_tps)])
    print(f"median of per-pair eval t/s ratios: {pair_ratio:.3f}", file=sys.stderr, flush=True)
    print_ratio_table([
        (f"eval t/s (-n {N_PREDICT}, KV {args.cache_type})", median(ref_tps), median(our_eval), ">= 0.97"),
        ("our wall / their eval t/s", median(ref_tps), median(our_wall), "(info)"),
    ], higher_is_better=True)


if __name__ == "__main__":
    main()
