"""GET /lora-adapters lists the adapters loaded with --lora (id, path, scale); POST sets their global
scales. A generation request may carry `"lora": [{"id": 0, "scale": 0.5}]`: then the adapters it
lists run at those scales and the others at 0 for that request alone, as in llama-server.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request

from .. import spine
from ..errors import APIError, body_error
from ..job_rules import request_scales
from ..model_set import ModelSet


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
    engine = spine.ready(model.engine)
    turns = getattr(engine, "lora", None)
    return turns.adapters.loras if turns is not None and turns.adapters is not None else []
