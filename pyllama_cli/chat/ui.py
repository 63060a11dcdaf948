"""The chat REPL's front ends: what it reads from the user and how it shows answers.

`TerminalUI` (stdin and stdout are terminals): prompt-toolkit input with persistent history,
Ctrl-R search, `\"\"\"` blocks, Alt-Enter newlines, bracketed paste, Ctrl-G for $EDITOR and Tab
completion; answers rendered live as Markdown with rich (raw text with --plain); chrome on stderr.
`PlainUI` (scripts, pipes): one message per line, answers on stdout followed by a blank line, no
colours, everything else on stderr. The REPL only talks to `read_line` and the `show_*` methods,
which is the seam tests drive.
"""

from __future__ import annotations

import itertools
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from ..core.text.reasoning import ReasoningSplitter, Thinking

try:
    import termios
except ImportError:  # Windows: no echo control, nothing else changes
    termios = None  # type: ignore[assignment]

REASONING_SHOW = "show"
REASONING_HIDE = "hide"
BLOCK_QUOTES = '"""'
REFRESH_S = 0.08  # live Markdown re-render interval: smooth enough, cheap on long answers


class ChatUI:
    """What the REPL needs from a front end."""

    interactive = False

    def read_line(self) -> str | None:
        """The next message or command; None at end of input. Ctrl-C raises KeyboardInterrupt."""
        raise NotImplementedError

    def show_answer(self, chunks: Iterable[str], thinking: Thinking = Thinking()) -> str:
        """Show streamed answer text as it arrives; return all of it."""
        raise NotImplementedError

    def show_info(self, text: str) -> None:
        """Output the user asked for (/help, /show)."""
        raise NotImplementedError

    def notice(self, text: str) -> None:
        """A short status line (command results, warnings)."""
        raise NotImplementedError

    def error(self, message: str, hint: str | None = None) -> None:
        raise NotImplementedError

    def show_stats(self, line: str) -> None:
        self.notice(line)

    def banner(self, lines: list[str]) -> None:
        """Start-up lines; only terminals show them."""

    def echo_user(self, text: str) -> None:
        """Show a message the user did not type (-p)."""

    def edit(self, text: str = "") -> str | None:
        """Let the user write a message in $EDITOR; None when there is no terminal for it."""
        return None


# ---------------------------------------------------------------- plain (pipes, scripts)


class PlainUI(ChatUI):
    """Line-oriented chat for pipes: answers on stdout, each followed by a blank line; the rest on stderr."""

    def __init__(self, reasoning: str = REASONING_SHOW, stdin: IO[str] | None = None, stdout: IO[str] | None = None,
                 stderr: IO[str] | None = None):
        self.reasoning = reasoning
        self.stdin = stdin or sys.stdin
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr

    def _line(self) -> str | None:
        line = self.stdin.readline()
        return line.rstrip("\r\n") if line else None

    def read_line(self) -> str | None:
        line = self._line()
        if line is not None and line.lstrip().startswith(BLOCK_QUOTES):
            return collect_block(line, self._line)
        return line

    def show_answer(self, chunks: Iterable[str], thinking: Thinking = Thinking()) -> str:
        raw: list[str] = []
        splitter = thinking.splitter()
        newlines = ""  # trailing newlines wait until more text follows: the answer ends with exactly one
        started = False
        for chunk in itertools.chain(chunks, [""]):  # "" flushes text held back as a possible tag ("a <" at the end)
            raw.append(chunk)
            if self.reasoning == REASONING_SHOW:
                parts = [(False, chunk)]
            else:
                parts = splitter.feed(chunk) if chunk else splitter.flush()
            for is_reasoning, text in parts:
                if is_reasoning:
                    continue
                if not started:
                    text = text.lstrip("\n") if self.reasoning == REASONING_HIDE else text
                    started = bool(text)
                body = text.rstrip("\n")
                if body:
                    self.stdout.write(newlines + body)
                    newlines = ""
                newlines += text[len(body):]
            self.stdout.flush()
        self.stdout.write("\n\n")
        self.stdout.flush()
        return "".join(raw)

    def show_info(self, text: str) -> None:
        self._err(text)

    def notice(self, text: str) -> None:
        self._err(text)

    def error(self, message: str, hint: str | None = None) -> None:
        self._err(f"Error: {message}" + (f"\nHint: {hint}" if hint else ""))

    def _err(self, text: str) -> None:
        self.stderr.write(text + "\n")
        self.stderr.flush()


def collect_block(first: str, more: Callable[[], str | None]) -> str:
    """The message of a \"\"\" block: lines up to the closing \"\"\" (end of input closes it too)."""
    body = first.lstrip()[len(BLOCK_QUOTES):]
    if body.rstrip().endswith(BLOCK_QUOTES):
        return body.rstrip()[: -len(BLOCK_QUOTES)].strip("\n")
    lines = [body] if body else []
    while (line := more()) is not None:
        if line.rstrip().endswith(BLOCK_QUOTES):
            tail = line.rstrip()[: -len(BLOCK_QUOTES)]
            if tail:
                lines.append(tail)
            break
        lines.append(line)
    return "\n".join(lines)


def is_open_block(text: str) -> bool:
    """True while `text` is a triple-quote block still waiting for its closing quotes."""
    body = text.lstrip()
    return body.startswith(BLOCK_QUOTES) and not body[len(BLOCK_QUOTES):].rstrip().endswith(BLOCK_QUOTES)


def stats_line(stats: Any, n_used: int, n_ctx: int) -> str:
    """`[ Prompt: X t/s | Generation: Y t/s | TTFT: Z s | Context: used/n_ctx ]` for a GenerationStats, with
    `| Draft: accepted/drafted (rate)` before Context when speculative decoding drafted tokens."""
    draft = (f"Draft: {stats.n_draft_accepted}/{stats.n_drafted} ({stats.draft_acceptance:.0%}) | "
             if stats.n_drafted else "")
    return (f"[ Prompt: {stats.prompt_tps:.1f} t/s | Generation: {stats.generation_tps:.1f} t/s | "
            f"TTFT: {stats.ttft_ms / 1000:.2f} s | {draft}Context: {n_used}/{n_ctx} ]")


# ---------------------------------------------------------------- terminal


class TerminalUI(ChatUI):
    """prompt-toolkit input and rich output for a person at a terminal.

    `pt_input`/`pt_output` and the consoles can be given so tests drive it through pipes.
    """

    interactive = True

    def __init__(self, *, history: Path | None, commands: list[str], plain: bool = False,
                 reasoning: str = REASONING_SHOW, pt_input: Any = None, pt_output: Any = None,
                 console: Any = None, err_console: Any = None):
        from rich.console import Console
        from rich.theme import Theme

        from ..console import STYLES, err

        self.plain = plain
        self.reasoning = reasoning
        self.console = console or Console(theme=Theme(STYLES), highlight=False)
        self.err = err_console or err()
        self.session = _prompt_session(history, commands, pt_input, pt_output)

    def read_line(self) -> str | None:
        try:
            line = self.session.prompt("> ")
        except EOFError:
            return None
        # A triple-quote block was edited as one buffer (Enter adds lines until it is closed): one history entry.
        return collect_block(line, lambda: None) if line.lstrip().startswith(BLOCK_QUOTES) else line

    def show_answer(self, chunks: Iterable[str], thinking: Thinking = Thinking()) -> str:
        render = self._stream_plain if self.plain else self._stream_markdown
        with _no_echo():
            return render(chunks, thinking.splitter())

    def _stream_plain(self, chunks: Iterable[str], splitter: ReasoningSplitter) -> str:
        from rich.text import Text

        raw = []
        # Chained, not listed: each chunk is shown as it is generated. "" flushes text held back as a possible tag.
        for chunk in itertools.chain(chunks, [""]):
            raw.append(chunk)
            for is_reasoning, text in splitter.feed(chunk) if chunk else splitter.flush():
                if not (is_reasoning and self.reasoning == REASONING_HIDE):
                    self.console.print(Text(text, style="dim" if is_reasoning else ""), end="")
        self.console.print()
        return "".join(raw)

    def _stream_markdown(self, chunks: Iterable[str], splitter: ReasoningSplitter) -> str:
        from rich.live import Live

        raw: list[str] = []
        reasoning: list[str] = []
        answer: list[str] = []
        last = 0.0
        # Refreshed by hand (no timer thread): output stays in step with the tokens.
        with Live(console=self.console, auto_refresh=False, transient=True, vertical_overflow="visible") as live:
            for chunk in chunks:
                raw.append(chunk)
                for is_reasoning, text in splitter.feed(chunk):
                    (reasoning if is_reasoning else answer).append(text)
                if time.monotonic() - last >= REFRESH_S:
                    live.update(_Tail(self._renderable(reasoning, answer)), refresh=True)
                    last = time.monotonic()
        for is_reasoning, text in splitter.flush():
            (reasoning if is_reasoning else answer).append(text)
        self.console.print(self._renderable(reasoning, answer))
        return "".join(raw)

    def _renderable(self, reasoning: list[str], answer: list[str]) -> Any:
        from rich.console import Group
        from rich.markdown import Markdown
        from rich.text import Text

        parts: list[Any] = []
        if reasoning and self.reasoning == REASONING_SHOW:
            parts.append(Text("".join(reasoning).strip("\n"), style="dim italic"))
        parts.append(Markdown("".join(answer).lstrip("\n")))
        return Group(*parts)

    def show_info(self, text: str) -> None:
        self.err.print(text, markup=False, emoji=False, highlight=False)

    def notice(self, text: str) -> None:
        self.err.print(text, style="muted", markup=False, emoji=False, highlight=False)

    def error(self, message: str, hint: str | None = None) -> None:
        from rich.markup import escape

        self.err.print(f"[error]Error:[/error] {escape(message)}", emoji=False, highlight=False)
        if hint:
            self.err.print(f"[hint]Hint:[/hint] {escape(hint)}", emoji=False, highlight=False)

    def banner(self, lines: list[str]) -> None:
        for i, line in enumerate(lines):
            self.err.print(line, style="accent" if i == 0 else "muted", markup=False, emoji=False, highlight=False)

    def echo_user(self, text: str) -> None:
        self.console.print(f"> {text}", markup=False, emoji=False, highlight=False)

    def edit(self, text: str = "") -> str | None:
        return edit_in_editor(text)


@contextmanager
def _no_echo() -> Iterator[None]:
    """Keep the terminal from echoing keys (a Ctrl-C's "^C") into the answer being redrawn."""
    if termios is None:
        yield
        return
    try:
        fd = sys.stdin.fileno()
        saved = termios.tcgetattr(fd) if os.isatty(fd) else None
    except (AttributeError, ValueError, OSError, termios.error):
        saved = None
    if saved is None:
        yield
        return
    quiet = list(saved)
    quiet[3] &= ~termios.ECHO
    termios.tcsetattr(fd, termios.TCSANOW, quiet)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSANOW, saved)


class _Tail:
    """While streaming, only the last screenful is redrawn: rich cannot move the cursor above the screen."""

    def __init__(self, renderable: Any):
        self.renderable = renderable

    def __rich_console__(self, console: Any, options: Any) -> Any:
        from rich.segment import Segment

        height = max(1, console.size.height - 1)
        lines = console.render_lines(self.renderable, options.update(height=None), pad=False)
        for line in lines[-height:]:
            yield from line
            yield Segment.line()


def _prompt_session(history: Path | None, commands: list[str], pt_input: Any, pt_output: Any) -> Any:
    from prompt_toolkit import PromptSession
    from prompt_toolkit.application import get_app
    from prompt_toolkit.filters import Condition
    from prompt_toolkit.history import FileHistory, InMemoryHistory
    from prompt_toolkit.key_binding import KeyBindings

    bindings = KeyBindings()

    @Condition
    def open_block() -> bool:
        return is_open_block(get_app().current_buffer.text)

    @bindings.add("enter", filter=open_block)
    def _block_newline(event: Any) -> None:
        event.current_buffer.insert_text("\n")

    @bindings.add("escape", "enter")
    def _newline(event: Any) -> None:
        event.current_buffer.insert_text("\n")

    @bindings.add("c-g")
    def _editor(event: Any) -> None:
        event.current_buffer.open_in_editor()

    store: Any = InMemoryHistory()
    if history is not None:
        try:
            history.parent.mkdir(parents=True, exist_ok=True)
            store = FileHistory(str(history))
        except OSError:
            pass  # a read-only home: history for this session only
    return PromptSession(
        history=store, key_bindings=bindings, completer=_slash_completer(commands), complete_while_typing=True,
        placeholder="Send a message (/help for commands)", input=pt_input, output=pt_output,
        prompt_continuation="... ",
        enable_open_in_editor=False,
    )


def _slash_completer(commands: list[str]) -> Any:
    """Tab completes slash commands, and file paths after /read, /save and /load."""
    from prompt_toolkit.completion import Completer, Completion, PathCompleter
    from prompt_toolkit.document import Document

    paths = PathCompleter(expanduser=True)

    class SlashCompleter(Completer):
        def get_completions(self, document: Any, event: Any) -> Any:
            text = document.text_before_cursor
            if text.startswith("/") and " " not in text:
                yield from (Completion(n, start_position=-len(text)) for n in commands if n.startswith(text))
                return
            for prefix in PATH_COMMANDS:
                if text.startswith(prefix):
                    rest = text[len(prefix):]
                    yield from paths.get_completions(Document(rest, len(rest)), event)
                    return

    return SlashCompleter()


PATH_COMMANDS = ("/read ", "/save ", "/load ")


# ---------------------------------------------------------------- helpers


def edit_in_editor(text: str = "") -> str | None:
    """Open $VISUAL/$EDITOR (else vi) on `text`; the saved text, or None if the editor failed."""
    editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
    fd, path = tempfile.mkstemp(prefix="pyllama-", suffix=".md")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        try:
            done = subprocess.run([*shlex.split(editor), path], check=False)
        except OSError:
            return None
        if done.returncode != 0:
            return None
        return Path(path).read_text(encoding="utf-8").rstrip("\n")
    finally:
        os.unlink(path)


# Clipboard writers, first found wins: Wayland, X11 (two tools), macOS, WSL/Windows.
CLIPBOARD_TOOLS = (["wl-copy"], ["xclip", "-selection", "clipboard"], ["xsel", "--clipboard", "--input"],
                   ["pbcopy"], ["clip.exe"])


def copy_to_clipboard(text: str) -> str | None:
    """Put `text` on the clipboard; the tool used, or None when no clipboard tool is installed."""
    for cmd in CLIPBOARD_TOOLS:
        if shutil.which(cmd[0]):
            try:
                done = subprocess.run(cmd, input=text.encode("utf-8"), check=False, timeout=5,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            except (OSError, subprocess.TimeoutExpired):
                continue
            if done.returncode == 0:
                return cmd[0]
    return None
