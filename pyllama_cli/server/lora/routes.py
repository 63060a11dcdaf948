"""GET /lora-adapters lists the adapters loaded with --lora (id, path, scale); POST sets their global
scales. A generation request may carry `"lora": [{"id": 0, "scale": 0.5}]`: then the adapters it
lists run at those scales and the others at 0 for that request alone, as in llama-server.
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import FastAPI, Request

from ..errors import APIError, body_error
from ..models import ModelSet


def add_routes(app: FastAPI, models: ModelSet) -> None:
    @app.get("/lora-adapters", tags=["llama-server"])
    async def list_adapters(request: Request) -> Any:
        """The LoRA adapters: id (their order on the command line), path and global scale."""
        loras = _loras(await models.named(request))
        return [{"id": lora.id, "path": str(lora.path), "scale": lora.scale, "task_name": lora.task_name,
                 "prompt_prefix": lora.prompt_prefix} for lora in loras]

    @app.post("/lora-adapters", tags=["llama-server"])
    async def set_adapters(request: Request) -> Any:
        """Set the global scales: [{"id": 0, "scale": 0.5}, ...]; adapters not listed get scale 0."""
        loras = _loras(await models.named(request))
        try:
            body = await request.json()
        except (ValueError, RecursionError) as exc:
            raise body_error(exc) from None
        if not isinstance(body, list):
            raise APIError(400, "Request body must be an array", param="body", code="invalid_value")
        scales = request_scales(len(loras), body, "body")
        for lora, scale in zip(loras, scales, strict=True):
            lora.scale = scale
        return {"success": True}


def _loras(model: Any) -> list[Any]:
    from ..app import _ready

    engine = _ready(model.engine)
    turns = getattr(engine, "lora", None)
    return turns.adapters.loras if turns is not None and turns.adapters is not None else []


def request_scales(n_adapters: int, entries: Any, field: str = "lora") -> tuple[float, ...]:
    """One scale per adapter from llama-server's [{"id", "scale"}] list (unlisted adapters: 0).

    Raises:
        APIError: 400 for a list that is not of {id, scale} objects, or an id out of range.
    """
    if not isinstance(entries, list):
        raise APIError(400, f"{field} must be an array of objects with 'id' and 'scale' fields", param=field,
                       code="invalid_value")
    scales = [0.0] * n_adapters
    for entry in entries:
        if not isinstance(entry, dict) or not _is_int(entry.get("id")) or not _is_number(entry.get("scale", 0.0)):
            raise APIError(400, f"{field} must be an array of objects with 'id' and 'scale' fields", param=field,
                           code="invalid_value")
        lora_id = entry["id"]
        if not 0 <= lora_id < n_adapters:
            loaded = f"ids 0..{n_adapters - 1}" if n_adapters else "none"
            raise APIError(400, f"{field}: no LoRA adapter with id {lora_id} (loaded: {loaded})", param=field,
                           code="invalid_value")
        scales[lora_id] = float(entry.get("scale", 0.0))
    return tuple(scales)


def job_lora(engine: Any, entries: Any) -> tuple[float, ...] | None:
    """A request's `lora` field as the job's scales (None when the request has none, or an empty list, as
    llama-server reads it: the global scales)."""
    if entries is None or entries == []:
        return None
    turns = getattr(engine, "lora", None)
    loras = turns.adapters.loras if turns is not None and turns.adapters is not None else []
    return request_scales(len(loras), entries)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
