"""The embedding flags of `embed` and `serve`, as llama.cpp names them: --pooling, --embd-normalize,
and serve's --rerank (alias --reranking)."""

from __future__ import annotations

from typing import Annotated

import typer

from ..core.embed.compute import DEFAULT_EMBD_NORMALIZE
from ..core.embed.pooling import POOLING_NAMES

EMBEDDING_PANEL = "Embeddings"

PoolingOpt = Annotated[str | None, typer.Option(
    "--pooling", help=f"Pooling of embeddings: {', '.join(POOLING_NAMES)} (default: the model's own, else mean).",
    rich_help_panel=EMBEDDING_PANEL, show_default=False)]
EmbdNormalizeOpt = Annotated[int, typer.Option(
    "--embd-normalize", min=-1, help="Normalisation of embeddings: -1 none, 0 max absolute as int16, 1 taxicab, "
    "2 euclidean, >2 p-norm.", rich_help_panel=EMBEDDING_PANEL)]
RerankOpt = Annotated[bool, typer.Option(
    "--rerank", "--reranking", help="Serve a reranker: POST /rerank, /reranking and /v1/rerank (rank pooling).",
    rich_help_panel=EMBEDDING_PANEL)]

__all__ = ["DEFAULT_EMBD_NORMALIZE", "EmbdNormalizeOpt", "PoolingOpt", "RerankOpt"]
