"""What the server was started with (kept free of heavy imports: the serve command builds it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.generate.sampling import SamplingSettings
from ..core.text.reasoning import FORMAT_DEEPSEEK, UNLIMITED

DEFAULT_MAX_BODY_SIZE = 8 * 1024 * 1024


@dataclass(frozen=True)
class ServerSettings:
    """Server-wide options; per-request fields override the sampling defaults."""

    alias: str  # the model id clients name
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    n_predict: int = -1  # default max tokens per request (-1: the rest of the context)
    stop: tuple[str, ...] = ()  # stop strings added to every request
    api_key: str | None = None
    cors_origins: tuple[str, ...] = ()
    max_body_size: int = DEFAULT_MAX_BODY_SIZE
    chat_template: str | None = None  # NAME|FILE|JINJA override of the model's template
    reasoning_format: str = FORMAT_DEEPSEEK  # "none": thinking stays in the answer's text
    reasoning_budget: int = UNLIMITED  # thinking tokens before the block is closed (-1: no limit)
