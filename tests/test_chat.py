"""`pyllama chat` on the tiny model: the scripted REPL, KV-cache reuse between turns, slash commands,
context overflow and shift, and the terminal front end driven through prompt-toolkit's pipe input."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import time
from dataclasses import replace
from pathlib import Path

import pytest

from pyllama_cli.chat.repl import ChatRepl, ChatSettings, command_names, find_command, parse_param
from pyllama_cli.chat.ui import PlainUI, TerminalUI
from pyllama_cli.core.text.reasoning import ReasoningSplitter, Thinking
from pyllama_cli.console import STYLES
from pyllama_cli.core.text.chat_template import BUILTIN_TEMPLATES, TemplateError, render_template
from pyllama_cli.core.generate.conversation import Conversation, fit_context, open_chat_engine
from pyllama_cli.core.model.native import Model
from pyllama_cli.core.model.resolve import ResolvedModel
from pyllama_cli.core.model.session import Session
from pyllama_cli.core.paths import data_dir
from pyllama_cli.core.generate.sampling import SamplingSettings
from pyllama_cli.core.model.settings import LoadSettings
from pyllama_cli.errors import ContextOverflow, InputError
from pyllama_cli.server.errors import to_api_error
from tests.fixtures.make_gguf import TINY, write_llama_gguf
from tests.helpers import CliResult, run_cli, run_process

FAST = ("-t", "1", "-c", "512")
STATS = re.compile(r"^\[ Prompt: [\d.]+ t/s \| Generation: [\d.]+ t/s \| TTFT: [\d.]+ s \| Context: \d+/\d+ \]$")
GREEDY = SamplingSettings(temperature=0)


def chat(model: Path, *args: str, stdin: str) -> CliResult:
    return run_cli("chat", "-m", str(model), *FAST, *args, stdin=stdin)


def chrome(result: CliResult) -> list[str]:
    """stderr without the stats lines (their timings vary)."""
    return [line for line in result.stderr.splitlines() if not STATS.match(line)]


@pytest.fixture(scope="module")
def llm(tiny_model: Path):
    model = Model.load(tiny_model, LoadSettings(n_threads=1))
    yield model
    model.close()


@pytest.fixture
def engine(llm, tiny_model: Path):
    session = Session(ResolvedModel(tiny_model, (tiny_model,)), llm)
    eng = open_chat_engine(session, LoadSettings(n_ctx=512, n_threads=1))
    yield eng
    eng.close()
    eng.ctx.close()  # not session.close(): the model is the module's


# --- the scripted (non-terminal) chat -----------------------------------------------------------


def test_scripted_chat_regen_with_temperature_0_repeats_the_answer(tiny_model: Path, tmp_path: Path) -> None:
    conv = tmp_path / "conv.json"
    script = f"hi\n/set temperature 0\nhello\n/regen\n/save {conv}\n/exit\n"
    result = chat(tiny_model, "-n", "16", "-s", "1", "-sys", "Be brief.", stdin=script)
    assert result.exit_code == 0
    messages = json.loads(conv.read_text())
    assert [(m["role"], m["content"]) for m in messages[:4:2]] == [("system", "Be brief."), ("assistant",
                                                                                           messages[2]["content"])]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert (messages[1]["content"], messages[3]["content"]) == ("hi", "hello")
    first, regen = messages[2]["content"], messages[4]["content"]
    # stdout: each answer followed by a blank line; the answer to "hello" twice (the regen equals it).
    assert result.stdout == f"{first}\n\n{regen}\n\n{regen}\n\n"
    assert chrome(result) == ["temperature = 0.0", f"Saved 5 messages to {conv}."]
    assert sum(bool(STATS.match(line)) for line in result.stderr.splitlines()) == 3


def test_the_issue_command_as_a_real_process(tiny_model: Path, tmp_path: Path) -> None:
    conv = tmp_path / "conv.json"
    script = f"hi\n/set temperature 0\nhello\n/regen\n/save {conv}\n/exit\n"
    result = run_process("chat", "-m", str(tiny_model), "-n", "16", "-s", "1", "-t", "1", stdin=script)
    assert result.exit_code == 0, result.stderr
    messages = json.loads(conv.read_text())
    assert [(m["role"], m["content"]) for m in messages[::2]] == [("user", "hi"), ("user", "hello")]
    assert result.stdout.endswith(f"{messages[3]['content']}\n\n{messages[3]['content']}\n\n")
    assert "\x1b[" not in result.stdout + result.stderr  # no colours off a terminal


def test_first_message_single_turn_and_multiline_block(tiny_model: Path) -> None:
    one = chat(tiny_model, "-p", "hi", "--single-turn", "-n", "4", "--temp", "0", stdin="never read\n")
    assert one.exit_code == 0 and one.stdout.endswith("\n\n") and one.stdout.count("\n\n") == 1
    block = chat(tiny_model, "-n", "4", "--temp", "0", stdin='"""\nline one\nline two\n"""\n/show\n')
    assert "turns        1" in block.stderr


def test_unknown_and_ambiguous_commands_get_a_hint_and_never_reach_the_model(tiny_model: Path) -> None:
    result = chat(tiny_model, stdin="/frobnicate\n/s\n/set nope 1\n/set top_p 2\n/set temp warm\n/regen\n/undo\n")
    assert result.exit_code == 1 and result.stdout == ""  # piped: the failed /set commands show in the exit code
    assert chrome(result) == [
        "Error: unknown command /frobnicate",
        "Hint: /help lists them (// sends a message starting with /)",
        "Error: /s is ambiguous: /system, /set, /show, /save, /stats",
        "Error: unknown parameter 'nope'",
        ("Hint: parameters: temperature, top_k, top_p, min_p, typical_p, repeat_penalty, repeat_last_n, "
        "presence_penalty, frequency_penalty, mirostat, mirostat_lr, mirostat_ent, seed, ignore_eos, logit_bias, "
        "grammar, max_tokens, stop, dry_multiplier, dry_base, dry_allowed_length, dry_penalty_last_n, "
        "dry_sequence_breakers, xtc_probability, xtc_threshold, top_n_sigma, dynatemp_range, dynatemp_exponent, "
        "adaptive_target, adaptive_decay, samplers"),
        "Error: top_p must be between 0 and 1, not 2",
        "Error: temperature needs a number, not 'warm'",
        "No answer to regenerate.",
        "Nothing to undo.",
    ]


def test_set_checks_values_as_the_flags_do(tiny_model: Path) -> None:
    script = ("/set temperature nan\n/set top_p inf\n/set temperature 1e400\n/set seed 99999999999999999999\n"
              "/set repeat_last_n 2147483648\n/set top_k 1.5\n/set logit_bias 99999+1\n/set logit_bias x+1\n"
              "/set seed -1\n/show\n")
    result = chat(tiny_model, stdin=script)
    assert result.exit_code == 1 and result.stdout == ""
    assert [line for line in chrome(result) if not line.startswith("Hint:")][:9] == [
        "Error: temperature needs a finite number, not nan",
        "Error: top_p needs a finite number, not inf",
        "Error: temperature needs a finite number, not 1e400",
        "Error: seed must be between -1 and 4294967295, not 99999999999999999999",
        "Error: repeat_last_n must be between -1 and 2147483647, not 2147483648",
        "Error: top_k needs a whole number, not '1.5'",
        "Error: logit_bias token 99999 is out of range: the vocabulary has 1024 tokens (0..1023)",
        "Error: /set logit_bias 'x+1' is not TOKEN_ID+BIAS or TOKEN_ID-BIAS",
        "seed = -1",
    ]


def test_load_of_a_deeply_nested_file_is_one_error_line(tiny_model: Path, tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    result = chat(tiny_model, stdin=f"/load {deep}\n/show\n")
    assert result.exit_code == 1 and "Traceback" not in result.stderr
    assert chrome(result)[0] == f"Error: {deep} nests too deeply to read"


def test_a_failure_before_exit_still_exits_1_when_piped(tiny_model: Path) -> None:
    assert chat(tiny_model, stdin="/set foo 1\n/exit\n").exit_code == 1
    assert chat(tiny_model, stdin="/frobnicate\n/bye\n").exit_code == 1
    assert chat(tiny_model, stdin="/set top_k 5\n/exit\n").exit_code == 0


def test_clear_undo_system_read_and_markdown_save(tiny_model: Path, tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("alpha\nbeta\n")
    md, js = tmp_path / "t.md", tmp_path / "t.json"
    script = (f"/read {notes}\nsummarize\none more\n/undo\n/save {js}\n/system Be kind.\n/save {md}\n"
              "/clear\n/system\n/stats\n/read missing.txt\n/copy\n")
    result = chat(tiny_model, "-n", "3", "--temp", "0", "-sys", "Be brief.", stdin=script)
    saved = json.loads(js.read_text())
    assert saved[1] == {"role": "user", "content": "--- File: notes.txt ---\nalpha\nbeta\n\nsummarize"}
    assert [m["role"] for m in saved] == ["system", "user", "assistant"]  # /undo dropped "one more" and its answer
    assert md.read_text().startswith(f"# Chat with {tiny_model.name}\n\n## System\n\nBe kind.\n\n## User\n\n"
                                     "--- File: notes.txt ---\nalpha\nbeta\n\nsummarize\n\n## Assistant\n\n")
    lines = chrome(result)
    assert lines[:2] == [f"Loaded text from '{notes}' (2 lines); it goes with your next message.",
                         "Removed the last exchange."]
    assert lines[-5:] == ["Chat history cleared (the system prompt stays).", "Be kind.", "Stats line off.",
                          "Error: file does not exist or cannot be opened as text: 'missing.txt'",
                          "No answer to copy yet."]


def test_load_continues_a_saved_conversation(tiny_model: Path, tmp_path: Path) -> None:
    saved = tmp_path / "in.json"
    saved.write_text(json.dumps([{"role": "system", "content": "S"}, {"role": "user", "content": "a"},
                                 {"role": "assistant", "content": "b"}]))
    out = tmp_path / "out.json"
    result = chat(tiny_model, "-n", "2", "--temp", "0", stdin=f"/load {saved}\nnext\n/save {out}\n/load nope.txt\n")
    assert [m["content"] for m in json.loads(out.read_text())][:4] == ["S", "a", "b", "next"]
    assert chrome(result)[0] == f"Loaded 3 messages from {saved}."
    assert chrome(result)[-2:] == ["Error: /load reads a .json file written by /save", "Hint: /load chat.json"]


@pytest.mark.parametrize(("messages", "problem"), [
    ([{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}],
     "message 1 of {path} has the role 'tool', which is not one /load takes"),
    ([{"role": "user", "content": "a"}, {"role": "system", "content": "S"}],
     "message 1 of {path} has the role 'system', which comes only first"),
    ([{"role": "system", "content": "S"}, {"role": "user"}], 'message 1 has no "content": {{"role": "user"}}'),
])
def test_load_refuses_what_a_chat_cannot_hold(tiny_model: Path, tmp_path: Path, messages: list, problem: str) -> None:
    saved = tmp_path / "in.json"
    saved.write_text(json.dumps(messages))
    out = tmp_path / "out.json"
    result = chat(tiny_model, "-n", "1", "-sys", "Kept.", stdin=f"hi\n/load {saved}\n/save {out}\n")
    assert result.exit_code == 1
    assert f"Error: {problem.format(path=saved)}" in chrome(result)
    assert [m["content"] for m in json.loads(out.read_text())][:2] == ["Kept.", "hi"]  # the chat is unchanged


def test_double_slash_sends_text_that_starts_with_a_slash(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "c.json"
    chat(tiny_model, "-n", "1", stdin=f"//etc is a folder\n/save {out}\n")
    assert json.loads(out.read_text())[0] == {"role": "user", "content": "/etc is a folder"}


def test_copy_says_so_when_there_is_no_clipboard_tool(tiny_model: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    result = chat(tiny_model, "-n", "2", stdin="hi\n/copy\n")
    assert chrome(result)[-1] == "No clipboard tool found (wl-copy, xclip, xsel, pbcopy): nothing copied."


def test_bad_options_fail_before_the_model_loads(tiny_model: Path) -> None:
    result = chat(tiny_model, "--chat-template", "nosuch", stdin="")
    assert (result.exit_code, result.first_stderr_line) == (1, "Error: unknown chat template 'nosuch'")
    both = chat(tiny_model, "-sys", "a", "-sysf", "b.txt", stdin="")
    assert (both.exit_code, both.first_stderr_line) == (1, "Error: -sys and -sysf cannot be used together")


def test_a_template_that_does_not_parse_stops_the_chat_before_it_starts(tiny_model: Path) -> None:
    # It used to fail at every message ("message not kept") for the whole session.
    result = chat(tiny_model, "--chat-template", "{% if %}", stdin="hi\nagain\n")
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr.splitlines() == [
        "Error: chat template does not parse: Expected an expression, got 'end of statement block' (line 1)",
        "Hint: pass --chat-template NAME|FILE (built-ins: chatml, gemma, llama2, llama2-sys, llama2-sys-bos, llama2-sys-strip, llama3, mistral, phi3, zephyr)"]


@pytest.mark.parametrize(("content", "message"), [
    (b"\xfb\x00 not text", "Error: chat template file {path} is not UTF-8 text (byte 0)"),
    (b" \n", "Error: chat template file {path} is empty"),
    (None, "Error: cannot read chat template file {path}: Is a directory"),
])
def test_a_template_file_that_is_no_template_is_one_error_line(tiny_model: Path, tmp_path: Path,
                                                               content: bytes | None, message: str) -> None:
    path = tmp_path / "t.json"  # a name without a template suffix: it exists, so it is read as a file
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    result = chat(tiny_model, "--chat-template", str(path), stdin="hi\n")
    assert (result.exit_code, result.first_stderr_line) == (1, message.format(path=path))
    assert "Traceback" not in result.stderr


# --- the KV cache between turns -----------------------------------------------------------------


def test_second_turn_evaluates_only_the_new_turn(engine) -> None:
    conv = Conversation(system="Be brief.")
    conv.add_user("hi")
    conv.add_assistant("".join(engine.answer(conv.to_messages(), GREEDY, max_tokens=64)))
    first = engine.stats
    assert (first.n_cached, first.stop_reason) == (0, "eos")  # the whole answer is in the cache
    conv.add_user("hello there")
    "".join(engine.answer(conv.to_messages(), GREEDY, max_tokens=4))
    second = engine.stats
    new_turn = engine.model.tokenize(b"<|im_end|>\n<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n",
                                     add_special=False, parse_special=True)
    assert second.n_cached == first.n_prompt + first.n_generated
    assert second.n_evaluated == len(new_turn) == 23
    assert second.n_prompt == second.n_cached + len(new_turn)


# --- context overflow and shift -----------------------------------------------------------------


def test_overflow_says_so_and_keeps_the_conversation(tiny_model: Path) -> None:
    long = " ".join(["word"] * 300)
    result = run_cli("chat", "-m", str(tiny_model), "-t", "1", "-c", "256", "-n", "2", stdin=f"hi\n{long}\n/show\n")
    lines = chrome(result)
    assert re.fullmatch(r"Error: the conversation no longer fits the context: it needs \d+ tokens, the context "
                        r"holds 256", lines[0])
    assert lines[1] == ("Hint: /clear to start over (the system prompt stays), /undo to drop the last exchange, "
                        "or restart with a larger -c or with --context-shift")
    assert lines[2] == "(message not kept)"
    assert "turns        1" in result.stderr


def test_context_shift_drops_the_oldest_turns_but_never_the_system_prompt(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "c.json"
    msg = " ".join(["word"] * 50)
    script = "".join(f"{i} {msg}\n" for i in range(4)) + f"/save {out}\n"
    result = run_cli("chat", "-m", str(tiny_model), "-t", "1", "-c", "256", "-n", "8", "--temp", "0",
                     "--context-shift", "-sys", "Be brief.", stdin=script)
    assert result.exit_code == 0
    dropped = [line for line in chrome(result) if line.startswith("Context full")]
    assert dropped and all(re.fullmatch(r"Context full: dropped the (\d+ )?oldest turns? \(the system prompt "
                                        r"stays\)\.", line) for line in dropped)
    messages = json.loads(out.read_text())
    assert messages[0] == {"role": "system", "content": "Be brief."}
    assert messages[-2]["content"] == f"3 {msg}" and messages[1]["content"] != f"0 {msg}"


def test_an_answer_cut_by_the_context_gives_a_hint_that_fits_the_flags(tiny_model: Path) -> None:
    args = ("-m", str(tiny_model), "-t", "1", "-c", "256", "--ignore-eos", "-s", "1")
    shifting = chrome(run_cli("chat", *args, "--context-shift", stdin="hi\n"))
    assert shifting == ["Error: the answer was cut: the context is full (256/256 tokens)",
                        "Hint: /set n N to keep answers shorter, /clear to start over, or restart with a larger -c"]
    assert chrome(run_cli("chat", *args, stdin="hi\n"))[1] == (
        "Hint: /clear to start over, or restart with a larger -c or with --context-shift")


def test_fit_context_counts_and_drops_whole_turns() -> None:
    conv = Conversation(system="S", messages=[{"role": r, "content": c} for r, c in
                                              [("user", "a"), ("assistant", "b"), ("user", "c"), ("assistant", "d"),
                                               ("user", "e")]])
    def count(messages):
        return 10 * len(messages)

    assert fit_context(conv, count, 100, reserve=10, shift=False) == 0
    assert fit_context(conv, count, 40, reserve=10, shift=True) == 2
    assert [m["content"] for m in conv.to_messages()] == ["S", "e"]
    with pytest.raises(ContextOverflow, match="the last message alone needs 20 tokens"):
        fit_context(conv, count, 25, reserve=10, shift=True)


# --- the terminal front end, through prompt-toolkit's pipe input ---------------------------------


class _InterruptOnFirstWrite(io.StringIO):
    """A terminal stand-in that presses Ctrl-C (SIGINT) as soon as the answer starts to appear."""

    def __init__(self) -> None:
        super().__init__()
        self.fired = False

    def write(self, s: str) -> int:
        if not self.fired and re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", s).strip():  # text, not cursor codes
            self.fired = True
            os.kill(os.getpid(), signal.SIGINT)
        return super().write(s)


def run_terminal(engine, keys: str, *, history: Path | None, answer_out: io.StringIO | None = None,
                 settings: ChatSettings | None = None) -> tuple[int, Conversation, str]:
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput
    from rich.console import Console
    from rich.theme import Theme

    errors = io.StringIO()
    conv = Conversation()
    with create_pipe_input() as pipe:
        pipe.send_text(keys)
        ui = TerminalUI(history=history, commands=command_names(), pt_input=pipe, pt_output=DummyOutput(),
                        console=Console(file=answer_out or io.StringIO(), force_terminal=True, width=80, theme=Theme(STYLES)),
                        err_console=Console(file=errors, width=200, theme=Theme(STYLES)))
        code = ChatRepl(engine, ui, conv, settings or ChatSettings(sampling=GREEDY, max_tokens=4)).run()
    return code, conv, errors.getvalue()


def test_terminal_ctrl_c_stops_the_answer_and_keeps_the_part_shown(engine) -> None:
    settings = ChatSettings(sampling=SamplingSettings(temperature=0, ignore_eos=True), max_tokens=300)
    code, conv, err = run_terminal(engine, "tell me a story\r\x04", history=None,
                                   answer_out=_InterruptOnFirstWrite(), settings=settings)
    assert code == 0
    assert [m["role"] for m in conv.messages] == ["user", "assistant"]
    assert conv.messages[1]["content"]  # the partial answer is kept
    assert engine.stats.stop_reason == "interrupted" and engine.stats.n_generated < 300
    assert "(answer stopped; the part shown is kept)" in err


def test_terminal_history_persists_across_runs(engine, tmp_path: Path) -> None:
    history = data_dir() / "chat_history"
    run_terminal(engine, "first message\r/stats\r\x04", history=history)
    _, conv, _ = run_terminal(engine, "\x1b[A\x1b[A\r\x04", history=history)  # Up, Up, Enter
    assert conv.messages[0]["content"] == "first message"
    assert history.is_file()


def test_terminal_ctrl_c_at_the_prompt_hints_then_a_quick_second_exits_130(engine) -> None:
    code, conv, err = run_terminal(engine, "\x03\x03", history=None)
    assert code == 130 and conv.messages == []
    assert err.count("(Ctrl-C again to quit; or /exit, /bye, Ctrl-D)") == 1


def test_terminal_multiline_block_and_alt_enter(engine) -> None:
    _, conv, _ = run_terminal(engine, '"""\rone\rtwo"""\rthree\x1b\rfour\r\x04', history=None,
                              settings=ChatSettings(sampling=GREEDY, max_tokens=1))
    assert [m["content"] for m in conv.messages if m["role"] == "user"] == ["one\ntwo", "three\nfour"]


# --- templates that fail or blow up while rendering, and input that is not UTF-8 ---------------

HI = '[{"role": "user", "content": "hi"}]'
RENDER_FAILED = "Error: chat template failed to render: "
RENDER_HINT = "Hint: pass --chat-template NAME|FILE to use another template (built-ins: chatml, gemma, llama2, " \
              "llama2-sys, llama2-sys-bos, llama2-sys-strip, llama3, mistral, phi3, zephyr)\n"


@pytest.mark.parametrize("template, error", [
    ("{{ 1/0 }}", "ZeroDivisionError: division by zero"),
    ('{{ "a" + 1 }}', 'TypeError: can only concatenate str (not "int") to str'),
    ('{{ "abc".split(1) }}', "TypeError: must be str or None, not int"),
    ('{{ "%d" % "x" }}', "TypeError: %d format: a real number is required, not str"),
    ("{{ range(10**12)|list }}", "OverflowError: Range too big. The sandbox blocks ranges larger than MAX_RANGE "
                                 "(100000)."),
])
def test_a_template_that_raises_is_one_error_line(tiny_model: Path, template: str, error: str) -> None:
    result = run_cli("tokenize", "-m", str(tiny_model), "--chat", HI, "--chat-template", template)
    assert (result.exit_code, result.stderr, result.stdout) == (1, RENDER_FAILED + error + "\n" + RENDER_HINT, "")


def test_template_errors_through_chat_complete_and_the_gguf_template(tiny_model: Path, tmp_path: Path) -> None:
    zero = RENDER_FAILED + "ZeroDivisionError: division by zero\n" + RENDER_HINT
    # The chat REPL reports a turn it cannot answer and carries on, as for every template error.
    single = chat(tiny_model, "-st", "--chat-template", "{{ 1/0 }}", stdin="hi\n")
    assert (single.exit_code, single.stdout, single.stderr) == (1, "", zero + "(message not kept)\n")
    done = run_cli("complete", "-m", str(tiny_model), *FAST, "--chat", "-p", "hi", "--chat-template", "{{ 1/0 }}")
    assert (done.exit_code, done.stderr) == (1, zero)
    bad = write_llama_gguf(tmp_path / "bad-template.gguf", replace(TINY, chat_template="{{ 1/0 }}"))
    own = run_process("complete", "-m", str(bad), *FAST, "--chat", "-p", "hi")
    assert (own.exit_code, own.stderr) == (1, zero)


def test_serve_answers_a_failing_template_with_a_client_error() -> None:
    # The server maps a TemplateError to its 400 `invalid_template` answer; rendering must raise one.
    with pytest.raises(TemplateError) as caught:
        render_template("{{ 1/0 }}", [{"role": "user", "content": "hi"}])
    error = to_api_error(caught.value)
    assert (error.status, error.code, error.message) == (
        400, "invalid_template", "chat template failed to render: ZeroDivisionError: division by zero")


@pytest.mark.parametrize("template, error", [
    ('{{ "x" * 10**10 }}', "the result of '*' would hold 10,000,000,000 items (the limit is 10,000,000)"),
    ("{{ 10**10 * [0] }}", "the result of '*' would hold 10,000,000,000 items (the limit is 10,000,000)"),
    ("{{ 10 ** (10**10) }}", "the result of '**' would be an integer of about 33,219,280,949 bits (the limit is "
                             "1,000,000)"),
    ("{% set ns = namespace(n=2) %}{% for _ in range(30) %}{% set ns.n = ns.n * ns.n %}{% endfor %}",
     "the result of '*' would be an integer of about 1,048,578 bits (the limit is 1,000,000)"),
    ("{% set ns = namespace(s='xy') %}{% for _ in range(30) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
     "the result of '+' would hold 16,777,216 items (the limit is 10,000,000)"),
    ('{{ "%10000000000d" % 1 }}', "the result of '%' would hold 10,000,000,000 items (the limit is 10,000,000)"),
    ('{{ "%*d" % (10**10, 1) }}', "the result of '%' would hold 10,000,000,000 items (the limit is 10,000,000)"),
    ('{{ "x".ljust(10**10) }}', "the result of 'str.ljust' would hold 10,000,000,000 items (the limit is "
                                "10,000,000)"),
    ("{{ messages|tojson(indent=10**10) }}", "the result of 'tojson indent' would hold 10,000,000,000 items (the "
                                             "limit is 10,000,000)"),
    ('{% for _ in range(100000) %}{{ "x" * 1000 }}{% endfor %}', "its output would exceed 10,000,000 characters"),
])
def test_templates_that_would_build_huge_values_are_refused_at_once(template: str, error: str) -> None:
    start = time.monotonic()
    with pytest.raises(TemplateError) as caught:
        render_template(template, [{"role": "user", "content": "hi"}])
    assert caught.value.message == "chat template failed to render: " + error
    assert time.monotonic() - start < 5


def test_a_huge_repetition_on_the_command_line_is_one_error_line(tiny_model: Path) -> None:
    result = run_process("tokenize", "-m", str(tiny_model), "--chat", HI, "--chat-template", '{{ "x" * 10**10 }}',
                         timeout=60)
    assert (result.exit_code, result.stderr) == (1, RENDER_FAILED + "the result of '*' would hold 10,000,000,000 "
                                                 "items (the limit is 10,000,000)\n" + RENDER_HINT)


def test_sizes_within_the_limits_still_render() -> None:
    template = ("{% for m in messages %}{{ '  ' * loop.index0 }}{{ loop.index0 * 2 }} {{ '%s:%-4s|' % (m.role, 1) }}"
                "{{ m.content.ljust(4, '.') }}{{ [1] * 2 + [3] }}{{ 2 ** 10 }}{{ 'x' * 0 }}{% endfor %}"
                "{{ '%(n)d' % {'n': 20240612} }}{{ messages|tojson(indent=1) }}")
    assert render_template(template, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]) == (
        "0 user:1   |hi..[1, 1, 3]1024  2 assistant:1   |yo..[1, 1, 3]1024"
        '20240612[\n {\n  "role": "user",\n  "content": "hi"\n },\n {\n  "role": "assistant",\n  "content": "yo"\n }\n]')


def test_stdin_that_is_not_utf8_becomes_replacement_characters(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "c.json"
    result = run_process("chat", "-m", str(tiny_model), *FAST, "-n", "6", "-sys", "S\udcff",
                         stdin=b"\xff\xfe\n/system \xe2\x82 x\n" + f"/save {out}\n".encode())
    assert result.exit_code == 0 and "Traceback" not in result.stderr, result.stderr
    assert json.loads(out.read_text(encoding="utf-8"))[:2] == [
        {"role": "system", "content": "\ufffd x"}, {"role": "user", "content": "\ufffd\ufffd"}]
    single = run_process("chat", "-m", str(tiny_model), *FAST, "-n", "6", "-st", stdin=b"\xff\xfe\n")
    assert single.exit_code == 0 and single.stdout.endswith("\n\n") and "Traceback" not in single.stderr
    first = run_process("chat", "-m", str(tiny_model), *FAST, "-n", "6", "-st", "-p", "\udcff\udcfe")
    assert first.exit_code == 0 and first.stdout.endswith("\n\n") and "Traceback" not in first.stderr


def test_surrogates_from_argv_or_json_escapes_become_replacement_characters(tmp_path: Path) -> None:
    conv = Conversation(system="a\udcffb")  # b"a\xffb" as Python reads it from argv
    saved = tmp_path / "in.json"
    saved.write_text('[{"role": "user", "content": "half a pair: \\ud83d, bytes: \\udce2\\udc82"}]')
    conv.load(saved)
    conv.add_user("\udcc3\udca9")  # b"\xc3\xa9" escaped byte by byte: a whole character once decoded
    conv.save(tmp_path / "out.json")
    assert json.loads((tmp_path / "out.json").read_text(encoding="utf-8")) == [
        {"role": "system", "content": "a\ufffdb"}, {"role": "user", "content": "half a pair: \ufffd, bytes: \ufffd"},
        {"role": "user", "content": "\u00e9"}]


# --- pieces ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, expected", [
    ("chatml", ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n"
               "<|im_start|>user\nok?<|im_end|>\n<|im_start|>assistant\n")),
    # llama.cpp's four Llama 2 spellings (its llm_chat_apply_template): no BOS first, `</s>` after answers.
    ("llama2", "[INST] S\nhi [/INST]yo</s>[INST] ok? [/INST]"),
    ("llama2-sys", "[INST] <<SYS>>\nS\n<</SYS>>\n\nhi [/INST]yo</s>[INST] ok? [/INST]"),
    ("llama2-sys-bos", "[INST] <<SYS>>\nS\n<</SYS>>\n\nhi [/INST]yo</s><s>[INST] ok? [/INST]"),
    ("llama2-sys-strip", "[INST] <<SYS>>\nS\n<</SYS>>\n\nhi [/INST]yo</s>[INST] ok? [/INST]"),
    ("llama3", ("<s><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|><|start_header_id|>user<|end_header_id|>"
               "\n\nhi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nyo<|eot_id|><|start_header_id|>user"
               "<|end_header_id|>\n\nok?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")),
    ("mistral", "<s>[INST] S\n\nhi[/INST] yo</s>[INST] ok?[/INST]"),
    ("gemma", ("<s><start_of_turn>user\nS\n\nhi<end_of_turn>\n<start_of_turn>model\nyo<end_of_turn>\n"
              "<start_of_turn>user\nok?<end_of_turn>\n<start_of_turn>model\n")),
    ("phi3", ("<|system|>\nS<|end|>\n<|user|>\nhi<|end|>\n<|assistant|>\nyo<|end|>\n<|user|>\nok?<|end|>\n"
             "<|assistant|>\n")),
    ("zephyr", ("<|system|>\nS<|endoftext|>\n<|user|>\nhi<|endoftext|>\n<|assistant|>\nyo<|endoftext|>\n<|user|>\n"
                "ok?<|endoftext|>\n<|assistant|>\n")),
])
def test_builtin_templates(name: str, expected: str) -> None:
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "yo"}, {"role": "user", "content": "ok?"}]
    assert render_template(BUILTIN_TEMPLATES[name], messages, bos_token="<s>", eos_token="</s>") == expected


def test_llama2_sys_strip_trims_every_message_and_llama2_sys_does_not() -> None:
    messages = [{"role": "system", "content": " S "}, {"role": "user", "content": "\thi "}]
    render = {name: render_template(BUILTIN_TEMPLATES[name], messages, bos_token="<s>", eos_token="</s>")
              for name in ("llama2-sys", "llama2-sys-strip")}
    assert render == {"llama2-sys": "[INST] <<SYS>>\n S \n<</SYS>>\n\n\thi  [/INST]",
                      "llama2-sys-strip": "[INST] <<SYS>>\nS\n<</SYS>>\n\nhi [/INST]"}


def test_reasoning_is_split_even_when_tags_straddle_chunks() -> None:
    split = ReasoningSplitter()
    parts = [p for chunk in ["<thi", "nk>plan</th", "ink>\n\nAnswer <", "b"] for p in split.feed(chunk)]
    assert parts + split.flush() == [(True, "plan"), (False, "\n\nAnswer "), (False, "<b")]
    out = io.StringIO()
    text = PlainUI(reasoning="hide", stdout=out, stderr=io.StringIO()).show_answer(
        iter(["plan</th", "ink>\n\nAnswer\n", "\n"]), Thinking(inside=True))
    assert (out.getvalue(), text) == ("Answer\n\n", "plan</think>\n\nAnswer\n\n")


def test_hidden_reasoning_keeps_what_looked_like_the_start_of_a_tag_at_the_end(tiny_model: Path) -> None:
    # The grammar makes the answer end in "<": held back as a possible "<think>", it must still be printed.
    args = ("-st", "--grammar", 'root ::= "<think>x</think>\\n\\nok <"')
    assert chat(tiny_model, *args, "--reasoning", "hide", stdin="hi\n").stdout == "ok <\n\n"
    assert chat(tiny_model, *args, "--reasoning", "show", stdin="hi\n").stdout == "<think>x</think>\n\nok <\n\n"


def test_answers_are_shown_while_they_are_generated() -> None:
    def plain_ui(out: io.StringIO) -> PlainUI:
        return PlainUI(reasoning="hide", stdout=out, stderr=io.StringIO())

    for make_ui in (plain_ui, _plain_terminal_ui):
        out = io.StringIO()
        shown = _screens_between_chunks(make_ui(out), out, ["one ", "two"])
        assert shown == ["one ", "one two"]


def _screens_between_chunks(ui, out: io.StringIO, pieces: list[str]) -> list[str]:
    """What `ui` had written to `out` each time it asked for the next chunk of an answer."""
    shown: list[str] = []

    def chunks():
        for piece in pieces:
            yield piece
            shown.append(out.getvalue())

    ui.show_answer(chunks())
    return shown


def _plain_terminal_ui(out: io.StringIO) -> TerminalUI:
    """`chat --plain` at a terminal, its answers written to `out`."""
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput
    from rich.console import Console

    with create_pipe_input() as pipe:
        return TerminalUI(history=None, commands=[], plain=True, pt_input=pipe, pt_output=DummyOutput(),
                          console=Console(file=out, width=80), err_console=Console(file=io.StringIO()))


def test_parse_param_and_find_command() -> None:
    assert parse_param("temp", "0.5") == ("temperature", 0.5)
    assert parse_param("n", "32") == ("max_tokens", 32)
    assert parse_param("ignore-eos", "on") == ("ignore_eos", True)
    assert parse_param("logit_bias", "15+1,2-inf") == ("logit_bias", ((15, 1.0), (2, float("-inf"))))
    assert 'root ::= "yes" | "no"' in parse_param("grammar", "yes_no")[1]
    with pytest.raises(InputError, match="mirostat must be between 0 and 2"):
        parse_param("mirostat", "3")
    assert find_command("/bye").name == "/exit" and find_command("/reg").name == "/regen"
    assert find_command("/nope") is None


def test_set_seed_4294967295_means_random_as_in_llama_cpp() -> None:
    # llama.cpp's samplers draw a fresh seed for 4294967295 (its -1): kept, /show would name a seed that reproduces nothing.
    assert parse_param("seed", "4294967295") == ("seed", -1)
    assert parse_param("seed", "4294967294") == ("seed", 4294967294)


def test_data_dir_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert data_dir() == Path(os.environ["PYLLAMA_HOME"])
    monkeypatch.delenv("PYLLAMA_HOME")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert data_dir() == tmp_path / "pyllama"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert data_dir() == Path("~/.local/share/pyllama").expanduser()


def test_piped_input_with_a_failed_command_or_message_exits_1(tiny_model: Path, tmp_path: Path) -> None:
    # The turns that work are still answered; the exit code tells the script that one did not.
    missing = tmp_path / "none.json"
    result = chat(tiny_model, "-n", "3", stdin=f"hello\n/load {missing}\nagain\n")
    assert result.exit_code == 1
    assert f"Error: cannot read {missing}: No such file or directory" in chrome(result)
    assert result.stdout.count("\n\n") == 2
    assert chat(tiny_model, "-n", "3", stdin="hello\n").exit_code == 0


def test_single_turn_that_cannot_be_answered_exits_1_without_reading_on(tiny_model: Path) -> None:
    result = chat(tiny_model, "-st", "--chat-template", "{{ 1/0 }}", stdin="first\nsecond\n")
    assert result.exit_code == 1
    assert chrome(result)[0] == "Error: chat template failed to render: ZeroDivisionError: division by zero"
    assert result.stdout == ""


def test_a_sliding_window_turn_that_reuses_cells_no_longer_held_restores_a_checkpoint(models_dir: Path) -> None:
    # The window (96 positions) keeps about 256 cells: after a 300-token answer the cells of the prompt's
    # start are gone. When the next prompt differs from the cache right after the previous prompt (its
    # answer re-rendered otherwise), cutting there would leave those positions unseen; the turn restores
    # the checkpoint 4 tokens before the previous prompt's end instead, and answers as a fresh chat does.
    from tests.fixtures.make_gguf import WIDE_SWA, write_llama_gguf

    path = write_llama_gguf(models_dir / "wide-swa.gguf", WIDE_SWA)
    settings = LoadSettings(n_ctx=1024, n_batch=64, n_ubatch=64, n_threads=1)
    model = Model.load(path, settings)
    engine = open_chat_engine(Session(ResolvedModel(path, (path,)), model), settings)
    try:
        conv = Conversation(system="Be brief.")
        conv.add_user("tell me a long story")
        answer = "".join(engine.answer(conv.to_messages(), GREEDY, max_tokens=300))
        first = engine.stats
        assert first.n_generated == 300
        conv.add_assistant("a shorter story than the one told")  # not the answer's tokens
        conv.add_user("and then?")
        again = "".join(engine.answer(conv.to_messages(), GREEDY, max_tokens=16))
        assert engine.stats.n_cached == first.n_prompt - 5  # less one position, as llama-server takes a window's
        engine.generator.reset()
        assert "".join(engine.answer(conv.to_messages(), GREEDY, max_tokens=16)) == again
        assert engine.stats.n_cached == 0 and answer
    finally:
        engine.close()
        engine.ctx.close()
        model.close()
