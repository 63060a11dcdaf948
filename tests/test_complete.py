"""`pyllama complete` on the tiny model: reproducible sampling, grammars, schemas, stop strings, prompt cache."""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pyllama_cli.core.constrain.grammar import check_grammar, load_shipped, shipped_grammars
from pyllama_cli.errors import InputError
from tests.helpers import REPO_ROOT, CliResult, default_sigint, run_cli
from tests.test_schema import llama_cpp_parses

# One thread and a small context keep each run at a few tens of milliseconds on a busy machine.
FAST = ("-t", "1", "-c", "512")
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}},
          "required": ["ok", "n"]}
LONG_PROMPT = " ".join(["the quick brown fox jumps over the lazy dog"] * 20)


def complete(model: Path, *args: str, stdin: str = "") -> CliResult:
    return run_cli("complete", "-m", str(model), *FAST, *args, stdin=stdin)


def stats_of(result: CliResult) -> dict:
    """The `--stats --json` line: the last line on stderr."""
    return json.loads(result.stderr.strip().splitlines()[-1])


# --- reproducibility and output ----------------------------------------------------------------


def test_same_seed_gives_identical_output_and_other_seeds_differ(tiny_model: Path) -> None:
    first = complete(tiny_model, "-p", "Hello world", "-n", "24", "-s", "7")
    again = complete(tiny_model, "-p", "Hello world", "-n", "24", "-s", "7")
    other = complete(tiny_model, "-p", "Hello world", "-n", "24", "-s", "8")
    assert first.exit_code == again.exit_code == other.exit_code == 0
    assert first.stdout and first.stdout == again.stdout
    assert other.stdout != first.stdout
    assert first.stderr == ""  # nothing but the text, and only on stdout


def test_seed_4294967295_is_random_and_reports_the_seed_that_reproduces_it(tiny_model: Path) -> None:
    # llama.cpp reads 4294967295 (LLAMA_DEFAULT_SEED, its -1) as "draw a seed": the seed shown must be the one drawn.
    first = complete(tiny_model, "-p", "Hello world", "-n", "24", "-s", "4294967295", "--json")
    seed = stats_of(first)["seed"]
    assert 0 <= seed < 4294967295
    again = complete(tiny_model, "-p", "Hello world", "-n", "24", "-s", str(seed))
    assert (first.exit_code, again.stdout) == (0, first.stdout)


def test_stats_go_to_stderr_and_leave_stdout_alone(tiny_model: Path) -> None:
    plain = complete(tiny_model, "-p", "Hello world", "-n", "10", "-s", "3")
    with_stats = complete(tiny_model, "-p", "Hello world", "-n", "10", "-s", "3", "--stats")
    assert with_stats.stdout == plain.stdout
    labels = [line.split(":")[0] for line in with_stats.stderr.strip().splitlines()]
    assert labels == ["prompt", "generation", "first token", "stop reason", "seed"]
    assert "stop reason: length" in with_stats.stderr


def test_json_stats_shape(tiny_model: Path) -> None:
    stats = stats_of(complete(tiny_model, "-p", "Hello world", "-n", "10", "-s", "3", "--stats", "--json"))
    assert stats["prompt_tokens"] == 3  # <s> ▁hello ▁world
    assert (stats["generated_tokens"], stats["stop_reason"], stats["seed"]) == (10, "length", 3)
    assert {"prompt_tps", "generation_tps", "ttft_ms", "cached_tokens", "truncated_tokens"} <= set(stats)


def test_piped_stdin_follows_the_prompt(tiny_model: Path) -> None:
    piped = complete(tiny_model, "-p", "Summarize:", "-n", "12", "-s", "4", stdin="hello world")
    joined = complete(tiny_model, "-p", "Summarize:\nhello world", "-n", "12", "-s", "4")
    assert piped.exit_code == 0 and piped.stdout == joined.stdout


def test_a_final_newline_of_a_file_or_of_stdin_is_not_part_of_the_prompt(tiny_model: Path, tmp_path: Path) -> None:
    # As llama.cpp's -f: `echo TEXT |`, `cat FILE |` and -f FILE all give the prompt -p TEXT gives.
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Hello world\n")
    runs = [complete(tiny_model, "-p", "Hello world", "-n", "6", "-s", "2", "--json"),
            complete(tiny_model, "-f", str(prompt), "-n", "6", "-s", "2", "--json"),
            complete(tiny_model, "-n", "6", "-s", "2", "--json", stdin="Hello world\n")]
    assert [stats_of(r)["prompt_tokens"] for r in runs] == [3, 3, 3]  # <s> ▁hello ▁world
    assert runs[1].stdout == runs[2].stdout == runs[0].stdout
    prompt.write_text("Hello world\n\n")  # only the last line's newline goes
    assert stats_of(complete(tiny_model, "-f", str(prompt), "-n", "1", "--json"))["prompt_tokens"] == 4


def test_escapes_in_the_prompt_and_stop_texts_are_processed_as_llama_cpp_does(tiny_model: Path,
                                                                               tmp_path: Path) -> None:
    typed = complete(tiny_model, "-p", "a\\tb\\x41", "-n", "1", "-s", "1", "--echo")
    assert typed.stdout.startswith("a\tbA")
    assert complete(tiny_model, "-p", "a\\tb", "-n", "1", "-s", "1", "--echo", "--no-escape").stdout.startswith("a\\tb")
    prompt = tmp_path / "p.txt"
    prompt.write_text("a\\tb\n")
    assert complete(tiny_model, "-f", str(prompt), "-n", "1", "-s", "1", "--echo").stdout.startswith("a\tb")
    # Piped text is data: taken as it is, after the (unescaped) -p text.
    piped = complete(tiny_model, "-p", "x\\ty", "-n", "1", "-s", "1", "--echo", stdin="c\\td\n")
    assert piped.stdout.startswith("x\ty\nc\\td")
    # -r texts too: "\\x71" stops at the first "q" the model writes.
    free = complete(tiny_model, "-p", "Hello", "-n", "40", "-s", "4", "--ignore-eos").stdout
    assert "q" in free[1:]
    stopped = complete(tiny_model, "-p", "Hello", "-n", "40", "-s", "4", "--ignore-eos", "-r", "\\x71")
    assert stopped.stdout == free[:free.index("q")]


def test_dash_as_the_prompt_file_reads_stdin(tiny_model: Path) -> None:
    dash = complete(tiny_model, "-f", "-", "-n", "6", "-s", "2", stdin="Hello world\n")
    direct = complete(tiny_model, "-p", "Hello world", "-n", "6", "-s", "2")
    assert (dash.exit_code, dash.stderr) == (0, "")
    assert dash.stdout == direct.stdout


def test_echo_prints_the_prompt_first(tiny_model: Path) -> None:
    plain = complete(tiny_model, "-p", "Hello world", "-n", "6", "-s", "2")
    echoed = complete(tiny_model, "-p", "Hello world", "-n", "6", "-s", "2", "--echo")
    assert echoed.stdout == "Hello world" + plain.stdout


def test_chat_wraps_the_prompt_in_the_template(tiny_model: Path) -> None:
    result = complete(tiny_model, "--chat", "-sys", "Be brief.", "-p", "hi", "-n", "4", "-s", "1", "--echo")
    assert result.exit_code == 0
    assert result.stdout.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                                    "<|im_start|>assistant\n")


def test_logit_bias_forces_a_token(tiny_model: Path) -> None:
    # Token 263 is "▁hello": with a huge bias and greedy sampling it is picked every time.
    result = complete(tiny_model, "-p", "x", "-n", "3", "--temp", "0", "--logit-bias", "263+100")
    assert result.stdout == " hello hello hello"


# --- constrained output ------------------------------------------------------------------------


def test_yes_no_grammar_over_20_seeds(tiny_model: Path) -> None:
    for seed in range(20):
        result = complete(tiny_model, "-p", "Is the sky blue?", "-n", "16", "-s", str(seed), "--grammar", "yes_no",
                          "--stats", "--json")
        assert result.stdout in ("yes", "no"), (seed, result.stdout)
        assert stats_of(result)["stop_reason"] == "grammar"


def test_inline_grammar(tiny_model: Path) -> None:
    for seed in range(5):
        result = complete(tiny_model, "-p", "Answer:", "-n", "16", "-s", str(seed), "--grammar", 'root ::= "yes" | "no"')
        assert result.stdout in ("yes", "no"), (seed, result.stdout)


def test_json_schema_over_20_seeds(tiny_model: Path) -> None:
    for seed in range(20):
        result = complete(tiny_model, "-p", "JSON:", "-n", "200", "-s", str(seed), "-j", json.dumps(SCHEMA))
        value = json.loads(result.stdout)
        assert set(value) == {"ok", "n"}, (seed, result.stdout)
        assert isinstance(value["ok"], bool) and type(value["n"]) is int, (seed, result.stdout)


def test_json_schema_file(tiny_model: Path, tmp_path: Path) -> None:
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    result = complete(tiny_model, "-p", "JSON:", "-n", "200", "-s", "1", "-jf", str(schema))
    assert isinstance(json.loads(result.stdout)["ok"], bool)


@pytest.mark.parametrize("name", ["json", "json_arr", "list", "yes_no", "arithmetic", "c_identifier", "chess"])
def test_shipped_grammars_run_in_llama_cpp(tiny_model: Path, name: str) -> None:
    result = complete(tiny_model, "-p", "Go:", "-n", "24", "-s", "1", "--grammar", name)
    assert result.exit_code == 0, result.stderr
    assert result.stdout


def test_shipped_grammars_are_all_found_and_valid() -> None:
    assert set(shipped_grammars()) >= {"json", "json_arr", "list", "yes_no", "arithmetic", "c_identifier", "chess"}
    for name in shipped_grammars():
        check_grammar(load_shipped(name), name)


def test_grammar_error_names_line_and_column_before_loading_the_model(tmp_path: Path) -> None:
    missing_model = tmp_path / "no-such-model.gguf"
    result = run_cli("complete", "-m", str(missing_model), "-p", "x", "--grammar", 'root ::= "yes" |\n  "no')
    assert result.exit_code == 1
    assert result.first_stderr_line == "Error: --grammar: unterminated string literal at line 2, column 3"


@pytest.mark.parametrize(("grammar", "message"), [
    ('root ::= answer', "rule 'answer' is used but never defined at line 1, column 10"),
    ('root :: "a"', "expected '::=' after rule name 'root', found ':' at line 1, column 6"),
    ('root ::= root "a"', "rule 'root' is left-recursive, which llama.cpp cannot run at line 1, column 1"),
    ('root ::= [a-z', "unterminated character class at line 1, column 10"),
    ('root ::= "a"{3,1}', "repetition {3,1} has a maximum below its minimum at line 1, column 13"),
    ('root ::= "\\q"', "unknown escape \\q at line 1, column 11"),
    ('x ::= "a"', "the grammar has no 'root' rule at line 1, column 10"),
    ('root ::= "a"{,3}', "a repetition needs its minimum count first, as in {2}, {0,3} or {2,} at line 1, column 13"),
    ('root ::= "a"{100}{100}', "repetition {100} repeats an item of 100 rules 100 times: 10000 rules, more than "
                               "llama.cpp's limit of 2000 at line 1, column 18"),
    ('root ::= ("a"{0,100}){0,100}', "repetition {0,100} repeats an item of 101 rules 100 times: 10100 rules, more "
                                     "than llama.cpp's limit of 2000 at line 1, column 22"),
    ('root ::= "a"{0,50}{0,50}', "repetition {0,50} repeats an item of 50 rules 50 times: 2500 rules, more than "
                                 "llama.cpp's limit of 2000 at line 1, column 19"),
    ('root ::= ("a"{0,2000})?', "repetition ? repeats an item of 2001 rules, more than llama.cpp's limit of 2000 "
                                "at line 1, column 23"),
    ('root ::= "a" [z-a]', "character range z-a runs backwards, so it matches nothing at line 1, column 15"),
    ('root ::= [a-c\\x7f-\\x00]', "character range \\x7f-\\x00 runs backwards, so it matches nothing at line 1, "
                                "column 14"),
    ('root ::= [^\\x00-\\U0010FFFF]', "character class [^\\x00-\\U0010FFFF] matches no character at line 1, "
                                    "column 10"),
    ('root ::= [^\\x00-a] | [^b-\\U0010FFFF\\x00-a]',
     "character class [^b-\\U0010FFFF\\x00-a] matches no character at line 1, column 22"),
    ('root ::= [\\U00110000]', "\\U00110000 is past U+10FFFF, the last Unicode character at line 1, column 11"),
    ('root ::= "ok"\nx ::= "\\UFFFFFFFF"', "\\UFFFFFFFF is past U+10FFFF, the last Unicode character at line 2, "
                                          "column 8"),
    ('root ::= "\udcff"', "the grammar is not valid UTF-8 at line 1, column 11"),
    ('root ::= <[12a]>', "<[12a]> is not a token id reference at line 1, column 10"),
    ('root ::= "a" !<[]>', "<[]> is not a token id reference at line 1, column 15"),
])
def test_grammar_checker_messages(grammar: str, message: str) -> None:
    with pytest.raises(InputError) as exc:
        check_grammar(grammar, "g")
    assert exc.value.message == f"g: {message}"


@pytest.mark.parametrize(("grammar", "message"), [
    ('root ::= "a" <[99999]>', "token <[99999]> is past the model's vocabulary (ids 0..1023) at line 1, column 14"),
    ('root ::= ( "a"\n  | !<[1024]> "b" )', "token <[1024]> is past the model's vocabulary (ids 0..1023) at line 2, "
                                           "column 6"),
    ('root ::= <|im_end|> <|nope|>', "<|nope|> is not one token of the model's vocabulary at line 1, column 21"),
])
def test_token_references_the_model_lacks_are_one_error_line(tiny_model: Path, grammar: str, message: str) -> None:
    result = complete(tiny_model, "-p", "x", "-n", "4", "--grammar", grammar)
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [f"Error: grammar: {message}",
                                          "Hint: pyllama tokenize -m MODEL -p TEXT shows the tokens a text is made of"]


def test_token_references_the_model_has_run(tiny_model: Path) -> None:
    im_end = int(json.loads(run_cli("tokenize", "-m", str(tiny_model), "-p", "<|im_end|>", "--ids").stdout)[-1])
    result = complete(tiny_model, "-p", "x", "-n", "4", "--grammar", f'root ::= "ok" ( <|im_end|> | <[{im_end}]> )',
                      "--stats", "--json")
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "ok"  # the end-of-turn token ends the text, as it does without a grammar


def test_repetition_limit_error_suggests_a_rule_of_its_own(tmp_path: Path) -> None:
    result = run_cli("complete", "-m", str(tmp_path / "missing.gguf"), "-p", "x", "--grammar", 'root ::= "a"{100}{100}')
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        "Error: --grammar: repetition {100} repeats an item of 100 rules 100 times: 10000 rules, more than llama.cpp's "
        "limit of 2000 at line 1, column 18",
        'Hint: a rule reference counts as one rule: give the repeated item a rule of its own, e.g. row ::= "a"{100} '
        "and then row{100}"]


# Around llama.cpp's limits: each is taken by llama.cpp exactly when the checker passes it.
LIMIT_GRAMMARS = [
    'root ::= "a"{0,40}{0,50}', 'root ::= "a"{0,40}{0,51}', 'root ::= "a"{2000}', 'root ::= "a"{2001}',
    'root ::= "a"{0,2000}', 'root ::= "a"{0,2001}{0,3}', 'root ::= "a"{2,}{2000}', 'root ::= "a"{2,3000}{2}',
    'root ::= (("a")){1000}', 'root ::= ((("a"))){1000}', 'root ::= (("a")){0,1000}', 'root ::= (("a")){0,1001}',
    'root ::= (x y){666}\nx ::= "a"\ny ::= "b"', 'root ::= (x y){667}\nx ::= "a"\ny ::= "b"',
    'x ::= "a"\ny ::= "b"\nroot ::= (x y){1000}', 'row ::= "a"{100}\nroot ::= row{100}',
    'root ::= ("a"{0,999})?', 'root ::= ("a"{0,1999})*', 'root ::= ("a"{0,1999})+', 'root ::= ("a"{0,2000})*',
    'root ::= "a"{,3}', 'root ::= ("a"{\n2})', 'root ::= "a"{\n2}', 'root ::= [a\\-z]+',
    'root ::= ("a"{0,50} "b"{0,50}){0,19}', 'root ::= ("a"{0,50} "b"{0,50}){0,20}',
    'root ::= [^\\x02-\\U0010FFFF]', 'root ::= [^b-\\U0010FFFF\\x00-\\x60]', 'root ::= [\\U0010FFFF]',
]


def _checker_passes(grammar: str) -> bool:
    try:
        check_grammar(grammar)
    except InputError:
        return False
    return True


def test_checker_agrees_with_llama_cpp_near_its_limits(tiny_model: Path) -> None:
    verdicts = llama_cpp_parses(tiny_model, LIMIT_GRAMMARS)
    for grammar, accepted in zip(LIMIT_GRAMMARS, verdicts):
        assert _checker_passes(grammar) == accepted, grammar
    assert 0 < sum(verdicts) < len(verdicts)


def test_checker_agrees_with_llama_cpp_on_random_repeats(tiny_model: Path) -> None:
    rng = random.Random(3)
    counts = [0, 1, 2, 10, 50, 99, 100, 101, 999, 1000, 1001, 1999, 2000, 2001, 2500]

    def repeat() -> str:
        low, high = rng.choice(counts), rng.choice([None, 0, *counts])
        return rng.choice(["*", "+", "?", f"{{{low}}}", f"{{{low},}}", f"{{{low},{low + (high or 0)}}}"])

    def item(depth: int) -> str:
        if depth < 3 and rng.random() < 0.35:
            return "(" + " | ".join(sequence(depth + 1) for _ in range(rng.randint(1, 2))) + ")"
        return rng.choice(['"a"', '"bc"', "[a-c]", "x", "."])

    def sequence(depth: int) -> str:
        return " ".join(item(depth) + "".join(repeat() for _ in range(rng.choice([0, 0, 1, 1, 2])))
                        for _ in range(rng.randint(1, 3)))

    grammars = [f"root ::= {sequence(0)}\nx ::= \"q\"" for _ in range(300)]
    verdicts = llama_cpp_parses(tiny_model, grammars)
    for grammar, accepted in zip(grammars, verdicts):
        assert _checker_passes(grammar) == accepted, grammar
    assert 50 < sum(verdicts) < 250  # both answers are tested


@pytest.mark.parametrize(("grammar", "message"), [
    ('root ::= "a"{0,50}{0,50}', "repetition {0,50} repeats an item of 50 rules 50 times: 2500 rules, more than "
                                 "llama.cpp's limit of 2000 at line 1, column 19"),
    ('root ::= "a" [z-a]', "character range z-a runs backwards, so it matches nothing at line 1, column 15"),
    ("root ::= [^\\x00-\\U0010FFFF]", "character class [^\\x00-\\U0010FFFF] matches no character at line 1, "
                                    "column 10"),
    ("root ::= [\\U00110000]", "\\U00110000 is past U+10FFFF, the last Unicode character at line 1, column 11"),
    # llama.cpp's token texts are C strings: a grammar that needs a NUL stopped at once, with exit 0.
    ('root ::= "a\\x00"', "a NUL character (\\x00) can never be generated: no token holds one at line 1, column 12"),
    ("root ::= [\\x00]", "character class [\\x00] matches only NUL, which no token holds at line 1, column 10"),
    ("root ::= [^\\x01-\\U0010FFFF]", "character class [^\\x01-\\U0010FFFF] matches only NUL, which no token "
                                    "holds at line 1, column 10"),
])
def test_grammars_nothing_can_match_are_refused_before_the_model_loads(tmp_path: Path, grammar: str,
                                                                        message: str) -> None:
    result = run_cli("complete", "-m", str(tmp_path / "missing.gguf"), "-p", "x", "--grammar", grammar)
    assert result.exit_code == 1
    assert result.first_stderr_line == f"Error: --grammar: {message}"
    assert result.stdout == ""


def test_unknown_grammar_name_lists_the_shipped_ones(tiny_model: Path) -> None:
    result = complete(tiny_model, "-p", "x", "--grammar", "yaml")
    assert result.exit_code == 1
    assert result.first_stderr_line == "Error: no shipped grammar named 'yaml'"
    assert "json, json_arr" in result.stderr


def test_bad_json_schema_is_one_line_error(tiny_model: Path) -> None:
    result = complete(tiny_model, "-p", "x", "-j", "{type: object}")
    assert result.exit_code == 1
    assert result.first_stderr_line.startswith("Error: -j/--json-schema: not valid JSON: ")


def test_two_constraints_are_refused(tiny_model: Path) -> None:
    result = complete(tiny_model, "-p", "x", "--grammar", "yes_no", "-j", "{}")
    assert result.exit_code == 1
    assert result.first_stderr_line == "Error: --grammar and -j/--json-schema cannot be used together"


# --- stop strings ------------------------------------------------------------------------------


def test_stop_string_is_never_printed_and_ends_generation(tiny_model: Path) -> None:
    free = complete(tiny_model, "-p", "Hello world", "-n", "40", "-s", "11").stdout
    # A short ASCII piece of the free-running text, taken from its middle.
    start = next(i for i in range(8, len(free) - 3) if free[i:i + 3].isascii() and free[i:i + 3].strip())
    stop = free[start:start + 3]
    result = complete(tiny_model, "-p", "Hello world", "-n", "40", "-s", "11", "-r", stop, "--stats", "--json")
    assert result.stdout == free[:free.index(stop)]
    assert stop not in result.stdout
    assert stats_of(result)["stop_reason"] == "stop"


# --- context limits ----------------------------------------------------------------------------


def test_prompt_longer_than_the_context_is_an_error_with_both_numbers(tiny_model: Path) -> None:
    result = run_cli("complete", "-m", str(tiny_model), "-t", "1", "-c", "256", "-p", LONG_PROMPT * 2)
    assert result.exit_code == 1
    assert result.first_stderr_line == "Error: the prompt has 362 tokens but the context holds 256"
    assert "-c/--ctx-size" in result.stderr and "--truncate" in result.stderr
    assert result.stdout == ""


def test_a_text_cut_by_the_full_context_says_so(tiny_model: Path) -> None:
    result = complete(tiny_model, "-p", "Hello", "-n", "1000", "--ignore-eos", "-s", "1")
    assert result.exit_code == 0 and result.stdout
    assert result.stderr == ("Warning: the context is full (512 tokens): generation stopped after 510 tokens; "
                             "raise -c/--ctx-size for a longer text\n")
    assert complete(tiny_model, "-p", "Hello", "-n", "500", "--ignore-eos", "-s", "1").stderr == ""


def test_constrained_output_stopped_by_n_says_it_may_be_unfinished(tiny_model: Path) -> None:
    schema = '{"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}'
    cut = complete(tiny_model, "-p", "x", "-n", "3", "-s", "3", "-j", schema)
    assert (cut.exit_code, cut.stdout) == (0, '{ "')
    assert cut.stderr == ("Warning: generation stopped at the -n limit of 3 tokens before the grammar said the output "
                          "was done, so it may be unfinished; raise -n/--n-predict\n")
    done = complete(tiny_model, "-p", "x", "-n", "200", "-s", "3", "-j", schema)
    assert (done.stderr, set(json.loads(done.stdout))) == ("", {"name"})
    assert complete(tiny_model, "-p", "x", "-n", "3", "-s", "3").stderr == ""  # no grammar: -n is the plan


def test_truncate_keeps_the_end_and_says_so(tiny_model: Path) -> None:
    result = run_cli("complete", "-m", str(tiny_model), "-t", "1", "-c", "256", "-n", "8", "-s", "1", "-p",
                     LONG_PROMPT * 2, "--truncate", "--stats", "--json")
    assert result.exit_code == 0
    assert "Warning: the prompt has 362 tokens but the context holds 256: kept its last 248 tokens" in result.stderr
    stats = stats_of(result)
    assert (stats["prompt_tokens"], stats["truncated_tokens"], stats["generated_tokens"]) == (248, 114, 8)


# --- prompt cache ------------------------------------------------------------------------------


def test_prompt_cache_skips_the_shared_prefix(tiny_model: Path, tmp_path: Path) -> None:
    cache = tmp_path / "prompt.cache"
    args = ("-n", "12", "-s", "5", "--prompt-cache", str(cache), "--stats", "--json")
    first = complete(tiny_model, "-p", LONG_PROMPT, *args)
    second = complete(tiny_model, "-p", LONG_PROMPT, *args)
    longer = complete(tiny_model, "-p", LONG_PROMPT + " and more", *args)
    s1, s2, s3 = stats_of(first), stats_of(second), stats_of(longer)
    assert (s1["evaluated_tokens"], s1["prompt_cache"]["saved"]) == (181, True)
    # The last prompt token is evaluated again for fresh logits; everything before comes from the file.
    assert (s2["evaluated_tokens"], s2["prompt_cache"]["reused_tokens"], s2["prompt_cache"]["saved"]) == (1, 180, False)
    assert second.stdout == first.stdout  # a restored state generates exactly what a fresh one did
    assert (s3["prompt_tokens"], s3["evaluated_tokens"], s3["prompt_cache"]["reused_tokens"]) == (183, 2, 181)


def test_prompt_cache_from_another_model_is_ignored_with_a_warning(tiny_model: Path, tmp_path: Path) -> None:
    cache = tmp_path / "prompt.cache"
    other = shutil.copy(tiny_model, tmp_path / "other.gguf")
    complete(tiny_model, "-p", LONG_PROMPT, "-n", "2", "--prompt-cache", str(cache))
    result = complete(Path(other), "-p", LONG_PROMPT, "-n", "2", "--prompt-cache", str(cache), "--stats", "--json")
    assert result.exit_code == 0
    assert f"Warning: ignoring prompt cache {cache}: it was saved for {tiny_model.resolve()}" in result.stderr
    assert stats_of(result)["evaluated_tokens"] == 181


def test_prompt_cache_refuses_a_foreign_file(tiny_model: Path, tmp_path: Path) -> None:
    foreign = tmp_path / "notes.txt"
    foreign.write_text("my notes")
    result = complete(tiny_model, "-p", "x", "--prompt-cache", str(foreign))
    assert result.exit_code == 1
    assert result.first_stderr_line == f"Error: {foreign} is not a pyllama prompt-cache file"
    assert foreign.read_text() == "my notes"


# --- usage errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "line"), [
    ((), "Error: no prompt given"),
    (("-p", "x", "-f", "f.txt"), "Error: -p/--prompt and -f/--file cannot be used together"),
    (("-p", "x", "-sys", "be nice"), "Error: -sys/--system-prompt needs --chat"),
    (("-f", "missing.txt"), "Error: prompt file not found: missing.txt"),
    (("-p", "x", "--logit-bias", "5000+1"),
     "Error: --logit-bias token 5000 is out of range: the vocabulary has 1024 tokens (0..1023)"),
])
def test_usage_errors(tiny_model: Path, args: tuple[str, ...], line: str) -> None:
    result = complete(tiny_model, *args)
    assert result.exit_code == 1
    assert result.first_stderr_line == line


def test_malformed_logit_bias_is_a_usage_error(tiny_model: Path) -> None:
    result = complete(tiny_model, "-p", "x", "--logit-bias", "5000")
    assert result.exit_code == 1
    assert result.first_stderr_line == "Error: --logit-bias '5000' is not TOKEN_ID+BIAS or TOKEN_ID-BIAS"


# --- Ctrl-C ------------------------------------------------------------------------------------


def _interrupt_after_first_output(args: list[str]) -> tuple[int, bytes, str]:
    proc = subprocess.Popen([sys.executable, "-m", "pyllama_cli", "complete", *args], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO_ROOT, preexec_fn=default_sigint)
    first = proc.stdout.read(1)  # the run has started streaming
    proc.send_signal(signal.SIGINT)
    start = time.monotonic()
    rest, err = proc.communicate(timeout=60)
    assert time.monotonic() - start < 10, "Ctrl-C did not stop the run promptly"
    return proc.returncode, first + rest, err.decode()


def test_ctrl_c_during_generation_keeps_the_text_and_exits_130(tiny_model: Path) -> None:
    # A large context and --ignore-eos: the run would take many seconds without the interrupt.
    code, out, err = _interrupt_after_first_output(
        ["-m", str(tiny_model), "-t", "1", "-c", "16384", "-n", "-1", "--ignore-eos", "-p", "Hello", "--stats"])
    assert code == 130
    assert out
    assert "stop reason: interrupted" in err
    assert err.rstrip().endswith("Interrupted by user")


def test_ctrl_c_during_a_long_prompt_evaluation(tiny_model: Path, tmp_path: Path) -> None:
    # --echo prints the prompt before its evaluation starts; small batches make that evaluation long.
    prompt = tmp_path / "long.txt"
    prompt.write_text(" ".join(["hello world"] * 7000))
    code, _, err = _interrupt_after_first_output(
        ["-m", str(tiny_model), "-t", "1", "-c", "16384", "-b", "16", "-ub", "16", "-f", str(prompt), "--echo",
         "--stats", "--json"])
    assert code == 130
    stats = json.loads([line for line in err.splitlines() if line.startswith("{")][-1])
    assert (stats["stop_reason"], stats["generated_tokens"]) == ("interrupted", 0)


def test_a_reader_that_leaves_early_ends_the_run_quietly_with_141(tiny_model: Path) -> None:
    # `pyllama complete ... | head -c 1`: as llama-completion and `pyllama tokenize`, the exit code a SIGPIPE gives.
    # A large context and --ignore-eos: the run is still generating when the reader leaves.
    args = ["-m", str(tiny_model), "-t", "1", "-c", "16384", "-p", "Hello", "-n", "-1", "--ignore-eos", "--stats"]
    proc = subprocess.Popen([sys.executable, "-m", "pyllama_cli", "complete", *args], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO_ROOT)
    assert proc.stdout.read(1)
    proc.stdout.close()
    _, err = proc.communicate(timeout=60)
    assert (proc.returncode, err) == (141, PAST_TRAINING.format(n=16384).encode() + b"\n")


PAST_TRAINING = ("Warning: -c {n} is more than the 2048 tokens the model was trained on: past them its output may "
                 "degrade (possible training context overflow)")


def test_a_context_past_the_trained_length_is_warned_as_llama_cpp_does(tiny_model: Path) -> None:
    # Before: accepted without a word (llama.cpp: "possible training context overflow").
    past = run_cli("complete", "-m", str(tiny_model), "-c", "4096", "-p", "hi", "-n", "1")
    assert (past.exit_code, past.stderr) == (0, PAST_TRAINING.format(n=4096) + "\n")
    within = run_cli("complete", "-m", str(tiny_model), "-c", "2048", "-p", "hi", "-n", "1")
    assert (within.exit_code, within.stderr) == (0, "")


def test_prompt_bytes_that_are_not_utf8_pass_through(tiny_model: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pyllama_cli", "complete", "-m", str(tiny_model), *FAST, "-n", "2", "--echo", "--json"],
        input=b"caf\xe9 \xff", capture_output=True, cwd=REPO_ROOT, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(b"caf\xe9 \xff")
    assert json.loads(result.stderr.decode().strip().splitlines()[-1])["generated_tokens"] == 2


def test_no_text_is_printed_after_ctrl_c(capsys: pytest.CaptureFixture[str]) -> None:
    # Before: the token being generated when Ctrl-C came was printed after it.
    from contextlib import nullcontext

    from pyllama_cli.commands.complete import _stream
    from pyllama_cli.core.interrupt import StopFlag

    flag = StopFlag()

    class Run:
        text = ""

        def stream(self, stop_flag: object) -> object:
            yield "Hello"
            flag.set()  # Ctrl-C, while the next token is computed
            yield " world"

    assert _stream(Run(), False, lambda f: nullcontext(f), flag, None) is True
    assert capsys.readouterr().out == "Hello"

