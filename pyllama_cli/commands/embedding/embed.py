"""`pyllama embed`: the embeddings of prompts, as llama-embedding computes and prints them."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from ...console import model_progress, write_all
from ...core.embed.compute import DEFAULT_EMBD_NORMALIZE
from ...core.embed.output import FORMATS
from ...core.embed.pooling import POOLING_NAMES
from ...core.model.resolve import ModelRequest
from ...core.model.session import open_model
from ...core.model.settings import LoadSettings
from ...errors import InputError, UsageError
from ...options.load import model_options

EXAMPLES = """\
Examples:
  pyllama embed -m embedder.gguf -p "hello world"
  pyllama embed -m embedder.gguf -f lines.txt --embd-output-format json | jq '.data[0].embedding[:4]'
  pyllama embed -m embedder.gguf -p "a<#>b" --embd-separator "<#>" --pooling last --embd-output-format json+
  pyllama embed -m reranker.gguf --pooling rank --embd-normalize -1 -p "$(printf 'what is a fox\ta fox is an animal')"
"""

INPUT_PANEL = "Input"
OUTPUT_PANEL = "Output"


@model_options(load=True)
def embed(
    model: ModelRequest,
    load: LoadSettings,
    prompt: Annotated[str | None, typer.Option(
        "-p", "--prompt", help="The text to embed: one prompt per line (see --embd-separator).",
        rich_help_panel=INPUT_PANEL, show_default=False)] = None,
    file: Annotated[str | None, typer.Option(
        "-f", "--file", help="Read the prompts from FILE (default: -p, else standard input).",
        rich_help_panel=INPUT_PANEL, show_default=False)] = None,
    separator: Annotated[str, typer.Option(
        "--embd-separator", help="What separates prompts (default: a newline).", rich_help_panel=INPUT_PANEL,
        show_default=False)] = "\n",
    cls_separator: Annotated[str, typer.Option(
        "--cls-separator", help="With --pooling rank: what separates a query from its document (default: a tab).",
        rich_help_panel=INPUT_PANEL, show_default=False)] = "\t",
    output_format: Annotated[str, typer.Option(
        "--embd-output-format", help=f"Output: {', '.join(FORMATS)} (raw: one embedding per line).",
        rich_help_panel=OUTPUT_PANEL)] = "raw",
    pooling: Annotated[str | None, typer.Option(
        "--pooling", help=f"Pooling: {', '.join(POOLING_NAMES)} (default: the model's own, else mean).",
        rich_help_panel=OUTPUT_PANEL, show_default=False)] = None,
    normalize: Annotated[int, typer.Option(
        "--embd-normalize", help="Normalisation: -1 none, 0 max absolute as int16, 1 taxicab, 2 euclidean, "
        ">2 p-norm.", rich_help_panel=OUTPUT_PANEL, min=-1)] = DEFAULT_EMBD_NORMALIZE,
) -> None:
    """Print the embeddings of prompts, as llama-embedding does: pipe them on (jq, numpy, a file)."""
    from ...core.embed.compute import embed_inputs
    from ...core.embed.output import format_embeddings
    from ...core.embed.pooling import RANK, embedding_context, pooling_type
    from ...core.embed.rerank import embedding_prompt_tokens

    if output_format not in FORMATS:
        raise UsageError(f"--embd-output-format {output_format!r} is not a format",
                         hint=f"use one of {', '.join(FORMATS)}")
    kind = pooling_type(pooling)
    prompts = _read_prompts(prompt, file).split(separator)
    with open_model(model, load, progress=model_progress()) as session:
        session.ctx = embedding_context(session.model, _batch_for_context(load), kind)
        rank = session.ctx.pooling_type() == RANK
        inputs = [embedding_prompt_tokens(session.model, text, rank, cls_separator) for text in prompts]
        vectors = embed_inputs(session.ctx, inputs, normalize)
    text = format_embeddings(vectors, output_format, normalize, len(prompts))
    sys.stdout.flush()
    write_all(sys.stdout.buffer, text.encode("utf-8"))
    sys.stdout.buffer.flush()


def _batch_for_context(load: LoadSettings) -> LoadSettings:
    """As llama-embedding: the batch holds the whole context, so any input that fits the context fits a batch."""
    from dataclasses import replace

    return replace(load, n_batch=max(load.n_batch, load.n_ctx)) if load.n_ctx else load


def _read_prompts(prompt: str | None, file: str | None) -> str:
    if prompt is not None and file is not None:
        raise UsageError("-p and -f both give the prompts", hint="give one of them")
    if file is not None:
        try:
            with open(file, encoding="utf-8") as fh:
                text = fh.read()
        except OSError as exc:
            raise InputError(f"cannot read {file}: {exc.strerror or exc}") from exc
        return text[:-1] if text.endswith("\n") else text  # llama.cpp's -f drops one trailing newline
    return prompt if prompt is not None else sys.stdin.read().removesuffix("\n")
