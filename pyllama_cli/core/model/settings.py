"""Settings shared by every command that loads a model; defaults follow llama.cpp's.

Kept free of llama_cpp imports so that commands can declare options without loading the library.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

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

# -ctk/-ctv: the KV cache types llama.cpp's common arguments accept, in its order, with their ggml type ids.
KV_CACHE_TYPES = {"f32": 0, "f16": 1, "bf16": 30, "q8_0": 8, "q4_0": 2, "q4_1": 3, "iq4_nl": 20, "q5_0": 6, "q5_1": 7}
DEFAULT_CACHE_TYPE = "f16"
# Types llama.cpp stores in blocks (quantized): a V cache of these needs flash attention.
SPLIT_MODES = {"none": 0, "layer": 1, "row": 2, "tensor": 3}  # llama_split_mode (-sm)
ROPE_SCALING_TYPES = {"none": 0, "linear": 1, "yarn": 2}  # llama_rope_scaling_type
QUANTIZED_CACHE_TYPES = frozenset({"q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"})


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
    # KV cache (-ctk, -ctv, --swa-full, -kvo/-nkvo)
    cache_type_k: str = DEFAULT_CACHE_TYPE
    cache_type_v: str = DEFAULT_CACHE_TYPE
    swa_full: bool = False
    kv_offload: bool = True
    # RoPE and YaRN (--rope-*, --yarn-*): 0 or negative = the model's own value, as in llama.cpp
    rope_scaling: str | None = None  # none, linear or yarn; None = the model's
    rope_freq_base: float = 0.0
    rope_freq_scale: float = 0.0
    yarn_orig_ctx: int = 0
    yarn_ext_factor: float = -1.0
    yarn_attn_factor: float = -1.0
    yarn_beta_slow: float = -1.0
    yarn_beta_fast: float = -1.0
    # Weight placement (-ot, --cpu-moe, --n-cpu-moe, -sm, -mg); None = llama.cpp's default
    tensor_overrides: tuple[tuple[str, str], ...] = ()  # (pattern, buffer type name)
    cpu_moe: bool = False
    n_cpu_moe: int = 0
    split_mode: str | None = None
    main_gpu: int | None = None

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
