"""`pyllama perplexity`: llama-perplexity's PPL, KL divergence against a base model, HellaSwag, Winogrande."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from ..console import count_progress, human_size, info, model_progress, stdout_is_tty, warn
from ..core.evaluate import modes
from ..core.evaluate.modes import DEFAULT_CHUNK_CTX, DEFAULT_HELLASWAG_TASKS
from ..core.paths import require_folder
from ..core.model.resolve import ModelRequest
from ..core.model.session import open_model
from ..core.model.settings import LoadSettings
from ..options.load import LOAD_PANEL, model_options

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

ChunkCtxOpt = Annotated[int, typer.Option(
    "-c", "--ctx-size", min=0,
    help=f"Tokens per chunk (default: {DEFAULT_CHUNK_CTX}; with --kl-divergence, the base file's).",
    rich_help_panel=LOAD_PANEL, show_default=False)]


@model_options(load=True, own={"ctx_size": ChunkCtxOpt})  # -c: tokens per chunk, not the context size
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
        "--hellaswag-tasks", min=1, help="HellaSwag tasks to draw at random.",
        rich_help_panel=TASK_PANEL)] = DEFAULT_HELLASWAG_TASKS,
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
    # No -c is llama-perplexity's 512 tokens per chunk (or the base file's), not the shared default.
    given_ctx = load.n_ctx if cli.get_parameter_source("ctx_size").name != "DEFAULT" else None
    ev = modes.evaluation(file=file, kld=kl_divergence, base=kl_base, hellaswag=hellaswag, winogrande=winogrande,
                          n_ctx=given_ctx, chunks=chunks, n_hellaswag=hellaswag_tasks, n_winogrande=winogrande_tasks)
    if ev.mode == modes.PERPLEXITY:
        _run_perplexity(model, load, ev, as_json)
    elif ev.mode == modes.KLD:
        _run_kld(model, load, ev, as_json)
    else:
        _run_tasks(model, load, ev, as_json)


def _run_perplexity(request: ModelRequest, load: LoadSettings, ev: modes.Evaluation, as_json: bool) -> None:
    from ..core.evaluate import perplexity as ppl

    text = ppl.read_text(ev.path)
    if ev.base is not None:
        require_folder(ev.base, "the KL-divergence base")
    with open_model(request, load, progress=model_progress()) as session:
        run = ppl.PerplexityRun.prepare(session.model, load, text, ev.chunk_ctx, ev.chunks)
        plan = run.plan
        info(f"perplexity: {len(run.tokens)} tokens, {plan.n_chunk} chunks of {plan.n_ctx}, "
             f"{plan.n_seq} per batch of {plan.n_batch}")
        if ev.base is None:
            _render_perplexity(run, as_json, session.path)
            return
        from ..core.evaluate.kld import writing_base

        with writing_base(ev.base, plan, session.model.n_vocab, run.tokens) as writer:
            run.on_chunk = writer.on_chunk
            _render_perplexity(run, as_json, session.path)
        info(f"saved the base log-probs to {ev.base} ({human_size(ev.base.stat().st_size)})")


def _render_perplexity(run: Any, as_json: bool, model_path: Path) -> None:
    with count_progress("perplexity", run.plan.n_chunk, "chunks") as advance:
        # On a terminal the bar owns the screen: the [i] line is printed once it is complete.
        streaming = not as_json and not (advance.active and stdout_is_tty())
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


def _run_kld(request: ModelRequest, load: LoadSettings, ev: modes.Evaluation, as_json: bool) -> None:
    from ..core.evaluate import kld

    header = kld.read_base_header(ev.base)
    with open_model(request, load, progress=model_progress()) as session:
        kld.check_compatible(header, session.model.n_vocab, ev.n_ctx)
        run = kld.KldRun.prepare(session.model, load, header, ev.chunks, ev.n_ctx)
        info(f"KL divergence: {run.plan.n_chunk} chunks of {header.n_ctx} from {ev.base}")
        rows = []
        if not as_json:
            typer.echo(kld.TABLE_HEADER)
        with count_progress("perplexity", run.plan.n_chunk, "chunks") as advance:
            for i, row in run.chunks():
                rows.append({"chunk": i, **row})
                advance(1, f"KLD {row['kld']:.5f}")
                if not as_json:
                    typer.echo(kld.format_row(i, row))
        summary = run.stats.summary()
    if as_json:
        from ..core.text.json_text import json_ready

        typer.echo(json.dumps(json_ready({"model": str(session.path), "base": str(ev.base), "chunks": rows,
                                          "summary": summary}), indent=2))
        return
    typer.echo("")
    positions = summary["count"]["positions"]
    if positions < kld.MIN_SUMMARY_POSITIONS:
        # llama-perplexity prints no statistics for so few values; --json still carries them.
        info(f"no summary: {positions} scored positions, fewer than {kld.MIN_SUMMARY_POSITIONS}")
        return
    typer.echo("\n".join(kld.summary_lines(summary)))


def _run_tasks(request: ModelRequest, load: LoadSettings, ev: modes.Evaluation, as_json: bool) -> None:
    from ..core.evaluate import multiple_choice as mc

    winogrande = ev.mode == modes.WINOGRANDE
    name, picked = mc.pick_tasks(ev.path, winogrande, ev.n_tasks, warn)
    with open_model(request, load, progress=model_progress()) as session:
        tasks = mc.winogrande_tasks(session.model, picked) if winogrande else mc.hellaswag_tasks(session.model, picked)
        info(f"{name}: {len(tasks)} tasks from {ev.path}")
        results = _score(mc, session.model, load, ev.chunk_ctx, tasks, winogrande, as_json)
    if as_json:
        typer.echo(json.dumps(mc.results_json(name, session.path, results), indent=2))
        return
    typer.echo("")
    typer.echo(mc.final_line(name, results[-1]))


def _score(mc: Any, model: Any, load: LoadSettings, n_ctx: int, tasks: list[Any], winogrande: bool,
           as_json: bool) -> list[Any]:
    results = []
    line = mc.winogrande_line if winogrande else mc.hellaswag_line
    if not as_json and not winogrande:
        typer.echo(mc.HELLASWAG_HEADER)
    with count_progress("perplexity", len(tasks), "tasks") as advance:
        for r in mc.score_tasks(model, load, tasks, n_ctx, winogrande=winogrande):
            results.append(r)
            advance(1, f"acc {100 * r.accuracy:.2f}%")
            if not as_json:
                typer.echo(line(r))
    return results

