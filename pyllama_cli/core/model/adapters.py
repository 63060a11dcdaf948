"""LoRA adapters and control vectors: what the load flags ask for, checked, loaded and applied.

A LoRA adapter is loaded once per model (`llama_adapter_lora_init`) and applied per context with a
scale for each adapter (`llama_set_adapters_lora`); llama.cpp applies one adapter set to a whole
context, so a server runs requests with different sets one set at a time. Control vectors are
summed (each times its scale) into one vector per layer, as llama.cpp's common code does, and set on
every context of the model (`llama_set_adapter_cvec`).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import InvalidGGUF, ModelLoadError, UsageError
from ..gguf.reader import read_gguf

if TYPE_CHECKING:  # numpy loads when a control vector does: the settings classes are needed at start-up
    import numpy as np

_F32 = 0  # ggml's type id of F32


@dataclass(frozen=True)
class AdapterFile:
    """A LoRA adapter or control vector file and the scale it is applied with."""

    path: Path
    scale: float = 1.0


@dataclass(frozen=True)
class AdapterSettings:
    """--lora/--lora-scaled, --lora-init-without-apply, --control-vector[-scaled] and their layer range."""

    loras: tuple[AdapterFile, ...] = ()
    lora_init_without_apply: bool = False
    control_vectors: tuple[AdapterFile, ...] = ()
    cvec_layer_range: tuple[int, int] | None = None  # 1-based, both inclusive; None = every layer


@dataclass
class LoraAdapter:
    """A LoRA adapter loaded for one model: its id (position on the command line), file and scale."""

    id: int
    path: Path
    scale: float
    handle: Any
    task_name: str = ""  # the adapter's adapter.lora.task_name and prompt_prefix, as llama-server lists them
    prompt_prefix: str = ""


@dataclass(frozen=True)
class ControlVector:
    """The summed control vectors: n_embd floats per layer from layer 1, and the layers they apply to."""

    data: np.ndarray
    n_embd: int
    layer_start: int
    layer_end: int


def _check_exists(path: Path, kind: str, flag: str) -> None:
    if not path.is_file():
        raise UsageError(f"{kind} file not found: {path}", hint=f"give {flag} the path of a GGUF {kind} file")


def check_lora_file(path: Path, model_path: Path, model_arch: str) -> None:
    """Refuse, before llama.cpp reads it, a file that is no LoRA adapter or one made for another architecture."""
    _check_exists(path, "LoRA adapter", "--lora")
    try:
        header = read_gguf(path, check_data=False)
    except InvalidGGUF as err:
        raise UsageError(f"{path} is not a LoRA adapter: {err.message}",
                         hint="--lora takes a GGUF adapter (convert_lora_to_gguf.py writes one)") from None
    if header.get("general.type") != "adapter" or header.get("adapter.type") != "lora":
        raise UsageError(f"{path} is not a LoRA adapter (general.type {header.get('general.type')!r}, "
                         f"adapter.type {header.get('adapter.type')!r})",
                         hint="--lora takes a GGUF adapter (convert_lora_to_gguf.py writes one)")
    if header.architecture != model_arch:
        raise ModelLoadError(
            f"LoRA adapter {path.name} is for {header.architecture} models, but {model_path.name} is {model_arch}",
            hint="use an adapter made for this base model")


def load_loras(model: Any, settings: AdapterSettings, model_arch: str) -> list[LoraAdapter]:
    """Load every --lora of `settings` for `model` (a native Model); ids follow the command line."""
    from .library import lib

    loaded: list[LoraAdapter] = []
    try:
        for index, item in enumerate(settings.loras):
            check_lora_file(item.path, model.path, model_arch)
            handle = lib.llama_adapter_lora_init(model.handle, str(item.path).encode())
            if not handle:
                raise ModelLoadError(
                    f"LoRA adapter {item.path.name} does not fit {model.path.name}",
                    hint="its tensors are missing from or shaped unlike the model's: use an adapter made for "
                    "this base model (--verbose shows llama.cpp's reason)")
            loaded.append(LoraAdapter(index, item.path, item.scale, handle, _meta(handle, "adapter.lora.task_name"),
                                      _meta(handle, "adapter.lora.prompt_prefix")))
    except BaseException:
        free_loras(loaded)
        raise
    return loaded


def _meta(handle: Any, key: str) -> str:
    from .library import lib

    buf = ctypes.create_string_buffer(1024)
    n = lib.llama_adapter_meta_val_str(handle, key.encode(), buf, ctypes.sizeof(buf))
    return buf.value.decode("utf-8", errors="replace") if n >= 0 else ""


def free_loras(loras: list[LoraAdapter]) -> None:
    from .library import lib

    for lora in loras:
        if lora.handle:
            lib.llama_adapter_lora_free(lora.handle)
            lora.handle = None


def set_loras(ctx_handle: Any, loras: list[LoraAdapter], scales: list[float]) -> None:
    """Apply `loras` with `scales` to a context (adapters of scale 0 are left out, as llama-server does)."""
    from .library import lib

    chosen = [(lora.handle, scale) for lora, scale in zip(loras, scales, strict=True) if scale != 0.0]
    handles = (lib.llama_adapter_lora_p_ctypes * max(1, len(chosen)))(*[h for h, _ in chosen])
    values = (ctypes.c_float * max(1, len(chosen)))(*[s for _, s in chosen])
    if lib.llama_set_adapters_lora(ctx_handle, handles, len(chosen), values) != 0:
        raise ModelLoadError("llama.cpp could not apply the LoRA adapters",
                             hint="run with --verbose to see llama.cpp's reason")


def load_control_vector(settings: AdapterSettings, n_embd: int, n_layer: int) -> ControlVector | None:
    """Sum the --control-vector files (each direction.N times its scale); None when none is given."""
    import numpy as np

    if not settings.control_vectors:
        return None
    data = np.zeros(0, dtype=np.float32)
    for item in settings.control_vectors:
        data = _add(data, _read_directions(item, n_embd))
    start, end = settings.cvec_layer_range or (1, n_layer)
    return ControlVector(data, n_embd, start if start > 0 else 1, end if end > 0 else n_layer)


def _add(total: np.ndarray, more: np.ndarray) -> np.ndarray:
    import numpy as np

    size = max(total.size, more.size)
    out = np.zeros(size, dtype=np.float32)
    out[:total.size] += total
    out[:more.size] += more
    return out


def _read_directions(item: AdapterFile, n_embd: int) -> np.ndarray:
    """One file's directions laid out layer after layer from layer 1, times the file's scale."""
    import numpy as np

    _check_exists(item.path, "control vector", "--control-vector")
    hint = "a control vector holds 1-D F32 tensors direction.1, direction.2, ... of the model's embedding size"
    try:
        header = read_gguf(item.path)
    except InvalidGGUF as err:
        raise UsageError(f"{item.path} is not a control vector: {err.message}", hint=hint) from None
    data = np.zeros(0, dtype=np.float32)
    for tensor in header.tensors:
        prefix, _, number = tensor.name.partition(".")
        layer = int(number) if prefix == "direction" and number.isdigit() else 0
        if layer < 1 or tensor.ggml_type != _F32 or len(tensor.shape) != 1:
            raise UsageError(f"{item.path}: tensor {tensor.name} is not a control vector direction", hint=hint)
        if tensor.shape[0] != n_embd:
            raise ModelLoadError(f"control vector {item.path.name} has {tensor.shape[0]} values per layer, "
                                 f"but the model's embedding size is {n_embd}",
                                 hint="use a control vector made for this model")
        values = np.fromfile(item.path, dtype=np.float32, count=n_embd,
                             offset=header.data_offset + tensor.offset)
        data = _add(data, np.concatenate([np.zeros(n_embd * (layer - 1), np.float32), values * item.scale]))
    return data


def set_control_vector(ctx_handle: Any, cvec: ControlVector) -> None:
    from .library import lib

    pointer = cvec.data.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
    if lib.llama_set_adapter_cvec(ctx_handle, pointer, cvec.data.size, cvec.n_embd,
                                  cvec.layer_start, cvec.layer_end) != 0:
        raise ModelLoadError("llama.cpp could not apply the control vector",
                             hint="check --control-vector-layer-range against the model's layer count")


class ModelAdapters:
    """The adapters of one loaded model, set on each of its contexts as it is made.

    `scales` are the global LoRA scales (serve's POST /lora-adapters changes them); a context made
    with --lora-init-without-apply starts with every adapter off.
    """

    def __init__(self, loras: list[LoraAdapter] | None = None, cvec: ControlVector | None = None,
                 apply_at_start: bool = True):
        self.loras = loras or []
        self.cvec = cvec
        self.apply_at_start = apply_at_start

    @classmethod
    def load(cls, model: Any, settings: AdapterSettings) -> ModelAdapters:
        if not settings.loras and not settings.control_vectors:
            return cls()
        from .library import lib

        arch = model.meta("general.architecture") or "unknown"
        cvec = load_control_vector(settings, model.n_embd, int(lib.llama_model_n_layer(model.handle)))
        loras = load_loras(model, settings, arch)
        if settings.lora_init_without_apply:
            for lora in loras:
                lora.scale = 0.0
        return cls(loras, cvec, not settings.lora_init_without_apply)

    def scales(self) -> list[float]:
        return [lora.scale for lora in self.loras]

    def apply(self, ctx_handle: Any) -> None:
        """Set the control vector and the LoRA adapters at their global scales on a new context."""
        if self.cvec is not None:
            set_control_vector(ctx_handle, self.cvec)
        if self.loras and self.apply_at_start:
            set_loras(ctx_handle, self.loras, self.scales())
