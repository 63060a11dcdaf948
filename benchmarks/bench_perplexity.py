"""`pyllama perplexity` against `llama-perplexity`: the same numbers, and the wall time side by side.

Both tools score the same text on the realistic-shape model (8 chunks of 512 by default, 4 chunks
per decode as llama-perplexity batches them). A round runs each tool twice, mirrored (A,B,B,A, then
B,A,A,B), and a tool's time for the round is the mean of its two runs, so a drift in the machine's
speed that is steady across the round cancels out of the round's ratio. Every run's [i] values and
final estimate must agree to all printed decimals; the wall time (process start, model load and all)
is reported as the median ratio and the median of per-round ratios, target <= 1.03x. The load
average is printed before and after: run it alone on the machine.

With --kld the script also makes a KL-divergence base file with llama-perplexity from the F16 model,
then compares the Q4_0 model against it with both tools (pyllama reads llama.cpp's base file) and
checks that the printed tables agree.

    python benchmarks/bench_perplexity.py [--chunks 8] [-c 512] [--repeat 3] [--kld]
"""

from __future__ import annotations

import re
import statistics
import sys
import tempfile
from pathlib import Path

from _common import (
    BENCH_DIR,
    base_parser,
    bench_model,
    llama_cpp_bin,
    load_note,
    median,
    print_ratio_table,
    pyllama_cmd,
    run_cpu_timed,
    run_timed,
    mirrored_round,
    pair_text,
)

_CHUNK_LINE = re.compile(r"(\[\d+\][0-9.]+,)+")
_FINAL = re.compile(r"Final estimate: PPL = [0-9.]+ \+/- [0-9.]+")


def english_text(n_words: int) -> str:
    """Deterministic sentences of whole-word pieces the synthetic vocabulary holds."""
    from tests.fixtures.make_gguf import _COMMON_WORDS

    x, words = 7, []
    for _ in range(n_words):
        x = (x * 1103515245 + 12345) % 2**31
        words.append(_COMMON_WORDS[(x >> 8) % len(_COMMON_WORDS)])
    sentences = [" ".join(words[i:i + 8]) for i in range(0, n_words, 8)]
    return " ".join(s[0].upper() + s[1:] + "." for s in sentences) + "\n"


def text_file(n_tokens: int) -> Path:
    path = BENCH_DIR / f"ppl-text-{n_tokens}.txt"
    if not path.exists():
        path.write_text(english_text(n_tokens * 3 // 4 + 64))  # ~1.3 tokens per word with the punctuation
    return path


def scores(output: bytes, n_chunks: int) -> tuple[str, str] | None:
    """The [i] line and the final estimate line of either tool's combined output; None when some are
    missing (llama-perplexity's log thread sometimes loses its last lines at exit)."""
    text = output.decode(errors="replace")
    chunks, final = _CHUNK_LINE.search(text), _FINAL.search(text)
    if not chunks or not final or chunks.group(0).count("[") != n_chunks:
        return None
    return chunks.group(0), final.group(0)


def _check_scores(ref, our, n_chunks: int) -> tuple[str, str] | None:
    """The figures both runs printed, once checked equal; None when llama-perplexity's were lost."""
    our_scores = scores(our.stdout + our.stderr, n_chunks)
    if our_scores is None:
        raise SystemExit(f"no perplexity figures in pyllama's output:\n{our.stderr.decode()[-2000:]}")
    ref_scores = scores(ref.stdout + ref.stderr, n_chunks)
    if ref_scores is None:
        print("  (llama-perplexity's output lost lines this run; not compared)", file=sys.stderr)
        return None
    if ref_scores != our_scores:
        raise SystemExit(f"PPL differs:\n  llama-perplexity: {ref_scores}\n  pyllama:          {our_scores}")
    return ref_scores


def compare_ppl(args, ref_bin: Path, model: Path, text: Path) -> list[tuple[str, float, float, str]]:
    common = ["-m", str(model), "-f", str(text), "-c", str(args.ctx), "--chunks", str(args.chunks),
              "-t", str(args.threads)]
    ref_cmd = [str(ref_bin / "llama-perplexity"), *common]
    our_cmd = [*pyllama_cmd(), "perplexity", *common]
    ref_times, our_times, ref_cpu, our_cpu = [], [], [], []
    compared = None
    for i in range(args.repeat):
        runs = mirrored_round(i, {"ref": ref_cmd, "ours": our_cmd}, run_cpu_timed)
        t_ref, c_ref = (statistics.fmean(r[k] for r in runs["ref"]) for k in (0, 1))
        t_our, c_our = (statistics.fmean(r[k] for r in runs["ours"]) for k in (0, 1))
        ref_times.append(t_ref)
        our_times.append(t_our)
        ref_cpu.append(c_ref)
        our_cpu.append(c_our)
        print(f"round {i + 1}: llama-perplexity {pair_text([r[0] for r in runs['ref']])} s "
              f"({pair_text([r[1] for r in runs['ref']])} s CPU), pyllama {pair_text([r[0] for r in runs['ours']])} s "
              f"({pair_text([r[1] for r in runs['ours']])} s CPU)", file=sys.stderr)
        for ref, our in zip((r[2] for r in runs["ref"]), (r[2] for r in runs["ours"])):
            compared = _check_scores(ref, our, args.chunks) or compared
    if compared is None:
        raise SystemExit("no run of llama-perplexity printed all its figures; nothing was compared")
    print(f"PPL equal: yes, {compared[1]}  (both tools, every chunk equal: {compared[0]})")
    paired = [o / r for o, r in zip(our_times, ref_times)]
    print(f"wall: median of per-round ratios {median(paired):.3f} (rounds: {', '.join(f'{x:.3f}' for x in paired)})")
    what = f"{args.chunks} chunks of {args.ctx}"
    return [(f"wall s, {what}", median(ref_times), median(our_times), "<= 1.03"),
            (f"CPU s, {what}", median(ref_cpu), median(our_cpu), "(less noisy on a shared machine)")]


def compare_kld(args, ref_bin: Path, text: Path) -> None:
    f16, q4 = bench_model("F16"), bench_model("Q4_0")
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "f16.kld"
        common = ["-c", str(args.ctx), "-t", str(args.threads)]
        run_timed([str(ref_bin / "llama-perplexity"), "-m", str(f16), "-f", str(text), "--chunks", str(args.chunks),
                   "--kl-divergence-base", str(base), *common])
        kld = ["-m", str(q4), "--kl-divergence", "--kl-divergence-base", str(base), *common]
        _, ref = run_timed([str(ref_bin / "llama-perplexity"), *kld])
        _, our = run_timed([*pyllama_cmd(), "perplexity", *kld])
    ref_rows = [ln for ln in ref.stdout.decode().splitlines() if re.match(r"^ +\d+ +[0-9.]+ ±", ln)]
    our_rows = [ln for ln in our.stdout.decode().splitlines() if re.match(r"^ +\d+ +[0-9.]+ ±", ln)]
    print("\nKL divergence of Q4_0 against an F16 base made by llama-perplexity:")
    print("\n".join(our_rows))
    same = ref_rows == our_rows
    print(f"per-chunk table equal to llama-perplexity's: {'yes' if same else 'NO'}")
    for line in our.stdout.decode().splitlines():
        if line.startswith(("Mean    KLD", "Same top p", "99.0%   KLD", "Median  KLD")):
            print(line)
    if not same:
        raise SystemExit("KL-divergence tables differ:\n" + "\n".join(ref_rows))


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("-c", "--ctx", type=int, default=512, help="tokens per chunk")
    p.add_argument("--chunks", type=int, default=8)
    p.add_argument("--kld", action="store_true", help="also compare KL divergence (Q4_0 against an F16 base)")
    args = p.parse_args()
    ref_bin = llama_cpp_bin(args.llama_cpp_bin)
    model = args.model or bench_model("Q4_0")
    text = text_file(args.ctx * (args.chunks + 1))
    print(f"model {model.name}, text {text.name}, {args.threads} threads, {args.repeat} interleaved runs each")
    print(f"before: {load_note()}")
    rows = compare_ppl(args, ref_bin, model, text)
    print_ratio_table(rows, higher_is_better=False)
    print(f"after: {load_note()}")
    if args.kld:
        compare_kld(args, ref_bin, text)


if __name__ == "__main__":
    main()
