"""What the server was started with (kept free of heavy imports: the serve command builds it)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..core.constrain.bounds import DEFAULT_MAX_GRAMMAR_SECONDS, DEFAULT_MAX_GRAMMAR_SIZE
from ..core.generate.sampling import SamplingSettings
from ..core.media.settings import ProjectorSettings
from ..core.generate.speculative import SpeculativeSettings
from ..core.serving.cache.settings import CacheSettings
from ..core.text.reasoning import FORMAT_DEEPSEEK, UNLIMITED

DEFAULT_MAX_BODY_SIZE = 8 * 1024 * 1024


def vertex_mode() -> bool:
    """Vertex AI's custom-container mode (AIP_MODE=PREDICTION; llama_server/vertex.py has its routes)."""
    return os.environ.get("AIP_MODE", "") == "PREDICTION"


def listen_port(port: int) -> int:
    """The port to listen on: AIP_HTTP_PORT in Vertex AI's mode (it overrides --port, as in llama-server)."""
    return int(os.environ.get("AIP_HTTP_PORT") or 8080) if vertex_mode() else port


@dataclass(frozen=True)
class ServerLimits:
    """What one client may take of the server: the HTTP limits (see limits.py) and the shutdown grace.

    The defaults are far above what an ordinary client sends or needs; they stop a hostile one.
    """

    shutdown_grace: float = 3.0  # seconds running requests get after SIGTERM/Ctrl-C, then they are cut
    max_header_size: int = 16 * 1024  # total bytes of the header fields (431 beyond)
    max_headers: int = 100  # header fields (431 beyond)
    max_url_length: int = 8 * 1024  # bytes of the request target (414 beyond)
    header_timeout: float = 10.0  # seconds to send a request's head, from its first byte (or the connect)
    body_timeout: float = 60.0  # seconds to send a request's body, from the end of its head (408 beyond)
    max_connections: int = 512  # open connections; a request on one beyond gets 503
    keep_alive_timeout: float = 5.0  # seconds an idle keep-alive connection stays open
    max_grammar_size: int = DEFAULT_MAX_GRAMMAR_SIZE  # bytes of GBNF a request's grammar or schema may make
    max_grammar_seconds: float = DEFAULT_MAX_GRAMMAR_SECONDS  # seconds its conversion and parse may take
    stream_buffer_size: int = 8 * 1024 * 1024  # bytes one X-Conversation-Id stream may buffer (streams/)
    stream_sessions: int = 64  # X-Conversation-Id streams kept at once, running or finished
    stream_grace: float = 300.0  # seconds a finished stream stays readable


@dataclass(frozen=True)
class MediaPolicy:
    """What a request's images and audio may be (docs/multimodal.md): where from, and how many bytes."""

    domains: tuple[str, ...] = ()  # hosts whose http(s) media URLs requests may name (--media-domains)
    path: Path | None = None  # the folder file: URLs may name (--media-path; None: file: URLs refused)
    max_image_bytes: int = 20 * 2**20  # a request's image bytes at most (--media-max-image-size)
    max_audio_bytes: int = 100 * 2**20  # its audio bytes at most (--media-max-audio-size)


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
    webui: bool = True  # serve the chat page at GET /
    docs: bool = False  # serve Swagger UI at /docs (--docs)
    allowed_hosts: tuple[str, ...] = ()  # Host names answered (--allowed-hosts; (): any, see http/hosts.py)
    limits: ServerLimits = field(default_factory=ServerLimits)
    speculative: SpeculativeSettings = field(default_factory=SpeculativeSettings)  # --spec-type, -md
    slot_save_path: Path | None = None  # where /slots/ID?action=save|restore files live (None: off)
    reasoning_format: str = FORMAT_DEEPSEEK  # "none": thinking stays in the answer's text
    reasoning_budget: int = UNLIMITED  # thinking tokens before the block is closed (-1: no limit)
    prompt_cache: CacheSettings = field(default_factory=CacheSettings)  # --cache-ram, --cache-disk...
    access_log: str | None = "text"  # one line per request on stderr: "text" or "json"; None: off (-q)
    verbose: bool = False  # -v: each request's prompt tokens by part, uvicorn's own log
    pooling: int = -1  # --pooling as llama.cpp's pooling type (-1: the model's own); 4 (rank) with --rerank
    embd_normalize: int = 2  # --embd-normalize
    projector: ProjectorSettings = field(default_factory=ProjectorSettings)  # --mmproj and its companions
    media: MediaPolicy = field(default_factory=MediaPolicy)  # what requests' media may be
    aliases: tuple[str, ...] = ()  # every --alias name (a,b,c); `alias`, the id, is the first in order
    tags: tuple[str, ...] = ()  # --tags: informational, listed in /v1/models
    models_autoload: bool = True  # router mode: load a model on its first request (--no-models-autoload)
    cors_proxy: bool = False  # --ui-mcp-proxy: /cors-proxy?url= fetches URLs for the web page (llama-server's)
    tools: tuple[str, ...] = ()  # --tools: llama-server's built-in tools at /tools ("all": every one); off: 403
    metrics: bool = True  # serve /metrics (--no-metrics: 501, as llama-server without --metrics)
