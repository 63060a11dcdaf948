"""llama.cpp's RPC backend: other machines' `rpc-server`s lend their devices to this process.

`add_servers()` registers servers (`--rpc HOST:PORT,...`) in libggml's device registry, after a
TCP connect with a timeout, since ggml's own connect and handshake block without one.
`model_devices()` turns `-dev` and `-ts` into llama_model_params. `start_server()` runs ggml's
RPC server (`pyllama rpc-server`). Everything goes through the RPC backend's registry entry in the
libggml that libllama uses, so a build without `-DGGML_RPC=on` fails with one line on how to rebuild.

When a server dies mid-run, ggml's RPC client does not return an error: it calls GGML_ABORT.
`install_abort_handler()` replaces ggml's abort report (a gdb backtrace, then SIGABRT) with one
`Error:` line and exit code 1, from whichever thread ggml aborted on.
"""

from __future__ import annotations

import ctypes
import os
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...errors import RpcError, UsageError
from . import library

DEFAULT_RPC_PORT = 50052
CONNECT_TIMEOUT_S = 5.0  # a TCP connect, then ggml's handshake: each must finish within this
REBUILD_HINT = ('this llama-cpp-python was built without -DGGML_RPC=on; rebuild it with: '
                'CMAKE_ARGS="-DGGML_RPC=on" pip install --force-reinstall --no-cache-dir llama-cpp-python')
MIB = 1024 * 1024

_ADD_SERVER = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)
_START_SERVER = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t,
                                 ctypes.POINTER(ctypes.c_void_p))
_ABORT_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_char_p)

# The seam that finds the RPC backend: the libggml that libllama uses. Tests point it at a library
# without the RPC backend to see the rebuild hint.
rpc_library: Callable[[], ctypes.CDLL] = library._ggml

_lock = threading.Lock()
_added: dict[str, int] = {}  # endpoint -> its registry entry, added once per process
_abort_state: dict[str, Any] = {}


@dataclass(frozen=True)
class Device:
    """One device in libggml's registry: CPU, a GPU, or an RPC server's (named RPC0, RPC1, ...)."""

    name: str
    description: str
    kind: int
    free: int
    total: int
    handle: int

    @property
    def is_cpu(self) -> bool:
        return self.kind in library.CPU_DEVICE_TYPES

    def line(self) -> str:
        return f"{self.name}: {self.description} ({self.total // MIB} MiB, {self.free // MIB} MiB free)"


def _bind(ggml: ctypes.CDLL) -> ctypes.CDLL:
    vp, size = ctypes.c_void_p, ctypes.c_size_t
    for name, args, res in (("ggml_backend_reg_by_name", [ctypes.c_char_p], vp),
                            ("ggml_backend_reg_get_proc_address", [vp, ctypes.c_char_p], vp),
                            ("ggml_backend_register", [vp], None),
                            ("ggml_backend_dev_name", [vp], ctypes.c_char_p),
                            ("ggml_backend_dev_memory", [vp, ctypes.POINTER(size), ctypes.POINTER(size)], None),
                            ("ggml_set_abort_callback", [_ABORT_CALLBACK], vp)):
        fn = getattr(ggml, name)
        fn.argtypes, fn.restype = args, res
    return ggml


def rpc_function(name: str) -> int:
    """The address of one of the RPC backend's functions, found as llama.cpp's tools find it.

    Raises:
        RpcError: the loaded library has no RPC backend.
    """
    library.ensure_backend()
    try:
        ggml = _bind(rpc_library())
    except AttributeError:  # not even a backend registry to ask
        raise RpcError("the loaded llama.cpp library has no RPC backend", hint=REBUILD_HINT) from None
    reg = ggml.ggml_backend_reg_by_name(b"RPC")
    address = ggml.ggml_backend_reg_get_proc_address(reg, name.encode()) if reg else None
    if not address:
        raise RpcError("the loaded llama.cpp library has no RPC backend", hint=REBUILD_HINT)
    return address


def parse_endpoints(value: str, flag: str = "--rpc") -> tuple[str, ...]:
    """`HOST:PORT[,HOST:PORT...]` as a tuple of endpoints, each checked."""
    endpoints = tuple(part.strip() for part in value.split(",") if part.strip())
    if not endpoints:
        raise UsageError(f"{flag} names no server", hint="give HOST:PORT, e.g. 192.168.1.20:50052")
    for endpoint in endpoints:
        host, _, port = endpoint.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise UsageError(f"{flag} {endpoint!r} is not HOST:PORT", hint="e.g. 192.168.1.20:50052")
        if ":" in host:  # ggml splits an endpoint at its first colon
            raise UsageError(f"{flag} {endpoint!r}: ggml's RPC takes IPv4 addresses and host names, not IPv6")
    return endpoints


def _split(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    return host, int(port)


def check_reachable(endpoint: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Raise RpcError unless a TCP connection to `endpoint` opens within `timeout` seconds."""
    try:
        with socket.create_connection(_split(endpoint), timeout=timeout):
            pass
    except TimeoutError:
        raise RpcError(f"RPC server {endpoint} did not answer within {timeout:g} s",
                       hint="check the address, that `pyllama rpc-server` runs there, and the firewall") from None
    except OSError as exc:
        raise RpcError(f"RPC server {endpoint} cannot be reached: {exc.strerror or exc}",
                       hint=f"start it there with `pyllama rpc-server -H HOST -p {_split(endpoint)[1]}`, "
                       "or check the address") from None


def add_servers(endpoints: tuple[str, ...], timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Register each RPC server's devices with libggml (once per process), as llama.cpp's --rpc does.

    Raises:
        RpcError: no RPC backend, or a server that is unreachable, silent or lends no device.
    """
    if not endpoints:
        return
    add = _ADD_SERVER(rpc_function("ggml_backend_rpc_add_server"))
    ggml = _bind(rpc_library())
    install_abort_handler(endpoints)
    with _lock:
        for endpoint in endpoints:
            if endpoint in _added:
                continue
            check_reachable(endpoint, timeout)
            reg = _call_with_timeout(lambda e=endpoint: add(e.encode()), timeout)
            if reg is _TIMED_OUT:
                raise RpcError(f"RPC server {endpoint} accepted the connection but did not answer within "
                               f"{timeout:g} s", hint="an rpc-server serves one client at a time: is another "
                               "one using it? Otherwise check that it is an RPC server of the same llama.cpp")
            if not reg:
                raise RpcError(f"RPC server {endpoint} lends no device", hint="check its -d/--device")
            ggml.ggml_backend_register(reg)
            _added[endpoint] = reg


_TIMED_OUT = object()


def _call_with_timeout(fn: Callable[[], Any], timeout: float) -> Any:
    """fn() on a daemon thread; _TIMED_OUT if it has not returned after `timeout` seconds (it is left to run)."""
    box: list[Any] = [_TIMED_OUT]
    worker = threading.Thread(target=lambda: box.__setitem__(0, fn()), name="rpc-connect", daemon=True)
    worker.start()
    worker.join(timeout)
    return box[0]


def devices() -> list[Device]:
    """Every device libggml knows now (RPC servers added so far included), with its memory."""
    library.ensure_backend()
    ggml = _bind(library._ggml())
    found = []
    for i in range(ggml.ggml_backend_dev_count()):
        dev = ggml.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        ggml.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        found.append(Device(ggml.ggml_backend_dev_name(dev).decode(), ggml.ggml_backend_dev_description(dev).decode(),
                            ggml.ggml_backend_dev_type(dev), free.value, total.value, dev))
    return found


class ModelDevices:
    """-dev and -ts as llama_model_params fields; holds the C arrays while the model loads."""

    def __init__(self, names: tuple[str, ...], split: tuple[float, ...]):
        self.devices: Any = None
        self.split: Any = None
        if names:
            self.devices = self._device_array(names)
        if split:
            n_max = int(library.lib.llama_max_devices())
            if len(split) > n_max:
                raise UsageError(f"-ts gives {len(split)} proportions; llama.cpp takes at most {n_max}")
            self.split = (ctypes.c_float * n_max)(*split)

    @staticmethod
    def _device_array(names: tuple[str, ...]) -> Any:
        if names == ("none",):
            return (ctypes.c_void_p * 1)()
        known = {dev.name: dev for dev in devices()}
        chosen = []
        for name in names:
            dev = known.get(name)
            if dev is None or dev.is_cpu:
                offered = ", ".join(n for n, d in known.items() if not d.is_cpu) or "none besides the CPU"
                raise UsageError(f"-dev {name!r} is not a device to offload to (devices: {offered})",
                                 hint="--list-devices shows them; RPC servers' devices appear once --rpc is given")
            chosen.append(dev.handle)
        return (ctypes.c_void_p * (len(chosen) + 1))(*chosen)

    def apply(self, params: Any) -> None:
        if self.devices is not None:
            params.devices = ctypes.cast(self.devices, ctypes.c_void_p)
        if self.split is not None:
            params.tensor_split = ctypes.cast(self.split, ctypes.POINTER(ctypes.c_float))


def model_devices(rpc: tuple[str, ...], names: tuple[str, ...], split: tuple[float, ...]) -> ModelDevices:
    """Add the RPC servers, then resolve -dev and -ts against the devices there are."""
    add_servers(rpc)
    return ModelDevices(names, split)


# ---------------------------------------------------------------- a server gone mid-run

_GGML_PREFIX = re.compile(r"^.*?:\d+: ")


def install_abort_handler(endpoints: tuple[str, ...]) -> None:
    """From now on, a GGML_ABORT (ggml's RPC client aborts when a server goes away) ends the process
    with one `Error:` line naming the servers that no longer answer, and exit code 1, not SIGABRT."""
    _abort_state.setdefault("endpoints", [])
    _abort_state["endpoints"] += [e for e in endpoints if e not in _abort_state["endpoints"]]
    if "callback" in _abort_state:
        return
    callback = _ABORT_CALLBACK(_on_abort)
    _abort_state["callback"] = callback  # referenced for the life of the process
    _bind(library._ggml()).ggml_set_abort_callback(callback)


def abort_message(raw: str, endpoints: list[str]) -> tuple[str, str]:
    """The error and hint for a ggml abort message ("file.cpp:123: what happened")."""
    reason = _GGML_PREFIX.sub("", raw.strip()).rstrip(".")
    if "RPC" not in reason:
        return f"llama.cpp stopped: {reason}", "set PYLLAMA_DEBUG=1 for a traceback"
    time.sleep(0.2)  # the dead process's listening socket may outlive, by a moment, the connection that broke
    gone = [e for e in endpoints if not _answers(e)]
    which = f"RPC server {', '.join(gone)} is gone" if gone else "an RPC server stopped answering"
    return f"{which} ({reason})", "restart `pyllama rpc-server` there and run the command again"


def _answers(endpoint: str) -> bool:
    try:
        check_reachable(endpoint, timeout=0.5)
        return True
    except RpcError:
        return False


# Who takes a dead server instead of ending the process: (message, hint) -> True when taken (a server).
_gone_handlers: list[Callable[[str, str], bool]] = []


def on_server_gone(handler: Callable[[str, str], bool]) -> None:
    """Let `handler(message, hint)` take a GGML_ABORT instead of ending the process.

    When it returns True the thread ggml aborted on is parked for good (returning would let ggml
    call abort()), and so is whatever thread waits on it inside llama.cpp: the context that ran on
    the dead server can never run again, but the rest of the process goes on (`serve` answers 503).
    """
    _gone_handlers.append(handler)


def _on_abort(raw: bytes) -> None:
    taken = False
    try:
        message, hint = abort_message(raw.decode("utf-8", "replace"), list(_abort_state.get("endpoints", [])))
        taken = any(handler(message, hint) for handler in list(_gone_handlers))
        if not taken:
            os.write(2, f"Error: {message}\nHint: {hint}\n".encode())
    finally:
        if not taken:
            os._exit(1)  # ggml calls abort() when this returns: leave first, from whatever thread this is
    threading.Event().wait()  # never returns; waits without the GIL


# ---------------------------------------------------------------- the server side


def server_devices(names: tuple[str, ...]) -> list[Device]:
    """The devices `rpc-server -d` lends: those named, else every accelerator, else the CPU (as llama.cpp's)."""
    known = devices()
    if names:
        by_name = {dev.name: dev for dev in known}
        missing = [name for name in names if name not in by_name]
        if missing:
            raise UsageError(f"-d {missing[0]!r} is not a device here (devices: {', '.join(by_name)})",
                             hint="--list-devices shows them")
        return [by_name[name] for name in names]
    return [dev for dev in known if not dev.is_cpu] or [dev for dev in known if dev.is_cpu][:1]


def start_server(endpoint: str, cache_dir: str | None, n_threads: int, lend: list[Device]) -> threading.Thread:
    """ggml's RPC server on a daemon thread: it serves clients (one at a time) until the process ends.

    The thread ends by itself only when ggml could not start (it says why on stderr).
    """
    start = _START_SERVER(rpc_function("ggml_backend_rpc_start_server"))
    handles = (ctypes.c_void_p * len(lend))(*[dev.handle for dev in lend])
    args = (endpoint.encode(), cache_dir.encode() if cache_dir else None, n_threads, len(lend), handles)
    thread = threading.Thread(target=lambda: start(*args), name="rpc-server", daemon=True)
    thread.start()
    return thread
