"""Settings shared by every command that loads a model; defaults follow llama.cpp's.

Kept free of llama_cpp imports so that commands can declare options without loading the library.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from ...errors import UsageError
from .adapters import AdapterSettings
from .limits import (  # noqa: F401 - re-exported: the load settings' defaults and bounds live in limits
    DEFAULT_N_BATCH,
    DEFAULT_N_CTX,
    DEFAULT_N_GPU_LAYERS,
    DEFAULT_N_UBATCH,
    DEFAULT_POLL,
    DEFAULT_SEED,
    FLASH_ATTN_CHOICES,
    INT32_MAX,
    MAX_THREADS,
    PRIORITIES,
    UINT32_MAX,
)

_MAX_MASK_DIGITS = MAX_THREADS // 4  # one hex digit per 4 CPUs: llama.cpp reads at most 128


@dataclass(frozen=True)
class CpuPlacement:
    """How one pool's threads run: llama.cpp's CPU parameters (-C/-Cr, --prio, --poll, --cpu-strict).

    The thread count is not here: it is -t (or -tb for the batch pool).
    """

    cpus: tuple[int, ...] = ()  # the CPUs the threads may run on (() = any: the inherited affinity)
    prio: int = 0  # a PRIORITIES key
    poll: int = DEFAULT_POLL  # 0 = no polling .. 100 = mostly polling
    strict: bool = False  # one CPU per thread, in mask order, instead of the whole mask for each

# -ctk/-ctv: the KV cache types llama.cpp's common arguments accept, in its order, with their ggml type ids.
KV_CACHE_TYPES = {"f32": 0, "f16": 1, "bf16": 30, "q8_0": 8, "q4_0": 2, "q4_1": 3, "iq4_nl": 20, "q5_0": 6, "q5_1": 7}
DEFAULT_CACHE_TYPE = "f16"
SPLIT_MODES = {"none": 0, "layer": 1, "row": 2, "tensor": 3}  # llama_split_mode (-sm)
ROPE_SCALING_TYPES = {"none": 0, "linear": 1, "yarn": 2}  # llama_rope_scaling_type
# Types llama.cpp stores in blocks (quantized): a V cache of these needs flash attention.
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
    # Memory fit (-fit, -fitt, -fitc): with -c 0, the context is chosen to leave fit_margin bytes free
    fit: bool = True
    fit_margin: int = 1024 * 1024 * 1024
    fit_ctx: int = 4096
    cpu: CpuPlacement = CpuPlacement()  # the generation pool's CPUs, priority, polling
    cpu_batch: CpuPlacement | None = None  # the batch pool's (-Cb, --prio-batch, ...); None = same as `cpu`
    adapters: AdapterSettings = AdapterSettings()  # --lora, --control-vector and their scales

    def resolved_threads(self) -> int:
        return self.n_threads if self.n_threads > 0 else default_threads()

    def resolved_threads_batch(self) -> int:
        return self.n_threads_batch if self.n_threads_batch > 0 else self.resolved_threads()

    def resolved_cpu_batch(self) -> CpuPlacement:
        return self.cpu_batch if self.cpu_batch is not None else self.cpu


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


# ---------------------------------------------------------------- --rpc, -dev, -ts as llama.cpp reads them

_SPLIT = re.compile(r"[,/]+")


def parse_rpc(value: str | None) -> tuple[str, ...]:
    if value is None:
        return ()
    from .rpc import parse_endpoints

    return parse_endpoints(value)


def parse_devices(value: str | None) -> tuple[str, ...]:
    if value is None:
        return ()
    names = tuple(name.strip() for name in value.split(",") if name.strip())
    if not names:
        raise UsageError("-dev names no device", hint="--list-devices shows them")
    if "none" in names and len(names) > 1:
        raise UsageError("-dev none cannot be combined with devices")
    return names


def parse_tensor_split(value: str | None) -> tuple[float, ...]:
    if value is None:
        return ()
    try:
        shares = tuple(float(part) for part in _SPLIT.split(value.strip()) if part)
    except ValueError:
        raise UsageError(f"-ts {value!r} is not a list of numbers", hint="e.g. -ts 3,1") from None
    if not shares or any(share < 0 for share in shares) or sum(shares) <= 0:
        raise UsageError(f"-ts {value!r} needs non-negative shares, not all 0", hint="e.g. -ts 3,1")
    return shares


def parse_cpu_mask(mask: str, flag: str = "-C") -> list[int]:
    """The CPUs whose bits are set in a hex mask (0x optional; the last digit holds CPUs 0-3)."""
    digits = mask[2:] if mask[:2].lower() == "0x" else mask
    if not digits:
        raise UsageError(f"{flag} {mask!r} has no hex digits", hint=f"e.g. {flag} 0x3 for CPUs 0 and 1")
    if len(digits) > _MAX_MASK_DIGITS:
        raise UsageError(f"{flag} {mask!r} is longer than {_MAX_MASK_DIGITS} hex digits",
                         hint=f"llama.cpp places at most {MAX_THREADS} CPUs")
    try:
        bits = int(digits, 16)
    except ValueError:
        bad = next(c for c in digits if c not in "0123456789abcdefABCDEF")
        raise UsageError(f"{flag} {mask!r}: {bad!r} is not a hex digit", hint=f"e.g. {flag} 0x3 for CPUs 0 and 1"
                         ) from None
    return [cpu for cpu in range(MAX_THREADS) if bits >> cpu & 1]


def parse_cpu_range(text: str, flag: str = "-Cr") -> list[int]:
    """The CPUs of `lo-hi` (either end may be left out: 0 and the last CPU ggml places)."""
    hint = f"give lo-hi, e.g. {flag} 0-3 (CPUs 0 to {MAX_THREADS - 1})"
    lo_text, dash, hi_text = text.partition("-")
    if not dash:
        raise UsageError(f"{flag} {text!r} is not a range", hint=hint)
    try:
        lo = int(lo_text) if lo_text.strip() else 0
        hi = int(hi_text) if hi_text.strip() else MAX_THREADS - 1
    except ValueError:
        raise UsageError(f"{flag} {text!r} is not a range of CPU numbers", hint=hint) from None
    if not 0 <= lo < MAX_THREADS or not 0 <= hi < MAX_THREADS:
        raise UsageError(f"{flag} {text!r} is out of bounds", hint=hint)
    if lo > hi:
        raise UsageError(f"{flag} {text!r} ends before it starts", hint=hint)
    return list(range(lo, hi + 1))


def parse_overrides(values: list[str] | None, separator: str = ",") -> tuple[tuple[str, str], ...]:
    """-ot values: PATTERN=BUFTYPE items separated by `separator`, in order."""
    pairs = []
    for value in values or ():
        for item in (part for part in value.split(separator) if part):
            pattern, sep, buft = item.partition("=")
            if not sep:
                raise UsageError(f"-ot {item!r} has no '='", hint="give PATTERN=BUFTYPE, e.g. -ot 'exps=CPU'")
            try:
                re.compile(pattern)
            except re.error as exc:
                raise UsageError(f"-ot {pattern!r} is not a valid regular expression ({exc})",
                                 hint="e.g. -ot 'blk\\.[0-9]+\\.ffn_.*_exps=CPU'") from None
            pairs.append((pattern, buft))
    return tuple(pairs)


def bench_overrides(values: list[str] | None) -> tuple[tuple[tuple[str, str], ...], ...]:
    """bench's -ot: one configuration per comma-separated group (an empty group: no override)."""
    groups = [group for value in values or () for group in value.split(",")]
    return tuple(parse_overrides([group], ";") for group in groups) or ((),)
