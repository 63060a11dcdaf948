"""Speculative decoding (--spec-type, -md): the same text as without, at temperature 0; the same
distribution at temperature > 0; and every end of generation (grammar, stop string, -n, Ctrl-C,
a full context) where it is without speculation. In complete, chat and serve --parallel 4."""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from pyllama_cli.core.generate.conversation import ChatEngine
from pyllama_cli.core.generate.generator import Generator
from pyllama_cli.core.generate.sampling import SamplingSettings
from pyllama_cli.core.generate.speculative import (
    Adaptive,
    NgramMapK,
    NgramSimple,
    Speculation,
    SpeculativeSettings,
    open_speculation,
)
from pyllama_cli.core.model.native import Context, Model
from pyllama_cli.core.model.settings import LoadSettings
from pyllama_cli.core.serving.jobs import GenerationJob
from pyllama_cli.core.serving.scheduler import ParallelEngine
from tests.fixtures.make_gguf import CHATML_TEMPLATE, TINY, write_llama_gguf
from tests.helpers import run_cli
from tests.test_serve import Server, _start

LOAD = LoadSettings(n_ctx=1024, n_threads=1)
GREEDY = SamplingSettings(temperature=0.0)
YES_NO = 'root ::= ("yes" | "no") " " [a-z ]{1,30}'
# 20 prompts: plain ones, one with a grammar, some with stop strings and short -n budgets.
WORDS = "the quick brown fox jumps over the lazy dog hello world once upon a time there was".split()
CASES = [(" ".join(WORDS[i:i + 3 + i % 4]), {}) for i in range(14)] + [
    ("the fox", {"stop": ("las",)}),
    ("hello world", {"stop": ("J", "vi")}),
    ("once upon", {"max_tokens": 7}),
    ("a time", {"max_tokens": 1}),
    ("Is the sky blue?", {"grammar": YES_NO}),
    ("yes or no:", {"grammar": YES_NO, "stop": ("e",)}),
]


@pytest.fixture(scope="module")
def draft_models(models_dir: Path) -> dict[str, Path]:
    """The target's own weights (a draft it always agrees with), other weights on the same vocabulary
    (a draft it rejects), and a model with another vocabulary."""
    return {
        "other": write_llama_gguf(models_dir / "tiny-other-seed.gguf", replace(TINY, seed=7)),
        "vocab": write_llama_gguf(models_dir / "tiny-other-vocab.gguf", replace(TINY, n_vocab_pieces=TINY.n_vocab_pieces
                                                                                  - 24)),
    }


@pytest.fixture(scope="module")
def target(tiny_model: Path) -> Iterator[tuple[Model, Context]]:
    model = Model.load(tiny_model, LOAD)
    ctx = Context(model, LOAD)
    yield model, ctx
    ctx.close()
    model.close()


def _variants(tiny_model: Path, draft_models: dict[str, Path]) -> dict[str, SpeculativeSettings]:
    return {
        "ngram-simple": SpeculativeSettings("ngram-simple", ngram_size_n=2),
        "ngram-map-k": SpeculativeSettings("ngram-map-k", ngram_size_n=2, ngram_size_m=8),
        "md-same": SpeculativeSettings("draft-simple", n_max=6, draft_path=tiny_model),
        "md-other": SpeculativeSettings("draft-simple", n_max=4, draft_path=draft_models["other"]),
    }


def _generate(gen: Generator, prompt: str, sampling: SamplingSettings = GREEDY, max_tokens: int = 24,
              **kwargs: object) -> tuple[str, object]:
    ids = [int(t) for t in gen.model.tokenize(prompt.encode())]
    gen.reset()
    text = "".join(gen.stream(ids, replace(sampling, grammar=kwargs.pop("grammar", None)), max_tokens=max_tokens,
                              **kwargs))
    return text, gen.stats


def _speculation(spec: SpeculativeSettings, model: Model, n_ctx: int) -> Speculation:
    speculation = open_speculation(spec, LOAD, model, n_ctx_seq=n_ctx)
    assert speculation is not None
    return speculation


# ---------------------------------------------------------------- complete: the same text


def test_greedy_text_is_the_same_with_each_spec_type_over_20_prompts(target, tiny_model, draft_models) -> None:
    model, ctx = target
    plain = Generator(model, ctx)
    expected = [_generate(plain, prompt, **dict(extra)) for prompt, extra in CASES]
    plain.close()
    assert {stats.stop_reason for _, stats in expected} >= {"length", "stop", "grammar"}
    for name, spec in _variants(tiny_model, draft_models).items():
        speculation = _speculation(spec, model, ctx.n_ctx)
        gen = Generator(model, ctx, speculation)
        try:
            got = [_generate(gen, prompt, **dict(extra)) for prompt, extra in CASES]
        finally:
            gen.close()
            speculation.close()
        for (prompt, _), (text, stats), (want, want_stats) in zip(CASES, got, expected):
            assert (text, stats.tokens, stats.stop_reason) == (want, want_stats.tokens, want_stats.stop_reason), \
                (name, prompt)
        drafted = sum(stats.n_drafted for _, stats in got)
        accepted = sum(stats.n_draft_accepted for _, stats in got)
        assert drafted > 0, name
        if name == "md-same":  # the target's own weights: the target takes every drafted token of a free run
            free = [stats for (_, extra), (_, stats) in zip(CASES, got) if not extra and stats.stop_reason == "length"]
            assert len(free) >= 10 and all(s.n_draft_accepted == s.n_drafted > 0 for s in free)
        elif name == "md-other":  # a draft the target always rejects still gives the same text
            assert accepted == 0
        else:
            assert 0 < accepted <= drafted, name


def test_complete_prints_the_same_text_and_the_acceptance_in_stats(tiny_model: Path) -> None:
    args = ("complete", "-m", str(tiny_model), "-p", "the quick brown fox", "-n", "40", "--temp", "0", "-c", "256")
    plain = run_cli(*args)
    spec = run_cli(*args, "--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "2", "--json")
    assert plain.exit_code == spec.exit_code == 0
    assert spec.stdout == plain.stdout
    stats = json.loads(spec.stderr.strip().splitlines()[-1])
    assert stats["draft_tokens"] > 0 and 0 < stats["draft_accepted"] <= stats["draft_tokens"]
    assert stats["draft_acceptance"] == round(stats["draft_accepted"] / stats["draft_tokens"], 4)
    text = run_cli(*args, "-md", str(tiny_model), "--stats")
    assert text.stdout == plain.stdout
    # The target's own weights as the draft: every drafted token is accepted.
    assert re.search(r"^speculative: (\d+)/\1 drafted tokens accepted \(100\.0%\)$", text.stderr, re.MULTILINE)
    small_batch = run_cli(*args, "-md", str(tiny_model), "-b", "4")  # a step's decode holds 1 + 3 drafted at most
    assert (small_batch.exit_code, small_batch.stdout) == (0, plain.stdout)


def test_a_draft_model_with_another_vocabulary_is_one_error_line(tiny_model: Path, draft_models) -> None:
    result = run_cli("complete", "-m", str(tiny_model), "-p", "hi", "-n", "4", "-md", str(draft_models["vocab"]))
    assert result.exit_code != 0
    assert result.first_stderr_line == ("Error: the draft model's vocabulary differs from the target's: 1000 tokens "
                                        "against 1024")
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(("args", "message"), [
    (("--spec-type", "ngram-cache"), "Error: --spec-type ngram-cache is not implemented in pyllama"),
    (("--spec-type", "draft-simple"), "Error: --spec-type draft-simple needs a draft model"),
    (("-md", "a.gguf", "-hfd", "u/r"), "Error: give either -md/--model-draft or -hfd/--hf-repo-draft, not both"),
])
def test_bad_speculative_flags_are_one_error_line(tiny_model: Path, args: tuple[str, ...], message: str) -> None:
    result = run_cli("complete", "-m", str(tiny_model), "-p", "hi", *args)
    assert result.exit_code == 1
    assert result.first_stderr_line == message


def test_an_embeddings_server_refuses_speculation(tiny_model: Path) -> None:
    result = run_cli("serve", "-m", str(tiny_model), "--embeddings", "--spec-type", "ngram-simple")
    assert result.exit_code == 1
    assert result.first_stderr_line == ("Error: --spec-type and -md speed up generation; an --embeddings server "
                                        "generates nothing")


# ---------------------------------------------------------------- the drafters


def test_ngram_drafters_copy_what_followed_the_last_ngram() -> None:
    history = [5, 6, 7, 8, 9, 5, 6, 7, 1, 2, 5, 6]
    assert NgramSimple(2, 4).draft(history, 16) == [7, 1, 2, 5]  # the latest earlier "5 6" was followed by 7 1 2 5
    assert NgramSimple(2, 4).draft(history, 2) == [7, 1]
    assert NgramSimple(3, 4).draft(history, 16) == []  # "2 5 6" never came before
    assert NgramSimple(2, 5).draft([1, 2, 3, 1, 2], 16) == [3, 1, 2, 3, 1]  # a loop is drafted past its period
    # map-k counts continuations: "5 6" -> 7 twice, so 7 and what followed its latest occurrence.
    mapk = NgramMapK(2, 3, min_hits=2)
    assert mapk.draft(history, 16) == [7, 1, 2]
    assert NgramMapK(2, 3, min_hits=3).draft(history, 16) == []
    assert mapk.draft([1, 2, 3, 1, 2], 16) == []  # a new sequence is indexed from scratch


def test_draft_length_adapts_to_what_the_model_accepts() -> None:
    adaptive = Adaptive(NgramSimple(1, 48))
    loop = [7, 8] * 20
    assert len(adaptive.draft(loop, 16)) == 16  # the first draft is as long as allowed
    adaptive.feedback(16, 3)
    assert len(adaptive.draft(loop, 16)) == 4  # one more than was accepted
    adaptive.feedback(4, 4)
    assert len(adaptive.draft(loop, 16)) == 8  # twice as long after a draft accepted whole
    adaptive.feedback(8, 0)
    assert len(adaptive.draft(loop, 16)) == 1


# ---------------------------------------------------------------- temperature > 0: the same distribution

ALPHA = 0.01
Z_99 = 2.3263  # the standard normal's upper 1% point


def chi2_critical(df: int) -> float:
    """The chi-square distribution's upper ALPHA point (Wilson-Hilferty: within 1% for df >= 2; 6.635 for df 1)."""
    if df == 1:
        return 6.635
    k = 2 / (9 * df)
    return df * (1 - k + Z_99 * math.sqrt(k)) ** 3

N_SEEDS = 300
POSITION = 3  # the 4th generated token: sampled along a draft (the first two never are)


def _chi_square(a: Counter, b: Counter, min_expected: float = 5.0) -> tuple[float, int]:
    """Pearson's two-sample statistic over categories (rare ones pooled) and its degrees of freedom."""
    total_a, total_b = sum(a.values()), sum(b.values())
    keep = [k for k in a | b if (a[k] + b[k]) * min(total_a, total_b) / (total_a + total_b) >= min_expected]
    rows = [(a[k], b[k]) for k in keep]
    rest = (total_a - sum(x for x, _ in rows), total_b - sum(y for _, y in rows))
    if sum(rest):
        rows.append(rest)
    stat = 0.0
    for x, y in rows:
        for observed, total in ((x, total_a), (y, total_b)):
            expected = (x + y) * total / (total_a + total_b)
            stat += (observed - expected) ** 2 / expected
    return stat, len(rows) - 1


def _tokens_at(gen: Generator, ids: list[int], sampling: SamplingSettings, seeds: range) -> Counter:
    counts: Counter = Counter()
    for seed in seeds:
        list(gen.stream(ids, replace(sampling, seed=seed), max_tokens=POSITION + 1))
        counts[tuple(gen.stats.tokens[POSITION:POSITION + 1])] += 1
    return counts


@pytest.fixture(scope="module")
def peaked_model(models_dir: Path) -> Path:
    """Peaked next-token distributions, as a trained model's are: a greedy draft is often, not always, right."""
    return write_llama_gguf(models_dir / "tiny-peaked.gguf", replace(TINY, logit_scale=6.0))


def test_sampled_distribution_is_the_same_with_speculation(peaked_model: Path) -> None:
    """Chi-square test of homogeneity at alpha = 0.01: the token at a fixed position, over many seeds,
    without speculation and with a draft model (the same weights, drafting greedily)."""
    model = Model.load(peaked_model, LOAD)
    ctx = Context(model, replace(LOAD, n_ctx=128))
    sampling = SamplingSettings(temperature=1.0, top_k=4, top_p=1.0, min_p=0.0)
    ids = [int(t) for t in model.tokenize(b"the quick brown")]
    speculation = _speculation(SpeculativeSettings("draft-simple", n_max=3, draft_path=peaked_model), model, 128)
    plain, spec = Generator(model, ctx), Generator(model, ctx, speculation)
    try:
        without = _tokens_at(plain, ids, sampling, range(N_SEEDS))
        with_spec = _tokens_at(spec, ids, sampling, range(N_SEEDS, 2 * N_SEEDS))
        stat, df = _chi_square(without, with_spec)
        assert df >= 2, without  # enough categories for the test to mean something
        assert stat < chi2_critical(df), (stat, df, without, with_spec)
        # The same test tells a different distribution apart: temperature 0.3 instead of 1.0.
        cooler = _tokens_at(plain, ids, replace(sampling, temperature=0.3), range(N_SEEDS))
        stat, df = _chi_square(without, cooler)
        assert stat > chi2_critical(df), (stat, df, without, cooler)
    finally:
        plain.close()
        spec.close()
        speculation.close()
        ctx.close()
        model.close()
    assert spec.stats.n_drafted > 0


# ---------------------------------------------------------------- Ctrl-C and a full context


def test_interrupt_during_speculation_stops_where_it_does_without(target, tiny_model) -> None:
    model, ctx = target
    speculation = _speculation(SpeculativeSettings("draft-simple", n_max=8, draft_path=tiny_model), model, ctx.n_ctx)
    results = []
    for gen in (Generator(model, ctx), Generator(model, ctx, speculation)):
        seen: list[int] = []
        text, stats = _generate(gen, "the quick brown fox", max_tokens=40, on_token=seen.append,
                                stop_flag=lambda seen=seen: len(seen) >= 5)  # Ctrl-C after the 5th token
        results.append((text, list(stats.tokens), stats.stop_reason))
        again = _generate(gen, "the quick brown fox", max_tokens=8)  # the KV cache holds what `cached` says
        results.append(again[0])
        gen.close()
    speculation.close()
    assert results[0][2] == "interrupted" and len(results[0][1]) == 5
    assert results[2:] == results[:2]


def test_a_full_context_during_speculation_ends_as_without(tiny_model: Path) -> None:
    model = Model.load(tiny_model, LOAD)
    ctx = Context(model, replace(LOAD, n_ctx=64))  # llama.cpp makes it 256, its smallest
    n_ctx = ctx.n_ctx
    speculation = _speculation(SpeculativeSettings("draft-simple", n_max=16, draft_path=tiny_model), model, n_ctx)
    results = []
    try:
        for gen in (Generator(model, ctx), Generator(model, ctx, speculation)):
            text, stats = _generate(gen, "the quick brown fox", max_tokens=-1,
                                    sampling=replace(GREEDY, ignore_eos=True))
            results.append((text, list(stats.tokens), stats.stop_reason, list(gen.cached)))
            gen.close()
    finally:
        speculation.close()
        ctx.close()
        model.close()
    assert results[0][2] == "context" and len(results[0][3]) == n_ctx  # the last token took the last position
    assert results[1] == results[0]


# ---------------------------------------------------------------- chat


def test_chat_turns_are_the_same_with_speculation(target, tiny_model: Path) -> None:
    model, ctx = target
    turns = ["hello there", "say it again", "once more with the fox"]

    def converse(speculation: Speculation | None) -> list[tuple[str, int]]:
        engine = ChatEngine(model, ctx, CHATML_TEMPLATE, "chatml", speculation)
        engine.generator.reset()
        messages: list[dict] = []
        answers = []
        for turn in turns:
            messages.append({"role": "user", "content": turn})
            answer = "".join(engine.answer(messages, GREEDY, max_tokens=30, stop=("las",)))
            messages.append({"role": "assistant", "content": answer})
            answers.append((answer, engine.stats.n_drafted))
        engine.close()  # closes the speculation too
        return answers

    plain = converse(None)
    spec = converse(_speculation(SpeculativeSettings("ngram-simple", ngram_size_n=2), model, ctx.n_ctx))
    assert [a for a, _ in spec] == [a for a, _ in plain]
    assert sum(n for _, n in spec) > 0


def test_chat_stats_line_shows_the_drafts(tiny_model: Path) -> None:
    args = ("chat", "-m", str(tiny_model), "-n", "30", "--temp", "0", "-c", "256")
    plain = run_cli(*args, stdin="hello there\nsay it again\n")
    spec = run_cli(*args, "-md", str(tiny_model), stdin="hello there\nsay it again\n")
    assert plain.exit_code == spec.exit_code == 0
    assert spec.stdout == plain.stdout
    first, second = spec.stderr.strip().splitlines()
    assert re.search(r"\| Draft: (\d+)/\1 \(100%\) \| Context: 51/256 \]$", first), first
    # The second answer ends at <|im_end|> after two tokens: drafted tokens past it are not accepted.
    assert re.search(r"\| Draft: 2/16 \(12%\) \| Context: 78/256 \]$", second), second


# ---------------------------------------------------------------- serve --parallel 4


def _serve_all(tiny_model: Path, spec: SpeculativeSettings | None) -> list[tuple[str, str, int, int]]:
    engine = ParallelEngine(tiny_model, LoadSettings(n_ctx=2048, n_threads=1), n_slots=4, speculative=spec)
    engine.start()
    deadline = time.monotonic() + 60
    while engine.state == "loading" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.ready, engine.error

    async def one(prompt: str, extra: dict) -> tuple[str, str, int, int]:
        ids = engine.tokenize(prompt)
        sampling = replace(GREEDY, grammar=extra.get("grammar"))
        job = GenerationJob(prompt=tuple(ids), sampling=sampling, max_tokens=extra.get("max_tokens", 24),
                            stop=extra.get("stop", ()))
        text, stats = "", None
        async for event in engine.submit(job):
            text += event.text
            stats = event.stats or stats
        return text, stats.stop_reason, stats.n_drafted, stats.n_draft_accepted

    async def main() -> list[tuple[str, str, int, int]]:
        return await asyncio.gather(*[one(prompt, extra) for prompt, extra in CASES])

    try:
        return asyncio.run(main())
    finally:
        engine.close()


def test_serve_parallel_4_gives_the_same_text_with_each_spec_type(tiny_model: Path, draft_models) -> None:
    expected = _serve_all(tiny_model, None)
    for name, spec in _variants(tiny_model, draft_models).items():
        got = _serve_all(tiny_model, spec)
        assert [g[:2] for g in got] == [e[:2] for e in expected], name
        assert sum(g[2] for g in got) > 0, name
        if name == "md-other":
            assert sum(g[3] for g in got) == 0


@pytest.fixture(scope="module")
def spec_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = _start(tiny_model, tmp_path_factory.mktemp("serve-spec") / "stderr.log", "-np", "4", "-md",
                 str(tiny_model), "--spec-draft-n-max", "8")
    yield srv
    srv.stop()


def test_serve_reports_drafts_in_timings_and_metrics(spec_server: Server) -> None:
    body = {"prompt": "the quick brown fox", "max_tokens": 20, "temperature": 0, "ignore_eos": True}
    answer = httpx.post(f"{spec_server.url}/v1/completions", json=body, timeout=60).json()
    assert answer["usage"]["completion_tokens"] == 20
    timings = answer["timings"]
    assert timings["predicted_n"] == 20
    # The first token comes from the prompt; then steps of 1 + 8 drafted, 1 + 8, and 1 (the -n budget's last).
    assert timings["draft_n"] == timings["draft_n_accepted"] == 16
    chunks = []
    with httpx.stream("POST", f"{spec_server.url}/v1/chat/completions", timeout=60,
                      json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10, "temperature": 0,
                            "stream": True}) as resp:
        chunks = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: {")]
    assert chunks[-1]["choices"][0]["finish_reason"] is not None
    assert chunks[-1]["timings"]["draft_n"] == chunks[-1]["timings"]["draft_n_accepted"] > 0
    metrics = httpx.get(f"{spec_server.url}/metrics").text
    drafted = int(next(line.split()[1] for line in metrics.splitlines()
                       if line.startswith("pyllama_draft_tokens_total ")))
    accepted = int(next(line.split()[1] for line in metrics.splitlines()
                        if line.startswith("pyllama_draft_tokens_accepted_total ")))
    assert drafted == accepted >= 16 + chunks[-1]["timings"]["draft_n"]
