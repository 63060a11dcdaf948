"""What a cached state depends on, as one versioned key: an entry serves only an engine with the same.

A sequence's KV cells are a function of its tokens and of the model's weights and context settings.
The tokens are each entry's own key; everything else is here. The model file is named by its name,
size and modification time (hashing gigabytes at every start would cost more than a prefill). The
chat template only changes which tokens a conversation becomes, so a token match already covers
it; it is part of the key anyway, so that an entry never outlives the template it was made with.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

FORMAT = 1  # of the entries' layout (disk.py); a change makes every older entry a mismatch


def cache_key(path: Path, *, n_ctx_slot: int, kv_unified: bool, flash_attn: str, template: str,
              type_k: str = "f16", type_v: str = "f16", rope: dict[str, Any] | None = None,
              adapters: Any = None) -> dict[str, Any]:
    """The key of an engine's entries: its model file and the settings its states depend on. `type_k`
    and `type_v` are the cells' types (-ctk, -ctv: a state's bytes are read as those); `rope` the
    RoPE and YaRN settings (the K cells hold keys already rotated by them); `adapters` the LoRA and
    control vector files (an AdapterSettings: each entry also records the LoRA scales it was made with)."""
    stat = path.stat()
    return {"format": FORMAT, "library": _library_version(), "model": path.name, "model_size": stat.st_size,
            "model_mtime_ns": stat.st_mtime_ns, "n_ctx_slot": n_ctx_slot, "kv_unified": kv_unified,
            "flash_attn": flash_attn, "type_k": type_k, "type_v": type_v, "rope": dict(rope or {}),
            "adapters": _adapter_key(adapters), "template_sha256": hashlib.sha256(template.encode()).hexdigest()}


def _adapter_key(adapters: Any) -> dict[str, Any]:
    """The adapter files by name, size and time; a control vector's scale and layers (fixed at load)."""
    if adapters is None:
        return {}
    return {"lora": [_file(a.path) for a in adapters.loras],
            "control_vectors": [[*_file(c.path), c.scale] for c in adapters.control_vectors],
            "cvec_layer_range": list(adapters.cvec_layer_range or ())}


def _file(path: Path) -> list[Any]:
    stat = Path(path).stat()
    return [Path(path).name, stat.st_size, stat.st_mtime_ns]


def key_digest(key: dict[str, Any]) -> str:
    """A short, stable name for a key (the disk entries' file-name prefix)."""
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _library_version() -> str:
    try:
        from importlib.metadata import version

        return version("llama_cpp_python")
    except Exception:  # noqa: BLE001 - a source checkout without metadata: the key still names the model
        return "unknown"
