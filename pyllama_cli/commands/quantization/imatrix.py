"""`pyllama imatrix`: llama-imatrix's importance matrix (same bytes), its combining and its statistics."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from ...console import count_progress, info, model_progress, warn
from ...core.model.resolve import ModelRequest
from ...core.model.settings import LoadSettings
from ...errors import UsageError
from ...options.load import LOAD_PANEL, model_options

EXAMPLES = """\
Examples:
  pyllama imatrix -m model-F16.gguf -f calibration.txt -o imatrix.gguf
  pyllama imatrix -m model-F16.gguf -f calibration.txt --chunks 100 --no-ppl
  pyllama imatrix --in-file a.gguf --in-file b.gguf -o combined.gguf
  pyllama imatrix --in-file imatrix.gguf --show-statistics
  pyllama quantize --imatrix imatrix.gguf model-F16.gguf IQ2_XS
"""

DEFAULT_CHUNK_CTX = 512
PANEL = "Importance matrix (llama-imatrix's flags)"
ChunkCtxOpt = Annotated[int, typer.Option(
    "-c", "--ctx-size", min=0, help="Tokens per chunk.", rich_help_panel=LOAD_PANEL)]


def _flag(*names: str, help: str, **kw: Any) -> Any:
    return typer.Option(*names, help=help, rich_help_panel=PANEL, **kw)


@model_options(load=True, own={"ctx_size": ChunkCtxOpt})  # -c: tokens per chunk, not the context size
def imatrix(
    cli: typer.Context,
    model: ModelRequest,
    load: LoadSettings,
    file: Annotated[Path | None, _flag("-f", "--file", help="Calibration text (read as bytes; one trailing "
                                       "newline is dropped).", show_default=False, dir_okay=False)] = None,
    output: Annotated[Path, _flag("-o", "--output", "--output-file", help="The matrix file to write.")
                      ] = Path("imatrix.gguf"),
    chunks: Annotated[int, _flag("--chunks", min=-1, help="Process at most N chunks (-1 = all).")] = -1,
    output_frequency: Annotated[int, _flag("-ofreq", "--output-frequency", min=1,
                                           help="Save the matrix every N chunks.")] = 10,
    save_frequency: Annotated[int, _flag("--save-frequency", min=0,
                                         help="Also keep a copy every N chunks (OUTPUT.at_N; 0 = never).")] = 0,
    process_output: Annotated[bool, _flag("--process-output", help="Collect for output.weight too.")] = False,
    ppl: Annotated[bool, _flag("--ppl/--no-ppl", help="Compute the perplexity.")] = True,
    skip_chunks: Annotated[int, _flag("--chunk", "--from-chunk", min=0, help="Start at chunk N (skip the first N).")
                           ] = 0,
    in_files: Annotated[list[Path] | None, _flag("--in-file", help="A matrix to add to this one (repeatable): "
                                                 "without -f, the files are only combined.", show_default=False,
                                                 dir_okay=False)] = None,
    output_format: Annotated[str | None, _flag("--output-format", metavar="gguf|dat",
                                               help="File format (default: gguf).", show_default=False)] = None,
    show_statistics: Annotated[bool, _flag("--show-statistics",
                                           help="Print the statistics of one --in-file matrix and exit.")] = False,
) -> None:
    """Compute an importance matrix over a text, as llama.cpp's llama-imatrix does (the same bytes).

    `pyllama quantize --imatrix FILE` uses it for better low-bit quants (IQ2/IQ3, Q4_K_M...).
    PPL per chunk goes to stderr; Ctrl-C saves the chunks done so far. The matrix is written whole
    or not at all; stdout gets its path.
    """
    from ...core.imatrix.run import ImatrixRequest, ImatrixRun
    from ...core.paths import require_folder

    if output_format not in (None, "gguf", "dat"):
        raise UsageError(f"--output-format {output_format!r}: give gguf or dat")
    files = list(in_files or [])
    # No -c is llama-imatrix's 512 tokens per chunk, not the shared default (the model's context).
    n_ctx = load.n_ctx if cli.get_parameter_source("ctx_size").name != "DEFAULT" else DEFAULT_CHUNK_CTX
    if show_statistics:
        _show_statistics(files, n_ctx)
        return
    if output_format is None and not str(output).endswith(".gguf"):
        warn("saving the matrix in the GGUF format with a suffix other than .gguf "
             "(--output-format dat writes the old format)")
    require_folder(output, "imatrix")
    request = ImatrixRequest(
        output=output, prompt_file=str(file) if file is not None else None, n_ctx=n_ctx, n_chunks=chunks,
        skip_chunks=skip_chunks, out_freq=output_frequency, save_freq=save_frequency,
        process_output=process_output, compute_ppl=ppl, legacy=output_format == "dat", in_files=files)
    run = ImatrixRun(request, load.n_batch)
    if file is None:
        if not files:
            raise UsageError("no text (-f) and no matrices (--in-file) to combine",
                             hint="pyllama imatrix -m MODEL -f TEXT, or --in-file A --in-file B to combine")
        run.load_inputs()
        typer.echo(str(run.save()))
        info(f"imatrix: {'combined' if len(files) > 1 else 'saved'} {len(files)} matri"
             f"{'ces' if len(files) > 1 else 'x'} into {output}")
        return
    _collect(model, load, run, file)


def _collect(request: ModelRequest, load: LoadSettings, run: Any, file: Path) -> None:
    from ...core.evaluate.perplexity import read_text
    from ...core.model.session import open_model

    text = read_text(file)
    run.load_inputs()
    with open_model(request, load, progress=model_progress()) as session:
        plan = run.plan(session.model, text)
        info(f"imatrix: {len(run.tokens)} tokens, {plan.n_chunk} chunks of {plan.n_ctx}, "
             f"{plan.n_seq} per batch of {plan.n_batch}")
        with run.open_context(session.model, load, plan) as ctx, \
                count_progress("imatrix", plan.n_chunk, "chunks") as advance:
            streamed: list[str] = []
            for done in run.chunks(ctx, plan):
                if done.chunk == 1 and not advance.active:
                    _eta(done.seconds, plan)
                if done.ppl is not None:
                    streamed.append(f"[{done.chunk}]{done.ppl:.4f},")
                    if not advance.active:
                        sys.stderr.write(streamed[-1])
                        sys.stderr.flush()
                advance(1, f"PPL {done.ppl:.4f}" if done.ppl is not None else "")
        if advance.active and streamed:
            sys.stderr.write("".join(streamed))
        sys.stderr.write("\n")
        path = run.save()
    if run.req.compute_ppl:
        info(f"Final estimate: PPL = {run.sums.ppl:.4f} +/- {run.uncertainty:.5f}")
    typer.echo(str(path))
    info(f"imatrix: {len(run.collector.stats)} weights, {run.collector.last_chunk} chunks, saved to {path}")


def _eta(seconds: float, plan: Any) -> None:
    total = int(seconds * plan.n_chunk / plan.n_seq)
    hours = f"{total // 3600} hours " if total >= 3600 else ""
    info(f"imatrix: {seconds:.2f} seconds per pass - ETA {hours}{(total % 3600 if hours else total) / 60:.2f} minutes")


def _show_statistics(files: list[Path], n_ctx: int) -> None:
    from ...core.imatrix import storage
    from ...core.imatrix.statistics import table_lines

    if len(files) != 1:
        raise UsageError("--show-statistics needs exactly one --in-file matrix",
                         hint="pyllama imatrix --in-file imatrix.gguf --show-statistics")
    matrix = storage.Matrix()
    storage.load_into(matrix, files[0], n_ctx)
    for line in table_lines(str(files[0]), matrix.stats):
        typer.echo(line)


