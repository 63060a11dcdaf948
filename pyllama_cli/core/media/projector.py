"""The loaded projector: libmtmd's `mtmd_context` over a text model, made and freed here.

libmtmd reports why a projector cannot be loaded in its log only (`mtmd_init_from_file` returns
NULL); the log is routed through pyllama's, and its error line becomes the error raised.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import InputError, ModelLoadError
from ..model.library import log_listener, restore_log_callback, route_log
from .check import Media
from .settings import ProjectorSettings

LOG_ERROR = 4  # ggml_log_level's GGML_LOG_LEVEL_ERROR
_MISMATCH = re.compile(r"text model \(n_embd = (\d+)\) and mmproj \(n_embd = (\d+)\)")


def mtmd() -> Any:
    """llama-cpp-python's libmtmd bindings, with its log going where llama.cpp's goes."""
    import llama_cpp.mtmd_cpp as bindings  # imports the llama_cpp package, which sets its own log callback

    restore_log_callback()
    route_log(bindings.mtmd_helper_log_set)
    return bindings


@dataclass(frozen=True)
class Capabilities:
    vision: bool
    audio: bool

    def names(self) -> list[str]:
        return [name for name, ok in (("vision", self.vision), ("audio", self.audio)) if ok]


class Projector:
    """An mmproj loaded for one text model; frees its native context on close()."""

    def __init__(self, path: Path, handle: Any, lib: Any):
        self.path = path
        self.handle = handle
        self.lib = lib
        self.capabilities = Capabilities(bool(lib.mtmd_support_vision(handle)), bool(lib.mtmd_support_audio(handle)))

    @classmethod
    def load(cls, path: Path, model: Any, settings: ProjectorSettings, n_threads: int) -> Projector:
        """Load `path` for `model` (a native.Model).

        Raises:
            ModelLoadError: the file is missing, not a projector, or made for a model of another width.
        """
        if not path.is_file():
            raise ModelLoadError(f"projector file not found: {path}", hint="check the --mmproj path")
        lib = mtmd()
        params = lib.mtmd_context_params_default()
        params.use_gpu = settings.offload
        params.print_timings = False
        if n_threads > 0:
            params.n_threads = n_threads
        params.image_min_tokens = settings.image_min_tokens
        params.image_max_tokens = settings.image_max_tokens
        errors: list[str] = []
        with log_listener(lambda level, text: errors.append(text) if level == LOG_ERROR else None):
            handle = lib.mtmd_init_from_file(str(path).encode(), model.handle, params)
        if not handle:
            raise _load_error(path, model, errors)
        return cls(path, handle, lib)

    def close(self) -> None:
        if self.handle:
            self.lib.mtmd_free(self.handle)
            self.handle = None

    def check_kind(self, media: Media) -> None:
        """Raise InputError when the projector does not take this kind of media (images, audio)."""
        if media.kind == "image" and not self.capabilities.vision:
            raise InputError(f"the projector {self.path.name} does not take images", hint="send audio only")
        if media.kind == "audio" and not self.capabilities.audio:
            raise InputError(f"the projector {self.path.name} does not take audio", hint="send images only")

    def bitmap(self, media: Media) -> Any:
        """Decode checked media bytes into an mtmd bitmap (the caller frees it).

        Raises:
            InputError: the projector does not take this kind of media, or the bytes do not decode.
        """
        self.check_kind(media)
        import ctypes

        buf = (ctypes.c_uint8 * len(media.data)).from_buffer_copy(media.data)
        bitmap = self.lib.mtmd_helper_bitmap_init_from_buf(self.handle, buf, len(media.data), False)
        if not bitmap:
            raise InputError(f"{media.name} could not be decoded as a {media.format} {media.kind}",
                             hint="the file may be damaged or cut short")
        # The id names the content: libmtmd's chunks carry it, and so does the prompt's placeholder.
        self.lib.mtmd_bitmap_set_id(bitmap, media_id(media.data).encode())
        return bitmap


def media_id(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def _load_error(path: Path, model: Any, errors: list[str]) -> ModelLoadError:
    text = " ".join(line.strip() for line in errors)
    mismatch = _MISMATCH.search(text)
    if mismatch:
        text_embd, proj_embd = mismatch.groups()
        return ModelLoadError(
            f"the projector {path.name} makes embeddings of size {proj_embd}, but the text model takes "
            f"embeddings of size {text_embd}", hint="use the mmproj file made for this model")
    reason = errors[-1].strip() if errors else "libmtmd refused it"
    return ModelLoadError(f"cannot load the projector {path}: {reason}",
                          hint="--mmproj takes a multimodal projector GGUF (a file named mmproj-*.gguf)")


def with_hf_projector(settings: ProjectorSettings, request: Any, resolved: Any,
                      tqdm_class: Any = None) -> ProjectorSettings:
    """`settings` with the projector of an -hf model's repo when --mmproj names none (and --no-mmproj is
    not given), as llama.cpp's -hf finds it: core/model/resolve.py's pick_projector."""
    from dataclasses import replace

    from ..model.resolve import resolve_hf_projector

    if settings.path is not None or not settings.auto or not getattr(request, "hf_repo", None) or not resolved.repo:
        return settings
    path = resolve_hf_projector(request, resolved.filename, tqdm_class=tqdm_class)
    return replace(settings, path=path) if path is not None else settings


@contextmanager
def open_projector(settings: ProjectorSettings, model: Any, n_threads: int = -1,
                   needed: bool = True) -> Iterator[Projector | None]:
    """The projector `settings` name, loaded for `model` and freed on exit; None without one, or when the
    run has no media (`needed` False: a text-only run spends no time on it)."""
    if not needed or not settings.enabled or settings.path is None:
        yield None
        return
    projector = Projector.load(settings.path, model, settings, n_threads)
    try:
        yield projector
    finally:
        projector.close()
