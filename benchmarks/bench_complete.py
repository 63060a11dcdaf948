"""`pyllama complete` vs llama.cpp's `llama-completion`: generation speed (tokens per second).

Both tools get the same model, prompt, seed, thread count, context size and sampling defaults and
generate 128 tokens (--ignore-eos, so neither stops early), interleaved A,B,B,A,A,B... and produce
the same text. Rows (ratio = pyllama / llama.cpp, medians over the runs):

- eval counter (target >= 0.95): llama-completion's `eval time ... tokens per second` line against
  pyllama's `eval_tps` from `--stats --json`: the same llama.cpp counter (decode time of single-token
  decodes), read from each tool's own context.
- wall clock: pyllama's `generation_tps` (wall time of its whole token loop: sampling, printing and
  time spent waiting for the CPU included) against llama-completion's `total time` with -n 128 minus
  with -n 1 (same start-up and prompt), i.e. the same kind of figure.
- pyllama wall clock against llama-completion's eval line: the strictest pairing. On a quiet machine
  it matches the rows above; on a busy one the time a process loses between decodes (it wakes the
  reader of its output each token) shows up on pyllama's side only.
- CPU ms per generated token ((-n 128) - (-n 1)) / 127, independent of the CPU share a process got.

    python benchmarks/bench_complete.py [--llama-cpp-bin DIR] [-m MODEL] [-t THREADS] [--repeat 5]
"""

from __future__ import annotations

import json
import re
import sys

from _common import (
    base_parser,
    bench_model,
    llama_cpp_bin,
    median,
    print_ratio_table,
    pyllama_cmd,
    run_cpu_timed,
    turn_order,
)

PROMPT = ("The history of the city begins with a small market town on the river, where traders from the "
          "north and the south met each spring to exchange wool, salt and iron. Over the centuries")
N_PREDICT = 128
SEED = 42
N_CTX = 1024

_EVAL = re.compile(r"(?<!prompt )eval time =\s*([\d.]+) ms /\s*(\d+) (?:runs|tokens)\s*\(\s*[\d.]+ ms per token,"
                   r"\s*([\d.]+) tokens per second\)")
_SAMPLING = re.compile(r"sampling time =\s*([\d.]+) ms")
_TOTAL = re.compile(r"total time =\s*([\d.]+) ms")


def ref_rates(stderr: str) -> tuple[float, float]:
    """llama-completion's eval t/s, and its t/s with sampling time added (decode + sample per token)."""
    match = _EVAL.search(stderr)
    if not match:
        sys.exit("no 'eval time' line in llama-completion's output:\n" + stderr[-2000:])
    eval_ms, runs, tps = float(match.group(1)), int(match.group(2)), float(match.group(3))
    sampling = _SAMPLING.search(stderr)
    sampling_ms = float(sampling.group(1)) if sampling else 0.0
    # Sampling covers one more token than eval (the first comes from the prompt's logits).
    per_token_ms = (eval_ms + sampling_ms * runs / (runs + 1)) / runs
    return tps, 1000.0 / per_token_ms


def ref_total_ms(stderr: str) -> float:
    """llama-completion's `total time` (wall time since its context was created)."""
    match = _TOTAL.search(stderr)
    if not match:
        sys.exit("no 'total time' line in llama-completion's output:\n" + stderr[-2000:])
    return float(match.group(1))


def our_rates(stderr: str) -> tuple[float, float]:
    """pyllama's generation t/s (wall time of the token loop) and its llama.cpp-counted eval t/s."""
    stats = json.loads(stderr.strip().splitlines()[-1])
    if stats["generated_tokens"] != N_PREDICT:
        sys.exit(f"pyllama generated {stats['generated_tokens']} tokens, expected {N_PREDICT}")
    return float(stats["generation_tps"]), float(stats["eval_tps"])


def same_text_as_ref(ref: bytes, ours: bytes) -> bool:
    """llama-completion prints invalid UTF-8 bytes as they are and ends with a blank line; pyllama prints
    U+FFFD for invalid bytes. Compare after making both the same kind of text."""
    return ref.decode("utf-8", errors="replace").rstrip("\n") == ours.decode("utf-8")


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.set_defaults(repeat=5)
    args = p.parse_args()
    tool = str(llama_cpp_bin(args.llama_cpp_bin) / "llama-completion")
    model = str(args.model or bench_model("Q4_0"))

    def common(n: int) -> list[str]:
        return ["-m", model, "-p", PROMPT, "-n", str(n), "-s", str(SEED), "-t", str(args.threads), "-c", str(N_CTX),
                "--ignore-eos"]

    def ref_cmd(n: int) -> list[str]:
        return [tool, *common(n), "-no-cnv", "--no-display-prompt", "--no-warmup"]

    def our_cmd(n: int) -> list[str]:
        return [*pyllama_cmd(), "complete", *common(n), "--stats", "--json"]

    runs: dict[str, list[float]] = {k: [] for k in ("ref_tps", "ref_e2e", "ref_wall", "our_tps", "our_eval",
                                                     "ref_cpu", "our_cpu")}
    same_text = []
    for i in range(args.repeat):
        done, base = {}, {}
        for who in turn_order(i, ("ref", "our")):
            cmd = ref_cmd if who == "ref" else our_cmd
            _, base_cpu, base[who] = run_cpu_timed(cmd(1), stdin=b"")
            _, full_cpu, done[who] = run_cpu_timed(cmd(N_PREDICT), stdin=b"")
            # CPU time per generated token: independent of how much of the CPU others leave us.
            runs[f"{who}_cpu"].append((full_cpu - base_cpu) / (N_PREDICT - 1) * 1000)
        ref_err = done["ref"].stderr.decode(errors="replace")
        tps, e2e = ref_rates(ref_err)
        runs["ref_tps"].append(tps)
        runs["ref_e2e"].append(e2e)
        # llama.cpp's wall-clock generation rate: its total time with -n 128 minus with -n 1 (which has the
        # same start-up and prompt), so time spent between decodes counts as it does in pyllama's figure.
        wall_ms = ref_total_ms(ref_err) - ref_total_ms(base["ref"].stderr.decode(errors="replace"))
        runs["ref_wall"].append((N_PREDICT - 1) / (wall_ms / 1000) if wall_ms > 0 else float("nan"))
        tps, eval_tps = our_rates(done["our"].stderr.decode(errors="replace"))
        runs["our_tps"].append(tps)
        runs["our_eval"].append(eval_tps)
        same_text.append(same_text_as_ref(done["ref"].stdout, done["our"].stdout))
    sys.stderr.flush()
    report(runs, same_text)


def report(runs: dict[str, list[float]], same_text: list[bool]) -> None:
    print(f"runs (eval t/s): llama.cpp {[round(x, 2) for x in runs['ref_tps']]}  "
          f"pyllama {[round(x, 2) for x in runs['our_eval']]}", file=sys.stderr)
    print(f"same text as llama-completion: {sum(same_text)}/{len(same_text)} runs", file=sys.stderr)
    # Each pair ran back to back, so its ratio is less exposed to load drifting over the whole run.
    pair_ratio = median([ours / ref for ours, ref in zip(runs["our_eval"], runs["ref_tps"])])
    print(f"median of per-pair eval t/s ratios: {pair_ratio:.3f}", file=sys.stderr, flush=True)
    print_ratio_table([
        (f"eval t/s (-n {N_PREDICT})", median(runs["ref_tps"]), median(runs["our_eval"]), ">= 0.95"),
        ("wall-clock t/s", median(runs["ref_wall"]), median(runs["our_tps"]), "(info)"),
        ("our wall / their eval t/s", median(runs["ref_tps"]), median(runs["our_tps"]), "(info)"),
        ("  their eval+sampling t/s", median(runs["ref_e2e"]), median(runs["our_tps"]), "(info)"),
    ], higher_is_better=True)
    print()
    print_ratio_table([
        ("CPU ms per generated token", median(runs["ref_cpu"]), median(runs["our_cpu"]), "(info)"),
    ], higher_is_better=False)


if __name__ == "__main__":
    main()
