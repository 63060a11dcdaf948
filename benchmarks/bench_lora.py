"""Generation with a LoRA adapter: `pyllama complete --lora` vs `llama-completion --lora` (tokens per second).

The realistic-shape Q4_0 model gets a rank-8 F32 adapter on every layer's attention and feed-forward
weights (tests/fixtures/make_adapters.py, made once next to the model). Both tools generate 128
tokens with it (--ignore-eos), interleaved A,B,B,A..., and the row compares llama.cpp's own eval
counter of each (target: pyllama >= 0.97 x llama-completion). The texts are compared too.

    python benchmarks/bench_lora.py [--llama-cpp-bin DIR] [-t THREADS] [--repeat 5] [--n-predict 128]
"""

from __future__ import annotations

import sys

from _common import (
    BENCH_DIR,
    base_parser,
    bench_model,
    llama_cpp_bin,
    median,
    print_ratio_table,
    pyllama_cmd,
    run_timed,
    turn_order,
)
from bench_complete import N_CTX, PROMPT, SEED, ref_rates, same_text_as_ref


def bench_adapter() -> str:
    """A LoRA adapter for the realistic-shape model, written once."""
    from tests.fixtures.make_adapters import write_lora_gguf
    from tests.fixtures.make_gguf import PRESETS

    path = BENCH_DIR / "bench-lora-F32.gguf"
    if not path.exists():
        print(f"writing a LoRA adapter for the realistic-shape model to {path} (once)...", file=sys.stderr)
        write_lora_gguf(path.with_suffix(".tmp"), PRESETS["bench"]).rename(path)
    return str(path)


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.set_defaults(repeat=5)
    p.add_argument("--n-predict", type=int, default=128)
    args = p.parse_args()
    tool = str(llama_cpp_bin(args.llama_cpp_bin) / "llama-completion")
    model, adapter = str(args.model or bench_model("Q4_0")), bench_adapter()
    common = ["-m", model, "-p", PROMPT, "-n", str(args.n_predict), "-s", str(SEED), "-t", str(args.threads),
              "-c", str(N_CTX), "--ignore-eos", "--lora", adapter]
    commands = {"ref": [tool, *common, "-no-cnv", "--no-display-prompt", "--no-warmup"],
                "our": [*pyllama_cmd(), "complete", *common, "--stats", "--json"]}
    rates: dict[str, list[float]] = {"ref": [], "our": []}
    same = []
    for i in range(args.repeat):
        done = {who: run_timed(commands[who], stdin=b"")[1] for who in turn_order(i, ("ref", "our"))}
        rates["ref"].append(ref_rates(done["ref"].stderr.decode(errors="replace"))[0])
        stats_line = done["our"].stderr.decode(errors="replace")
        rates["our"].append(our_rates_n(stats_line, args.n_predict))
        same.append(same_text_as_ref(done["ref"].stdout, done["our"].stdout))
    print(f"runs (eval t/s): llama.cpp {[round(x, 2) for x in rates['ref']]}  "
          f"pyllama {[round(x, 2) for x in rates['our']]}", file=sys.stderr)
    print(f"same text as llama-completion: {sum(same)}/{len(same)} runs", file=sys.stderr, flush=True)
    pairs = median([o / r for o, r in zip(rates["our"], rates["ref"])])
    print(f"median of per-pair ratios: {pairs:.3f}", file=sys.stderr, flush=True)
    print_ratio_table([(f"eval t/s with --lora (-n {args.n_predict})", median(rates["ref"]), median(rates["our"]),
                        ">= 0.97")], higher_is_better=True)


def our_rates_n(stderr: str, n_predict: int) -> float:
    import json

    stats = json.loads(stderr.strip().splitlines()[-1])
    if stats["generated_tokens"] != n_predict:
        sys.exit(f"pyllama generated {stats['generated_tokens']} tokens, expected {n_predict}")
    return float(stats["eval_tps"])


if __name__ == "__main__":
    main()
