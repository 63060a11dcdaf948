"""Persistent CPU thread pools for a context, made and attached as llama.cpp's own tools do.

llama.cpp's tools make a ggml thread pool per context (two when the batch threads differ from the
generation threads) and attach it with `llama_attach_threadpool`; a context without one gets a
throw-away pool inside every graph computation. The pools also carry the placement flags: the CPU
mask (-C/-Cr), the priority (--prio), polling (--poll) and strict placement (--cpu-strict).

What a pool saves depends on the build. Without OpenMP the throw-away pool starts and joins its
threads on every graph, which persistent pools avoid. With OpenMP (the default of Linux builds,
pip's included) the worker threads are OpenMP's and persist anyway: the throw-away pool is two
small allocations, the attached one carries the mask and priority, and --poll is not used.

The functions come from the shipped libraries, not from the bindings: `llama_attach_threadpool`
and `llama_detach_threadpool` are exported by libllama, `ggml_threadpool_new` and `_free` are
found through the CPU backend's registry (as llama.cpp's common code finds them).
"""

from __future__ import annotations

import ctypes
import functools
import os
from dataclasses import dataclass
from typing import Any

from ...errors import ThreadPoolError
from .library import LOG_INFO, LOG_WARN, ensure_backend, log_line, shipped_library
from .settings import MAX_THREADS, CpuPlacement

_CPU_DEVICE = 0  # GGML_BACKEND_DEVICE_TYPE_CPU
# setpriority's nice value for each ggml_sched_priority, as llama.cpp sets the process's.
_NICE = {-1: 5, 0: 0, 1: -5, 2: -10, 3: -20}


class _ThreadpoolParams(ctypes.Structure):
    # ggml.h's struct ggml_threadpool_params (GGML_MAX_N_THREADS = 512).
    _fields_ = [("cpumask", ctypes.c_bool * MAX_THREADS), ("n_threads", ctypes.c_int), ("prio", ctypes.c_int),
                ("poll", ctypes.c_uint32), ("strict_cpu", ctypes.c_bool), ("paused", ctypes.c_bool)]


@dataclass(frozen=True)
class PoolFunctions:
    """ggml's pool constructor and destructor and libllama's attach and detach, typed for ctypes."""

    new: Any
    free: Any
    attach: Any
    detach: Any


@functools.cache
def pool_functions() -> PoolFunctions:
    """Find the four functions in the shipped libllama and libggml (once per process).

    Raises:
        ThreadPoolError: the build lacks one of them, or has no CPU backend.
    """
    ensure_backend()
    llama, ggml = _open("llama"), _open("ggml")
    vp = ctypes.c_void_p
    attach = _typed(llama, "llama_attach_threadpool", [vp, vp, vp], None)
    detach = _typed(llama, "llama_detach_threadpool", [vp], None)
    dev_by_type = _typed(ggml, "ggml_backend_dev_by_type", [ctypes.c_int], vp)
    dev_reg = _typed(ggml, "ggml_backend_dev_backend_reg", [vp], vp)
    proc = _typed(ggml, "ggml_backend_reg_get_proc_address", [vp, ctypes.c_char_p], vp)
    device = dev_by_type(_CPU_DEVICE)
    reg = dev_reg(device) if device else None
    if not reg:
        raise ThreadPoolError("ggml has no CPU backend to make thread pools with",
                              hint="reinstall llama-cpp-python")
    new_ptr, free_ptr = proc(reg, b"ggml_threadpool_new"), proc(reg, b"ggml_threadpool_free")
    if not new_ptr or not free_ptr:
        raise ThreadPoolError("ggml's CPU backend does not offer ggml_threadpool_new and ggml_threadpool_free",
                              hint="reinstall llama-cpp-python")
    new = ctypes.CFUNCTYPE(vp, ctypes.POINTER(_ThreadpoolParams))(new_ptr)
    free = ctypes.CFUNCTYPE(None, vp)(free_ptr)
    return PoolFunctions(new, free, attach, detach)


def _open(stem: str) -> ctypes.CDLL:
    try:
        return shipped_library(stem)
    except OSError as exc:
        raise ThreadPoolError(f"cannot open lib{stem}: {exc}", hint="reinstall llama-cpp-python") from None


def _typed(dll: ctypes.CDLL, name: str, args: list[Any], res: Any) -> Any:
    try:
        fn = getattr(dll, name)
    except AttributeError:
        raise ThreadPoolError(f"{name} is not exported by {os.path.basename(dll._name)}",
                              hint="reinstall llama-cpp-python") from None
    fn.argtypes, fn.restype = args, res
    return fn


def pool_params(n_threads: int, cpu: CpuPlacement, paused: bool = False) -> _ThreadpoolParams:
    """ggml's pool parameters for `n_threads` threads placed as `cpu` says."""
    params = _ThreadpoolParams(n_threads=n_threads, prio=cpu.prio, poll=cpu.poll, strict_cpu=cpu.strict,
                               paused=paused)
    for i in cpu.cpus:
        params.cpumask[i] = True
    return params


class ThreadPools:
    """The pools attached to one context: one, or a batch pool and a paused generation pool.

    As llama.cpp's common code: when the two pools' parameters (threads, mask, priority, polling,
    strictness) are the same there is one pool for both. Where the build lacks the functions the
    context keeps ggml's per-graph threads and `missing` says why (also in the --verbose log).
    """

    def __init__(self, ctx_handle: Any, n_threads: int, n_threads_batch: int, cpu: CpuPlacement = CpuPlacement(),
                 cpu_batch: CpuPlacement | None = None):
        self.pools: list[int] = []
        self.missing: str | None = None
        cpu_batch = cpu if cpu_batch is None else cpu_batch
        try:
            self._fns = pool_functions()
        except ThreadPoolError as exc:
            self.missing = exc.message
            log_line(LOG_WARN, f"pyllama: no thread pool for this context: {exc.message}\n")
            return
        set_process_priority(cpu.prio)
        batch = None
        if (n_threads_batch, cpu_batch) != (n_threads, cpu):
            batch = self._make(pool_params(n_threads_batch, cpu_batch))
            if batch is None:
                return
        main = self._make(pool_params(n_threads, cpu, paused=batch is not None))
        if main is None:
            self.free()
            return
        self._fns.attach(ctx_handle, main, batch)
        log_line(LOG_INFO, f"pyllama: thread pools attached: {self.describe(n_threads, n_threads_batch)}\n")

    @property
    def attached(self) -> int:
        """How many pools the context runs on (0 when none could be made)."""
        return len(self.pools)

    def describe(self, n_threads: int, n_threads_batch: int) -> str:
        if len(self.pools) == 1:
            return f"1 pool of {_threads(n_threads)}"
        return f"a batch pool of {_threads(n_threads_batch)} and a paused pool of {_threads(n_threads)} for generation"

    def _make(self, params: _ThreadpoolParams) -> int | None:
        pool = self._fns.new(ctypes.byref(params))
        if not pool:
            self.missing = f"ggml could not make a pool of {params.n_threads} threads"
            log_line(LOG_WARN, f"pyllama: {self.missing}\n")
            return None
        self.pools.append(pool)
        return pool

    def detach(self, ctx_handle: Any) -> None:
        if self.pools:
            self._fns.detach(ctx_handle)

    def free(self) -> None:
        while self.pools:
            self._fns.free(self.pools.pop())


def _threads(n: int) -> str:
    return f"{n} thread{'s' if n != 1 else ''}"


def set_process_priority(prio: int) -> None:
    """--prio for the whole process too, as llama.cpp's tools set it (a failure is only logged)."""
    if prio == 0 or not hasattr(os, "setpriority"):
        return
    try:
        os.setpriority(os.PRIO_PROCESS, 0, _NICE[prio])
    except OSError as exc:
        log_line(LOG_WARN, f"pyllama: cannot set the process priority to {prio}: {exc.strerror}\n")
