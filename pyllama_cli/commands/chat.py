"""`pyllama chat`: a conversation with a model, in a terminal or from a script."""

from __future__ import annotations

import os
import sys
from contextlib import closing
from pathlib import Path
from typing import Annotated, Any

import typer

from ..console import model_progress
from ..core.model.resolve import ModelRequest
from ..core.model.session import open_model
from ..core.model.settings import LoadSettings
from ..errors import InputError, UsageError
from ..options.load import ChatTemplateOpt, SystemPromptOpt, in_panel, media_options, model_options
from ..options.sampling import SamplingOptions, sampling_options
from ..options.speculative import SpeculativeOptions, speculative_options

EXAMPLES = """\
Examples:
  pyllama chat -m model.gguf
  pyllama chat -hf ggml-org/gemma-3-1b-it-GGUF -sys "Answer in one sentence."
  pyllama chat -m model.gguf -p "Summarize RFC 2119" --single-turn
  pyllama chat -m model.gguf --chat-template chatml --temp 0.2 -c 8192 --context-shift
  printf 'hi\\n/save chat.json\\n' | pyllama chat -m model.gguf
"""

CHAT_PANEL = "Chat"
REASONING_CHOICES = ("show", "hide")
HISTORY_FILE = "chat_history"


@model_options(load=True)
@sampling_options()
@speculative_options()
@media_options()
def chat(
    model: ModelRequest,
    load: LoadSettings,
    media: Any,
    sampling: SamplingOptions,
    speculative: SpeculativeOptions,
    system_prompt: in_panel(SystemPromptOpt, CHAT_PANEL) = None,
    system_prompt_file: Annotated[Path | None, typer.Option(
        "-sysf", "--system-prompt-file", help="Read the system prompt from this file.", rich_help_panel=CHAT_PANEL,
        show_default=False, dir_okay=False)] = None,
    prompt: Annotated[str | None, typer.Option(
        "-p", "--prompt", help="First user message.", rich_help_panel=CHAT_PANEL, show_default=False)] = None,
    single_turn: Annotated[bool, typer.Option(
        "-st", "--single-turn", help="Answer one message (-p or the first line read) and exit.",
        rich_help_panel=CHAT_PANEL)] = False,
    chat_template: in_panel(ChatTemplateOpt, CHAT_PANEL) = None,
    context_shift: Annotated[bool, typer.Option(
        "--context-shift", help="When the conversation outgrows the context, drop the oldest turns (never the "
        "system prompt) instead of stopping.", rich_help_panel=CHAT_PANEL)] = False,
    plain: Annotated[bool, typer.Option(
        "--plain", help="Print answers as raw text instead of rendered Markdown.", rich_help_panel=CHAT_PANEL)] = False,
    reasoning: Annotated[str, typer.Option(
        "--reasoning", help="Reasoning between <think> and </think>: show (dimmed) or hide.",
        rich_help_panel=CHAT_PANEL)] = "show",
    no_history: Annotated[bool, typer.Option(
        "--no-history", help="Do not read or write the input history file.", rich_help_panel=CHAT_PANEL)] = False,
) -> None:
    """Chat with a model using its chat template; the KV cache is kept between turns.

    On a terminal: Markdown answers, input history (Up/Down, Ctrl-R), \"\"\" or Alt-Enter for several
    lines, Ctrl-G for $EDITOR, Tab completion, /help for the slash commands. With stdin not a
    terminal: one message per line, each answer on stdout followed by a blank line.
    """
    from ..chat.repl import ChatRepl, ChatSettings
    from ..core.text.chat_template import resolve_template
    from ..core.generate.conversation import Conversation, open_chat_engine
    from ..core.generate.speculative import resolve_draft
    from ..core.media.projector import open_projector, with_hf_projector

    if reasoning not in REASONING_CHOICES:
        raise typer.BadParameter(f"{reasoning!r} is not one of {', '.join(REASONING_CHOICES)}",
                                 param_hint="'--reasoning'")
    system = _system_prompt(system_prompt, system_prompt_file)
    if chat_template:
        resolve_template(None, chat_template)  # an unknown name fails before the model loads
    if not (model.model or model.hf_repo or model.hf_file) and _on_terminal():
        from ..chat.first_run import first_run_request

        model = first_run_request(model)  # pick a cached model, or fetch a small first one
    progress = model_progress()
    spec = resolve_draft(speculative.settings, speculative.draft, progress.download)
    with open_model(model, load, progress=progress) as session, \
            open_projector(with_hf_projector(media, model, session.resolved, progress.download), session.model,
                           load.n_threads) as projector, \
            closing(open_chat_engine(session, load, chat_template, spec)) as engine:
        engine.projector = projector  # /image (docs/multimodal.md)
        ui = _make_ui(plain, reasoning, no_history)
        settings = ChatSettings(sampling=sampling.settings, max_tokens=sampling.n_predict, stop=sampling.stop,
                                context_shift=context_shift)
        ui.banner(_banner(session.path.name, session.model.description, engine.template_name, engine.n_ctx, system))
        code = ChatRepl(engine, ui, Conversation(system=system), settings).run(prompt, single_turn)
    if code:
        raise typer.Exit(code)


def _system_prompt(text: str | None, path: Path | None) -> str:
    if text is not None and path is not None:
        raise UsageError("-sys and -sysf cannot be used together", hint="give the system prompt one way")
    if path is None:
        return text or ""
    try:
        return path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read the system prompt file {path}: {getattr(exc, 'strerror', None) or exc}") from exc


def _make_ui(plain: bool, reasoning: str, no_history: bool):
    from ..chat.repl import command_names
    from ..chat.ui import PlainUI, TerminalUI
    from ..core.paths import data_dir

    if not _on_terminal():
        return PlainUI(reasoning=reasoning, stdin=_lenient(sys.stdin))
    history = None if no_history else data_dir() / HISTORY_FILE
    return TerminalUI(history=history, commands=command_names(), plain=plain, reasoning=reasoning)


def _on_terminal() -> bool:
    return sys.stdin.isatty() and sys.stdout.isatty() and os.environ.get("TERM") != "dumb"


def _lenient(stdin: Any) -> Any:
    """stdin with bytes that do not decode read as U+FFFD, as the model's answers are: messages are text
    (rendered by templates, saved as JSON), and a strict locale would fail the read itself."""
    if hasattr(stdin, "reconfigure"):
        stdin.reconfigure(errors="replace")
    return stdin


def _banner(name: str, description: str, template: str, n_ctx: int, system: str) -> list[str]:
    return [f"pyllama chat · {name} ({description})",
            f"template: {template} · context: {n_ctx} tokens" + (" · custom system prompt" if system else ""),
            "/help for commands · Ctrl-C stops an answer · Ctrl-D or /exit quits"]
