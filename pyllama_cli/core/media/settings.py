"""The projector's settings, with llama.cpp's defaults; free of llama_cpp imports (flags read them)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_IMAGE_TOKENS = -1  # -1: the projector's own minimum and maximum (dynamic-resolution models only)
# libmtmd's default media marker: where an image or audio clip goes in a prompt.
MEDIA_MARKER = "<__media__>"


@dataclass(frozen=True)
class ProjectorSettings:
    """--mmproj and its companions. `path` None: no projector (text only)."""

    path: Path | None = None
    auto: bool = True  # --mmproj-auto/--no-mmproj: with -hf, look for the repo's projector
    offload: bool = True  # --mmproj-offload: the projector runs on the GPU when there is one
    image_min_tokens: int = DEFAULT_IMAGE_TOKENS
    image_max_tokens: int = DEFAULT_IMAGE_TOKENS

    @property
    def enabled(self) -> bool:
        return self.path is not None and self.auto
