"""`pyllama rpc-server`: lend this machine's devices to other pyllama (or llama.cpp) processes over ggml's RPC."""

from __future__ import annotations

import errno
import ipaddress
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from ..console import info, warn
from ..errors import RpcError, UsageError
from ..options.hardware.devices import DEVICE_PANEL

EXAMPLES = """\
Examples:
  pyllama rpc-server                               # lend this machine's GPUs (else its CPU) on 127.0.0.1:50052
  pyllama rpc-server -H 10.0.0.5 -p 50052 -c       # on a private network, with the tensor cache
  pyllama complete -m model.gguf --rpc 10.0.0.5:50052,10.0.0.6:50052 -p "Hello"
"""

DEFAULT_HOST = "127.0.0.1"


def _default_threads() -> int:
    return max(1, (os.cpu_count() or 2) // 2)  # llama.cpp's rpc-server: half the hardware threads


def rpc_server(
    host: Annotated[str, typer.Option("-H", "--host", help="Address to listen on. The protocol has no "
                                      "authentication or encryption: keep it on a private network.")] = DEFAULT_HOST,
    port: Annotated[int, typer.Option("-p", "--port", min=1, max=65535, help="Port to listen on.")] = 50052,
    threads: Annotated[int, typer.Option("-t", "--threads", min=0, help="Threads of the CPU device "
                                         "(0 = half the hardware threads).", show_default=False)] = 0,
    device: Annotated[str | None, typer.Option(
        "-d", "--device", metavar="DEV,...", help="Devices to lend, comma-separated (default: every GPU, else "
        "the CPU).", rich_help_panel=DEVICE_PANEL, show_default=False)] = None,
    cache: Annotated[bool, typer.Option("-c", "--cache", help="Keep large tensors the clients send in a local "
                                        "cache ($LLAMA_CACHE/rpc, else ~/.cache/llama.cpp/rpc), so that a "
                                        "model loads faster the next time.")] = False,
    list_devices: Annotated[bool, typer.Option(
        "--list-devices", help="Print this machine's devices with their memory and exit.",
        rich_help_panel=DEVICE_PANEL)] = False,
) -> None:
    """Run ggml's RPC server: clients add it with --rpc HOST:PORT and put part of a model on its devices.

    It serves one client at a time. SIGTERM or Ctrl-C stops it.
    """
    from ..core.model.rpc import MIB, devices, rpc_function, server_devices, start_server

    rpc_function("ggml_backend_rpc_start_server")  # a library without RPC fails here, in one line
    if list_devices:
        sys.stdout.write("\n".join(["Available devices:"] + [f"  {dev.line()}" for dev in devices()]) + "\n")
        return
    if ":" in host:
        raise UsageError(f"-H {host}: ggml's RPC takes IPv4 addresses and host names, not IPv6")
    lend = server_devices(tuple(d for d in (device or "").replace("/", ",").split(",") if d))
    if not _is_loopback(host):
        warn(f"listening on {host}: ggml's RPC protocol has no authentication or encryption, and whoever reaches "
             "the port can use this machine's devices and memory; use a private network or an SSH/WireGuard tunnel")
    _check_port_free(host, port)
    cache_dir = _cache_dir() if cache else None
    endpoint = f"{host}:{port}"
    for dev in lend:
        info(f"lending {dev.name} ({dev.description}): {dev.free // MIB} MiB free of {dev.total // MIB} MiB")
    info(f"RPC server on {endpoint}" + (f", tensor cache in {cache_dir}" if cache_dir else "")
         + "; Ctrl-C stops it")
    sys.stdout.flush()
    os.dup2(2, 1)  # ggml prints its banner and each connection on stdout: people's text goes to stderr
    with _stopping_on_sigterm():  # before the port opens: whoever sees it open may stop the server at once
        try:
            server = start_server(endpoint, cache_dir, threads or _default_threads(), lend)
            while server.is_alive():
                server.join(0.5)
        except KeyboardInterrupt:
            info("RPC server stopped")
            return
    raise RpcError(f"ggml's RPC server could not start on {endpoint}", hint="its reason is on the line above")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_port_free(host: str, port: int) -> None:
    """Fail in one line when the port is taken (ggml would only print that it could not create its socket)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as ggml's server socket
        probe.bind((host, port))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise RpcError(f"port {port} on {host} is in use", hint="stop what uses it, or choose another with -p") \
                from None
        raise RpcError(f"cannot listen on {host}:{port}: {exc.strerror or exc}", hint="check -H/--host") from None
    finally:
        probe.close()


def _cache_dir() -> str:
    """llama.cpp's cache folder for RPC tensors: $LLAMA_CACHE/rpc, else $XDG_CACHE_HOME/llama.cpp/rpc."""
    base = os.environ.get("LLAMA_CACHE")
    root = Path(base) if base else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llama.cpp"
    folder = root / "rpc"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RpcError(f"cannot create the tensor cache {folder}: {exc.strerror}", hint="set LLAMA_CACHE") from None
    return str(folder)


class _stopping_on_sigterm:
    """SIGTERM stops the server as Ctrl-C does."""

    def __enter__(self) -> None:
        self.previous: Any = signal.signal(signal.SIGTERM, _raise_interrupt)

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGTERM, self.previous)


def _raise_interrupt(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt
