"""The one place that talks to libllama (through llama-cpp-python's ctypes bindings).

`Model` and `Context` own native handles and free them deterministically. Everything else in
pyllama uses these classes, or `lib` for the few hot loops that call llama.cpp directly.
llama.cpp's own log is routed through `llama_log_set`: silent by default, to stderr with
--verbose, to a file with --log-file.
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
from typing import IO, TYPE_CHECKING, Any

from ...errors import InputError, Interrupted, ModelLoadError
from .settings import LoadSettings

if TYPE_CHECKING:
    import numpy as np


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


def _keeping_gil(fn: Any) -> Any:
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


_token_to_piece = _keeping_gil(lib.llama_token_to_piece)
_vocab_is_eog = _keeping_gil(lib.llama_vocab_is_eog)
# Top-k, top-p, temperature and a draw over one row of logits: tens of microseconds (no grammar).
sampler_sample = _keeping_gil(lib.llama_sampler_sample)

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
            line = text.decode("utf-8", errors="replace")
            if self.sink is not None:
                self.sink.write(line)
                self.sink.flush()
            for listener in list(self.listeners):
                listener(level, line)
        except BaseException:  # noqa: BLE001 - an exception must never cross back into C
            pass


_router = _LogRouter()


def configure_logging(verbose: bool = False, log_file: Path | None = None) -> None:
    """Route llama.cpp's log: nowhere (default), stderr (verbose), or appended to a file."""
    _ensure_backend()
    # Re-install the callback: other code in the process (tests, fixtures) may have replaced it.
    lib.llama_log_set(_router.callback, ctypes.c_void_p(0))
    if log_file is not None:
        _router.sink = _open_log(log_file)
    else:
        _router.sink = sys.stderr if verbose else None


def _open_log(path: Path) -> IO[str]:
    try:
        return open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives for the process
    except OSError as exc:
        hint = "create its folder first" if isinstance(exc, FileNotFoundError) else "choose a file you can write"
        raise InputError(f"cannot open the log file {path}: {exc.strerror}", hint=hint) from None


@contextmanager
def log_listener(fn: Callable[[int, str], None]) -> Iterator[None]:
    """Call `fn(level, text)` for each llama.cpp log line while the block runs."""
    _ensure_backend()
    _router.listeners.append(fn)
    try:
        yield
    finally:
        _router.listeners.remove(fn)


def _ensure_backend() -> None:
    global _backend_ready
    with _backend_lock:
        if not _backend_ready:
            lib.llama_log_set(_router.callback, ctypes.c_void_p(0))
            lib.llama_backend_init()
            _backend_ready = True


def system_info() -> str:
    _ensure_backend()
    return lib.llama_print_system_info().decode("utf-8", errors="replace").strip()


def supports_gpu_offload() -> bool:
    _ensure_backend()
    return bool(lib.llama_supports_gpu_offload())


# ---------------------------------------------------------------- model


class Model:
    """A loaded llama.cpp model (or just its vocabulary) and its tokenizer."""

    def __init__(self, handle: Any, path: Path):
        self.handle = handle
        self.path = path
        self.vocab = lib.llama_model_get_vocab(handle)
        self.n_vocab = lib.llama_vocab_n_tokens(self.vocab)
        # A model without a tokenizer ("none"/"no_vocab") aborts inside llama.cpp on any text call.
        self.has_vocab = lib.llama_vocab_type(self.vocab) != lib.LLAMA_VOCAB_TYPE_NONE
        self.mapped: MappedFile | None = None  # set by load() when the weights are memory-mapped
        # A token's piece and end-of-generation flag never change: generation loops ask for the same
        # few thousand tokens over and over, so each is fetched from llama.cpp once.
        self._pieces: dict[tuple[int, bool], bytes] = {}
        self._eog: dict[int, bool] = {}

    @classmethod
    def load(
        cls,
        path: Path,
        settings: LoadSettings,
        *,
        vocab_only: bool = False,
        on_progress: Callable[[float], None] | None = None,
    ) -> Model:
        """Load a GGUF file (the first part of a split model loads every part).

        Raises:
            ModelLoadError: llama.cpp refused the file.
            Interrupted: Ctrl-C during the load.
        """
        configure_logging(settings.verbose, settings.log_file)
        params = lib.llama_model_default_params()
        params.vocab_only = vocab_only
        params.n_gpu_layers = settings.n_gpu_layers if settings.n_gpu_layers >= 0 else 999
        params.load_mode = _load_mode(settings)
        interrupted = False

        def progress(fraction: float, _user: Any) -> bool:
            nonlocal interrupted
            try:
                if on_progress is not None:
                    on_progress(fraction)
                return True
            except BaseException:  # noqa: BLE001 - Ctrl-C lands here; tell llama.cpp to stop
                interrupted = True
                return False

        callback = lib.llama_progress_callback(progress)
        params.progress_callback = callback
        handle = lib.llama_model_load_from_file(str(path).encode(), params)
        if interrupted:
            if handle:
                lib.llama_model_free(handle)
            raise Interrupted("model loading interrupted")
        if not handle:
            raise ModelLoadError(
                f"llama.cpp could not load {path}",
                hint="run again with --verbose to see llama.cpp's reason (unsupported architecture or a damaged file)",
            )
        model = cls(handle, path)
        if settings.mmap and not vocab_only:
            model.mapped = MappedFile(path)
        return model

    def check_file(self) -> None:
        """Raise before llama.cpp touches weights that a shrunken model file no longer has (see MappedFile)."""
        if self.mapped is not None:
            self.mapped.check()

    def close(self) -> None:
        if self.handle:
            lib.llama_model_free(self.handle)
            self.handle = None
        if self.mapped is not None:
            self.mapped.close()
            self.mapped = None

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- description

    @property
    def description(self) -> str:
        buf = ctypes.create_string_buffer(256)
        lib.llama_model_desc(self.handle, buf, ctypes.sizeof(buf))
        return buf.value.decode("utf-8", errors="replace")

    @property
    def size_bytes(self) -> int:
        return int(lib.llama_model_size(self.handle))

    @property
    def n_params(self) -> int:
        return int(lib.llama_model_n_params(self.handle))

    @property
    def n_ctx_train(self) -> int:
        return int(lib.llama_model_n_ctx_train(self.handle))

    @property
    def n_embd(self) -> int:
        return int(lib.llama_model_n_embd(self.handle))

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(4096)
        n = lib.llama_model_meta_val_str(self.handle, key.encode(), buf, ctypes.sizeof(buf))
        if n < 0:
            return None
        if n >= ctypes.sizeof(buf):
            buf = ctypes.create_string_buffer(n + 1)
            lib.llama_model_meta_val_str(self.handle, key.encode(), buf, ctypes.sizeof(buf))
        return buf.value.decode("utf-8", errors="replace")

    def chat_template(self, name: str | None = None) -> str | None:
        raw = lib.llama_model_chat_template(self.handle, name.encode() if name else None)
        return raw.decode("utf-8", errors="replace") if raw else None

    # ---- vocabulary

    @property
    def bos(self) -> int:
        return int(lib.llama_vocab_bos(self.vocab))

    @property
    def eos(self) -> int:
        return int(lib.llama_vocab_eos(self.vocab))

    @property
    def eot(self) -> int:
        return int(lib.llama_vocab_eot(self.vocab))

    @property
    def add_bos(self) -> bool:
        return bool(lib.llama_vocab_get_add_bos(self.vocab))

    def is_eog(self, token: int) -> bool:
        eog = self._eog.get(token)
        if eog is None:
            eog = self._eog[token] = bool(_vocab_is_eog(self.vocab, token))
        return eog

    @functools.cached_property
    def eog_tokens(self) -> tuple[int, ...]:
        """Every end-of-generation token (EOS, EOT, <|im_end|>, ...), found by one pass over the vocabulary."""
        return tuple(t for t in range(self.n_vocab) if _vocab_is_eog(self.vocab, t))

    def tokenize(self, text: bytes, *, add_special: bool = True, parse_special: bool = False) -> np.ndarray:
        """Token ids of `text` as an int32 array (BOS added when the vocab wants it and add_special)."""
        self._need_vocab()
        n_max = len(text) + 8
        buf = (lib.llama_token * n_max)()
        n = lib.llama_tokenize(self.vocab, text, len(text), buf, n_max, add_special, parse_special)
        if n < 0:
            n_max = -n
            buf = (lib.llama_token * n_max)()
            n = lib.llama_tokenize(self.vocab, text, len(text), buf, n_max, add_special, parse_special)
        import numpy as np

        return np.frombuffer(buf, dtype=np.int32, count=n).copy()

    def _need_vocab(self) -> None:
        if not self.has_vocab:
            raise InputError(f"{self.path.name} has no tokenizer (its tokenizer.ggml.model is 'none'), so it "
                             "cannot turn text into tokens or back", hint="use a model file that has a vocabulary")

    def token_to_piece(self, token: int, *, special: bool = True) -> bytes:
        piece = self._pieces.get((token, special))
        if piece is None:
            piece = self._pieces[token, special] = self._fetch_piece(token, special)
        return piece

    def _fetch_piece(self, token: int, special: bool) -> bytes:
        self._need_vocab()
        buf = ctypes.create_string_buffer(64)
        n = _token_to_piece(self.vocab, token, buf, 64, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = _token_to_piece(self.vocab, token, buf, -n, 0, special)
        return buf.raw[:n]

    def detokenize(self, tokens: list[int] | np.ndarray, *, remove_special: bool = False,
                   unparse_special: bool = True) -> bytes:
        self._need_vocab()
        ids = (lib.llama_token * len(tokens))(*[int(t) for t in tokens])
        size = max(64, len(tokens) * 8)
        buf = ctypes.create_string_buffer(size)
        n = lib.llama_detokenize(self.vocab, ids, len(tokens), buf, size, remove_special, unparse_special)
        if n < 0:
            size = -n
            buf = ctypes.create_string_buffer(size)
            n = lib.llama_detokenize(self.vocab, ids, len(tokens), buf, size, remove_special, unparse_special)
        return buf.raw[:n]


def _size_reader() -> Callable[[int], int]:
    """The size of an open file, read before every decode.

    lseek(fd, 0, SEEK_END) through libc keeps the GIL (see _keeping_gil); os.fstat would release it
    just before llama_decode. Where libc cannot be reached that way, os.fstat it is.
    """
    try:
        libc = ctypes.PyDLL(None)
        seek = getattr(libc, "lseek64", None) or libc.lseek
    except (OSError, AttributeError, TypeError):
        return lambda fd: os.fstat(fd).st_size
    seek.argtypes, seek.restype = (ctypes.c_int, ctypes.c_int64, ctypes.c_int), ctypes.c_int64

    def size(fd: int) -> int:
        end = seek(fd, 0, os.SEEK_END)
        return end if end >= 0 else os.fstat(fd).st_size

    return size


_current_size = _size_reader()


class MappedFile:
    """The model file whose weights llama.cpp reads through mmap.

    Deleting or replacing the file is harmless (the mapping keeps the old data), but truncating it
    makes any access to the lost pages kill the process with SIGBUS. Decoding checks the size of
    the file (through a descriptor of its own, so a replaced file does not count) beforehand.
    """

    def __init__(self, path: Path):
        self.path = path
        self.fd = os.open(path, os.O_RDONLY)
        self.size = os.fstat(self.fd).st_size

    def check(self) -> None:
        size = _current_size(self.fd)
        if size < self.size:
            raise ModelLoadError(f"{self.path} was truncated while in use ({size} of {self.size} bytes left)",
                                 hint="restore the file and restart; --no-mmap keeps a private copy of the weights")

    def close(self) -> None:
        os.close(self.fd)


def _load_mode(settings: LoadSettings) -> int:
    if settings.mmap and settings.mlock:
        return lib.LLAMA_LOAD_MODE_MMAP_MLOCK
    if settings.mlock:
        return lib.LLAMA_LOAD_MODE_MLOCK
    return lib.LLAMA_LOAD_MODE_MMAP if settings.mmap else lib.LLAMA_LOAD_MODE_NONE


# ---------------------------------------------------------------- context


_FLASH_ATTN = {"auto": "LLAMA_FLASH_ATTN_TYPE_AUTO", "on": "LLAMA_FLASH_ATTN_TYPE_ENABLED",
               "off": "LLAMA_FLASH_ATTN_TYPE_DISABLED"}


def _check_kv_cache_fits(model: Model, params: Any, settings: LoadSettings) -> None:
    """Refuse a context whose KV cache alone is bigger than this machine's memory.

    llama.cpp would try anyway: with Linux's overcommit its buffers are granted, then filled, and the
    kernel kills the process (no message, exit 137) once RAM runs out. Only a cache in system memory
    is checked (a GPU's allocation fails cleanly), and only one that is surely that big: models with a
    sliding window or a recurrent state keep less per token than this estimate, so they are left alone.
    """
    on_gpu = settings.n_gpu_layers != 0 and params.offload_kqv and supports_gpu_offload()
    handle = model.handle
    if on_gpu or lib.llama_model_n_swa(handle) > 0 or lib.llama_model_is_recurrent(handle) \
            or lib.llama_model_is_hybrid(handle):
        return
    n_head = int(lib.llama_model_n_head(handle))
    memory = _memory_bytes() if n_head > 0 else None
    if memory is None:
        return
    head_dim = int(lib.llama_model_n_embd(handle)) // n_head
    per_layer = int(lib.llama_model_n_head_kv(handle)) * head_dim  # elements per token, for K and for V each
    per_token = int(lib.llama_model_n_layer(handle)) * per_layer * (
        _bytes_per_element(int(params.type_k)) + _bytes_per_element(int(params.type_v)))
    needed = int(params.n_ctx) * per_token
    if needed > memory:
        raise ModelLoadError(
            f"a context of {params.n_ctx} tokens needs a {needed / 2**30:.1f} GiB KV cache for {model.path.name}, "
            f"more than this machine's {memory / 2**30:.1f} GiB of memory",
            hint=f"lower -c/--ctx-size (the model was trained on {model.n_ctx_train} tokens)")


def _bytes_per_element(ggml_type: int) -> float:
    """Bytes per value of a cache type (-ctk/-ctv), from the GGUF reader's type table; a type it does
    not know counts as none, so it can never be the reason for a refusal."""
    from ..gguf.reader import GGML_TYPES

    _, block, size = GGML_TYPES.get(ggml_type, ("", 1, 0))
    return size / block


def _memory_bytes() -> int | None:
    """RAM plus swap: the most any allocation here can ever get (None when it cannot be read)."""
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        return sum(int(fields[key].split()[0]) * 1024 for key in ("MemTotal", "SwapTotal") if key in fields)
    except (OSError, ValueError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None


class Context:
    """A llama.cpp context (KV cache + compute buffers) over a loaded model.

    `abort_requested` is polled by llama.cpp between graph nodes while `abortable()` is active, so a
    Ctrl-C stops even a long prompt evaluation.
    """

    def __init__(self, model: Model, settings: LoadSettings, *, n_ctx: int | None = None,
                 n_seq_max: int = 1, embeddings: bool = False, kv_unified: bool = False, **extra: Any):
        params = lib.llama_context_default_params()
        params.n_ctx = n_ctx if n_ctx is not None else (settings.n_ctx or model.n_ctx_train)
        params.n_batch = min(settings.n_batch, params.n_ctx) if settings.n_batch > 0 else params.n_ctx
        params.n_ubatch = min(settings.n_ubatch, params.n_batch)
        params.n_seq_max = n_seq_max
        params.n_threads = settings.resolved_threads()
        params.n_threads_batch = settings.resolved_threads_batch()
        params.flash_attn_type = getattr(lib, _FLASH_ATTN[settings.flash_attn])
        params.embeddings = embeddings
        params.kv_unified = kv_unified
        params.no_perf = False
        for key, value in extra.items():
            setattr(params, key, value)
        _check_kv_cache_fits(model, params, settings)
        self.abort_requested = False
        self.abort_check: Callable[[], bool] | None = None
        self._abort_cb = lib.ggml_abort_callback(self._should_abort)
        handle = lib.llama_init_from_model(model.handle, params)
        if not handle:
            raise ModelLoadError(
                f"llama.cpp could not create a context of {params.n_ctx} tokens for {model.path.name}",
                hint="lower -c/--ctx-size, or run with --verbose for llama.cpp's reason (often: not enough memory)",
            )
        self.handle = handle
        self.threads = _ThreadPools(handle, int(params.n_threads), int(params.n_threads_batch))
        self.model = model
        self.n_ctx = int(lib.llama_n_ctx(handle))
        self.n_batch = int(params.n_batch)
        self.n_ubatch = int(params.n_ubatch)
        self.memory = lib.llama_get_memory(handle)

    def close(self) -> None:
        if self.handle:
            self.threads.detach(self.handle)
            lib.llama_free(self.handle)
            self.handle = None
            self.threads.free()

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _should_abort(self, _data: Any) -> bool:
        try:
            return bool(self.abort_requested or (self.abort_check is not None and self.abort_check()))
        except BaseException:  # noqa: BLE001 - a Ctrl-C raised here must not cross into C
            self.abort_requested = True
            return True

    @contextmanager
    def abortable(self) -> Iterator[None]:
        """Let `abort_requested` stop llama_decode mid-graph (costs a Python call per graph node)."""
        lib.llama_set_abort_callback(self.handle, self._abort_cb, None)
        try:
            yield
        finally:
            lib.llama_set_abort_callback(self.handle, lib.ggml_abort_callback(0), None)

    def decode(self, batch: Any) -> None:
        """Run llama_decode; raise on failure or abort."""
        self.model.check_file()
        rc = lib.llama_decode(self.handle, batch.raw if isinstance(batch, Batch) else batch)
        if rc == 0:
            return
        if rc == 2 or self.abort_requested or (self.abort_check is not None and self.abort_check()):
            raise Interrupted("evaluation interrupted")
        if rc == 1:
            raise ModelLoadError("no room left in the KV cache for this batch", hint="raise -c/--ctx-size")
        raise ModelLoadError(f"llama_decode failed with code {rc}")

    def logits(self, i: int = -1) -> np.ndarray:
        """A view of the logits of output `i` of the last batch (n_vocab float32)."""
        import numpy as np

        ptr = lib.llama_get_logits_ith(self.handle, i)
        return np.ctypeslib.as_array(ptr, shape=(self.model.n_vocab,))

    def clear_memory(self) -> None:
        lib.llama_memory_clear(self.memory, True)

    def remove_tokens(self, seq_id: int, start: int, end: int = -1) -> bool:
        return bool(lib.llama_memory_seq_rm(self.memory, seq_id, start, end))

    def synchronize(self) -> None:
        lib.llama_synchronize(self.handle)


class _ThreadpoolParams(ctypes.Structure):
    # ggml.h's struct ggml_threadpool_params (GGML_MAX_N_THREADS = 512).
    _fields_ = [("cpumask", ctypes.c_bool * 512), ("n_threads", ctypes.c_int), ("prio", ctypes.c_int),
                ("poll", ctypes.c_uint32), ("strict_cpu", ctypes.c_bool), ("paused", ctypes.c_bool)]


class _ThreadPools:
    """Persistent CPU worker threads attached to a context, as llama.cpp's own tools attach them.

    Without them ggml starts and joins its worker threads inside every llama_decode, which costs
    generation speed (one decode per token). When the build lacks the symbols there are no pools
    and llama.cpp keeps its per-call threads.
    """

    def __init__(self, ctx_handle: Any, n_threads: int, n_threads_batch: int):
        self.pools: list[int] = []
        fns = _threadpool_functions()
        if fns is None:
            return
        self._new, self._free, self._attach, self._detach = fns
        # As llama.cpp's common code: one pool when both sizes match, else a batch pool and a paused one.
        batch = self._make(n_threads_batch, paused=False) if n_threads_batch != n_threads else None
        main = self._make(n_threads, paused=batch is not None)
        if main is None:
            self.free()
            return
        self._attach(ctx_handle, main, batch)

    def _make(self, n_threads: int, paused: bool) -> int | None:
        params = _ThreadpoolParams(n_threads=n_threads, prio=0, poll=50, strict_cpu=False, paused=paused)
        pool = self._new(ctypes.byref(params))
        if pool:
            self.pools.append(pool)
        return pool or None

    def detach(self, ctx_handle: Any) -> None:
        if self.pools:
            self._detach(ctx_handle)

    def free(self) -> None:
        while self.pools:
            self._free(self.pools.pop())


_threadpool_fns: tuple[Any, ...] | None | bool = False


def _threadpool_functions() -> tuple[Any, ...] | None:
    """ggml's threadpool constructor/destructor (found through the CPU backend) and llama's attach/detach."""
    global _threadpool_fns
    if _threadpool_fns is not False:
        return _threadpool_fns  # type: ignore[return-value]
    _threadpool_fns = None
    native = getattr(getattr(lib, "llama_cpp", None), "_lib", None)
    try:
        dev_by_type = native.ggml_backend_dev_by_type
        dev_by_type.argtypes, dev_by_type.restype = [ctypes.c_int], ctypes.c_void_p
        dev_reg = native.ggml_backend_dev_backend_reg
        dev_reg.argtypes, dev_reg.restype = [ctypes.c_void_p], ctypes.c_void_p
        proc = native.ggml_backend_reg_get_proc_address
        proc.argtypes, proc.restype = [ctypes.c_void_p, ctypes.c_char_p], ctypes.c_void_p
        attach, detach = native.llama_attach_threadpool, native.llama_detach_threadpool
    except AttributeError:
        return None
    attach.argtypes, attach.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p], None
    detach.argtypes, detach.restype = [ctypes.c_void_p], None
    _ensure_backend()
    device = dev_by_type(0)  # GGML_BACKEND_DEVICE_TYPE_CPU
    reg = dev_reg(device) if device else None
    new_ptr = proc(reg, b"ggml_threadpool_new") if reg else None
    free_ptr = proc(reg, b"ggml_threadpool_free") if reg else None
    if not new_ptr or not free_ptr:
        return None
    new = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.POINTER(_ThreadpoolParams))(new_ptr)
    free = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(free_ptr)
    _threadpool_fns = (new, free, attach, detach)
    return _threadpool_fns


class Batch:
    """A reusable llama_batch for up to `capacity` tokens."""

    def __init__(self, capacity: int, n_seq_max: int = 1):
        self.capacity = capacity
        self.raw = lib.llama_batch_init(capacity, 0, n_seq_max)
        self.n_tokens = 0

    def close(self) -> None:
        if self.raw is not None:
            lib.llama_batch_free(self.raw)
            self.raw = None

    def __enter__(self) -> Batch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def clear(self) -> None:
        self.n_tokens = 0
        self.raw.n_tokens = 0

    def add(self, token: int, pos: int, seq_ids: tuple[int, ...] = (0,), logits: bool = False) -> None:
        i = self.n_tokens
        raw = self.raw
        raw.token[i] = token
        raw.pos[i] = pos
        raw.n_seq_id[i] = len(seq_ids)
        for j, s in enumerate(seq_ids):
            raw.seq_id[i][j] = s
        raw.logits[i] = logits
        self.n_tokens = i + 1
        raw.n_tokens = self.n_tokens

    def fill(self, tokens: list[int] | np.ndarray, start_pos: int, seq_id: int = 0, logits_last: bool = True) -> None:
        """Replace the batch with `tokens` at consecutive positions of one sequence."""
        self.clear()
        n = len(tokens)
        for k, tok in enumerate(tokens):
            self.add(int(tok), start_pos + k, (seq_id,), logits_last and k == n - 1)
