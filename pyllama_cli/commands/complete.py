"""`pyllama complete`: stream a one-shot completion of a prompt to stdout."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from ..console import err, model_progress, silence_stdout, warn, write_all
from ..core.media.check import read_media_files
from ..core.text.escapes import process_text_escapes
from ..core.paths import require_folder
from ..core.model.resolve import ModelRequest
from ..core.model.session import open_model
from ..core.model.settings import LoadSettings
from ..errors import Interrupted, OutputClosed, UsageError
from ..options.adapters import MediaFileOpt
from ..options.load import ChatTemplateOpt, SystemPromptOpt, in_panel, media_options, model_options
from ..options.sampling import SamplingOptions, sampling_options, shift_options
from ..options.speculative import SpeculativeOptions, speculative_options

EXAMPLES = """\
Examples:
  pyllama complete -m model.gguf -p "The capital of France is" -n 32
  cat notes.txt | pyllama complete -m model.gguf -p "Summarize:" > summary.txt
  pyllama complete -m model.gguf -p "Is water wet? Answer:" --grammar yes_no
  pyllama complete -m model.gguf --chat -p "List three colors as JSON" -j '{"type": "array"}'
  pyllama complete -m model.gguf -f long-preamble.txt --prompt-cache preamble.bin --stats
  pyllama complete -m model.gguf --mmproj mmproj.gguf --image photo.jpg --chat -p "What is in the image?"
"""

PROMPT_PANEL = "Prompt"
OUTPUT_PANEL = "Output"
REASONING_CHOICES = ("show", "hide")


@model_options(load=True)
@sampling_options()
@shift_options()
@speculative_options()
@media_options()
def complete(
    model: ModelRequest,
    load: LoadSettings,
    sampling: SamplingOptions,
    speculative: SpeculativeOptions,
    media: Any,
    prompt: Annotated[str | None, typer.Option(
        "-p", "--prompt", help="Prompt text (piped stdin, if any, is appended after it).",
        rich_help_panel=PROMPT_PANEL, show_default=False)] = None,
    file: Annotated[Path | None, typer.Option(
        "-f", "--file", help="Read the prompt from this file (- reads standard input).", rich_help_panel=PROMPT_PANEL,
        show_default=False, dir_okay=False)] = None,
    escape: Annotated[bool, typer.Option(
        "--escape/--no-escape", "-e", help="Turn \\n, \\t, \\xHH... in the -p/-f prompt and -r texts into the "
        "characters they name, as llama.cpp does (piped stdin is taken as it is).",
        rich_help_panel=PROMPT_PANEL)] = True,
    image: in_panel(MediaFileOpt, PROMPT_PANEL) = None,
    chat: Annotated[bool, typer.Option(
        "--chat", help="Send the prompt as one user turn through the model's chat template (instruct models).",
        rich_help_panel=PROMPT_PANEL)] = False,
    system_prompt: in_panel(SystemPromptOpt, PROMPT_PANEL) = None,
    chat_template: in_panel(ChatTemplateOpt, PROMPT_PANEL) = None,
    reasoning: Annotated[str, typer.Option(
        "--reasoning", help="A reasoning model's thinking (between the template's markers, such as <think> and "
        "</think>): show it, or hide it and print the answer only.", rich_help_panel=OUTPUT_PANEL)] = "show",
    truncate: Annotated[bool, typer.Option(
        "--truncate", help="If the prompt is longer than the context, keep its end (and say so) instead of failing.",
        rich_help_panel=PROMPT_PANEL)] = False,
    prompt_cache: Annotated[Path | None, typer.Option(
        "--prompt-cache", help="Save the evaluated prompt's state to this file and reuse its longest matching "
        "prefix next time.", rich_help_panel=PROMPT_PANEL, show_default=False, dir_okay=False)] = None,
    echo: Annotated[bool, typer.Option(
        "--echo", help="Print the prompt before the generated text.", rich_help_panel=OUTPUT_PANEL)] = False,
    stats: Annotated[bool, typer.Option(
        "--stats", help="Print speed and stop reason on stderr after the text (also with -v).",
        rich_help_panel=OUTPUT_PANEL)] = False,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print the statistics as one JSON line on stderr (implies --stats).",
        rich_help_panel=OUTPUT_PANEL)] = False,
) -> None:
    """Complete a prompt and stream the generated text to stdout (only the text: `> out.txt` holds it).

    The prompt comes from -p, -f, or piped stdin (appended after -p when both are given).
    Sampling flags, grammars and JSON schemas follow llama.cpp's names and defaults.
    Ctrl-C stops at once, keeps what was printed and exits with 130.
    """
    from ..core.generate.one_shot import OneShot, OneShotRequest, as_typed, cut_warning, read_prompt
    from ..core.generate.speculative import resolve_draft, speculating
    from ..core.interrupt import StopFlag, catch_sigint
    from ..core.media.projector import open_projector, with_hf_projector
    from ..core.text.reasoning import AnswerOnly

    if system_prompt is not None and not chat:
        raise UsageError("-sys/--system-prompt needs --chat", hint="add --chat to use the chat template")
    if chat_template is not None and not chat:
        raise UsageError("--chat-template needs --chat", hint="add --chat to use the chat template")
    if reasoning not in REASONING_CHOICES:
        raise typer.BadParameter(f"{reasoning!r} is not one of {', '.join(REASONING_CHOICES)}",
                                 param_hint="'--reasoning'")
    if prompt_cache is not None:
        require_folder(prompt_cache, "the prompt cache")
    unescape = process_text_escapes if escape else as_typed
    attached = read_media_files(image or [])
    request = OneShotRequest(
        prompt=read_prompt(prompt, file, unescape), sampling=sampling.settings, n_predict=sampling.n_predict,
        stop=tuple(map(unescape, sampling.stop)), chat=chat, system_prompt=system_prompt, chat_template=chat_template,
        truncate=truncate, prompt_cache=prompt_cache, context_shift=sampling.context_shift, keep=sampling.keep,
        media=attached,
    )
    progress = model_progress()
    spec = resolve_draft(speculative.settings, speculative.draft, progress.download)
    with open_model(model, load, context={}, progress=progress) as session, \
            speculating(spec, load, session.model, session.ctx.n_ctx) as speculation, \
            open_projector(with_hf_projector(media, model, session.resolved, progress.download) if attached else media,
                           session.model, load.n_threads, needed=bool(attached)) as projector:
        run = OneShot(session.model, session.ctx, request, warn=warn, speculation=speculation, projector=projector)
        try:
            answer = AnswerOnly(run.thinking) if reasoning == "hide" else None
            interrupted = _stream(run, echo, catch_sigint, StopFlag(), answer)
        finally:
            run.close()
        if cut := cut_warning(run.report.stats, session.ctx.n_ctx, constrained=request.sampling.grammar is not None):
            sys.stdout.flush()
            warn(cut)
    if stats or as_json or load.verbose:
        _print_stats(run.report.to_dict(), as_json)
    if interrupted:
        raise Interrupted("Interrupted by user")


def _stream(run: Any, echo: bool, catch_sigint: Any, flag: Any, answer: Any) -> bool:
    """Write the generated text to stdout as it comes (through `answer`, an AnswerOnly, when reasoning is
    hidden); return True when Ctrl-C stopped it."""
    sink = _Stdout()
    with catch_sigint(flag):
        try:
            if echo:
                sink.write(run.text)
            for piece in run.stream(stop_flag=flag.__bool__):  # drained to its end, but nothing shown after ^C
                sink.write("" if flag else answer.feed(piece) if answer is not None else piece)
            if answer is not None and not flag:
                sink.write(answer.flush())
        except Interrupted:  # Ctrl-C during the prompt evaluation
            return True
        except BrokenPipeError:  # the reader went away (`| head`): stop generating, quietly, with 141 as others do
            sink.detach()
            raise OutputClosed() from None
    return bool(flag)


class _Stdout:
    """Writes UTF-8 to stdout and flushes each piece, so tokens appear as they are generated."""

    def __init__(self) -> None:
        sys.stdout.flush()
        self.raw = getattr(sys.stdout, "buffer", None)

    def write(self, text: str) -> None:
        if self.raw is not None:
            write_all(self.raw, text.encode("utf-8", errors="surrogateescape"))
            self.raw.flush()
        else:
            sys.stdout.write(text)
            sys.stdout.flush()

    @staticmethod
    def detach() -> None:
        # The interpreter's final flush must not fail again.
        silence_stdout()


def _print_stats(data: dict[str, Any], as_json: bool) -> None:
    sys.stdout.flush()
    if as_json:
        print(json.dumps(data), file=sys.stderr, flush=True)
        return
    reused = f", {data['cached_tokens']} reused" if data["cached_tokens"] else ""
    lines = [
        f"prompt:      {data['prompt_tokens']} tokens{reused}, {data['prompt_tps']:.1f} t/s",
        f"generation:  {data['generated_tokens']} tokens, {data['generation_tps']:.1f} t/s",
        f"first token: {data['ttft_ms']:.1f} ms",
        f"stop reason: {data['stop_reason']}",
        f"seed:        {data['seed']}",
    ]
    if data["truncated_tokens"]:
        lines.insert(1, f"truncated:   {data['truncated_tokens']} prompt tokens dropped")
    if data["draft_tokens"]:
        lines.insert(-2, f"speculative: {data['draft_accepted']}/{data['draft_tokens']} drafted tokens accepted "
                         f"({data['draft_acceptance']:.1%})")
    console = err()
    console.print()
    for line in lines:
        console.print(line, style="muted", markup=False, highlight=False)
