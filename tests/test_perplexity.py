"""`pyllama perplexity`: llama-perplexity's PPL, KL divergence against a base model, HellaSwag, Winogrande.

Expected values are computed here independently: logits from llama-cpp-python's high-level
`Llama` (one chunk at a time) and the NLL math in numpy. Flash attention is off on both sides
because the CPU flash-attention kernel rounds through F16, differently for different batch shapes.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from pyllama_cli.core.evaluate import multiple_choice as mc
from tests.fixtures.make_gguf import (
    _COMMON_WORDS,
    TINY,
    WIDE,
    WORD_BOUNDARY,
    build_vocab,
    write_llama_gguf,
    write_quantized,
)
from tests.helpers import run_cli

N_CTX = 128


def english(n_words: int, seed: int = 7) -> str:
    """Deterministic sentences of words the tiny model's vocabulary holds whole."""
    x, words = seed, []
    for _ in range(n_words):
        x = (x * 1103515245 + 12345) % 2**31
        words.append(_COMMON_WORDS[(x >> 8) % len(_COMMON_WORDS)])
    sentences = [" ".join(words[i:i + 8]) for i in range(0, n_words, 8)]
    return " ".join(s[0].upper() + s[1:] + "." for s in sentences) + "\n"


@pytest.fixture(scope="module")
def text_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ppl") / "text.txt"
    path.write_text(english(480))  # 650 tokens: 5 chunks of 128
    return path


@pytest.fixture(scope="module")
def llama(tiny_model: Path):
    import llama_cpp

    return llama_cpp.Llama(str(tiny_model), n_ctx=N_CTX, logits_all=True, flash_attn=False, verbose=False)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    top = x.max(axis=-1, keepdims=True)
    return x - top - np.log(np.exp(x - top).sum(axis=-1, keepdims=True))


def chunk_logits(llama, tokens: list[int]) -> np.ndarray:
    llama.reset()
    llama.eval(tokens)
    return np.array(llama.scores[:len(tokens)])


@pytest.fixture(scope="module")
def expected_nll(llama, text_file: Path) -> list[np.ndarray]:
    """Per chunk, the NLL of tokens n_ctx/2+1 .. n_ctx-1, with the chunk's first token made BOS."""
    tokens = llama.tokenize(text_file.read_bytes()[:-1], add_bos=True, special=False)
    first, out = N_CTX // 2, []
    for c in range(len(tokens) // N_CTX):
        chunk = [llama.token_bos()] + list(tokens[c * N_CTX + 1:(c + 1) * N_CTX])
        lp = log_softmax(chunk_logits(llama, chunk)[first:N_CTX - 1])
        out.append(-lp[np.arange(len(lp)), chunk[first + 1:]])
    return out


def expected_stdout(nll: list[np.ndarray]) -> str:
    parts, seen = [], np.zeros(0)
    for i, chunk in enumerate(nll, 1):
        seen = np.concatenate([seen, chunk])
        parts.append(f"[{i}]{math.exp(seen.mean()):.4f},")
    ppl = math.exp(seen.mean())
    unc = ppl * math.sqrt((np.mean(seen ** 2) - seen.mean() ** 2) / (len(seen) - 1))
    return "".join(parts) + f"\nFinal estimate: PPL = {ppl:.4f} +/- {unc:.5f}\n"


def ppl(model: Path, *args: str):
    return run_cli("perplexity", "-m", str(model), "-c", str(N_CTX), "-fa", "off", *args)


# ---------------------------------------------------------------- perplexity


def test_ppl_equals_numpy_over_llama_cpp_python_logits(tiny_model: Path, text_file: Path, expected_nll) -> None:
    result = ppl(tiny_model, "-f", str(text_file))
    assert result.exit_code == 0, result.stderr
    assert len(expected_nll) == 5
    assert result.stdout == expected_stdout(expected_nll)
    assert result.stderr.splitlines()[0] == "perplexity: 650 tokens, 5 chunks of 128, 5 per batch of 640"


@pytest.mark.parametrize("batch", ["128", "48"])  # one chunk per decode; a chunk over three decodes
def test_batch_size_changes_nothing(tiny_model: Path, text_file: Path, expected_nll, batch: str) -> None:
    result = ppl(tiny_model, "-f", str(text_file), "-b", batch, "--chunks", "2")
    assert result.exit_code == 0, result.stderr
    assert result.stdout == expected_stdout(expected_nll[:2])


@pytest.mark.parametrize("workers", [2, 3, 64])  # even and uneven shares; more workers than blocks
def test_threads_sharing_the_rows_give_the_same_nll_bits(workers: int) -> None:
    from pyllama_cli.core.evaluate.perplexity import token_nll

    rng = np.random.default_rng(3)
    n_vocab = 40_000  # 13 rows a block: 255 rows make 20 blocks to share
    logits = (rng.standard_normal((255, n_vocab)) * 4).astype(np.float32)
    targets = rng.integers(0, n_vocab, 255)
    alone = token_nll(logits, targets, workers=1)
    assert np.array_equal(token_nll(logits, targets, workers=workers), alone)
    shifted = logits.astype(np.float64) - logits.max(axis=1, keepdims=True)
    exact = np.log(np.exp(shifted).sum(axis=1)) - shifted[np.arange(255), targets]
    assert np.allclose(alone, exact, rtol=1e-6)


def test_json_has_each_chunk_and_the_final_estimate(tiny_model: Path, text_file: Path, expected_nll) -> None:
    result = ppl(tiny_model, "-f", str(text_file), "--chunks", "3", "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    seen = np.concatenate(expected_nll[:3])
    assert [c["chunk"] for c in data["chunks"]] == [1, 2, 3]
    assert f"{data['ppl']:.4f}" == f"{math.exp(seen.mean()):.4f}"
    assert data["chunks"][-1]["ppl"] == data["ppl"]
    assert (data["n_tokens"], data["n_ctx"], data["n_chunks"], data["n_seq"], data["scored_tokens"]) == \
        (650, 128, 3, 3, 3 * 63)


def test_text_too_short_says_how_many_tokens(tiny_model: Path, tmp_path: Path) -> None:
    short = tmp_path / "short.txt"
    short.write_text(english(40))
    result = run_cli("perplexity", "-m", str(tiny_model), "-f", str(short))
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.first_stderr_line == ("Error: the text is 55 tokens long; perplexity with a context of 512 "
                                        "needs at least 1024 tokens")


@pytest.mark.parametrize(("args", "message"), [
    ((), "Error: no text to score"),
    (("--kl-divergence",), "Error: --kl-divergence needs --kl-divergence-base FILE"),
    (("-f", "x.txt", "--hellaswag", "h.txt"), "Error: --hellaswag does not read -f"),
    (("--hellaswag", "h.txt", "--winogrande", "w.csv"), "Error: --hellaswag and --winogrande cannot be combined"),
    (("-f", "missing.txt"), "Error: text file not found: missing.txt"),
    # llama-perplexity refuses -c 0 too; it was taken as the 512 of no -c at all.
    (("-f", "x.txt", "-c", "0"), "Error: -c 0: perplexity needs a context size above 0"),
])
def test_bad_flag_combinations(tiny_model: Path, args: tuple[str, ...], message: str) -> None:
    result = run_cli("perplexity", "-m", str(tiny_model), *args)
    assert result.exit_code == 1
    assert result.first_stderr_line == message


# ---------------------------------------------------------------- KL divergence


@pytest.fixture(scope="module")
def quantized(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("quant")
    return write_quantized(tiny_model, folder / "f16.gguf", "F16"), write_quantized(tiny_model, folder / "q4.gguf",
                                                                                    "Q4_0")


def save_base(model: Path, text: Path, out: Path, *args: str):
    return ppl(model, "-f", str(text), "--kl-divergence-base", str(out), *args)


def test_base_file_records_tokens_context_and_vocab(tiny_model: Path, text_file: Path, tmp_path: Path,
                                                     llama) -> None:
    base = tmp_path / "base.kld"
    result = save_base(tiny_model, text_file, base, "--chunks", "2")
    assert result.exit_code == 0, result.stderr
    data = base.read_bytes()
    assert data[:8] == b"_logits_"
    assert np.frombuffer(data, "<i4", 3, 8).tolist() == [N_CTX, 1024, 2]
    tokens = np.frombuffer(data, "<i4", 2 * N_CTX, 20)
    assert tokens.tolist() == llama.tokenize(text_file.read_bytes()[:-1], add_bos=True)[:2 * N_CTX]
    assert len(data) == 20 + 4 * 2 * N_CTX + 2 * 2 * 63 * (1024 + 4)


def test_kld_of_a_model_against_itself_is_zero_to_the_printed_digits(tiny_model: Path, text_file: Path,
                                                                     tmp_path: Path) -> None:
    base = tmp_path / "base.kld"
    assert save_base(tiny_model, text_file, base).exit_code == 0
    result = ppl(tiny_model, "--kl-divergence", "--kl-divergence-base", str(base), "--json")
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)["summary"]
    # As in llama-perplexity, the 16-bit rounding of the stored base leaves each position's value a
    # little either side of 0 (the base is not renormalized).
    kld = summary["kld"]
    assert abs(kld["mean"]) < 1e-7 and -1e-5 < kld["min"] < 0 < kld["max"] < 1e-5
    assert summary["same_top"]["p"] == 1.0
    assert summary["count"]["positions"] == 5 * 63
    text = ppl(tiny_model, "--kl-divergence", "--kl-divergence-base", str(base)).stdout.splitlines()
    assert text[0].startswith("chunk             PPL               ln(PPL(Q)/PPL(base))")
    assert len(text[1:6]) == 5 and all(line.endswith("100.000 ±  0.000 %") for line in text[1:6])
    assert "Same top p: 100.000 ± 0.000 %" in text
    # The sign of a mean this close to 0, and whether the uncertainty's variance rounds to a little
    # below 0 (C prints "-nan" for its square root), differ by CPU: assert only what holds on all.
    mean_line = next(line for line in text if line.startswith("Mean    KLD:"))
    mean, uncertainty = (float(part) for part in mean_line.removeprefix("Mean    KLD:").split("±"))
    assert abs(mean) < 1e-6 and (math.isnan(uncertainty) or 0 <= uncertainty < 1e-6)


def test_kld_of_q4_0_against_its_f16_base_is_positive(quantized: tuple[Path, Path], text_file: Path,
                                                      tmp_path: Path) -> None:
    f16, q4 = quantized
    base = tmp_path / "f16.kld"
    assert save_base(f16, text_file, base, "--chunks", "3").exit_code == 0
    result = ppl(q4, "--kl-divergence", "--kl-divergence-base", str(base), "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert len(data["chunks"]) == 3
    kld = data["summary"]["kld"]
    assert kld["mean"] > 1e-4 and kld["min"] <= kld["median"] <= kld["99.0%"] <= kld["max"]
    assert data["summary"]["same_top"]["p"] < 1.0
    lines = ppl(q4, "--kl-divergence", "--kl-divergence-base", str(base)).stdout.splitlines()
    assert [line.split(":")[0] for line in lines if "KLD:" in line] == [
        "Mean    KLD", "Maximum KLD", "99.9%   KLD", "99.0%   KLD", "95.0%   KLD", "90.0%   KLD", "Median  KLD",
        "10.0%   KLD", " 5.0%   KLD", " 1.0%   KLD", " 0.1%   KLD", "Minimum KLD"]


def test_kld_takes_the_stored_base_as_it_is_not_renormalized() -> None:
    from pyllama_cli.core.evaluate.kld import quantize_log_probs, row_width
    from pyllama_cli.core.evaluate.kld_stats import KldStats

    rng = np.random.default_rng(3)
    n_rows, n_vocab = 8, 20000
    base_logits = (4 * rng.standard_normal((n_rows, n_vocab))).astype(np.float32)  # peaked, as WIDE's
    logits = base_logits + (0.05 * rng.standard_normal((n_rows, n_vocab))).astype(np.float32)
    rows = quantize_log_probs(base_logits, row_width(n_vocab))
    scale, min_log_prob = np.ascontiguousarray(rows[:, :4]).view("<f4").T
    stats = KldStats()
    stats.add_chunk(logits, np.zeros(n_rows, np.int64), (scale, min_log_prob, rows[:, 4:4 + n_vocab]))
    log_p = scale[:, None].astype(np.float64) * rows[:, 4:4 + n_vocab] + min_log_prob[:, None]
    p = np.where(log_p > -16, np.exp(log_p), 0.0)  # the tokens at -16 or below count as zero
    log_q = log_softmax(logits)
    expected = (p * (log_p - log_q)).sum(axis=1)
    assert np.concatenate(stats.kld_values) == pytest.approx(expected, abs=1e-6)
    # Renormalizing the kept mass would add about the mass lost below -16 to every position.
    mass = p.sum(axis=1)
    renormalized = (p * (log_p - log_q)).sum(axis=1) / mass - np.log(mass)
    assert np.all(renormalized - expected > 1e-4)


def test_same_top_token_is_the_first_of_a_tie_in_the_base() -> None:
    from pyllama_cli.core.evaluate.kld import quantize_log_probs, row_width
    from pyllama_cli.core.evaluate.kld_stats import KldStats

    base_logits = np.array([[0.0, 5.0, 5.0, 1.0], [0.0, 5.0, 5.0, 1.0]], np.float32)  # tokens 1 and 2 tie
    logits = np.array([[0.0, 4.9, 5.0, 1.0], [0.0, 5.0, 4.9, 1.0]], np.float32)
    rows = quantize_log_probs(base_logits, row_width(4))
    scale, min_log_prob = np.ascontiguousarray(rows[:, :4]).view("<f4").T
    stats = KldStats()
    stats.add_chunk(logits, np.zeros(2, np.int64), (scale, min_log_prob, rows[:, 4:8]))
    # The base's top is token 1 (the first of the tie), as in llama-perplexity: only row 2 agrees.
    assert stats.n_same_top == 1


@pytest.mark.parametrize(("n_ctx", "n_batch", "n_seq"), [
    (None, 2048, 4),  # llama-perplexity's context is sized by -c's 512: 2048 / 512 sequences
    (128, 2048, 5),  # -c 128: 16 sequences, so all 5 chunks in one decode
    (None, 256, 1),  # 256 / 512 rounds to a single sequence
])
def test_kld_evaluates_as_many_chunks_per_decode_as_llama_perplexity(n_ctx: int | None, n_batch: int,
                                                                     n_seq: int) -> None:
    from pyllama_cli.core.evaluate.kld import BaseHeader, KldRun
    from pyllama_cli.core.model.settings import LoadSettings

    header = BaseHeader(Path("base.kld"), 128, 1024, 5, np.zeros(5 * 128, np.int32))
    assert KldRun.prepare(None, LoadSettings(n_batch=n_batch), header, -1, n_ctx).plan.n_seq == n_seq


def test_base_from_another_vocabulary_or_context_is_refused(tiny_model: Path, text_file: Path, tmp_path: Path) -> None:
    from dataclasses import replace

    other = write_llama_gguf(tmp_path / "other.gguf", replace(TINY, n_vocab_pieces=TINY.n_vocab_pieces - 24))
    base = tmp_path / "base.kld"
    assert save_base(other, text_file, base, "--chunks", "2").exit_code == 0
    result = ppl(tiny_model, "--kl-divergence", "--kl-divergence-base", str(base))
    assert result.exit_code == 1
    assert result.first_stderr_line == (f"Error: {base} was made with a 1000-token vocabulary; this model has "
                                        "1024 tokens")
    result = run_cli("perplexity", "-m", str(other), "--kl-divergence", "--kl-divergence-base", str(base), "-c", "64")
    assert result.first_stderr_line == (f"Error: {base} was made with a context of 128 tokens; this run asked for "
                                        "-c 64")
    result = ppl(tiny_model, "--kl-divergence", "--kl-divergence-base", str(text_file))
    assert result.first_stderr_line == f"Error: {text_file} is not a KL-divergence base file (no _logits_ header)"


def test_failed_run_leaves_no_base_file(tiny_model: Path, text_file: Path, tmp_path: Path) -> None:
    short = tmp_path / "short.txt"
    short.write_text(english(40))
    result = save_base(tiny_model, short, tmp_path / "base.kld")
    assert result.exit_code == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["short.txt"]
    result = save_base(tiny_model, text_file, tmp_path / "no" / "base.kld")
    assert result.first_stderr_line == (f"Error: cannot write the KL-divergence base {tmp_path / 'no' / 'base.kld'}: "
                                        f"the folder {tmp_path / 'no'} does not exist")


def strict_json(text: str):
    """json.loads that refuses NaN and Infinity, which are not JSON (jq and JavaScript reject them)."""
    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_json_is_strict_when_the_uncertainty_is_undefined(tiny_model: Path, text_file: Path) -> None:
    # -c 4 scores one token per chunk: the ± of one value is NaN, which --json writes as null.
    result = run_cli("perplexity", "-m", str(tiny_model), "-f", str(text_file), "-c", "4", "--chunks", "1", "--json")
    assert result.exit_code == 0, result.stderr
    data = strict_json(result.stdout)
    assert data["scored_tokens"] == 1
    assert data["uncertainty"] is None


def test_kld_of_few_positions_has_strict_json_and_no_text_summary(tiny_model: Path, text_file: Path,
                                                                  tmp_path: Path) -> None:
    base = tmp_path / "base.kld"
    made = run_cli("perplexity", "-m", str(tiny_model), "-f", str(text_file), "-c", "8", "--chunks", "2",
                   "--kl-divergence-base", str(base))
    assert made.exit_code == 0, made.stderr
    compare = ("perplexity", "-m", str(tiny_model), "--kl-divergence", "--kl-divergence-base", str(base))
    result = run_cli(*compare, "--json")
    assert result.exit_code == 0, result.stderr
    summary = strict_json(result.stdout)["summary"]
    assert summary["count"]["positions"] == 6
    assert summary["perplexity"]["cor_ln_ppl"] is None  # no variance to correlate
    # As llama-perplexity: the table and a blank line, no statistics for fewer than 100 positions.
    result = run_cli(*compare)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.split("\n")
    assert len(lines) == 5 and lines[0].startswith("chunk ") and lines[3:] == ["", ""]
    assert result.stderr.splitlines()[-1] == "no summary: 6 scored positions, fewer than 100"


@pytest.fixture(scope="module")
def small_base(tiny_model: Path, text_file: Path, tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A valid base file of 2 chunks of 8 tokens (6 scored positions), as bytes to corrupt."""
    base = tmp_path_factory.mktemp("kld") / "base.kld"
    made = run_cli("perplexity", "-m", str(tiny_model), "-f", str(text_file), "-c", "8", "--chunks", "2",
                   "--kl-divergence-base", str(base))
    assert made.exit_code == 0, made.stderr
    return base.read_bytes()


def _patched(data: bytes, offset: int, values: list, dtype: str) -> bytes:
    raw = np.array(values, dtype).tobytes()
    return data[:offset] + raw + data[offset + len(raw):]


ROWS = 20 + 4 * 16  # the first stored row: after the header and the 16 tokens


@pytest.mark.parametrize(("patch", "message"), [
    # A corrupt chunk count must not make pyllama allocate 32 GiB for the tokens before the size check.
    ((16, [2**30], "<i4"), "is truncated: 12420 bytes where 1073741824 chunks of 8 tokens need 6657199308820"),
    # A smaller n_ctx than written: the rows would be read at the wrong offsets.
    ((8, [5], "<i4"), "has a corrupt header: 12420 bytes where 2 chunks of 5 tokens with a 1024-token "
                      "vocabulary take 8284"),
    ((ROWS, [1e30, 1e30], "<f4"), "holds corrupt log-probs (chunk 1)"),  # overflowed math.exp
    ((ROWS, [float("nan"), float("nan")], "<f4"), "holds corrupt log-probs (chunk 1)"),
])
def test_corrupt_base_file_is_one_line_error(tiny_model: Path, small_base: bytes, tmp_path: Path,
                                             patch: tuple, message: str) -> None:
    base = tmp_path / "bad.kld"
    base.write_bytes(_patched(small_base, *patch))
    result = run_cli("perplexity", "-m", str(tiny_model), "--kl-divergence", "--kl-divergence-base", str(base))
    assert result.exit_code == 1
    assert result.stderr.splitlines()[-2:] == [f"Error: {base} {message}", "Hint: make the base file again"]
    assert "Traceback" not in result.stderr and "Warning" not in result.stderr


# ---------------------------------------------------------------- KL divergence on a real vocabulary size


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """WIDE (32,000 tokens, peaked distributions) in F16 and Q8_0, and 700 words it finds likely
    (5 chunks of 128 tokens)."""
    folder = tmp_path_factory.mktemp("wide")
    f16 = write_llama_gguf(folder / "f16.gguf", WIDE)
    q8 = write_quantized(f16, folder / "q8_0.gguf", "Q8_0")
    text = folder / "text.txt"
    text.write_text(likely_words(f16, 700) + "\n")
    return f16, q8, text


def likely_words(model: Path, n_words: int, seed: int = 1) -> str:
    """Words the model draws itself, one at a time from its next-token distribution over the tokens
    that are a word on their own (so the text tokenizes back to exactly the drawn tokens): its PPL and
    Δp are those of a model on text it predicts, not of noise it gives a probability of 1e-7."""
    import llama_cpp

    pieces = build_vocab(WIDE)[0]
    llm = llama_cpp.Llama(str(model), n_ctx=n_words + 1, n_threads=1, verbose=False)
    words = np.array([i for i, piece in enumerate(pieces) if piece.startswith(WORD_BOUNDARY) and piece[1:].isalpha()
                      and llm.tokenize(piece[1:].encode(), add_bos=False) == [i]])
    rng = np.random.default_rng(seed)
    drawn: list[int] = []
    llm.eval([llm.token_bos()])
    for _ in range(n_words):
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits(llm.ctx), shape=(llm.n_vocab(),))
        weights = np.exp(logits[words].astype(np.float64) - logits[words].max())
        drawn.append(int(words[rng.choice(len(words), p=weights / weights.sum())]))
        llm.eval([drawn[-1]])
    text = "".join(pieces[t] for t in drawn).replace(WORD_BOUNDARY, " ")[1:]
    assert llm.tokenize(text.encode(), add_bos=False) == drawn
    return text


def test_kld_of_a_model_against_itself_on_a_large_vocabulary_is_near_zero(wide: tuple[Path, Path, Path],
                                                                          tmp_path: Path) -> None:
    f16, _, text = wide
    base = tmp_path / "base.kld"
    assert save_base(f16, text, base).exit_code == 0
    result = ppl(f16, "--kl-divergence", "--kl-divergence-base", str(base), "--json")
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)["summary"]
    # The divergence of the stored base as it is, as llama-perplexity takes it. Renormalized, it was
    # 0.000385 here: the probability mass of the tokens below -16, which is no divergence at all.
    kld = summary["kld"]
    assert abs(kld["mean"]) < 1e-6 and -1e-4 < kld["min"] < 0 < kld["max"] < 1e-4
    assert summary["count"]["positions"] == 5 * 63
    assert 100 < summary["perplexity"]["ppl"] < 1000  # the text is one the model predicts


# ---------------------------------------------------------------- HellaSwag and Winogrande


HELLASWAG = """\
The quick brown fox
1
is a small dog.
jumps over the lazy dog.
was here last day.
can make a new story.
Once upon a time there was
3
the the the the.
a good day to you.
no one here.
a small fox with a name.
What is the answer to
0
the first question?
brown brown fox fox.
lazy lazy lazy.
day day dog.
Thank you for the
2
fox fox fox.
dog was not.
good chat and the story.
old old new.
"""


def test_task_sampling_draws_what_llama_cpp_draws() -> None:
    # Orders printed by a C++ program with std::mt19937(1) and libstdc++'s distributions, as llama.cpp draws.
    assert [n for n, _ in mc.select_hellaswag(list(range(10)), 6)] == [5, 10, 7, 9, 1, 2]
    assert [n for n, _ in mc.select_hellaswag(list(range(4)), 400)] == [2, 4, 3, 1]
    assert [n for n, _ in mc.select_winogrande(list(range(10)), 4)] == [5, 9, 6, 7]


def test_hellaswag_scores_each_ending_by_its_mean_log_prob(tiny_model: Path, tmp_path: Path, llama) -> None:
    path = tmp_path / "hs.txt"
    path.write_text(HELLASWAG)
    result = ppl(tiny_model, "--hellaswag", str(path), "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert [r["file_task"] for r in data["results"]] == [2, 4, 3, 1]  # llama.cpp's draw order
    lines = HELLASWAG.splitlines()
    for r in data["results"]:
        context, endings = lines[6 * r["file_task"] - 6], lines[6 * r["file_task"] - 4:6 * r["file_task"]]
        seqs = [llama.tokenize(f"{context} {e}".encode(), add_bos=True) for e in endings]
        prefix = next(i for i in range(min(map(len, seqs))) if len({s[i] for s in seqs}) > 1)
        for seq, score in zip(seqs, r["scores"]):
            lp = log_softmax(chunk_logits(llama, seq)[prefix - 1:-1])
            assert score == pytest.approx(lp[np.arange(len(lp)), seq[prefix:]].mean(), abs=1e-4)
        assert r["chosen"] == int(np.argmax(r["scores"]))
    n_right = sum(r["correct"] for r in data["results"])
    assert data["accuracy"] == n_right / 4
    text = ppl(tiny_model, "--hellaswag", str(path), "--hellaswag-tasks", "2").stdout.splitlines()
    first = data["results"][0]["correct"]
    low, high = mc.wilson_interval(float(first), 1)
    assert text[:2] == ["task\tacc_norm\t95% confidence interval",
                        f"1\t{100.0 * first:.8f}%\t[{100 * low:.4f}%, {100 * high:.4f}%]"]
    assert text[-1].startswith("Final HellaSwag score(2 tasks): ")


WINOGRANDE = """\
index,sentence,option1,option2,answer
0,The fox was quick but the dog was lazy so _ jumps over the dog.,fox,dog,1
1,"The model has a good answer, so _ is here to tell me.",model,question,1
2,Hello there _.,world,dog,1
3,What is the name of _ dog?,your,their,2
"""


def test_winogrande_rows_and_final_score(tiny_model: Path, tmp_path: Path, llama) -> None:
    path = tmp_path / "wg.csv"
    path.write_text(WINOGRANDE)
    result = ppl(tiny_model, "--winogrande", str(path))
    assert result.exit_code == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines()[:3]]
    assert [(r[0], r[5]) for r in rows] == [("1", "1"), ("2", "1"), ("3", "1")]
    # Task 1 has more than 3 tokens after the blank: only those count, less the final ".".
    seq = llama.tokenize(b"The fox was quick but the dog was lazy so fox jumps over the dog.", add_bos=True)
    base = len(llama.tokenize(b"The fox was quick but the dog was lazy so fox", add_bos=True))
    lp = log_softmax(chunk_logits(llama, seq)[base - 1:len(seq) - 2])
    assert float(rows[0][2]) == pytest.approx(lp[np.arange(len(lp)), seq[base:len(seq) - 1]].mean(), abs=2e-6)
    n_right = sum(r[4] == r[5] for r in rows)
    p = np.float32(n_right / 3)
    assert result.stdout.splitlines()[-1] == (
        f"Final Winogrande score(3 tasks): {100 * p:.4f} +/- {100 * math.sqrt(p * (1 - p) / 2):.4f}")
    # As in llama-perplexity, the last row is not read (no newline follows it once -f drops one).
    assert "Warning: the last line of" in result.stderr


def test_bad_hellaswag_file_is_one_clear_error(tiny_model: Path, tmp_path: Path) -> None:
    path = tmp_path / "hs.txt"
    path.write_text("\n".join(HELLASWAG.splitlines()[:8]) + "\n")
    result = ppl(tiny_model, "--hellaswag", str(path))
    assert result.exit_code == 1
    assert result.first_stderr_line == "Error: a HellaSwag file has 6 lines per task; this one has 8 lines"


# ---------------------------------------------------------------- against llama-perplexity itself


def _llama_perplexity() -> Path | None:
    folder = os.environ.get("LLAMA_CPP_BIN")
    tool = Path(folder) / "llama-perplexity" if folder else None
    return tool if tool is not None and tool.is_file() else None


reference = pytest.mark.skipif(_llama_perplexity() is None, reason="set LLAMA_CPP_BIN to a folder with llama-perplexity")


def theirs(*args: str, until: tuple[str, ...]) -> str:
    """llama-perplexity's stdout and stderr. Its log thread sometimes loses lines at exit (more often on a
    loaded machine), so run it again, up to 10 times, until every string of `until` is in the output."""
    for _ in range(10):
        proc = subprocess.run([str(_llama_perplexity()), *args], check=False, capture_output=True, timeout=300)
        assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
        output = proc.stdout.decode() + proc.stderr.decode()
        if all(s in output for s in until):
            break
    return output


@pytest.mark.reference
@reference
def test_same_figures_as_llama_perplexity(tiny_model: Path, text_file: Path, tmp_path: Path) -> None:
    ours = run_cli("perplexity", "-m", str(tiny_model), "-f", str(text_file), "-c", str(N_CTX),
                   "--kl-divergence-base", str(tmp_path / "ours.kld"))
    chunks, final = ours.stdout.splitlines()
    ref = theirs("-m", str(tiny_model), "-f", str(text_file), "-c", str(N_CTX),
                 "--kl-divergence-base", str(tmp_path / "theirs.kld"), until=(chunks, final))
    assert chunks in ref and final in ref
    assert (tmp_path / "ours.kld").read_bytes() == (tmp_path / "theirs.kld").read_bytes()


def kld_output(output: str) -> list[str]:
    """llama-perplexity's KL-divergence lines: its table, from the header, to the "Same top p" line."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("chunk "))
    end = next(i for i, line in enumerate(lines) if line.startswith("Same top p:"))
    return lines[start:end + 1]


@pytest.mark.reference
@reference
def test_same_kld_table_and_summary_as_llama_perplexity(quantized: tuple[Path, Path], text_file: Path,
                                                        tmp_path: Path) -> None:
    f16, q4 = quantized
    base = tmp_path / "f16.kld"
    theirs("-m", str(f16), "-f", str(text_file), "-c", str(N_CTX), "--kl-divergence-base", str(base),
           until=("Final estimate",))
    args = ("-m", str(q4), "-c", str(N_CTX), "--kl-divergence", "--kl-divergence-base", str(base))
    ours = run_cli("perplexity", *args)
    assert ours.exit_code == 0, ours.stderr
    assert ours.stdout.splitlines() == kld_output(theirs(*args, until=("Same top p:",)))


@pytest.mark.reference
@reference
@pytest.mark.parametrize("maker", ["pyllama", "llama-perplexity"])
def test_kld_on_a_large_vocabulary_equals_llama_perplexity_s_every_line(wide: tuple[Path, Path, Path],
                                                                       tmp_path: Path, maker: str) -> None:
    f16, q8, text = wide
    base = tmp_path / "base.kld"
    make = ("-m", str(f16), "-f", str(text), "-c", str(N_CTX), "--kl-divergence-base", str(base))
    if maker == "pyllama":
        made = run_cli("perplexity", *make)
        assert made.exit_code == 0, made.stderr
    else:
        theirs(*make, until=("Final estimate",))
    # A quantization, and the model against itself; without -c too, where llama-perplexity sizes its
    # context for 512-token chunks and so evaluates 4 of these 128-token chunks per decode.
    for model, ctx in ((q8, ("-c", str(N_CTX))), (f16, ("-c", str(N_CTX))), (q8, ())):
        args = ("-m", str(model), *ctx, "--kl-divergence", "--kl-divergence-base", str(base))
        ours = run_cli("perplexity", *args)
        assert ours.exit_code == 0, ours.stderr
        assert len(ours.stdout.splitlines()) == 46
        assert ours.stdout.splitlines() == kld_output(theirs(*args, until=("Same top p:",)))


@pytest.mark.reference
@reference
def test_same_task_rows_as_llama_perplexity(tiny_model: Path, tmp_path: Path) -> None:
    hellaswag, winogrande = tmp_path / "hs.txt", tmp_path / "wg.csv"
    hellaswag.write_text(HELLASWAG)
    winogrande.write_text(WINOGRANDE)
    for flag, path in (("--hellaswag", hellaswag), ("--winogrande", winogrande)):
        rows = run_cli("perplexity", "-m", str(tiny_model), flag, str(path)).stdout.splitlines()[:-2]
        ref = theirs("-m", str(tiny_model), "-f", str(path), flag, until=(rows[-1],))
        assert rows and all(row in ref.splitlines() for row in rows)
