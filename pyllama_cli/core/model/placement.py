"""Which buffer (device) holds which weights: `-ot PATTERN=BUFTYPE`, `--cpu-moe` and `--n-cpu-moe N` as
llama.cpp's tensor buffer-type overrides, and `-sm`/`-mg` as model parameters.

llama.cpp tries the overrides in order for each tensor; the first pattern found in the tensor's name
(a regular-expression search) chooses its buffer type. The buffer types are looked up by name among
ggml's devices (after any RPC servers were added), so an unknown one is refused before the load.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

from ...errors import UsageError
from .library import _ggml, ensure_backend, lib
from .settings import SPLIT_MODES, LoadSettings

# llama.cpp's pattern for the MoE expert weights (common.h's LLM_FFN_EXPS_REGEX), and one layer's.
FFN_EXPS_PATTERN = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"
CPU_BUFFER = "CPU"


def layer_exps_pattern(layer: int) -> str:
    return rf"blk\.{layer}{FFN_EXPS_PATTERN}"


def override_list(settings: LoadSettings) -> list[tuple[str, str]]:
    """(pattern, buffer type name) pairs in the order llama.cpp tries them: -ot's, then --cpu-moe's,
    then --n-cpu-moe's (one per layer)."""
    pairs = list(settings.tensor_overrides)
    if settings.cpu_moe:
        pairs.append((FFN_EXPS_PATTERN, CPU_BUFFER))
    pairs += [(layer_exps_pattern(i), CPU_BUFFER) for i in range(settings.n_cpu_moe)]
    return pairs


class _Override(ctypes.Structure):
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


class TensorOverrides:
    """The overrides as the NULL-terminated C array llama_model_params points at; holds it while the model loads."""

    def __init__(self, pairs: list[tuple[str, str]]):
        bufts = buffer_types()
        self._patterns = [pattern.encode() for pattern, _ in pairs]
        self.array = (_Override * (len(pairs) + 1))()  # zeroed: the last entry ends the list
        for slot, pattern, (_, name) in zip(self.array, self._patterns, pairs):
            if name not in bufts:
                raise UsageError(f"-ot: unknown buffer type {name!r}", hint=f"allowed values: {', '.join(bufts)}")
            slot.pattern, slot.buft = pattern, bufts[name]

    def apply(self, params: Any) -> None:
        params.tensor_buft_overrides = ctypes.cast(self.array, ctypes.c_void_p)


def apply_placement(params: Any, settings: LoadSettings) -> TensorOverrides | None:
    """Set -sm, -mg and the tensor overrides on model parameters; the returned object must live until
    the load returns (it owns the C strings)."""
    if settings.split_mode is not None:
        params.split_mode = SPLIT_MODES[settings.split_mode]
    if settings.main_gpu is not None:
        params.main_gpu = settings.main_gpu
    pairs = override_list(settings)
    if not pairs:
        return None
    if len(pairs) >= int(lib.llama_max_tensor_buft_overrides()):
        raise UsageError(f"{len(pairs)} tensor overrides are more than llama.cpp takes "
                         f"({int(lib.llama_max_tensor_buft_overrides()) - 1})", hint="use fewer -ot patterns")
    overrides = TensorOverrides(pairs)
    overrides.apply(params)
    return overrides


def buffer_types() -> dict[str, int]:
    """Each device's buffer type by name (CPU, CUDA0, RPC0[host:port], ...), as -ot names them."""
    ensure_backend()
    ggml = _bound()
    found: dict[str, int] = {}
    for i in range(ggml.ggml_backend_dev_count()):
        buft = ggml.ggml_backend_dev_buffer_type(ggml.ggml_backend_dev_get(i))
        if buft:
            found.setdefault(ggml.ggml_backend_buft_name(buft).decode(), buft)
    return found


@functools.cache
def _bound() -> ctypes.CDLL:
    ggml = _ggml()
    vp = ctypes.c_void_p
    ggml.ggml_backend_dev_buffer_type.argtypes, ggml.ggml_backend_dev_buffer_type.restype = [vp], vp
    ggml.ggml_backend_buft_name.argtypes, ggml.ggml_backend_buft_name.restype = [vp], ctypes.c_char_p
    return ggml

