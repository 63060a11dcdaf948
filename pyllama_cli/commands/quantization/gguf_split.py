"""`pyllama gguf-split`: llama-gguf-split's split and merge, with the same parts byte for byte."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ...console import human_size, info
from ...errors import UsageError

EXAMPLES = """\
Examples:
  pyllama gguf-split --split-max-size 2G model.gguf model
  pyllama gguf-split --split-max-tensors 64 --dry-run model.gguf model
  pyllama gguf-split --merge model-00001-of-00003.gguf model.gguf
"""


def gguf_split(
    paths: Annotated[list[str], typer.Argument(
        metavar="GGUF_IN GGUF_OUT", show_default=False,
        help="Split: the model and the parts' name prefix (PREFIX-00001-of-0000N.gguf). "
             "Merge: the first part and the merged file.")],
    split: Annotated[bool, typer.Option("--split", help="Split GGUF_IN into parts (the default).")] = False,
    merge: Annotated[bool, typer.Option("--merge", help="Merge the parts that begin with GGUF_IN into one file.")
                     ] = False,
    max_tensors: Annotated[int | None, typer.Option(
        "--split-max-tensors", metavar="N", show_default=False,
        help="At most N tensors per part (default: 128).")] = None,
    max_size: Annotated[str | None, typer.Option(
        "--split-max-size", metavar="N(M|G)", show_default=False,
        help="At most this much per part: megabytes (M, 10^6 bytes) or gigabytes (G, 10^9 bytes), e.g. 500M.")
                        ] = None,
    no_tensor_first_split: Annotated[bool, typer.Option(
        "--no-tensor-first-split", help="Put no tensor in the first part (metadata only).")] = False,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Print the plan (parts, tensors, sizes) and write nothing.")] = False,
) -> None:
    """Split a GGUF model into parts, or merge the parts, as llama.cpp's llama-gguf-split does.

    Parts are named PREFIX-00001-of-0000N.gguf, llama.cpp loads a split model from its first part, and
    every file is written whole or not at all. Split prints the parts' paths, merge the merged file's.
    """
    from ...core.split import files
    from ...core.split.plan import DEFAULT_MAX_TENSORS, parse_size, plan_lines, plan_split

    if len(paths) != 2:
        raise UsageError(f"expected GGUF_IN and GGUF_OUT, got {len(paths)} path{'s' if len(paths) != 1 else ''}",
                         hint="pyllama gguf-split [options] GGUF_IN GGUF_OUT")
    if split and merge:
        raise UsageError("either --split or --merge can be given, not both")
    if max_tensors is not None and max_size is not None:
        raise UsageError("either --split-max-tensors or --split-max-size can be given, not both")
    source, target = Path(paths[0]), paths[1]
    if merge:
        plan = files.plan_merge(source, Path(target))
        n_tensors = len(plan.output.tensors)
        if dry_run:
            info(f"gguf-split: would merge {len(plan.parts)} parts with {n_tensors} tensors into {target}")
            return
        files.write_merged(plan)
        typer.echo(target)
        info(f"gguf-split: {target} merged from {len(plan.parts)} parts with {n_tensors} tensors "
             f"({human_size(Path(target).stat().st_size)})")
        return
    layout = files.read_model(source)
    parts = plan_split(layout, target, max_tensors=max_tensors or DEFAULT_MAX_TENSORS,
                       max_bytes=parse_size(max_size) if max_size is not None else None,
                       no_tensor_first_split=no_tensor_first_split)
    if dry_run:
        typer.echo("\n".join(plan_lines(parts)))
        return
    files.write_parts(layout, parts)
    for part in parts:
        typer.echo(str(part.path))
    info(f"gguf-split: {len(parts)} parts written with a total of {len(layout.tensors)} tensors")

