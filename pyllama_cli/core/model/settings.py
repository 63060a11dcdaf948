"""Settings shared by every command that loads a model; defaults follow llama.cpp's.

Kept free of llama_cpp imports so that commands can declare options without loading the library.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .adapters import AdapterSettings

DEFAULT_N_CTX = 0  # 0 = the model's trained context length
DEFAULT_N_BATCH = 2048
DEFAULT_N_UBATCH = 512
DEFAULT_N_GPU_LAYERS = -1  # -1 = every layer (when the build supports offload)
DEFAULT_SEED = -1  # -1 = random
FLASH_ATTN_CHOICES = ("auto", "on", "off")
# llama.cpp reads counts (-c, -b, -n, ...) as 32-bit ints and seeds as 32-bit unsigned: bigger values would
# wrap around on the way into the C structs.
INT32_MAX = 2**31 - 1
UINT32_MAX = 2**32 - 1
# ggml's GGML_MAX_N_THREADS: asked for more, ggml aborts, or crashes creating the threads.
MAX_THREADS = 512


@dataclass(frozen=True)
class LoadSettings:
    """How to load a model and create its context."""

    n_ctx: int = DEFAULT_N_CTX
    n_threads: int = -1
    n_threads_batch: int = -1
    n_gpu_layers: int = DEFAULT_N_GPU_LAYERS
    flash_attn: str = "auto"
    n_batch: int = DEFAULT_N_BATCH
    n_ubatch: int = DEFAULT_N_UBATCH
    mlock: bool = False
    mmap: bool = True
    seed: int = DEFAULT_SEED
    verbose: bool = False
    log_file: Path | None = None
    rpc: tuple[str, ...] = ()  # RPC servers (HOST:PORT) whose devices join this process's
    devices: tuple[str, ...] = ()  # -dev: the devices to offload to (("none",) = none); () = llama.cpp's choice
    tensor_split: tuple[float, ...] = ()  # -ts: each device's share of the layers
    adapters: AdapterSettings = AdapterSettings()  # --lora, --control-vector and their scales

    def resolved_threads(self) -> int:
        return self.n_threads if self.n_threads > 0 else default_threads()

    def resolved_threads_batch(self) -> int:
        return self.n_threads_batch if self.n_threads_batch > 0 else self.resolved_threads()


def default_threads() -> int:
    """Physical cores available to this process, as llama.cpp's default thread count."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)
    cores = set()
    for cpu in cpus:
        siblings = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        try:
            cores.add(siblings.read_text().strip())
        except OSError:
            cores.add(str(cpu))
    return max(1, len(cores))
