"""Steps several commands share: resolving the model with progress, loading it with progress."""

from __future__ import annotations

from ..console import download_tqdm, load_progress
from ..core.model.resolve import ModelRequest, ResolvedModel, resolve_model
from ..core.model.settings import LoadSettings


def resolve(request: ModelRequest, *, tokenizer: bool = True) -> ResolvedModel:
    """Resolve a model request, drawing download progress on a terminal (see resolve_model)."""
    return resolve_model(request, tqdm_class=download_tqdm(), tokenizer=tokenizer)


def open_model(request: ModelRequest, settings: LoadSettings, *, vocab_only: bool = False):  # noqa: ANN201
    """Resolve and load a model, with a load progress bar on a terminal; returns (resolved, Model)."""
    from ..core.model.session import load_session

    resolved = resolve(request)
    with load_progress(f"Loading {resolved.path.name}") as on_progress:
        session = load_session(resolved, settings, vocab_only=vocab_only, on_progress=on_progress)
    return resolved, session.model
