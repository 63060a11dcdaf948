"""`pyllama quantize`: llama-quantize's arguments and types, with safe output files and a progress bar."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from ..console import download_tqdm, human_size, info, quantize_progress
from ..core.model.resolve import ModelRequest, resolve_model
from ..errors import UsageError
from ..options.load import JsonOpt, LogFileOpt, VerboseOpt, model_options

EXAMPLES = """\
Examples:
  pyllama quantize model-F16.gguf Q4_K_M
  pyllama quantize model-F16.gguf small.gguf q8_0 4
  pyllama quantize -hf user/model-GGUF:F16 Q6_K
  pyllama quantize --imatrix imatrix.gguf model-F16.gguf IQ2_XS
  pyllama quantize --list
"""

QUANT_PANEL = "Quantization (llama-quantize's flags)"
_MAX_NOTES = 5  # fallback notes shown before "... and N more"


def _flag(*names: str, help: str) -> Any:
    return typer.Option(*names, help=help, rich_help_panel=QUANT_PANEL, show_default=False)


@model_options(load=False)
def quantize(
    model: ModelRequest,
    args: Annotated[list[str] | None, typer.Argument(
        metavar="INPUT [OUTPUT] TYPE [NTHREADS]", show_default=False,
        help="As llama-quantize: the input GGUF (omit it with -m/-hf), the output (default: the input's "
             "name with TYPE, next to it), the type by name or number, and the thread count.")] = None,
    list_types: Annotated[bool, typer.Option("--list", help="List every type and exit.")] = False,
    as_json: JsonOpt = False,
    allow_requantize: Annotated[bool, _flag("--allow-requantize",
        help="Allow requantizing already quantized tensors (quality drops more than quantizing once).")] = False,
    leave_output_tensor: Annotated[bool, _flag("--leave-output-tensor",
        help="Leave output.weight un(re)quantized.")] = False,
    pure: Annotated[bool, _flag("--pure", help="No k-quant mixes: every tensor gets the same type.")] = False,
    imatrix: Annotated[str | None, _flag("--imatrix", help="Importance matrix file (llama-imatrix's output).")
                       ] = None,
    include_weights: Annotated[list[str] | None, _flag("--include-weights",
        help="Use the imatrix only for tensors whose name contains this (repeatable).")] = None,
    exclude_weights: Annotated[list[str] | None, _flag("--exclude-weights",
        help="Do not use the imatrix for tensors whose name contains this (repeatable).")] = None,
    output_tensor_type: Annotated[str | None, _flag("--output-tensor-type",
        help="ggml type for output.weight (q8_0, q6_K, f16, ...).")] = None,
    token_embedding_type: Annotated[str | None, _flag("--token-embedding-type",
        help="ggml type for the token embeddings.")] = None,
    override_kv: Annotated[list[str] | None, _flag("--override-kv",
        help="Set metadata in the output: KEY=TYPE:VALUE, TYPE int, float, bool or str (repeatable).")] = None,
    keep_split: Annotated[bool, _flag("--keep-split",
        help="Write one output part per input part (OUTPUT-0000i-of-0000N.gguf).")] = False,
    threads: Annotated[int, _flag("-t", "--threads",
        help="Threads (default: every hardware thread, as llama-quantize).")] = 0,
    force: Annotated[bool, _flag("-f", "--force", help="Replace OUTPUT if it exists.")] = False,
    verbose: VerboseOpt = False,
    log_file: LogFileOpt = None,
) -> None:
    """Quantize a GGUF model to another type, as llama.cpp's llama-quantize does (byte-identical output).

    llama.cpp writes a hidden temporary file that is renamed to OUTPUT only on success.
    An error or Ctrl-C leaves no partial file; an existing OUTPUT needs --force.
    """
    from ..core.gguf.ftypes import QUANT_TYPES, parse_tensor_type

    if list_types:
        _print_types(QUANT_TYPES, as_json)
        return
    from ..core.quantize import quantizer as core

    pos = core.parse_positionals(args or [], input_named=bool(model.model or model.hf_repo))
    if pos.nthreads is not None and threads and pos.nthreads != threads:
        raise UsageError(f"two thread counts: NTHREADS {pos.nthreads} and -t {threads}", hint="give one")
    # Every flag is checked before -hf may download anything.
    output_type = parse_tensor_type(output_tensor_type, "--output-tensor-type")
    embedding_type = parse_tensor_type(token_embedding_type, "--token-embedding-type")
    overrides = tuple(core.parse_override_kv(kv) for kv in override_kv or ())
    resolved = resolve_model(replace(model, model=pos.input) if pos.input else model, tqdm_class=download_tqdm(),
                             tokenizer=False)
    output = Path(pos.output) if pos.output else core.default_output(
        resolved.path, pos.quant, from_hub=resolved.repo is not None)
    request = core.QuantizeRequest(
        inputs=resolved.parts, output=output, quant=pos.quant, nthread=pos.nthreads or threads,
        allow_requantize=allow_requantize, leave_output_tensor=leave_output_tensor, pure=pure,
        keep_split=keep_split, imatrix=imatrix, output_tensor_type=output_type, token_embedding_type=embedding_type,
        include_weights=tuple(include_weights or ()), exclude_weights=tuple(exclude_weights or ()),
        overrides=overrides, force=force, verbose=verbose, log_file=log_file,
    )
    with quantize_progress(quiet=verbose) as on_progress:
        result = core.quantize_model(request, on_progress=on_progress)
    _report(request, result, as_json)


def _print_types(types: Any, as_json: bool) -> None:
    if as_json:
        import json

        rows = [{"name": t.name, "ftype": None if t.name == "COPY" else t.ftype, "bpw": t.bpw,
                 "description": t.description, "needs_imatrix": t.needs_imatrix, "alias_of": t.alias_of}
                for t in types]
        typer.echo(json.dumps(rows, indent=2))
        return
    typer.echo(f"{'NUM':>3}  {'TYPE':<9}  {'BPW':>6}  DESCRIPTION")
    for t in types:
        number = "" if t.name == "COPY" else str(t.ftype)
        bpw = _bpw(t.bpw)
        note = "  (needs --imatrix)" if t.needs_imatrix else ""
        typer.echo(f"{number:>3}  {t.name:<9}  {bpw:>6}  {t.description}{note}")


def _bpw(value: float | None) -> str:
    """Two decimals, more only where the value needs them to be exact (Q6_K: 6.5625)."""
    if value is None:
        return ""
    return next(f"{value:.{d}f}" for d in (2, 3, 4) if round(value, d) == value or d == 4)


def _report(request: Any, result: Any, as_json: bool) -> None:
    outputs = [str(p) for p in result.outputs]
    if as_json:
        import json

        typer.echo(json.dumps({
            "input": [str(p) for p in request.inputs], "output": outputs, "type": result.quant.name,
            "ftype": result.quant.ftype, "input_bytes": result.input_bytes, "output_bytes": result.output_bytes,
            "ratio": round(result.ratio, 4), "seconds": round(result.seconds, 3),
            "imatrix_entries": result.imatrix_entries,
        }, indent=2))
    else:
        for path in outputs:
            typer.echo(path)
    for warning in result.warnings[:_MAX_NOTES]:
        info(f"note: {warning}")
    if len(result.warnings) > _MAX_NOTES:
        info(f"note: ... and {len(result.warnings) - _MAX_NOTES} more tensors fell back to another type")
    info(f"{request.source.name} ({human_size(result.input_bytes)}) -> {Path(outputs[0]).name} "
         f"({result.quant.name}, {human_size(result.output_bytes)}): {result.ratio:.2f}x smaller "
         f"in {result.seconds:.2f} s")
