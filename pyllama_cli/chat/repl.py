"""The chat REPL: messages and slash commands read from a ChatUI, answers from a ChatEngine.

A line starting with `/` is a command (matched by unique prefix, as llama-cli does); `//` sends a
message that starts with `/`. Commands never reach the model; an unknown one is an error with a hint.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from .set_values import parse_param
from .ui import ChatUI, copy_to_clipboard, stats_line
from ..core.generate.conversation import ChatEngine, Conversation, fit_context
from ..core.generate.decide import STOP_CONTEXT, STOP_INTERRUPTED
from ..core.interrupt import StopFlag, catch_sigint
from ..core.generate.sampling import SamplingSettings, check_logit_bias
from ..errors import InputError, Interrupted, PyllamaError

MEDIA_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".bmp", ".wav", ".mp3", ".flac")  # what a dropped path may be
DOUBLE_PRESS_S = 1.0  # a second Ctrl-C within this many seconds exits
EXIT_INTERRUPTED = 130


@dataclass(frozen=True)
class SlashCommand:
    name: str
    usage: str
    help: str
    aliases: tuple[str, ...] = ()


SLASH_COMMANDS = [
    SlashCommand("/help", "/help", "show this help", ("/?",)),
    SlashCommand("/exit", "/exit", "leave the chat (also /bye, Ctrl-D)", ("/bye", "/quit")),
    SlashCommand("/clear", "/clear", "forget the conversation, keep the system prompt"),
    SlashCommand("/regen", "/regen", "drop the last answer and answer again"),
    SlashCommand("/undo", "/undo", "drop the last exchange (your message and its answer)"),
    SlashCommand("/system", "/system [TEXT]", "set the system prompt (no TEXT: show it; '-': remove it)"),
    SlashCommand("/set", "/set [PARAM VALUE]", "change a sampling parameter or max_tokens (no args: list them)"),
    SlashCommand("/show", "/show", "model, template, parameters and context usage"),
    SlashCommand("/read", "/read FILE", "add a file's text to your next message"),
    SlashCommand("/image", "/image FILE", "attach an image (or audio clip) to your next message (needs --mmproj)",
                 ("/audio",)),
    SlashCommand("/save", "/save FILE", "save the conversation: .json (messages) or .md (transcript)"),
    SlashCommand("/load", "/load FILE.json", "continue a conversation saved with /save"),
    SlashCommand("/stats", "/stats", "turn the stats line after each answer on or off"),
    SlashCommand("/copy", "/copy", "copy the last answer to the clipboard"),
    SlashCommand("/edit", "/edit", "write the next message in $EDITOR (also Ctrl-G)"),
]

KEYS_HELP = ('keys: Ctrl-C stops an answer · Ctrl-D exits · Alt-Enter new line · """ starts and ends a '
             "multi-line message · Ctrl-G opens $EDITOR · Ctrl-R searches history · Tab completes")


def command_names() -> list[str]:
    return [c.name for c in SLASH_COMMANDS] + [a for c in SLASH_COMMANDS for a in c.aliases]


def find_command(word: str) -> SlashCommand | None:
    """The command `word` names: exactly, by alias, or by a unique prefix; None when none matches.

    Raises:
        InputError: several commands start with `word`.
    """
    word = word.lower()
    for c in SLASH_COMMANDS:
        if word == c.name or word in c.aliases:
            return c
    matches = [c for c in SLASH_COMMANDS if c.name.startswith(word)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise InputError(f"{word} is ambiguous: {', '.join(c.name for c in matches)}")
    return None


# ---------------------------------------------------------------- the REPL


class CtrlC(StopFlag):
    """Set by Ctrl-C; also notices a second Ctrl-C within a second, which means: exit."""

    def __init__(self) -> None:
        super().__init__()
        self.last = float("-inf")
        self.exit = False

    def press(self) -> bool:
        """Record a Ctrl-C; True when it is the second one within DOUBLE_PRESS_S."""
        now = time.monotonic()
        if now - self.last < DOUBLE_PRESS_S:
            self.exit = True
        self.last = now
        return self.exit

    def set(self) -> None:
        self.press()
        super().set()


@dataclass
class ChatSettings:
    """What the REPL may change while it runs."""

    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    max_tokens: int = -1
    stop: tuple[str, ...] = ()
    context_shift: bool = False
    show_stats: bool = True


class ChatRepl:
    """Runs a chat: reads lines, runs commands, streams answers, keeps the conversation."""

    def __init__(self, engine: ChatEngine, ui: ChatUI, conv: Conversation, settings: ChatSettings):
        self.engine = engine
        self.ui = ui
        self.conv = conv
        self.settings = settings
        self.ctrl_c = CtrlC()
        self.n_answers = 0
        self.exit_code: int | None = None
        self.failed = False  # a command or message failed: a script feeding stdin must learn of it

    def run(self, first_message: str | None = None, single_turn: bool = False) -> int:
        """Chat until /exit, end of input or a double Ctrl-C; return the exit code.

        0, 130 after Ctrl-C, or 1 when input that was not typed at a terminal (a pipe, or -st) had a
        message or command fail: a script cannot read the notice, only the exit code.
        """
        if first_message is not None:
            self.ui.echo_user(first_message)
            self.send(first_message)
            if single_turn or self.exit_code is not None:
                return self._exit_code()
        while self.exit_code is None:
            try:
                line = self.ui.read_line()
            except KeyboardInterrupt:
                if self.ctrl_c.press():
                    return EXIT_INTERRUPTED
                self.ui.notice("(Ctrl-C again to quit; or /exit, /bye, Ctrl-D)")
                continue
            if line is None:
                break
            answered = self.handle(line)
            if single_turn and (answered or self.failed):
                break
        return self._exit_code()

    def _exit_code(self) -> int:
        code = self.exit_code or 0  # /exit leaves with 0 unless something failed on the way
        return 1 if code == 0 and self.failed and not self.ui.interactive else code

    def handle(self, line: str) -> bool:
        """Act on one line; True when it was sent to the model."""
        if not line.strip():
            return False
        if line.startswith("//"):
            return self.send(line[1:])
        dropped = self._dropped_media(line)
        if line.startswith("/") or dropped:
            word, _, arg = line.strip().partition(" ")
            try:
                if dropped:  # a file dropped on the terminal: attached as /image does
                    self.cmd_image(dropped)
                    return False
                cmd = find_command(word)
                if cmd is None:
                    raise InputError(f"unknown command {word}", hint="/help lists them (// sends a message starting with /)")
                return self.command(cmd, arg.strip())
            except PyllamaError as exc:
                self.failed = True
                self.ui.error(exc.message, exc.hint)
                return False
        return self.send(line)

    # ---- answering

    def send(self, text: str) -> bool:
        """Add a user message and answer it; a message that cannot be answered is taken back."""
        self.conv.add_user(text)
        if not self.respond() and self.conv.messages and self.conv.messages[-1]["role"] == "user":
            self.conv.messages.pop()
            self.ui.notice("(message not kept; Up recalls it)" if self.ui.interactive else "(message not kept)")
            return False
        return True

    def respond(self) -> bool:
        """Answer the conversation's last message; False when no answer could start."""
        s = self.settings
        try:
            dropped = fit_context(self.conv, self.engine.count_tokens, self.engine.n_ctx,
                                  reserve=self._reserve(), shift=s.context_shift)
            if dropped:
                self.ui.notice(f"Context full: dropped the {dropped} oldest turn{'s' if dropped > 1 else ''} "
                               "(the system prompt stays).")
            text = self._stream()
        except PyllamaError as exc:
            self.failed = True
            self.ui.error(exc.message, exc.hint)
            return False
        if text is None:
            return False
        self.conv.add_assistant(text)
        self._after_answer()
        return True

    def _reserve(self) -> int:
        """Context room an answer needs before it starts: with --context-shift, room for a whole answer."""
        n_ctx, max_tokens = self.engine.n_ctx, self.settings.max_tokens
        if not self.settings.context_shift:
            return 1
        return min(max_tokens if max_tokens > 0 else n_ctx // 4, n_ctx // 2)

    def _stream(self) -> str | None:
        """Stream one answer; its text (possibly cut by Ctrl-C), or None when stopped before any text."""
        s = self.settings
        sampling = s.sampling
        if sampling.seed >= 0:  # a fixed seed still gives /regen a new answer, reproducibly
            sampling = replace(sampling, seed=(sampling.seed + self.n_answers) % (2**32 - 1))
        self.n_answers += 1
        self.ctrl_c.clear()
        with catch_sigint(self.ctrl_c):
            try:
                chunks = self.engine.answer(self.conv.to_messages(), sampling, max_tokens=s.max_tokens,
                                            stop=s.stop, stop_flag=self.ctrl_c.__bool__)
                text = self.ui.show_answer(chunks, self.engine.thinking)
            except Interrupted:
                text = ""
        if self.ctrl_c.exit:
            self.exit_code = EXIT_INTERRUPTED
        if self.engine.stats.stop_reason == STOP_INTERRUPTED and not text:
            self.ui.notice("(stopped before the answer began)")
            return None
        return text

    def _after_answer(self) -> None:
        stats = self.engine.stats
        if self.exit_code is not None:
            return
        if stats.stop_reason == STOP_INTERRUPTED:
            self.ui.notice("(answer stopped; the part shown is kept)")
        elif stats.stop_reason == STOP_CONTEXT:
            self.ui.error(f"the answer was cut: the context is full ({self.engine.n_used}/{self.engine.n_ctx} tokens)",
                          self._answer_cut_hint())
        if self.settings.show_stats:
            self.ui.show_stats(stats_line(stats, stats.n_prompt + stats.n_generated, self.engine.n_ctx))

    def _answer_cut_hint(self) -> str:
        if not self.settings.context_shift:
            return "/clear to start over, or restart with a larger -c or with --context-shift"
        # Turns are dropped before an answer starts, never during one: a limit leaves room for a whole answer.
        return "/set n N to keep answers shorter, /clear to start over, or restart with a larger -c"

    # ---- commands

    def command(self, cmd: SlashCommand, arg: str) -> bool:
        """Run a slash command; True when it sent something to the model."""
        handler = getattr(self, "cmd_" + cmd.name[1:])
        return bool(handler(arg))

    def cmd_help(self, _arg: str) -> None:
        width = max(len(c.usage) for c in SLASH_COMMANDS) + 2
        lines = ["commands:"] + [f"  {c.usage:<{width}}{c.help}" for c in SLASH_COMMANDS]
        lines.append("  //TEXT" + " " * (width - 6) + "send TEXT starting with /")
        self.ui.show_info("\n".join(lines + ([KEYS_HELP] if self.ui.interactive else [])))

    def cmd_exit(self, _arg: str) -> None:
        self.exit_code = 0

    def cmd_clear(self, _arg: str) -> None:
        self.conv.clear()
        self.ui.notice("Chat history cleared (the system prompt stays).")

    def cmd_regen(self, _arg: str) -> bool:
        if not self.conv.drop_last_answer() and not (self.conv.messages and self.conv.messages[-1]["role"] == "user"):
            self.ui.notice("No answer to regenerate.")
            return False
        return self.respond()

    def cmd_undo(self, _arg: str) -> None:
        self.ui.notice("Removed the last exchange." if self.conv.undo() else "Nothing to undo.")

    def cmd_system(self, arg: str) -> None:
        if not arg:
            self.ui.show_info(self.conv.system or "(no system prompt)")
            return
        self.conv.system = "" if arg == "-" else arg
        self.ui.notice("System prompt removed." if arg == "-" else "System prompt set.")

    def cmd_set(self, arg: str) -> None:
        name, _, value = arg.partition(" ")
        if not name:
            self.ui.show_info(self.parameters_text())
            return
        key, typed = parse_param(name, value.strip())
        if key == "logit_bias":
            check_logit_bias(typed, self.engine.model.n_vocab, "logit_bias")
        s = self.settings
        if key == "max_tokens":
            s.max_tokens = typed
        elif key == "stop":
            s.stop = typed
        else:
            s.sampling = replace(s.sampling, **{key: typed})
        self.ui.notice(f"{key} = {_show_value(typed)}")

    def parameters_text(self) -> str:
        s = self.settings
        values = {f.name: getattr(s.sampling, f.name) for f in fields(s.sampling)}
        values.update(max_tokens=s.max_tokens, stop=s.stop)
        width = max(map(len, values)) + 2
        return "\n".join(f"  {k:<{width}}{_show_value(v)}" for k, v in values.items())

    def cmd_show(self, _arg: str) -> None:
        d = self.engine.describe()
        from ..console import human_count, human_size

        lines = [
            (f"model        {d['model']}  ({d['description']}, {human_count(d['parameters'])} parameters, "
            f"{human_size(d['size_bytes'])})"),
            f"template     {d['template']}",
            f"context      {self.engine.count_tokens(self.conv.to_messages())}/{d['n_ctx']} tokens used by the "
            f"conversation (trained: {d['n_ctx_train']})"
            + (", --context-shift on" if self.settings.context_shift else ""),
            f"turns        {self.conv.n_turns}",
            f"system       {self.conv.system or '(none)'}",
            "parameters",
            self.parameters_text(),
        ]
        self.ui.show_info("\n".join(lines))

    def cmd_read(self, arg: str) -> None:
        if not arg:
            raise InputError("/read needs a file name", hint="/read notes.txt")
        path = Path(arg).expanduser()
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            raise InputError(f"file does not exist or cannot be opened as text: '{arg}'") from None
        self.conv.attach(path.name, text)
        lines = text.count("\n") + (0 if text.endswith("\n") else 1)
        self.ui.notice(f"Loaded text from '{arg}' ({lines} lines); it goes with your next message.")

    def cmd_image(self, arg: str) -> None:
        from ..core.media.check import read_media

        if not arg:
            raise InputError("/image needs a file name", hint="/image photo.jpg")
        medium = read_media(Path(arg).expanduser())
        if self.engine.projector is None:
            sense = "see images" if medium.kind == "image" else "hear audio"
            raise InputError(f"this model cannot {sense}: there is no projector", hint="start chat with --mmproj FILE")
        self.engine.projector.check_kind(medium)  # refused now, not when the next message is sent
        self.conv.attach_media(medium)
        size = f" {medium.width}x{medium.height}" if medium.kind == "image" else ""
        self.ui.notice(f"Attached '{arg}' ({medium.format}{size}); it goes with your next message.")

    def _dropped_media(self, line: str) -> str:
        """The path in a line that is only an existing image or clip's path (quoted, or with backslashed spaces,
        as terminals paste a dropped file), when there is a projector; else ""."""
        path = line.strip().strip("'\"").replace("\\ ", " ")
        ok = self.engine.projector is not None and Path(path).suffix.lower() in MEDIA_SUFFIXES
        return path if ok and Path(path).expanduser().is_file() else ""

    def cmd_save(self, arg: str) -> None:
        if not arg:
            raise InputError("/save needs a file name", hint="/save chat.json or /save chat.md")
        self.conv.save(Path(arg).expanduser(), title=self.engine.describe()["model"])
        self.ui.notice(f"Saved {len(self.conv.to_messages())} messages to {arg}.")

    def cmd_load(self, arg: str) -> None:
        if not arg or Path(arg).suffix.lower() != ".json":
            raise InputError("/load reads a .json file written by /save", hint="/load chat.json")
        self.conv.load(Path(arg).expanduser())
        self.ui.notice(f"Loaded {len(self.conv.to_messages())} messages from {arg}.")

    def cmd_stats(self, _arg: str) -> None:
        self.settings.show_stats = not self.settings.show_stats
        self.ui.notice(f"Stats line {'on' if self.settings.show_stats else 'off'}.")

    def cmd_copy(self, _arg: str) -> None:
        answer = self.conv.last_answer()
        if answer is None:
            self.ui.notice("No answer to copy yet.")
            return
        tool = copy_to_clipboard(answer)
        self.ui.notice(f"Copied the last answer ({len(answer)} characters) with {tool}." if tool else
                       "No clipboard tool found (wl-copy, xclip, xsel, pbcopy): nothing copied.")

    def cmd_edit(self, _arg: str) -> bool:
        text = self.ui.edit("")
        if text is None:
            self.ui.notice("/edit needs a terminal and a working $EDITOR." if not self.ui.interactive
                           else "The editor failed; nothing sent.")
            return False
        if not text.strip():
            self.ui.notice("Empty message; nothing sent.")
            return False
        self.ui.echo_user(text)
        return self.send(text)


def _show_value(value: Any) -> str:
    if isinstance(value, str):
        return f"{len(value)} characters of GBNF" if "::=" in value else value
    if isinstance(value, tuple):
        return ", ".join(map(repr, value)) if value else "(none)"
    return "(none)" if value is None else str(value)
