"""llama-server's native routes: /completion (and /completions), /infill, /slots, /props, and (tokens.py)
the routes between text and tokens.

A request names its model in its body's `model`, else in `?model=` (routes with no body).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from starlette.concurrency import run_in_threadpool

from ... import __version__
from ...core.serving.engine import Engine
from ...errors import InputError
from .. import spine
from ..cards import modalities
from ..errors import APIError, body_error
from ..model_set import ModelSet, ServedModel
from ..settings import ServerSettings
from .answers import native_body, native_stream
from .prepare import prepare_infill, prepare_native
from .schemas import InfillRequest, NativeCompletionRequest, SlotFileRequest
from .tokens import add_token_routes

# A saved slot's file name: no folders, no parent references, nothing a shell or a path reads specially.
_SLOT_FILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def add_routes(app: FastAPI, models: ModelSet) -> None:
    @app.post("/completion", tags=["llama-server"])
    @app.post("/completions", include_in_schema=False)
    async def completion(body: NativeCompletionRequest, request: Request) -> Any:
        """Continue a prompt (a string, token ids, both mixed, or a list of prompts) in llama-server's shape."""
        return await spine.generate(models.named(request, body.model), request, body, prepare_native,
                                    native_stream, native_body)

    @app.post("/infill", tags=["llama-server"])
    async def infill(body: InfillRequest, request: Request) -> Any:
        """Fill in the middle between `input_prefix` and `input_suffix` (models with FIM tokens)."""
        return await spine.generate(models.named(request, body.model), request, body, prepare_infill,
                                    native_stream, native_body)

    @app.get("/slots", tags=["llama-server"])
    async def slots(request: Request) -> Any:
        """Each slot: its context, whether it is processing, and its token counts."""
        engine = spine.generating((await models.named(request)).engine)
        return [_slot_view(slot, engine) for slot in engine.slot_states()]

    @app.post("/slots/{id_slot}", tags=["llama-server"])
    async def slot_action(id_slot: int, request: Request) -> Any:
        """?action=save|restore with {"filename"} (under --slot-save-path), or ?action=erase."""
        model = await models.named(request)
        engine = spine.generating(model.engine)
        action = request.query_params.get("action", "")
        body = await _json_body(request) if action in ("save", "restore") else {}
        return await _slot_file(engine, model.settings, id_slot, action, body)

    @app.get("/props", tags=["llama-server"])
    async def props(request: Request) -> Any:
        """Server properties: slots, per-slot context, default sampling, model path, chat template (router
        mode without ?model=: the router's own, role "router")."""
        name = request.query_params.get("model")
        if models.router and name is None and (router := models.props()) is not None:  # type: ignore[attr-defined]
            return {**router, "build_info": _build_info()}
        if models.router and (known := models.described(name)) is not None:  # type: ignore[attr-defined]
            return known  # neither wakes a sleeping model nor keeps an idle one awake
        model = await models.named(request)
        spine.generating(model.engine)
        return await run_in_threadpool(props_body, model)

    if models.router:
        models.describe = props_body  # type: ignore[attr-defined]  # what a sleeping model's /props shows

    add_token_routes(app, models)


def props_body(model: ServedModel) -> dict[str, Any]:
    """GET /props of a loaded model: slots, per-slot context, default sampling, model path, chat template."""
    engine, settings = model.engine, model.settings
    template = engine.chat_template_text(settings.chat_template)
    return {"default_generation_settings": {"n_ctx": engine.n_ctx, "params": default_params(settings)},
            "total_slots": len(engine.slot_states()), "model_alias": model.id, "model_path": str(engine.path),
            "modalities": modalities(engine), "chat_template": template or "",
            "bos_token": _piece(engine, engine.model.bos), "eos_token": _piece(engine, engine.model.eos),
            "build_info": _build_info(), "is_sleeping": False}


def _build_info() -> str:
    """llama-server's b<build>-<commit> form: llama-cpp-python does not say llama.cpp's build number (0,
    as llama-bench's build_number here), only the commit; pyllama's version follows."""
    from ...core.model.library import llama_cpp_commit

    return f"b0-{llama_cpp_commit()} (pyllama {__version__})"


async def _json_body(request: Request) -> Any:
    """The body as JSON; a body that is none is a 400 (it was a 500 with a traceback)."""
    try:
        return await request.json()
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise body_error(exc) from None


def _slot_view(state: dict[str, Any], engine: Engine) -> dict[str, Any]:
    """A slot as llama-server shows it (id, n_ctx, is_processing), with pyllama's counts beside."""
    return {"id": state["id"], "n_ctx": engine.n_ctx, "speculative": False,
            "is_processing": state.get("state", "idle") != "idle", **state}


async def _slot_file(engine: Engine, settings: ServerSettings, id_slot: int, action: str,
                     body: dict[str, Any]) -> Any:
    from ...core.serving import slot_state

    n_slots = len(engine.slot_states())
    if not 0 <= id_slot < n_slots or not hasattr(engine, "on_idle_slot"):
        raise APIError(400, f"no slot {id_slot}: this server has slots 0..{n_slots - 1}", param="id_slot",
                       code="invalid_value")
    if action not in ("save", "restore", "erase"):
        raise APIError(400, f"invalid action {action!r}: use ?action=save, restore or erase", param="action",
                       code="invalid_value")
    if action == "erase":
        n = await _on_slot(engine, id_slot, slot_state.erase_slot)
        return {"id_slot": id_slot, "n_erased": n}
    path = _slot_path(settings, body)
    started = time.perf_counter()
    if action == "save":
        done = await _on_slot(engine, id_slot, lambda ctx, slot: slot_state.save_slot(ctx, slot, path))
        return {"id_slot": id_slot, "filename": path.name, "n_saved": done.n_tokens, "n_written": done.n_bytes,
                "timings": {"save_ms": (time.perf_counter() - started) * 1000}}
    done = await _on_slot(engine, id_slot, lambda ctx, slot: slot_state.restore_slot(ctx, slot, path, engine.n_ctx))
    return {"id_slot": id_slot, "filename": path.name, "n_restored": done.n_tokens, "n_read": done.n_bytes,
            "timings": {"restore_ms": (time.perf_counter() - started) * 1000}}


def _slot_path(settings: ServerSettings, body: dict[str, Any]) -> Path:
    folder = settings.slot_save_path
    if folder is None:
        # 400, not llama-server's 501: clients retry 5xx answers, and retrying cannot help.
        raise APIError(400, "slot save and restore are off: start the server with --slot-save-path DIR",
                       code="not_supported")
    try:
        name = SlotFileRequest.model_validate(body).filename
    except ValueError:
        raise APIError(400, "a body with \"filename\" is required", param="filename", code="invalid_value") from None
    if not _SLOT_FILE.match(name) or ".." in name:
        raise APIError(400, f"invalid filename {name!r}: a plain file name (letters, digits, '.', '_', '-')",
                       param="filename", code="invalid_value")
    path = folder / name
    if path.is_symlink():
        raise APIError(400, f"{name!r} is a symbolic link: slot files must be plain files in --slot-save-path",
                       param="filename", code="invalid_value")
    return path


async def _on_slot(engine: Any, id_slot: int, action: Callable[[Any, Any], Any]) -> Any:
    from ...core.serving.slot_state import SlotStorageFull

    try:
        return await asyncio.wrap_future(engine.on_idle_slot(id_slot, action))
    except InputError as exc:
        raise APIError(400, exc.message, code="invalid_value") from None
    except SlotStorageFull as exc:  # 507 Insufficient Storage, as WebDAV answers a full disk
        raise APIError(507, exc.message, code="insufficient_storage") from None


def _piece(engine: Engine, token: int) -> str:
    return engine.piece(token).decode("utf-8", errors="replace") if token >= 0 else ""


def default_params(settings: ServerSettings) -> dict[str, Any]:
    """The sampling a request gets for the fields it leaves out, under llama-server's names."""
    s = settings.sampling
    return {"n_predict": settings.n_predict, "temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p,
            "min_p": s.min_p, "typical_p": s.typical_p, "repeat_penalty": s.repeat_penalty,
            "repeat_last_n": s.repeat_last_n, "presence_penalty": s.presence_penalty,
            "frequency_penalty": s.frequency_penalty, "mirostat": s.mirostat, "mirostat_tau": s.mirostat_ent,
            "mirostat_eta": s.mirostat_lr, "seed": s.seed, "ignore_eos": s.ignore_eos, "stop": list(settings.stop)}
