"""libllama itself: its bindings, its log, its backend, and the devices ggml knows.

llama-cpp-python's ctypes bindings are imported here, once (`lib`); every other module reaches
llama.cpp through them. llama.cpp's own log is routed through `llama_log_set`: silent by default,
to stderr with --verbose, to a file with --log-file. libggml's device registry, which the bindings
do not cover, tells which devices (CPU, GPU, RPC servers) this process can use.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import importlib.util
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from ...errors import InputError, PyllamaError


def _import_bindings() -> Any:
    """llama-cpp-python's ctypes bindings (`llama_cpp.llama_cpp`), without its package `__init__`.

    The package's `__init__` also imports the high-level `Llama` API (jinja2, diskcache, numpy's
    typing): about 60 ms on every start that pyllama never uses. The submodule is loaded under a
    bare package object that is removed again, so a later `import llama_cpp` runs the real
    `__init__`, which then reuses these same, already-loaded bindings.
    """
    if "llama_cpp" in sys.modules:
        return importlib.import_module("llama_cpp.llama_cpp")
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None:
        raise ModuleNotFoundError("No module named 'llama_cpp'", name="llama_cpp")
    sys.modules["llama_cpp"] = importlib.util.module_from_spec(spec)
    try:
        return importlib.import_module("llama_cpp.llama_cpp")
    finally:
        del sys.modules["llama_cpp"]


lib = _import_bindings()


def keeping_gil(fn: Any) -> Any:
    """`fn` (a llama.cpp function from the bindings), called without releasing the GIL.

    ctypes releases the GIL around every call, and taking it back may wait for another thread's
    Python work: in a server, the event loop's. A generation loop that makes a few microsecond-calls
    per token then stalls between decodes while llama.cpp's threads sit idle. For calls that are
    short, never block and start no threads, keeping the GIL is the cheaper choice; llama_decode
    still releases it, which is when the other threads should run.
    """
    cdll = getattr(lib, "_lib", None)
    if cdll is None:  # bindings laid out differently: the plain (GIL-releasing) call still works
        return fn
    quick = getattr(ctypes.PyDLL(cdll._name, handle=cdll._handle), fn.__name__)
    quick.argtypes, quick.restype = fn.argtypes, fn.restype
    return quick


_backend_lock = threading.Lock()
_backend_ready = False


# ---------------------------------------------------------------- logging


class _LogRouter:
    """Receives every llama.cpp/ggml log line; forwards it to the sink and any listeners."""

    def __init__(self) -> None:
        self.sink: IO[str] | None = None
        self.listeners: list[Callable[[int, str], None]] = []
        # The ctypes callback must stay referenced for as long as llama.cpp may call it.
        self.callback = lib.llama_log_callback(self._on_log)

    def _on_log(self, level: int, text: bytes, _user: Any) -> None:
        try:
            self.dispatch(level, text.decode("utf-8", errors="replace"))
        except BaseException:  # noqa: BLE001 - an exception must never cross back into C
            pass

    def dispatch(self, level: int, line: str) -> None:
        if self.sink is not None:
            self.sink.write(line)
            self.sink.flush()
        for listener in list(self.listeners):
            listener(level, line)


_router = _LogRouter()


def configure_logging(verbose: bool = False, log_file: Path | None = None) -> None:
    """Route llama.cpp's log: nowhere (default), stderr (verbose), or appended to a file."""
    ensure_backend()
    # Re-install the callback: other code in the process (tests, fixtures) may have replaced it.
    lib.llama_log_set(_router.callback, ctypes.c_void_p(0))
    if log_file is not None:
        _router.sink = _open_log(log_file)
    else:
        _router.sink = sys.stderr if verbose else None


def restore_log_callback() -> None:
    """Put pyllama's log callback back after `import llama_cpp` replaced it with the package's own
    (which prints everything: the stray `~llama_context: ...` line at serve's shutdown)."""
    lib.llama_log_set(_router.callback, ctypes.c_void_p(0))


def _open_log(path: Path) -> IO[str]:
    try:
        return open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives for the process
    except OSError as exc:
        hint = "create its folder first" if isinstance(exc, FileNotFoundError) else "choose a file you can write"
        raise InputError(f"cannot open the log file {path}: {exc.strerror}", hint=hint) from None


LOG_INFO, LOG_WARN = 2, 3  # ggml_log_level


def log_line(level: int, line: str) -> None:
    """A line of pyllama's own about what it asked of llama.cpp, sent where llama.cpp's log goes."""
    _router.dispatch(level, line)


def route_log(log_set: Callable[[Any, Any], None]) -> None:
    """Send another library's log (libmtmd's `mtmd_helper_log_set`) where llama.cpp's goes, listeners included."""
    log_set(_router.callback, ctypes.c_void_p(0))


@contextmanager
def log_listener(fn: Callable[[int, str], None]) -> Iterator[None]:
    """Call `fn(level, text)` for each llama.cpp log line while the block runs."""
    ensure_backend()
    _router.listeners.append(fn)
    try:
        yield
    finally:
        _router.listeners.remove(fn)


def ensure_backend() -> None:
    global _backend_ready
    with _backend_lock:
        if not _backend_ready:
            lib.llama_log_set(_router.callback, ctypes.c_void_p(0))
            lib.llama_backend_init()
            _backend_ready = True


def system_info() -> str:
    ensure_backend()
    return lib.llama_print_system_info().decode("utf-8", errors="replace").strip()


def supports_gpu_offload() -> bool:
    ensure_backend()
    return bool(lib.llama_supports_gpu_offload())


# ---------------------------------------------------------------- devices


GPU_DEVICE_TYPES = (1, 2)  # GGML_BACKEND_DEVICE_TYPE_GPU, _IGPU (an RPC server registers as a GPU)
CPU_DEVICE_TYPES = (0, 3)  # GGML_BACKEND_DEVICE_TYPE_CPU, _ACCEL


def devices() -> list[tuple[int, str]]:
    """(ggml_backend_dev_type, description) of every device ggml knows now, RPC servers added at run time included."""
    ensure_backend()
    ggml = _ggml()
    found = [ggml.ggml_backend_dev_get(i) for i in range(ggml.ggml_backend_dev_count())]
    return [(ggml.ggml_backend_dev_type(d), ggml.ggml_backend_dev_description(d).decode()) for d in found]


def backend_names() -> list[tuple[str, int]]:
    """The backends compiled into (or loaded by) this libggml (CPU, CUDA, RPC, ...), each with how
    many devices it has now (RPC has none until servers are added)."""
    ensure_backend()
    ggml = _ggml()
    regs = [ggml.ggml_backend_reg_get(i) for i in range(ggml.ggml_backend_reg_count())]
    return [(ggml.ggml_backend_reg_name(reg).decode(), int(ggml.ggml_backend_reg_dev_count(reg))) for reg in regs]


def gpu_device_present() -> bool:
    """Whether ggml has a GPU-type device to offload to right now.

    llama_supports_gpu_offload() cannot tell: it is true in any build with a GPU-capable backend
    compiled in (the RPC backend is one) even when no device exists. Only where libggml's registry
    cannot be read is its answer used instead.
    """
    try:
        kinds = [kind for kind, _ in devices()]
    except (PyllamaError, OSError, AttributeError):
        return supports_gpu_offload()
    return any(kind in GPU_DEVICE_TYPES for kind in kinds)


def shipped_library(stem: str) -> ctypes.CDLL:
    """The copy of lib`stem` (llama, ggml, ...) that the bindings already loaded, opened with ctypes.

    Found beside the libllama the bindings use (LLAMA_CPP_LIB_PATH can point them at another build).

    Raises:
        PyllamaError: no such library there.
    """
    loaded = getattr(lib, "_lib", None) or getattr(getattr(lib, "llama_cpp", None), "_lib", None)
    lib_dir = Path(loaded._name).parent if loaded is not None else Path(lib.__file__).parent / "lib"
    names = sorted(lib_dir.glob(f"lib{stem}.*")) or sorted(lib_dir.glob(f"{stem}.*"))
    if not names:
        raise PyllamaError(f"lib{stem} not found in {lib_dir}", hint="reinstall llama-cpp-python")
    return _already_loaded(names) or ctypes.CDLL(str(names[0]))


@functools.cache
def llama_cpp_commit() -> str:
    """The llama.cpp commit libggml was built from (llama-bench's build_commit), "unknown" if it does not say."""
    try:
        commit = _ggml().ggml_commit
    except (AttributeError, PyllamaError):  # a libggml older than ggml_commit
        return "unknown"
    commit.argtypes, commit.restype = [], ctypes.c_char_p
    return (commit() or b"unknown").decode("utf-8", "replace")


def bindings_version() -> str:
    """llama-cpp-python's version, as installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llama-cpp-python")
    except PackageNotFoundError:
        return "unknown"


def _ggml() -> ctypes.CDLL:
    """libggml (already loaded by llama_cpp) with the device-registry calls llama_cpp does not bind."""
    ggml = shipped_library("ggml")
    vp, size = ctypes.c_void_p, ctypes.c_size_t
    for name, args, res in (("ggml_backend_dev_count", [], size), ("ggml_backend_dev_get", [size], vp),
                            ("ggml_backend_dev_type", [vp], ctypes.c_int),
                            ("ggml_backend_dev_description", [vp], ctypes.c_char_p),
                            ("ggml_backend_reg_count", [], size), ("ggml_backend_reg_get", [size], vp),
                            ("ggml_backend_reg_name", [vp], ctypes.c_char_p),
                            ("ggml_backend_reg_dev_count", [vp], size)):
        fn = getattr(ggml, name)
        fn.argtypes, fn.restype = args, res
    return ggml


def _already_loaded(names: list[Path]) -> ctypes.CDLL | None:
    """The copy, of the files in `names`, that the process already has (libllama itself or its libggml).

    pip's wheel holds libggml.so, libggml.so.0 and libggml.so.0.x as separate files, not links:
    opening another of them than libllama's dependency would load a second libggml with a registry
    of its own, where RPC servers added (or devices listed) are not the ones llama.cpp loads onto.
    """
    no_load = getattr(os, "RTLD_NOLOAD", 0)
    if not no_load:
        return None
    for name in names:
        try:
            return ctypes.CDLL(str(name), mode=no_load | getattr(os, "RTLD_GLOBAL", 0))
        except OSError:
            continue
    return None


@functools.cache
def ggml_base() -> ctypes.CDLL:
    """libggml-base (already loaded by llama_cpp): tensor sizes, op names and backend buffers, for the
    evaluation callback of `pyllama imatrix`."""
    loaded = getattr(getattr(lib, "llama_cpp", None), "_lib", None)
    lib_dir = Path(loaded._name).parent if loaded is not None else Path(lib.__file__).parent / "lib"
    names = sorted(lib_dir.glob("libggml-base.*")) or sorted(lib_dir.glob("ggml-base.*"))
    if not names:
        raise PyllamaError(f"libggml-base not found in {lib_dir}", hint="reinstall llama-cpp-python")
    base = _already_loaded(names) or ctypes.CDLL(str(names[0]))
    vp, size = ctypes.c_void_p, ctypes.c_size_t
    for name, args, res in (("ggml_op_name", [ctypes.c_int], ctypes.c_char_p), ("ggml_nbytes", [vp], size),
                            ("ggml_backend_buffer_is_host", [vp], ctypes.c_bool),
                            ("ggml_backend_tensor_get", [vp, vp, size, size], None)):
        fn = getattr(base, name)
        fn.argtypes, fn.restype = args, res
    return base
