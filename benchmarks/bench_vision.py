"""`pyllama complete --image` vs llama.cpp's `llama-mtmd-cli`: image encoding plus the first token.

Both tools get the realistic-shape text model (1024 wide, benchmarks/_common.py's `bench`), a projector
of LLaVA's type at a realistic width (4 evaluated blocks of a 768-wide ViT over 224 x 224 pixels in
14-pixel patches: 256 image tokens, written once by tests/fixtures/make_mmproj.py), the same 640 x 480 JPEG, the same
question through the chat template, greedy sampling and one generated token, interleaved A,B,B,A...

The time compared is "image in to first token": for pyllama, `ttft_ms` from `--json` (the prompt's text
and image chunks evaluated through libmtmd, image encoding included, and the first token sampled); for
llama-mtmd-cli, its `mtmd batch encoding done in X ms` plus its `prompt eval time` (the decode of the
text and image embeddings). Rows are speeds (1 / time), so ratio = pyllama / llama.cpp, target >= 0.97.

    python benchmarks/bench_vision.py [--llama-cpp-bin DIR] [-t THREADS] [--repeat 5]
"""

from __future__ import annotations

import json
import re
import sys

from _common import (
    BENCH_DIR,
    base_parser,
    bench_model,
    llama_cpp_bin,
    load_note,
    median,
    print_ratio_table,
    pyllama_cmd,
    run_timed,
    turn_order,
)

QUESTION = "Describe the image in one sentence."
N_CTX = 2048
_ENCODE = re.compile(r"mtmd batch encoding done in\s*([\d.]+) ms")
_PROMPT_EVAL = re.compile(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens")


def fixtures() -> tuple:
    """The projector and the image, made once under the benchmark folder."""
    from tests.fixtures.make_mmproj import ProjectorSpec, image_bytes, write_mmproj_gguf

    projector = BENCH_DIR / "mmproj-bench-llava-224.gguf"
    if not projector.exists():
        print(f"writing the benchmark projector to {projector} (once)...", file=sys.stderr)
        spec = ProjectorSpec(n_embd_text=1024, n_embd=768, n_ff=3072, n_layer=5, n_head=12, image_size=224,
                             patch_size=14)
        write_mmproj_gguf(projector.with_suffix(".tmp"), spec).rename(projector)
    image = BENCH_DIR / "vision-640x480.jpg"
    if not image.exists():
        image.write_bytes(image_bytes(640, 480, "JPEG", seed=7))
    return projector, image


def theirs(tool, model, projector, image, threads: int) -> tuple[float, int, str]:
    _, proc = run_timed([str(tool), "-m", str(model), "--mmproj", str(projector), "--image", str(image),
                         "-p", QUESTION, "-n", "1", "--temp", "0", "-c", str(N_CTX), "-t", str(threads), "-lv", "4"])
    log = proc.stderr.decode(errors="replace")
    encode, prompt = _ENCODE.search(log), _PROMPT_EVAL.search(log)
    if not encode or not prompt:
        sys.exit("llama-mtmd-cli printed no encoding or prompt eval time:\n" + log[-2000:])
    return float(encode.group(1)) + float(prompt.group(1)), int(prompt.group(2)), proc.stdout.decode(errors="replace")


def ours(model, projector, image, threads: int) -> tuple[float, int, str]:
    _, proc = run_timed([*pyllama_cmd(), "complete", "-m", str(model), "--mmproj", str(projector), "--image",
                         str(image), "--chat", "-p", QUESTION, "-n", "1", "--temp", "0", "-c", str(N_CTX),
                         "-t", str(threads), "--json"])
    stats = json.loads(proc.stderr.decode(errors="replace").strip().splitlines()[-1])
    return float(stats["ttft_ms"]), int(stats["prompt_tokens"]), proc.stdout.decode(errors="replace")


def main() -> int:
    args = base_parser(__doc__.splitlines()[0]).parse_args()
    tool = llama_cpp_bin(args.llama_cpp_bin) / "llama-mtmd-cli"
    if not tool.exists():
        sys.exit(f"{tool} not found: build it with shared/tools/build-llamacpp-ref.sh")
    model = args.model or bench_model("Q4_0")
    projector, image = fixtures()
    runs: dict[str, list[float]] = {"llama.cpp": [], "pyllama": []}
    for round_index in range(args.repeat):
        for name in turn_order(round_index, ("llama.cpp", "pyllama")):
            if name == "llama.cpp":
                ms, n_prompt, text = theirs(tool, model, projector, image, args.threads)
            else:
                ms, n_prompt, text = ours(model, projector, image, args.threads)
            runs[name].append(ms)
            print(f"round {round_index + 1} {name:<9}: {ms:8.1f} ms to the first token, {n_prompt} prompt tokens, "
                  f"text {text.strip()!r}", file=sys.stderr)
    ref_ms, our_ms = median(runs["llama.cpp"]), median(runs["pyllama"])
    print(f"image in to first token, medians of {args.repeat} interleaved runs ({load_note()}):")
    print_ratio_table([("first tokens per second", 1000 / ref_ms, 1000 / our_ms, ">= 0.97")], higher_is_better=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
