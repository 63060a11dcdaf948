"""`pyllama serve`: an OpenAI-compatible HTTP server for one model."""

from __future__ import annotations

import ipaddress
import re
import socket
from pathlib import Path
from typing import Annotated, Any

import typer

from ..console import download_tqdm, err, warn
from ..core.model.resolve import ModelRequest, resolve_model
from ..core.model.settings import LoadSettings
from ..errors import Interrupted, ModelLoadError, PyllamaError, UsageError
from ..options.load import ChatTemplateOpt, in_panel, model_options
from ..options.sampling import SamplingOptions, sampling_options

EXAMPLES = """\
Examples:
  pyllama serve -m model.gguf
  pyllama serve -hf ggml-org/gemma-3-1b-it-GGUF --port 8000 --alias gemma
  pyllama serve -m model.gguf --host 0.0.0.0 --api-key "$(cat key.txt)" --cors-origin https://app.example
  pyllama serve -m model.gguf -np 4 -c 16384        # 4 requests at once, 4096 tokens each
  pyllama serve -m embedder.gguf --embeddings
  curl http://127.0.0.1:8080/v1/chat/completions -d '{"messages": [{"role": "user", "content": "Hi"}]}'
"""

SERVER_PANEL = "Server"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
# Seconds in-flight requests get to finish after SIGTERM/Ctrl-C before they are cancelled.
SHUTDOWN_GRACE_S = 3
_SIZE = re.compile(r"^\s*(\d+)\s*([kmg]?)(i?b)?\s*$", re.IGNORECASE)


@model_options(load=True)
@sampling_options()
def serve(
    model: ModelRequest,
    load: LoadSettings,
    sampling: SamplingOptions,
    host: Annotated[str, typer.Option("--host", help="Address to listen on.", rich_help_panel=SERVER_PANEL)]
    = DEFAULT_HOST,
    port: Annotated[int, typer.Option(
        "--port", min=0, max=65535, help="Port to listen on (0 = any free port; the URL is printed).",
        rich_help_panel=SERVER_PANEL)] = DEFAULT_PORT,
    alias: Annotated[str | None, typer.Option(
        "-a", "--alias", help="Model id clients use (default: the model file's name without .gguf).",
        rich_help_panel=SERVER_PANEL, show_default=False)] = None,
    api_key: Annotated[str | None, typer.Option(
        "--api-key", envvar="PYLLAMA_API_KEY", help="Require 'Authorization: Bearer KEY' (all routes but /health).",
        rich_help_panel=SERVER_PANEL, show_default=False)] = None,
    cors_origin: Annotated[list[str] | None, typer.Option(
        "--cors-origin", help="Allow browser requests from this origin (repeatable; '*' = any). No CORS headers "
        "unless given.", rich_help_panel=SERVER_PANEL, show_default=False)] = None,
    embeddings: Annotated[bool, typer.Option(
        "--embeddings", help="Serve an embedding model: /v1/embeddings only.", rich_help_panel=SERVER_PANEL)] = False,
    max_body_size: Annotated[str, typer.Option(
        "--max-body-size", help="Largest request body accepted (bytes, or with K/M/G; larger gets 413).",
        rich_help_panel=SERVER_PANEL)] = "8MiB",
    chat_template: in_panel(ChatTemplateOpt, SERVER_PANEL) = None,
    parallel: Annotated[int, typer.Option(
        "-np", "--parallel", min=1, help="Slots: requests generated at once, batched together (continuous "
        "batching); more wait in a queue. -c is shared: each slot gets c/N tokens unless --kv-unified.",
        rich_help_panel=SERVER_PANEL)] = 1,
    kv_unified: Annotated[bool, typer.Option(
        "--kv-unified", help="One KV cache for all slots: each may use the whole context while there is room.",
        rich_help_panel=SERVER_PANEL)] = False,
) -> None:
    """Serve a model over an OpenAI-compatible HTTP API: chat, completions, embeddings.

    Official OpenAI clients work with base_url http://HOST:PORT/v1. The server answers /health with
    503 while the model loads and 200 after; /docs has the API's schema. Sampling flags set the
    defaults that requests override; -n sets the default max_tokens (default: the rest of the context).
    """
    from ..server.settings import ServerSettings

    if chat_template:
        from ..core.text.chat_template import resolve_template

        resolve_template(None, chat_template)  # an unknown name fails before the model loads
    resolved = resolve_model(model, tqdm_class=download_tqdm())
    settings = ServerSettings(
        alias=alias or _default_alias(resolved.path), sampling=sampling.settings, n_predict=sampling.n_predict,
        stop=sampling.stop, api_key=api_key or None, cors_origins=tuple(cors_origin or ()),
        max_body_size=parse_size(max_body_size), chat_template=chat_template,
    )
    sock = _listen(host, port)
    if not settings.api_key and not _is_loopback(sock):
        warn(f"{_url(sock)} is reachable from other machines and there is no --api-key: anyone who can reach it "
             "can use the model")
    _run(sock, resolved.path, load, settings, embeddings, parallel, kv_unified)


def _make_engine(path: Path, load: LoadSettings, embeddings: bool, parallel: int, kv_unified: bool,
                 **callbacks: Any) -> Any:
    """Embeddings run one input at a time; generation runs on the continuous-batching slots."""
    if embeddings:
        from ..core.serving.engine import SingleSlotEngine

        return SingleSlotEngine(path, load, embeddings=True, **callbacks)
    from ..core.serving.scheduler import ParallelEngine

    return ParallelEngine(path, load, n_slots=parallel, kv_unified=kv_unified, **callbacks)


def _run(sock: socket.socket, path: Path, load: LoadSettings, settings: Any, embeddings: bool, parallel: int,
         kv_unified: bool) -> None:
    import uvicorn

    from ..server.app import create_app

    url = _url(sock)
    server: uvicorn.Server

    def on_ready(engine: Any) -> None:
        kind = "embeddings" if embeddings else f"chat and completions, {parallel} slot{'s' * (parallel > 1)}"
        err().print(f"pyllama serve: ready at {url}/v1 - model {settings.alias!r} ({path.name}), "
                    f"context {engine.n_ctx} tokens per request, {kind}", markup=False, highlight=False)

    def on_failure(_: BaseException) -> None:
        server.should_exit = True

    engine = _make_engine(path, load, embeddings, parallel, kv_unified, on_ready=on_ready, on_failure=on_failure)
    app = create_app(engine, settings)
    config = uvicorn.Config(app, log_level="info" if load.verbose else "warning", access_log=load.verbose,
                            log_config=_log_config(), timeout_graceful_shutdown=SHUTDOWN_GRACE_S, lifespan="on")
    server = _server_class()(config)
    server.on_stop = engine.cancel_all
    err().print(f"pyllama serve: listening on {url} - loading {path.name} (/health answers 503 until ready)",
                markup=False, highlight=False)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    if engine.error is not None:
        error = engine.error
        raise error if isinstance(error, PyllamaError) else ModelLoadError(f"could not load {path.name}: {error}")
    if server.stop_signal is not None:
        import signal

        if server.stop_signal == signal.SIGINT:
            raise Interrupted("pyllama serve: stopped")
        err().print(f"pyllama serve: stopped ({signal.Signals(server.stop_signal).name})", markup=False,
                    highlight=False)


def _log_config() -> dict[str, Any]:
    """uvicorn's logging setup with the access log on stderr too (uvicorn sends it to stdout)."""
    import copy

    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config["handlers"]["access"]["stream"] = "ext://sys.stderr"
    return config


def _server_class() -> type:
    """uvicorn's Server, with a shutdown that ends every request cleanly and exits 0.

    On SIGTERM or Ctrl-C, running requests get SHUTDOWN_GRACE_S - 1 seconds to finish; then
    `on_stop` (the engine's cancel_all) ends the rest, so their streams still close with
    `data: [DONE]` before uvicorn's own deadline would cut the connections. uvicorn re-raises
    the signal once it has shut down, so the process would die of it (status 143) after a
    graceful stop; this one does not: a service manager sees 0.
    """
    import contextlib
    import signal
    import threading

    import uvicorn

    class Server(uvicorn.Server):
        stop_signal: int | None = None
        on_stop: Any = None

        def handle_exit(self, sig: int, frame: Any) -> None:
            if self.stop_signal is None and self.on_stop is not None:
                timer = threading.Timer(max(SHUTDOWN_GRACE_S - 1, 0), self.on_stop)
                timer.daemon = True
                timer.start()
            self.stop_signal = self.stop_signal or sig
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self) -> Any:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    return Server


def _listen(host: str, port: int) -> socket.socket:
    """Bind the port before loading anything, so a taken port fails at once with a clear message."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise UsageError(f"cannot listen on {host}:{port}: {reason}",
                         hint="pick another --port (0 = any free port) or --host") from None
    return sock


def _is_loopback(sock: socket.socket) -> bool:
    host = sock.getsockname()[0]
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _default_alias(path: Path) -> str:
    return path.stem


def parse_size(text: str) -> int:
    """Bytes in '8388608', '8M', '8MiB', '512K'... (powers of 1024)."""
    match = _SIZE.match(text)
    if not match:
        raise typer.BadParameter(f"{text!r} is not a size such as 8388608, 512K or 8MiB",
                                 param_hint="'--max-body-size'")
    return int(match.group(1)) * 1024 ** " kmg".index(match.group(2).lower() or " ")
