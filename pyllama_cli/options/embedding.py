"""The embedding flags of `embed` and `serve`, as llama.cpp names them: --pooling, --embd-normalize,
and serve's --embeddings and --rerank (alias --reranking), which `embedding_options` gathers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from ..core.embed.compute import DEFAULT_EMBD_NORMALIZE
from ..core.embed.pooling import POOLING_NAMES, RANK, UNSPECIFIED, pooling_type
from .llama_env import with_llama_env
from .load import option_param, with_flags
from .serve import EmbeddingsOpt

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


@dataclass(frozen=True)
class EmbeddingMode:
    """Whether serve computes embeddings (--embeddings, or --rerank), and how; true when it does."""

    enabled: bool = False
    pooling: int = UNSPECIFIED  # llama.cpp's pooling type (-1: the model's own); rank with --rerank
    normalize: int = DEFAULT_EMBD_NORMALIZE

    def __bool__(self) -> bool:
        return self.enabled

    @property
    def fields(self) -> dict[str, int]:
        """The ServerSettings fields it sets."""
        return {"pooling": self.pooling, "embd_normalize": self.normalize}


_PARAMS = with_llama_env([  # LLAMA_ARG_EMBEDDINGS, LLAMA_ARG_POOLING, LLAMA_ARG_RERANKING
    option_param("embeddings_flag", EmbeddingsOpt, False),
    option_param("pooling", PoolingOpt, None),
    option_param("embd_normalize", EmbdNormalizeOpt, DEFAULT_EMBD_NORMALIZE),
    option_param("rerank", RerankOpt, False),
])


def embedding_options() -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give serve --embeddings, --pooling, --embd-normalize and --rerank as one `embeddings: EmbeddingMode`."""

    def build(kwargs: dict[str, Any]) -> None:
        rerank, pooling_name = kwargs.pop("rerank"), kwargs.pop("pooling")
        pooling = RANK if rerank else pooling_type(pooling_name)
        kwargs["embeddings"] = EmbeddingMode(kwargs.pop("embeddings_flag") or rerank, pooling,
                                             kwargs.pop("embd_normalize"))

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        return with_flags(fn, ("embeddings",), _PARAMS, build)

    return decorate
