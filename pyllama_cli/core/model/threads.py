"""Persistent CPU thread pools for a context: ggml's threadpool structure and the functions that run it."""

from __future__ import annotations

import ctypes
from typing import Any

from .library import ensure_backend, lib


class _ThreadpoolParams(ctypes.Structure):
    # ggml.h's struct ggml_threadpool_params (GGML_MAX_N_THREADS = 512).
    _fields_ = [("cpumask", ctypes.c_bool * 512), ("n_threads", ctypes.c_int), ("prio", ctypes.c_int),
                ("poll", ctypes.c_uint32), ("strict_cpu", ctypes.c_bool), ("paused", ctypes.c_bool)]


class ThreadPools:
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
    ensure_backend()
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
