"""`pyllama chat` with no model named, on a terminal: pick a cached model with the arrow keys, or,
with none cached yet, take up the offer of a small default chat model (its size read from the Hub).

Off a terminal the command keeps its one-line error (`core.model.resolve.no_model_error`).
"""

from __future__ import annotations

from typing import Any

from ..console import human_size
from ..core.model.resolve import DEFAULT_QUANT, FIRST_CHOICE_REPO, ModelRequest, no_model_error
from ..errors import PyllamaError

DEFAULT_MODEL = f"{FIRST_CHOICE_REPO}:{DEFAULT_QUANT}"


def first_run_request(request: ModelRequest) -> ModelRequest:
    """The model to chat with when the user named none: a cached one they pick, or the default one.

    Raises:
        NoModelGiven: they declined the download, or the Hub cannot say what it would be.
    """
    from ..core.model.catalog import cached_models

    cached = cached_models()
    if cached:
        options = [(m, f"{m.name}  ({human_size(m.size)}{_parts(m)})") for m in cached]
        chosen = _choose("Which model? (Up/Down to move, Enter to chat)", options)
        # Resolved from the cache alone: it is there, so there is nothing to ask the Hub.
        return ModelRequest(hf_repo=chosen.repo, hf_file=chosen.filename, hf_token=request.hf_token, offline=True)
    if request.offline:
        raise no_model_error()
    try:
        from ..core.model.resolve import remote_model_files

        _, size = remote_model_files(DEFAULT_MODEL, request.hf_token)
    except PyllamaError as exc:
        error = no_model_error()
        error.hint = f"{exc.message}\n{error.hint}"
        raise error from exc
    if not _choose(f"No models downloaded yet.\nDownload {DEFAULT_MODEL} ({human_size(size)}) and chat with it?",
                   [(True, "Yes, download it"), (False, "No")]):
        raise no_model_error()
    return ModelRequest(hf_repo=DEFAULT_MODEL, hf_token=request.hf_token)


def _parts(model: Any) -> str:
    return f", {len(model.parts)} parts" if len(model.parts) > 1 else ""


def _choose(message: str, options: list[tuple[Any, str]]) -> Any:
    """An arrow-key list (prompt-toolkit's `choice`); Ctrl-C or Ctrl-D ends the command as Ctrl-C does."""
    from prompt_toolkit.shortcuts import choice

    return choice(message, options=options, default=options[0][0])
