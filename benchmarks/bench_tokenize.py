"""`pyllama tokenize` vs llama.cpp's `llama-tokenize` on a 10 MB text file, whole-process time.

Both tools tokenize the same file with the realistic-shape model (32k SPM vocab, loaded vocab-only),
in both output formats (one `%6d -> '%s'` line per token, and `--ids`), interleaved A,B,A,B.
The outputs must be byte-identical; the table reports median wall and CPU times and their ratios.
Target: pyllama within 1.2x of llama-tokenize.

    python benchmarks/bench_tokenize.py [--llama-cpp-bin DIR] [-m MODEL] [--size-mb 10] [--repeat 5]
"""

from __future__ import annotations

import random
import sys

from _common import (BENCH_DIR, base_parser, bench_model, llama_cpp_bin, median, print_ratio_table, pyllama_cmd,
                     run_cpu_timed)

# Mixed text: English words, punctuation, digits, newlines, tabs, accents, CJK, emoji and the odd
# special-token text, so byte-fallback and special-token parsing are exercised too.
_WORDS = ("the of and to in is that it was for on are as with his they at be this from have or by one had "
          "not but what all were when we there can an your which their said if do will each about how up out "
          "them then she many some so these would other into has more her two like him see time could no make "
          "than first been its who now people my made over did down only way find use may water long little "
          "very after words called just where most know").split()
_EXTRAS = ["naïve", "café", "über", "日本語", "中文", "😀", "👍🏽", "42", "3.14", "(x)", "«quote»", "<s>", "<|im_start|>"]


def make_text(size_bytes: int, seed: int = 0) -> bytes:
    """Deterministic text of about `size_bytes` bytes."""
    rng = random.Random(seed)
    parts: list[str] = []
    total = 0
    while total < size_bytes:
        n_words = rng.randint(5, 20)
        words = [rng.choice(_EXTRAS) if rng.random() < 0.05 else rng.choice(_WORDS) for _ in range(n_words)]
        sentence = " ".join(words).capitalize() + rng.choice([". ", ", ", "! ", "? ", ".\n", ".\n\n", ":\t"])
        parts.append(sentence)
        total += len(sentence.encode())
    return "".join(parts).encode()[:size_bytes].decode("utf-8", "ignore").encode()


def text_file(size_mb: float) -> str:
    path = BENCH_DIR / f"tokenize-{size_mb:g}MB.txt"
    if not path.exists():
        BENCH_DIR.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(make_text(int(size_mb * 1_000_000)))
        tmp.rename(path)
    return str(path)


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--size-mb", type=float, default=10.0, help="size of the text file in MB (default 10)")
    p.set_defaults(repeat=5)
    args = p.parse_args()
    tool = str(llama_cpp_bin(args.llama_cpp_bin) / "llama-tokenize")
    model = str(args.model or bench_model("Q4_0"))
    path = text_file(args.size_mb)
    rows = []
    for label, extra in (("lines (default)", []), ("--ids", ["--ids"])):
        ref_cmd = [tool, "--log-disable", "-m", model, "-f", path, "--show-count", *extra]
        our_cmd = [*pyllama_cmd(), "tokenize", "-m", model, "-f", path, "--show-count", *extra]
        ref_times, our_times, ref_cpu, our_cpu = [], [], [], []
        for _ in range(args.repeat):
            t_ref, c_ref, ref = run_cpu_timed(ref_cmd)
            t_our, c_our, our = run_cpu_timed(our_cmd)
            if ref.stdout != our.stdout:
                sys.exit(f"outputs differ for {label}: llama-tokenize {len(ref.stdout)} bytes, "
                         f"pyllama {len(our.stdout)} bytes")
            ref_times.append(t_ref)
            our_times.append(t_our)
            ref_cpu.append(c_ref)
            our_cpu.append(c_our)
        count = ref.stdout.rstrip().rsplit(b" ", 1)[-1].decode()
        print(f"{label}: {count} tokens, outputs identical; runs (s) llama.cpp {[round(t, 2) for t in ref_times]} "
              f"pyllama {[round(t, 2) for t in our_times]}", file=sys.stderr)
        rows.append((f"{args.size_mb:g} MB {label}, wall s", median(ref_times), median(our_times), "<= 1.2"))
        rows.append((f"{args.size_mb:g} MB {label}, CPU s", median(ref_cpu), median(our_cpu), "(less noisy)"))
    print_ratio_table(rows, higher_is_better=False)


if __name__ == "__main__":
    main()
