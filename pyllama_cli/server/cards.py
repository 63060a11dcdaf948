"""A model's entry in GET /v1/models: OpenAI's fields plus where it stands (the router's contract).

`status.value` is loaded, loading, unloaded or failed (with `failed` and `error`); `meta` and `runtime`
are there only while the model is loaded. ps and stop read these fields.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..core.serving.engine import Engine

OWNER = "pyllama"


def model_card(model_id: str, path: Path, size: int, *, status: str, aliases: tuple[str, ...] = (),
               tags: tuple[str, ...] = (),
               engine: Engine | None = None, idle_s: float = 0.0, error: BaseException | None = None) -> dict[str, Any]:
    created = int(path.stat().st_mtime) if path.exists() else 0
    state: dict[str, Any] = {"value": status}
    if error is not None:
        state.update(failed=True, error=getattr(error, "message", None) or str(error))
    card: dict[str, Any] = {"id": model_id, "object": "model", "created": created, "owned_by": OWNER,
                            "path": str(path), "size": size, "aliases": list(aliases), "tags": list(tags), "status": state}
    if engine is not None and engine.ready:
        card["meta"] = _meta(engine)
        card["runtime"] = _runtime(engine, idle_s)
    return card


def _meta(engine: Engine) -> dict[str, Any]:
    s = engine.summary
    if s is None:
        return {}
    return {"path": str(s.path), "description": s.description, "n_ctx": s.n_ctx, "n_ctx_train": s.n_ctx_train,
            "n_vocab": s.n_vocab, "n_embd": s.n_embd, "n_params": s.n_params, "size": s.size_bytes,
            "embeddings": s.embeddings, "modalities": modalities(engine)}


def modalities(engine: Engine) -> dict[str, bool]:
    """What the model takes besides text: its projector's (--mmproj) capabilities (docs/multimodal.md)."""
    caps = engine.projector.capabilities if engine.projector is not None else None
    return {"vision": bool(caps and caps.vision), "audio": bool(caps and caps.audio)}


def _runtime(engine: Engine, idle_s: float) -> dict[str, Any]:
    from ..core.serving.pool import memory_bytes

    slots = engine.slot_states()
    busy = sum(slot.get("state") != "idle" for slot in slots)
    return {"n_ctx": engine.n_ctx, "slots_total": len(slots), "slots_busy": busy,
            "idle_s": 0.0 if busy else round(idle_s, 1), "memory_bytes": memory_bytes(engine)}
