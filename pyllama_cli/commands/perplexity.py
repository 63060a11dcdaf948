"""`pyllama perplexity`: llama-perplexity's PPL, KL divergence against a base model, HellaSwag, Winogrande."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from ..console import err, human_size, info, stderr_is_tty, stdout_is_tty, warn
from ..core.paths import require_folder
from ..core.model.resolve import ModelRequest
from ..core.model.settings import LoadSettings
from ..errors import InputError, UsageError
from ..options.load import LOAD_PANEL, model_options
from .common import open_model

EXAMPLES = """\
Examples:
  pyllama perplexity -m model.gguf -f wiki.test.raw
  pyllama perplexity -m model.gguf -f wiki.test.raw -c 512 --chunks 20 --json
  pyllama perplexity -m model-F16.gguf -f wiki.test.raw --kl-divergence-base base.kld
  pyllama perplexity -m model-Q4_0.gguf --kl-divergence --kl-divergence-base base.kld
  pyllama perplexity -m model.gguf --hellaswag hellaswag_val_full.txt --hellaswag-tasks 400
  pyllama perplexity -m model.gguf --winogrande winogrande-debiased-eval.csv
"""

TASK_PANEL = "Benchmarks"
DEFAULT_CTX = 512  # llama-perplexity's -c (pyllama_cli.core.evaluate.perplexity.DEFAULT_CHUNK_CTX)

ChunkCtxOpt = Annotated[int, typer.Option(
    "-c", "--ctx-size", min=0, help="Tokens per chunk (default: 512; with --kl-divergence, the base file's).",
    rich_help_panel=LOAD_PANEL, show_default=False)]


@model_options(load=True)
def perplexity(
    cli: typer.Context,
    model: ModelRequest,
    load: LoadSettings,
    file: Annotated[Path | None, typer.Option(
        "-f", "--file", help="Text to score (read as bytes; one trailing newline is dropped).",
        show_default=False, dir_okay=False)] = None,
    chunks: Annotated[int, typer.Option(
        "--chunks", min=-1, help="Score at most N chunks (-1 = all).")] = -1,
    kl_divergence: Annotated[bool, typer.Option(
        "--kl-divergence", help="Compare this model with the base file given by --kl-divergence-base.")] = False,
    kl_base: Annotated[Path | None, typer.Option(
        "--kl-divergence-base", help="Base log-probs file: written by a run with -f, read with --kl-divergence "
        "(llama-perplexity's format).", show_default=False, dir_okay=False)] = None,
    hellaswag: Annotated[Path | None, typer.Option(
        "--hellaswag", help="HellaSwag task file (6 lines per task).", rich_help_panel=TASK_PANEL,
        show_default=False, dir_okay=False)] = None,
    hellaswag_tasks: Annotated[int, typer.Option(
        "--hellaswag-tasks", min=1, help="HellaSwag tasks to draw at random.", rich_help_panel=TASK_PANEL)] = 400,
    winogrande: Annotated[Path | None, typer.Option(
        "--winogrande", help="Winogrande task file (CSV).", rich_help_panel=TASK_PANEL, show_default=False,
        dir_okay=False)] = None,
    winogrande_tasks: Annotated[int, typer.Option(
        "--winogrande-tasks", min=0, help="Winogrande tasks to draw at random (0 = all, in file order).",
        rich_help_panel=TASK_PANEL)] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of text.")] = False,
) -> None:
    """Score a model on a text as llama-perplexity does: same chunks, same PPL to every printed decimal.

    Also KL divergence against a base model (is a quantization faithful?), HellaSwag and Winogrande.
    """
    if chunks == 0:
        raise UsageError("--chunks 0 leaves nothing to score", hint="give a number of chunks, or -1 for all")
    mode = _mode(file, kl_divergence, kl_base, hellaswag, winogrande)
    # No -c is 512; -c 0 is refused, as llama-perplexity refuses it (it used to mean 512 here).
    n_ctx = load.n_ctx if cli.get_parameter_source("ctx_size").name != "DEFAULT" else None
    if n_ctx == 0:
        raise UsageError("-c 0: perplexity needs a context size above 0",
                         hint=f"leave out -c for llama-perplexity's {DEFAULT_CTX} tokens per chunk")
    if mode == "ppl":
        _run_perplexity(model, load, n_ctx, _read(file), chunks, kl_base, as_json)
    elif mode == "kld":
        _run_kld(model, load, n_ctx, kl_base, chunks, as_json)
    else:
        _run_tasks(model, load, n_ctx, mode, hellaswag or winogrande, hellaswag_tasks, winogrande_tasks, as_json)


def _mode(file: Path | None, kld: bool, base: Path | None, hellaswag: Path | None, winogrande: Path | None) -> str:
    """Which of the four evaluations the flags ask for; refuse mixtures."""
    picked = [name for name, on in (("--hellaswag", hellaswag), ("--winogrande", winogrande),
                                    ("--kl-divergence", kld)) if on]
    if len(picked) > 1:
        raise UsageError(f"{' and '.join(picked)} cannot be combined", hint="run one evaluation at a time")
    if kld and base is None:
        raise UsageError("--kl-divergence needs --kl-divergence-base FILE",
                         hint="make the base file first: pyllama perplexity -m BASE.gguf -f TEXT "
                              "--kl-divergence-base FILE")
    if picked and file is not None:
        raise UsageError(f"{picked[0]} does not read -f", hint=f"drop -f; {picked[0]} has its own input")
    if (hellaswag or winogrande) and base is not None:
        raise UsageError("--kl-divergence-base goes with -f or --kl-divergence, not with a task file")
    if picked:
        return {"--hellaswag": "hellaswag", "--winogrande": "winogrande", "--kl-divergence": "kld"}[picked[0]]
    if file is None:
        raise UsageError("no text to score", hint="pass -f TEXT_FILE (or --hellaswag/--winogrande FILE, "
                                                  "or --kl-divergence with --kl-divergence-base FILE)")
    return "ppl"


def _read(path: Path) -> bytes:
    from ..core.evaluate.perplexity import read_text

    return read_text(path)


def _ctx(requested: int | None) -> int:
    """Tokens per chunk: -c, else llama-perplexity's 512."""
    return DEFAULT_CTX if requested is None else requested


# ---------------------------------------------------------------- perplexity


def _run_perplexity(request: ModelRequest, load: LoadSettings, n_ctx: int | None, text: bytes, chunks: int,
                    base: Path | None,
                    as_json: bool) -> None:
    from ..core.evaluate import perplexity as ppl

    if base is not None:
        require_folder(base, "the KL-divergence base")
    resolved, model = open_model(request, load)
    with model:
        tokens = ppl.tokenize_text(model, text)
        plan = ppl.plan_chunks(len(tokens), _ctx(n_ctx), load.n_batch, chunks)
        info(f"perplexity: {len(tokens)} tokens, {plan.n_chunk} chunks of {plan.n_ctx}, "
             f"{plan.n_seq} per batch of {plan.n_batch}")
        run = ppl.PerplexityRun(model, load, tokens, plan)
        if base is None:
            _render_perplexity(run, as_json, resolved.path)
            return
        from ..core.evaluate.kld import writing_base

        with writing_base(base, plan, model.n_vocab, tokens) as writer:
            run.on_chunk = writer.on_chunk
            _render_perplexity(run, as_json, resolved.path)
        info(f"saved the base log-probs to {base} ({human_size(base.stat().st_size)})")


def _render_perplexity(run: Any, as_json: bool, model_path: Path) -> None:
    live = not as_json
    with _progress(run.plan.n_chunk, "chunks") as advance:
        # On a terminal the bar owns the screen: the [i] line is printed once it is complete.
        streaming = live and not (advance.active and stdout_is_tty())
        parts = []
        for i, value in run.chunks():
            parts.append(f"[{i}]{value:.4f},")
            advance(1, f"PPL {value:.4f}")
            if streaming:
                sys.stdout.write(parts[-1])
                sys.stdout.flush()
    result = run.result
    if as_json:
        typer.echo(json.dumps({"model": str(model_path), **result.to_dict()}, indent=2))
        return
    if not streaming:
        sys.stdout.write("".join(parts))
    typer.echo(f"\nFinal estimate: PPL = {result.ppl:.4f} +/- {result.uncertainty:.5f}")
    info(f"{result.seconds:.2f} s for {result.n_chunk * result.n_ctx} tokens "
         f"({result.n_chunk * result.n_ctx / max(result.seconds, 1e-9):.1f} tokens/s)")


# ---------------------------------------------------------------- KL divergence


def _run_kld(request: ModelRequest, load: LoadSettings, n_ctx: int | None, base: Path, chunks: int,
             as_json: bool) -> None:
    from ..core.evaluate import kld

    header = kld.read_base_header(base)
    resolved, model = open_model(request, load)
    with model:
        kld.check_compatible(header, model.n_vocab, n_ctx)
        run = kld.KldRun.prepare(model, load, header, chunks, n_ctx)
        info(f"KL divergence: {run.plan.n_chunk} chunks of {header.n_ctx} from {base}")
        rows = []
        if not as_json:
            typer.echo(kld.TABLE_HEADER)
        with _progress(run.plan.n_chunk, "chunks") as advance:
            for i, row in run.chunks():
                rows.append({"chunk": i, **row})
                advance(1, f"KLD {row['kld']:.5f}")
                if not as_json:
                    typer.echo(kld.format_row(i, row))
        summary = run.stats.summary()
    if as_json:
        from ..core.text.json_text import json_ready

        typer.echo(json.dumps(json_ready({"model": str(resolved.path), "base": str(base), "chunks": rows,
                                          "summary": summary}), indent=2))
        return
    typer.echo("")
    positions = summary["count"]["positions"]
    if positions < kld.MIN_SUMMARY_POSITIONS:
        # llama-perplexity prints no statistics for so few values; --json still carries them.
        info(f"no summary: {positions} scored positions, fewer than {kld.MIN_SUMMARY_POSITIONS}")
        return
    typer.echo("\n".join(kld.summary_lines(summary)))


# ---------------------------------------------------------------- HellaSwag / Winogrande


def _run_tasks(request: ModelRequest, load: LoadSettings, n_ctx: int | None, mode: str, path: Path,
               n_hellaswag: int, n_winogrande: int, as_json: bool) -> None:
    from ..core.evaluate import multiple_choice as mc

    text = _read(path).decode("utf-8", errors="surrogateescape")
    if mode == "hellaswag":
        picked: list[Any] = mc.select_hellaswag(mc.parse_hellaswag(text), n_hellaswag)
        name = "HellaSwag"
    else:
        parsed = mc.parse_winogrande(text)
        if parsed.unread_last:
            warn(f"the last line of {path} is not used: llama-perplexity stops before a last line with no "
                 "newline after it (end the file with an empty line to use it)")
        picked = mc.select_winogrande(parsed.tasks, n_winogrande)
        name = "Winogrande"
    if not picked:
        raise InputError(f"no {name} tasks in {path}", hint="check the file format (see --help)")
    resolved, model = open_model(request, load)
    with model:
        tasks = mc.hellaswag_tasks(model, picked) if mode == "hellaswag" else mc.winogrande_tasks(model, picked)
        info(f"{name}: {len(tasks)} tasks from {path}")
        results = _score(mc, model, load, _ctx(n_ctx), tasks, mode, as_json)
    last = results[-1]
    if as_json:
        low, high = mc.wilson_interval(last.accuracy, last.n_done)
        typer.echo(json.dumps({
            "model": str(resolved.path), "benchmark": name.lower(), "tasks": last.n_done,
            "accuracy": last.accuracy, "uncertainty": mc.accuracy_uncertainty(last.accuracy, last.n_done),
            "ci95": [low, high],
            "results": [{"task": r.index, "file_task": r.number, "scores": r.scores, "chosen": r.chosen,
                         "answer": r.answer, "correct": r.chosen == r.answer} for r in results],
        }, indent=2))
        return
    typer.echo("")
    typer.echo(mc.final_line(name, last))


def _score(mc: Any, model: Any, load: LoadSettings, n_ctx: int, tasks: list[Any], mode: str,
           as_json: bool) -> list[Any]:
    results = []
    line = mc.hellaswag_line if mode == "hellaswag" else mc.winogrande_line
    if not as_json and mode == "hellaswag":
        typer.echo(mc.HELLASWAG_HEADER)
    with _progress(len(tasks), "tasks") as advance:
        for r in mc.score_tasks(model, load, tasks, n_ctx, winogrande=mode == "winogrande"):
            results.append(r)
            advance(1, f"acc {100 * r.accuracy:.2f}%")
            if not as_json:
                typer.echo(line(r))
    return results


# ---------------------------------------------------------------- progress


class _Advance:
    """Moves the progress bar; a no-op off a terminal."""

    def __init__(self, fn: Callable[[int, str], None] | None = None):
        self.fn = fn
        self.active = fn is not None

    def __call__(self, n: int, text: str) -> None:
        if self.fn is not None:
            self.fn(n, text)


@contextmanager
def _progress(total: int, unit: str) -> Iterator[_Advance]:
    """A transient bar with ETA on stderr, only when stderr is a terminal."""
    if not stderr_is_tty():
        yield _Advance()
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("[accent]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn(unit), TextColumn("{task.fields[value]}"), TimeRemainingColumn(),
                  console=err(), transient=True, redirect_stdout=False, redirect_stderr=False) as bar:
        task = bar.add_task("perplexity", total=total, value="")
        yield _Advance(lambda n, text: bar.update(task, advance=n, value=text))


def _own_ctx_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """Give -c this command's meaning (tokens per chunk, default 512) in place of the shared one."""
    sig = command.__signature__  # type: ignore[attr-defined]
    params = [p.replace(annotation=ChunkCtxOpt) if p.name == "ctx_size" else p for p in sig.parameters.values()]
    command.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    command.__annotations__["ctx_size"] = ChunkCtxOpt
    return command


perplexity = _own_ctx_option(perplexity)
