"""Resolve and load a model in one call, as every command that runs a model does."""

from __future__ import annotations

from collections.abc import Callable

from .native import Model
from .resolve import ResolvedModel
from .settings import LoadSettings


def load_model(
    resolved: ResolvedModel,
    settings: LoadSettings,
    *,
    vocab_only: bool = False,
    on_progress: Callable[[float], None] | None = None,
) -> Model:
    """Load a resolved (already header-checked) GGUF with llama.cpp.

    Raises:
        ModelLoadError: llama.cpp refused the file.
        Interrupted: Ctrl-C during the load.
    """
    return Model.load(resolved.path, settings, vocab_only=vocab_only, on_progress=on_progress)
