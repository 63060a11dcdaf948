"""The one owner of a loaded model: resolve, load, make a context, and free them in the right order.

Every command that runs a model opens it with `open_model()` (a context manager) and every server
engine with `load_session()`; nothing else calls `Model.load`. A `Session` frees its context before
its model, since a llama.cpp context points into the model's weights.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .resolve import ModelRequest, ResolvedModel, resolve_model
from .settings import LoadSettings

if TYPE_CHECKING:  # the bindings load only when a model does
    from .native import Context, Model

# What a caller passes to draw progress: a tqdm-compatible class for downloads, and a factory of
# context managers that yield a load-progress callback (0..1) for a label. Either may be None.
LoadBar = Callable[[str], AbstractContextManager[Callable[[float], None] | None]]


@dataclass(frozen=True)
class Progress:
    """How the caller shows downloads and loading (core code draws nothing itself)."""

    download: type | None = None
    load: LoadBar | None = None
    warn: Callable[[str], None] | None = None  # hears of a context past the model's trained length


class Session:
    """A loaded model, the file it came from, and the context made for it (if one was asked for)."""

    def __init__(self, resolved: ResolvedModel, model: Model, ctx: Context | None = None):
        self.resolved = resolved
        self.model = model
        self.ctx = ctx

    @property
    def path(self) -> Any:
        return self.resolved.path

    def open_context(self, settings: LoadSettings, **context: Any) -> Context:
        """Make the session's context (Context keyword arguments); the session frees it with the model.

        For callers with a check to make between loading and the context (chat's template), which
        open the model without `context` and call this after.
        """
        from .native import Context

        self.ctx = Context(self.model, settings, **context)
        return self.ctx

    def close(self) -> None:
        """Free the context, then the model; safe to call twice."""
        if self.ctx is not None:
            self.ctx.close()
            self.ctx = None
        self.model.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load_session(
    resolved: ResolvedModel,
    settings: LoadSettings,
    *,
    vocab_only: bool = False,
    context: dict[str, Any] | None = None,
    on_progress: Callable[[float], None] | None = None,
) -> Session:
    """Load a resolved GGUF and, when `context` is given (Context keyword arguments), a context for it.

    Raises:
        ModelLoadError: llama.cpp refused the file, or could not make the context.
        Interrupted: Ctrl-C during the load.
    """
    from .native import Model

    session = Session(resolved, Model.load(resolved.path, settings, vocab_only=vocab_only, on_progress=on_progress))
    if context is not None:
        try:
            session.open_context(settings, **context)
        except BaseException:
            session.close()
            raise
    return session


@contextmanager
def open_model(
    request: ModelRequest,
    settings: LoadSettings,
    *,
    vocab_only: bool = False,
    context: dict[str, Any] | None = None,
    progress: Progress | None = None,
    tokenizer: bool = True,
) -> Iterator[Session]:
    """Resolve `request` (`-m`/`-hf`), load it, and yield the `Session`; everything is freed on exit.

    `context` holds the Context keyword arguments ({} for the defaults of `settings`); without it
    the session holds the model alone (commands whose core makes its own contexts: perplexity, bench).
    """
    progress = progress or Progress()
    resolved = resolve_model(request, tqdm_class=progress.download, tokenizer=tokenizer)
    bar = progress.load(f"Loading {resolved.path.name}") if progress.load is not None else nullcontext(None)
    with bar as on_progress:
        session = load_session(resolved, settings, vocab_only=vocab_only, context=context, on_progress=on_progress)
    if session.ctx is not None and progress.warn is not None:
        past = past_trained_context(session.ctx.n_ctx, session.model.n_ctx_train)
        if past:
            progress.warn(past)
    with session:
        yield session


def past_trained_context(n_ctx: int, n_ctx_train: int, what: str | None = None) -> str | None:
    """llama.cpp's warning for a context longer than the model was trained on (it calls it a possible
    training context overflow: past that length the output degrades); None when it fits."""
    if n_ctx_train <= 0 or n_ctx <= n_ctx_train:
        return None
    return (f"{what or f'-c {n_ctx}'} is more than the {n_ctx_train} tokens the model was trained on: past "
            "them its output may degrade (possible training context overflow)")


def trained_context_warning(path: Path, n_ctx: int, what: str | None = None) -> str | None:
    """past_trained_context for a GGUF not loaded yet: its trained length read from the header."""
    from ..gguf.reader import read_metadata

    metadata = read_metadata(path)
    trained = metadata.get(f"{metadata.get('general.architecture')}.context_length")
    return past_trained_context(n_ctx, trained, what) if isinstance(trained, int) and n_ctx else None
