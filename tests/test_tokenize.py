"""`pyllama tokenize` / `pyllama detokenize` on the tiny model: exact ids, exact lines, round trips, errors.

The expected ids were checked once against llama.cpp's own llama-tokenize; the `reference` tests
repeat that comparison whenever $LLAMA_CPP_BIN points at llama.cpp's tools.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT, run_cli, run_process

# (text as typed on the command line, extra flags, the ids llama-tokenize --ids prints)
ID_CASES = [
    ("Hello world", [], [1, 358, 264]),
    ("Hello world", ["--no-bos"], [358, 264]),
    ("  two  spaces", [], [1, 261, 261, 409, 872, 261, 449, 829, 589, 377]),
    (r"line one\nline two\t tab", [], [1, 465, 394, 591, 300, 13, 598, 394, 591, 409, 872, 12, 409, 580]),
    (r"line one\nline two", ["--no-escape"], [1, 465, 394, 591, 300, 664, 600, 598, 394, 591, 409, 872]),
    ("héllo wörld 日本", [], [1, 411, 198, 172, 598, 814, 415, 198, 185, 604, 598, 590, 261, 233, 154, 168,
                             233, 159, 175]),
    ("emoji 😀👍", ["--no-bos"], [680, 821, 796, 261, 243, 162, 155, 131, 243, 162, 148, 144]),
    ("<s>Hi</s>", [], [1, 1, 550, 595, 2]),
    ("<s>Hi</s>", ["--no-bos"], [1, 550, 595, 2]),
    ("<s>Hi</s>", ["--no-parse-special"], [1, 739, 378, 674, 619, 595, 673, 663, 378, 674]),
    (r"<|im_start|>user\nHello<|im_end|>", [], [1, 259, 451, 378, 372, 13, 619, 591, 598, 814, 260]),
    (r"<|im_start|>user\nHello<|im_end|>", ["--no-bos", "--no-parse-special"],
     [739, 676, 595, 599, 675, 406, 407, 605, 676, 674, 606, 378, 372, 13, 619, 591, 598, 814, 673, 676, 595, 599,
      675, 397, 590, 676, 674]),
]


def _ids(stdout: str) -> list[int]:
    return json.loads(stdout)


@pytest.mark.parametrize(("text", "flags", "expected"), ID_CASES)
def test_ids_match_llama_tokenize(tiny_model: Path, text: str, flags: list[str], expected: list[int]) -> None:
    result = run_cli("tokenize", "-m", str(tiny_model), "--ids", *flags, "-p", text)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "[" + ", ".join(map(str, expected)) + "]\n"


def test_default_output_is_llama_tokenize_lines(tiny_model: Path) -> None:
    result = run_cli("tokenize", "-m", str(tiny_model), r"<|im_start|>Hello world\n", "--show-count")
    assert result.exit_code == 0, result.stderr
    assert result.stdout == (
        "     1 -> '<s>'\n"
        "   259 -> '<|im_start|>'\n"
        "   358 -> ' Hello'\n"
        "   264 -> ' world'\n"
        "    13 -> '\n'\n"
        "Total number of tokens: 5\n"
    )


def test_lines_print_pieces_as_c_strings(tiny_model: Path) -> None:
    """Raw bytes for partial UTF-8 pieces, and a NUL byte ends the piece, as printf("%s") does."""
    from pyllama_cli.core.text import tokenizer as tk
    from pyllama_cli.core.text.escapes import process_escapes
    from pyllama_cli.core.model.native import Model
    from pyllama_cli.core.model.settings import LoadSettings

    with Model.load(tiny_model, LoadSettings(), vocab_only=True) as model:
        tokens = tk.tokenize_text(model, process_escapes(rb"\x00\xc3\xa9"), add_bos=False)
        assert tokens.tolist() == [261, 3, 198, 172]
        lines = b"".join(tk.render_token_lines(model, tokens))
        assert lines == b"   261 -> ' '\n     3 -> ''\n   198 -> '\xc3'\n   172 -> '\xa9'\n"


@pytest.mark.parametrize("long_entry", [3, 500])  # 500: the padded table would be mostly padding
def test_bulk_output_equals_a_plain_join(long_entry: int, monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    from pyllama_cli.core.text import tokenizer as tk

    monkeypatch.setattr(tk, "_CHUNK_BYTES", 1000)  # many chunks
    ids = np.array([5, 0, 7, 5, 5, 2, 1000] * 300, dtype=np.int32)
    render = lambda t: b"%d:" % t + b"x" * (long_entry if t == 7 else t % 4) + b"\xff\n"  # noqa: E731
    assert b"".join(tk._gather(ids, render)) == b"".join(render(t) for t in ids.tolist())


@pytest.mark.parametrize(("typed", "unescaped"), [
    (rb"a\nb\tc\rd", b"a\nb\tc\rd"),
    (rb"q\'q\"q\\n", b"q'q\"q\\n"),
    (rb"\x41\x4", b"A\\x4"),  # a \x escape needs two more characters
    (rb"\x 7|\x-1|\x+f|\xzz|\x0x", b"\x07|\xff|\x0f|\\xzz|\\x0x"),  # strtol's whitespace and sign rules
    (rb"\q and a lone \\", b"\\q and a lone \\"),
    (b"trailing\\", b"trailing\\"),
])
def test_escapes_follow_string_process_escapes(typed: bytes, unescaped: bytes) -> None:
    from pyllama_cli.core.text.escapes import process_escapes

    assert process_escapes(typed) == unescaped


def test_file_is_read_verbatim_and_stdin_matches(tiny_model: Path, tmp_path: Path) -> None:
    text = "Hello world\n"  # the trailing newline is a token too
    path = tmp_path / "prompt.txt"
    path.write_text(text, encoding="utf-8")
    from_file = run_cli("tokenize", "-m", str(tiny_model), "-f", str(path), "--ids")
    from_stdin = run_cli("tokenize", "-m", str(tiny_model), "--stdin", "--ids", stdin=text)
    assert from_file.stdout == from_stdin.stdout == "[1, 358, 264, 13]\n"


def test_json_output(tiny_model: Path) -> None:
    result = run_cli("tokenize", "-m", str(tiny_model), "--json", "Hi é")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == {
        "ids": [1, 550, 595, 261, 198, 172], "pieces": ["<s>", " H", "i", " ", "\\xc3", "\\xa9"], "count": 6,
    }


def test_a_reader_that_leaves_ends_the_run_quietly_with_141(tiny_model: Path, tmp_path: Path) -> None:
    # `pyllama tokenize ... | head -c 100`: the shell reports 141 for llama-tokenize killed by SIGPIPE.
    path = tmp_path / "long.txt"
    path.write_text("Hello world, and more words. " * 20000, encoding="utf-8")
    proc = subprocess.Popen([sys.executable, "-m", "pyllama_cli", "tokenize", "-m", str(tiny_model), "-f", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO_ROOT)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(100).startswith(b"     1 -> '<s>'\n")
    proc.stdout.close()
    stderr = proc.stderr.read()
    assert proc.wait(timeout=120) == 141
    assert stderr == b""


def test_short_writes_are_completed() -> None:
    # A large write cut short (by a signal) returns the count written; the rest must still follow.
    from pyllama_cli.console import write_all

    class Trickle(io.BytesIO):
        def write(self, data: bytes) -> int:  # type: ignore[override]
            return super().write(bytes(data[:7]))

    out = Trickle()
    write_all(out, b"0123456789" * 10)
    assert out.getvalue() == b"0123456789" * 10


CHAT = '[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]'
CHAT_PROMPT = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_chat_renders_the_template_then_tokenizes(tiny_model: Path) -> None:
    result = run_cli("tokenize", "-m", str(tiny_model), "--chat", CHAT, "--show-prompt", "--ids")
    assert result.exit_code == 0, result.stderr
    prompt, ids = result.stdout[:len(CHAT_PROMPT)], result.stdout[len(CHAT_PROMPT):]
    assert prompt == CHAT_PROMPT
    plain = run_cli("tokenize", "-m", str(tiny_model), "--no-escape", "--ids", CHAT_PROMPT)
    assert ids == plain.stdout
    assert _ids(ids) == [1, 259, 449, 610, 378, 405, 599, 13, 613, 591, 492, 595, 591, 592, 648, 260, 261, 13,
                         259, 451, 378, 372, 13, 619, 595, 260, 261, 13, 259, 276, 378, 402, 605, 393, 605, 13]


def test_chat_json_carries_the_prompt(tiny_model: Path) -> None:
    result = run_cli("tokenize", "-m", str(tiny_model), "--chat", "--stdin", "--json", stdin=CHAT)
    doc = json.loads(result.stdout)
    assert doc["prompt"] == CHAT_PROMPT and doc["count"] == len(doc["ids"]) == len(doc["pieces"])


@pytest.mark.parametrize("text", ["Hello world", "  two  spaces\n\ttab\n", "héllo wörld 日本 emoji 😀👍",
                                  "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n", "x<s> y</s>",
                                  "a , b . it 's"])
@pytest.mark.parametrize("flags", [[], ["--no-bos"], ["--no-parse-special"]])
def test_detokenize_round_trips(tiny_model: Path, text: str, flags: list[str]) -> None:
    """(Text that itself starts with the BOS text, tokenized with --no-bos, is the one ambiguous case.)"""
    ids = run_cli("tokenize", "-m", str(tiny_model), "--no-escape", "--ids", *flags, "-p", text).stdout
    result = run_cli("detokenize", "-m", str(tiny_model), "--stdin", stdin=ids)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == text


def test_detokenize_takes_ids_as_arguments_and_json(tiny_model: Path) -> None:
    assert run_cli("detokenize", "-m", str(tiny_model), "1", "358", "264").stdout == "Hello world"
    assert run_cli("detokenize", "-m", str(tiny_model), "[358,", "264]").stdout == "Hello world"
    counted = run_cli("tokenize", "-m", str(tiny_model), "--ids", "--show-count", "Hello world").stdout
    assert run_cli("detokenize", "-m", str(tiny_model), "--stdin", stdin=counted).stdout == "Hello world"
    doc = run_cli("tokenize", "-m", str(tiny_model), "--json", "Hello world").stdout
    assert run_cli("detokenize", "-m", str(tiny_model), "--stdin", stdin=doc).stdout == "Hello world"


@pytest.mark.parametrize(("args", "stdin", "message"), [
    (["detokenize", "1", "1024"], "", "Error: token id 1024 is out of range: the vocab has 1024 tokens (0..1023)"),
    (["detokenize", "1", "x7"], "", "Error: 'x7' is not a token id"),
    (["detokenize", "1_000"], "", "Error: '1_000' is not a token id"),  # int() reads both
    (["detokenize", "\uff13"], "", "Error: '\uff13' is not a token id"),
    (["tokenize", "--no-escape", "--chat", '[{"role": "user", "content": "Hi"}]'], "",
     "Error: --no-escape does not apply with --chat: JSON messages are never unescaped"),
    (["detokenize", "--stdin"], '{"ids": [1, "a"]}',
     'Error: a JSON input must be an object with an "ids" list of integers (tokenize --json output)'),
    (["tokenize", "--chat", '[{"role": "user", "content": "Hi"'], "",
     "Error: the text is not valid JSON: Expecting ',' delimiter at line 1 column 34 (near '')"),
    (["tokenize", "--chat", "--stdin"], '{"role": "user"}',
     'Error: chat messages must be a non-empty JSON list of {"role", "content"} objects'),
    (["tokenize", "--chat", "--stdin"], '[{"role": "user"}]', 'Error: message 0 has no "content": {"role": "user"}'),
    (["tokenize", "--chat", "--stdin"], "[" * 100_000 + "]" * 100_000, "Error: standard input nests too deeply to read"),
    (["detokenize", "--stdin"], '{"ids": [' + "1" * 5000 + "]}",
     "Error: cannot read the ids: a number in it has too many digits"),
    (["tokenize", "-f", "/nonexistent/prompt.txt"], "", "Error: cannot read /nonexistent/prompt.txt: "
     "No such file or directory"),
    (["tokenize"], "", "Error: no input given: give exactly one of TEXT, -p/--prompt, -f/--file or --stdin"),
    (["tokenize", "Hi", "-p", "Ho"], "",
     "Error: TEXT and -p/--prompt given together: give exactly one of TEXT, -p/--prompt, -f/--file or --stdin"),
    (["tokenize", "Hi", "--ids", "--json"], "", "Error: --ids and --json are two output formats: pick one"),
    (["tokenize", "Hi", "--show-prompt"], "", "Error: --show-prompt only applies with --chat"),
])
def test_bad_input_is_one_line_error(tiny_model: Path, args: list[str], stdin: str, message: str) -> None:
    result = run_cli(args[0], "-m", str(tiny_model), *args[1:], stdin=stdin)
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.first_stderr_line == message
    assert "Traceback" not in result.stderr


def test_detokenize_refuses_stdin_that_is_not_utf8_in_a_strict_locale(tiny_model: Path) -> None:
    # In a UTF-8 locale such as en_US.UTF-8, Python's stdin decodes strictly (not surrogateescape).
    result = run_process("detokenize", "-m", str(tiny_model), "--stdin", stdin=b"1 \xff\xfe",
                         env={"PYTHONIOENCODING": "utf-8:strict"})
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "Error: standard input is not UTF-8 text (byte 2), so not token ids",
        "Hint: give integers, e.g. 1 15043 3186 or [1, 15043, 3186]"]


# ---------------------------------------------------------------- against llama.cpp itself

LLAMA_CPP_BIN = os.environ.get("LLAMA_CPP_BIN")
reference = pytest.mark.skipif(not LLAMA_CPP_BIN, reason="set LLAMA_CPP_BIN to llama.cpp's tools to compare")


def _bytes_of(cmd: list[str], stdin: bytes = b"") -> bytes:
    proc = subprocess.run(cmd, input=stdin, capture_output=True, timeout=120, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    return proc.stdout


@pytest.mark.reference
@reference
@pytest.mark.parametrize(("text", "flags"), [(t, f) for t, f, _ in ID_CASES] + [
    (r"bytes \x00\x41\xff \x 7\x-1 \q end\\", []), ("   ", ["--no-bos"]),
])
@pytest.mark.parametrize("ids", [True, False])
def test_same_output_as_llama_tokenize(tiny_model: Path, text: str, flags: list[str], ids: bool) -> None:
    args = ["-m", str(tiny_model), "-p", text, *flags, *(["--ids"] if ids else []), "--show-count"]
    theirs = _bytes_of([str(Path(LLAMA_CPP_BIN) / "llama-tokenize"), "--log-disable", *args])
    ours = _bytes_of([sys.executable, "-m", "pyllama_cli", "tokenize", *args])
    assert ours == theirs


@pytest.mark.reference
@reference
def test_same_output_as_llama_tokenize_for_files_and_stdin(tiny_model: Path, tmp_path: Path) -> None:
    data = "Hello wörld\n<|im_start|>x 😀\\n\t\n\n".encode()
    path = tmp_path / "in.txt"
    path.write_bytes(data)
    tool = str(Path(LLAMA_CPP_BIN) / "llama-tokenize")
    for args in (["-f", str(path)], ["--stdin"], ["-f", str(path), "--no-escape"]):
        theirs = _bytes_of([tool, "--log-disable", "-m", str(tiny_model), *args], data)
        ours = _bytes_of([sys.executable, "-m", "pyllama_cli", "tokenize", "-m", str(tiny_model), *args], data)
        assert ours == theirs, args


def test_chat_messages_of_tool_calls_need_no_content(tiny_model: Path) -> None:
    call = {"type": "function", "function": {"name": "f", "arguments": "{}"}}
    for message in ({"role": "assistant", "tool_calls": [call]}, {"role": "assistant", "content": None,
                                                                    "tool_calls": [call]}):
        messages = json.dumps([{"role": "user", "content": "hi"}, message])
        result = run_cli("tokenize", "-m", str(tiny_model), "--chat", messages, "--ids")
        assert result.exit_code == 0, result.stderr
