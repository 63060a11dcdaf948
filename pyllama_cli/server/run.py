"""Running `pyllama serve`: the listening socket, the engine, and uvicorn with a clean shutdown.

`listen()` binds the port before anything loads; `serve()` starts the engine (which loads the model
in the background while /health answers 503) and serves until a signal stops it. uvicorn, the
engines and the app are imported only when `serve()` runs.
"""

from __future__ import annotations

import gc
import ipaddress
import socket
import sys
from pathlib import Path
from typing import Any

from ..console import err, warn
from ..core.store.servers import register_server
from ..core.model.settings import LoadSettings
from ..errors import Interrupted, ModelLoadError, PyllamaError, ServerShutdown, UsageError

# Seconds the cut requests' last events get to reach their clients before uvicorn closes the connections.
CUT_WRITE_S = 1


def listen(host: str, port: int) -> socket.socket:
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


def listen_all(hosts: str, port: int) -> list[socket.socket]:
    """Bind each address of a comma-separated --host ("127.0.0.1,::1"), all on one port: with --port 0,
    the port the first one got."""
    socks: list[socket.socket] = []
    try:
        for host in [h.strip() for h in hosts.split(",") if h.strip()] or [hosts]:
            socks.append(listen(host, socks[0].getsockname()[1] if socks else port))
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    return socks


def listen_for(hosts: str, port: int, settings: Any) -> list[socket.socket]:
    """Bind every --host address before anything loads, and say on stderr what an open server allows."""
    if "*" in settings.cors_origins:
        warn("--cors-origin '*': any web page a browser opens may call this server with the browser's "
             "credentials and read its answers")
    from .settings import listen_port

    socks = listen_all(hosts, listen_port(port))  # Vertex AI mode (AIP_MODE): its AIP_HTTP_PORT
    for sock in socks:
        if not settings.api_key and not is_loopback(sock):
            warn(f"{url(sock)} is reachable from other machines and there is no --api-key: anyone who can "
                 "reach it can use the model")
    return socks


def is_loopback(sock: socket.socket) -> bool:
    host = sock.getsockname()[0]
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def make_engine(path: Path, load: LoadSettings, embeddings: bool, parallel: int, kv_unified: bool,
                speculative: Any = None, pooling: int = -1, embd_normalize: int = 2, prompt_cache: Any = None,
                **callbacks: Any) -> Any:
    """Embeddings run one input at a time; generation runs on the continuous-batching slots."""
    if embeddings:
        from ..core.serving.embedding_engine import EmbeddingEngine

        return EmbeddingEngine(path, load, pooling=pooling, embd_normalize=embd_normalize, **callbacks)
    from ..core.serving.scheduler import ParallelEngine

    return ParallelEngine(path, load, n_slots=parallel, kv_unified=kv_unified, speculative=speculative,
                          prompt_cache=prompt_cache, **callbacks)


def serve(sock: socket.socket | list[socket.socket], path: Path, load: LoadSettings, settings: Any, *,
          embeddings: bool, parallel: int, kv_unified: bool) -> None:
    """Serve on `sock` (or each of several) until SIGTERM or Ctrl-C; the sockets are closed on return.

    Raises:
        ModelLoadError (or the engine's own PyllamaError): the model could not be loaded.
        Interrupted: stopped by Ctrl-C (exit 130, as other commands).
    """
    import uvicorn

    from .app import create_app
    from .http.memory import fix_mmap_threshold
    from .model_set import OneModel

    fix_mmap_threshold()  # before the first request: big request bodies must not grow the heap for good
    socks = sock if isinstance(sock, list) else [sock]
    address = url(socks[0])
    server: uvicorn.Server

    def on_ready(engine: Any) -> None:
        kind = "embeddings" if embeddings else f"chat and completions, {parallel} slot{'s' * (parallel > 1)}"
        err().print(f"pyllama serve: ready at {address}/v1 - model {settings.alias!r} ({path.name}), "
                    f"context {engine.n_ctx} tokens per request, {kind}", markup=False, highlight=False)

    def on_failure(_: BaseException) -> None:
        server.should_exit = True

    if embeddings:  # before loading: llama.cpp aborts on a pooling the model cannot do
        from ..core.embed.pooling import check_pooling

        check_pooling(path, settings.pooling)
    engine = make_engine(path, load, embeddings, parallel, kv_unified, settings.speculative, settings.pooling,
                         settings.embd_normalize, prompt_cache=settings.prompt_cache, on_ready=on_ready,
                         on_failure=on_failure, projector=settings.projector)
    if load.rpc and hasattr(engine, "break_down"):
        _survive_dead_rpc_servers(engine)
    app = create_app(OneModel(engine, settings), settings)
    config = uvicorn_config(app, settings.limits, verbose=settings.verbose)
    server = server_class()(config)
    server.grace = settings.limits.shutdown_grace
    server.on_stop = lambda: engine.cancel_all(ServerShutdown())
    listening = ", ".join(url(s) for s in socks)
    err().print(f"pyllama serve: listening on {listening} - loading {path.name} (/health answers 503 until ready)",
                markup=False, highlight=False)
    run_registered(server, socks, address, bool(settings.api_key))
    _raise_for_stop(engine, server, path)


def run_registered(server: Any, socks: list[socket.socket], address: str, api_key_required: bool) -> None:
    """Run uvicorn's `server` on `socks` until it stops, registered meanwhile as a running server (so
    `pyllama rm` asks it what it has loaded); the sockets are closed after."""
    try:
        with register_server(address, api_key_required=api_key_required):
            server.run(sockets=socks)
    finally:
        for sock in socks:
            sock.close()
        # The process ends next: without this, the interpreter's last collection walks the whole heap
        # (seconds on a loaded machine, past a service manager's stop deadline); frozen, it skips it.
        gc.freeze()


def _survive_dead_rpc_servers(engine: Any) -> None:
    """An RPC server that dies under the model fails the requests running on it (and every later one,
    with 503: the model cannot run any more) instead of ending the process; stderr says so once."""
    from ..core.model.rpc import on_server_gone
    from ..errors import RpcError

    def gone(message: str, hint: str) -> bool:
        engine.break_down(RpcError(message, hint=hint))
        sys.stderr.write(f"Error: {message}\nHint: requests now get 503 until the server is restarted; {hint}\n")
        sys.stderr.flush()
        return True

    on_server_gone(gone)


def _raise_for_stop(engine: Any, server: Any, path: Path) -> None:
    """Turn why the server stopped into the command's outcome: a load error, Ctrl-C, or a clean stop."""
    from ..core.serving.engine import BROKEN

    if engine.error is not None and engine.state != BROKEN:  # a broken engine's error was reported when it broke
        error = engine.error
        raise error if isinstance(error, PyllamaError) else ModelLoadError(f"could not load {path.name}: {error}")
    if server.stop_signal is not None:
        import signal

        if server.stop_signal == signal.SIGINT:
            raise Interrupted("pyllama serve: stopped")
        err().print(f"pyllama serve: stopped ({signal.Signals(server.stop_signal).name})", markup=False,
                    highlight=False)


def uvicorn_config(app: Any, limits: Any, *, verbose: bool) -> Any:
    """uvicorn's settings: the guarded httptools protocol (limits.py), keep-alive, the shutdown deadline."""
    import uvicorn

    from .http.limits import guarded_protocol
    from .http.header_case import with_header_case

    # uvicorn's access log stays off: http/access_log.py writes one line per request, model and tokens included.
    return uvicorn.Config(app, log_level="info" if verbose else "warning", access_log=False, log_config=log_config(),
                          http=with_header_case(guarded_protocol(limits)), timeout_keep_alive=limits.keep_alive_timeout,
                          timeout_graceful_shutdown=limits.shutdown_grace + CUT_WRITE_S, lifespan="on")


def log_config() -> dict[str, Any]:
    """uvicorn's logging setup with the access log on stderr too (uvicorn sends it to stdout), and every
    handler masking secrets (redact.py): keys in URLs, authorization headers."""
    import copy

    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config["handlers"]["access"]["stream"] = "ext://sys.stderr"
    config["filters"] = {"redact": {"()": "pyllama_cli.server.http.redact.RedactFilter"}}
    for handler in config["handlers"].values():
        handler["filters"] = ["redact"]
    return config


def server_class() -> type:
    """uvicorn's Server, with a shutdown that ends every request cleanly and exits 0.

    On SIGTERM or Ctrl-C, running requests get `grace` seconds (--shutdown-grace) to finish; then
    `on_stop` (the engine's cancel_all) cuts the rest: each stream ends with an error event of type
    `server_shutdown` and `data: [DONE]`, each waiting non-streamed request gets 503 with Retry-After,
    within the CUT_WRITE_S that uvicorn's own deadline leaves before it drops the connections.
    uvicorn re-raises the signal once it has shut down, so the process would die of it (status
    143) after a graceful stop; this one does not: a service manager sees 0.
    """
    import contextlib
    import signal
    import threading

    import uvicorn

    class Server(uvicorn.Server):
        stop_signal: int | None = None
        on_stop: Any = None
        on_signal: Any = None  # at once: what is no request to wait for (the router's event streams)
        grace: float = 3.0

        def handle_exit(self, sig: int, frame: Any) -> None:
            if self.stop_signal is None and self.on_signal is not None:
                _soon(self.on_signal)  # not inside whatever the signal interrupted
            if self.stop_signal is None and self.on_stop is not None:
                timer = threading.Timer(self.grace, self.on_stop)
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


def _soon(action: Any) -> None:
    """Run `action` on the running event loop's next turn (a signal handler may have cut into its code)."""
    import asyncio

    try:
        asyncio.get_running_loop().call_soon(action)
    except RuntimeError:  # no loop running: nothing to cut into
        action()
