"""`pyllama tokenize` and `pyllama detokenize`: what ids a model sees, in llama-tokenize's formats."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Annotated

import typer

from ..console import model_progress, stdout_is_tty, write_all
from ..core.model.resolve import ModelRequest
from ..core.model.session import open_model
from ..core.model.settings import LoadSettings
from ..errors import InputError, UsageError
from ..options.load import ChatTemplateOpt, VerboseOpt, in_panel, model_options

EXAMPLES = """\
Examples:
  pyllama tokenize -m model.gguf "Hello world"
  pyllama tokenize -m model.gguf -f prompt.txt --ids --show-count
  cat prompt.txt | pyllama tokenize -m model.gguf --stdin --json
  pyllama tokenize -m model.gguf --chat '[{"role": "user", "content": "Hi"}]' --show-prompt
  pyllama detokenize -m model.gguf 1 15043 3186
  pyllama tokenize -m model.gguf "Hi" --ids | pyllama detokenize -m model.gguf --stdin
"""

INPUT_PANEL = "Input"
OUTPUT_PANEL = "Output"


@model_options(load=False)
def tokenize(
    model: ModelRequest,
    text: Annotated[str | None, typer.Argument(
        help="Text to tokenize (or use -p, -f or --stdin).", show_default=False)] = None,
    prompt: Annotated[str | None, typer.Option(
        "-p", "--prompt", help="Text to tokenize, as llama-tokenize's -p.", rich_help_panel=INPUT_PANEL,
        show_default=False)] = None,
    file: Annotated[str | None, typer.Option(
        "-f", "--file", help="Read the text from FILE (bytes as they are).", rich_help_panel=INPUT_PANEL,
        show_default=False)] = None,
    stdin: Annotated[bool, typer.Option(
        "--stdin", help="Read the text from standard input.", rich_help_panel=INPUT_PANEL)] = False,
    chat: Annotated[bool, typer.Option(
        "--chat", help="The input is a JSON list of messages: render it with the chat template, then tokenize.",
        rich_help_panel=INPUT_PANEL)] = False,
    chat_template: in_panel(ChatTemplateOpt, INPUT_PANEL) = None,
    no_bos: Annotated[bool, typer.Option(
        "--no-bos", help="Do not add the BOS token, even if the model normally uses one.",
        rich_help_panel=INPUT_PANEL)] = False,
    no_parse_special: Annotated[bool, typer.Option(
        "--no-parse-special", help="Tokenize special-token text such as <|im_start|> as plain text.",
        rich_help_panel=INPUT_PANEL)] = False,
    no_escape: Annotated[bool, typer.Option(
        "--no-escape", help="Keep \\n, \\t, \\xHH... in the text as typed (default: unescape them; not with --chat).",
        rich_help_panel=INPUT_PANEL)] = False,
    ids: Annotated[bool, typer.Option(
        "--ids", help="Print only the id list: [1, 2, 3].", rich_help_panel=OUTPUT_PANEL)] = False,
    show_count: Annotated[bool, typer.Option(
        "--show-count", help="Also print 'Total number of tokens: N'.", rich_help_panel=OUTPUT_PANEL)] = False,
    show_prompt: Annotated[bool, typer.Option(
        "--show-prompt", help="With --chat: print the rendered prompt before the tokens.",
        rich_help_panel=OUTPUT_PANEL)] = False,
    as_json: Annotated[bool, typer.Option(
        "--json", help='Print {"ids": [...], "pieces": [...], "count": N}.', rich_help_panel=OUTPUT_PANEL)] = False,
    verbose: VerboseOpt = False,
) -> None:
    """Print the tokens a model turns text into, as llama-tokenize does (same ids, same lines).

    Only the vocabulary is loaded, never the weights, so even a 70B model answers at once.
    """
    _check_tokenize_flags(ids, as_json, chat, chat_template, show_prompt, no_escape)
    source, data = _read_input(text, prompt, file, stdin)
    from ..core.text import tokenizer as tk
    from ..core.text.escapes import process_escapes

    with open_model(model, LoadSettings(verbose=verbose), vocab_only=True, progress=model_progress()) as session:
        vocab = session.model
        rendered = None
        if chat:
            messages = tk.parse_messages(data, source)
            rendered = tk.chat_prompt(vocab, messages, chat_template, add_bos=not no_bos)
            data = rendered.encode("utf-8")
        elif not no_escape:
            data = process_escapes(data)
        tokens = tk.tokenize_text(vocab, data, add_bos=not no_bos, parse_special=not no_parse_special)
        if as_json:
            _write([tk.render_json(vocab, tokens, rendered)])
            return
        if show_prompt and rendered is not None:
            _write([_prompt_block(rendered)])
        _write(tk.render_id_list(tokens) if ids else tk.render_token_lines(vocab, tokens))
        if show_count:
            _write([tk.render_count(tokens)])


def _check_tokenize_flags(ids: bool, as_json: bool, chat: bool, chat_template: str | None, show_prompt: bool,
                          no_escape: bool) -> None:
    if ids and as_json:
        raise UsageError("--ids and --json are two output formats: pick one")
    if chat and no_escape:
        raise UsageError("--no-escape does not apply with --chat: JSON messages are never unescaped",
                         hint="leave out --no-escape")
    if not chat and (chat_template is not None or show_prompt):
        flag = "--chat-template" if chat_template is not None else "--show-prompt"
        raise UsageError(f"{flag} only applies with --chat", hint="add --chat and give a JSON list of messages")


def _read_input(text: str | None, prompt: str | None, file: str | None, stdin: bool) -> tuple[str, bytes]:
    """The input bytes and a name for their source; exactly one source must be given."""
    given = [name for name, on in (("TEXT", text is not None), ("-p/--prompt", prompt is not None),
                                   ("-f/--file", file is not None), ("--stdin", stdin)) if on]
    if len(given) != 1:
        what = "no input given" if not given else f"{' and '.join(given)} given together"
        raise UsageError(f"{what}: give exactly one of TEXT, -p/--prompt, -f/--file or --stdin",
                         hint='e.g. pyllama tokenize -m model.gguf "Hello world"')
    if file is not None:
        try:
            with open(file, "rb") as fh:
                return file, fh.read()
        except OSError as exc:
            raise InputError(f"cannot read {file}: {exc.strerror or exc}") from exc
    if stdin:
        return "standard input", sys.stdin.buffer.read()
    # Command-line text round-trips to the exact bytes typed, even when they are not UTF-8.
    return "the text", (text if text is not None else prompt or "").encode("utf-8", "surrogateescape")


def _prompt_block(rendered: str) -> bytes:
    data = rendered.encode("utf-8")
    return data if data.endswith(b"\n") else data + b"\n"


def _write(chunks: Iterable[bytes]) -> None:
    """Write byte chunks straight to stdout's buffer (the text layer is flushed first to keep the order)."""
    sys.stdout.flush()
    out = sys.stdout.buffer
    for chunk in chunks:
        write_all(out, chunk)
    out.flush()


@model_options(load=False)
def detokenize(
    model: ModelRequest,
    token_ids: Annotated[list[str] | None, typer.Argument(
        metavar="ID...", help="Token ids: 1 2 3, 1,2,3 or [1, 2, 3].", show_default=False)] = None,
    stdin: Annotated[bool, typer.Option(
        "--stdin", help="Read the ids from standard input (tokenize's --ids or --json output works).")] = False,
    verbose: VerboseOpt = False,
) -> None:
    """Print the text that token ids stand for: the inverse of `pyllama tokenize`.

    The BOS the model adds by itself is dropped, so tokenize then detokenize gives the text back.
    """
    if bool(token_ids) == stdin:
        raise UsageError("give the ids either as arguments or with --stdin" if stdin else "no token ids given",
                         hint="e.g. pyllama detokenize -m model.gguf 1 15043 3186")
    from ..core.text import tokenizer as tk

    raw = _stdin_ids_text() if stdin else " ".join(token_ids or [])
    token_list = tk.parse_ids(raw)
    with open_model(model, LoadSettings(verbose=verbose), vocab_only=True, progress=model_progress()) as session:
        data = tk.detokenize_ids(session.model, token_list)
    # A terminal gets a final newline so the shell prompt does not land on the text; pipes get the bytes.
    _write([data + b"\n" if stdout_is_tty() and not data.endswith(b"\n") else data])


def _stdin_ids_text() -> str:
    """Standard input as text, read as bytes: the text layer's decoding fails in a strict UTF-8 locale."""
    data = sys.stdin.buffer.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"standard input is not UTF-8 text (byte {exc.start}), so not token ids",
                         hint="give integers, e.g. 1 15043 3186 or [1, 15043, 3186]") from None
