"""ollama's model routes over pyllama's models: /api/tags, /api/show, /api/ps, /api/pull, /api/delete, /api/copy.

What ollama reads from its own manifests is read here from the GGUF header (architecture, parameter
count, quantization, chat template, metadata). A pull fetches `hf.co/user/repo:QUANT` into the Hugging
Face cache with pyllama's resumable download, streaming ollama's progress objects; a delete removes
it from there; a copy is one more name for a model, kept while the server runs.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone
from functools import lru_cache
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from ...core.gguf.ftypes import ftype_name
from ...core.gguf.reader import GGUFFile, read_gguf
from ...core.text.reasoning import KNOWN_MARKERS
from ...errors import PyllamaError
from ..errors import APIError
from ..model_set import ModelSet, ServedModel
from .answers import MEDIA_TYPE, dumps
from .names import Names, hf_card, hf_spec, not_found
from .schemas import CopyRequest, ModelRequest, PullRequest

FOREVER = timedelta(days=365 * 292)  # what ollama reports as the expiry of a model that never unloads
MODEL_INFO_ARRAY = 16  # longer metadata arrays (the vocabulary) are shown as null, as ollama shows them


def add_model_routes(app: FastAPI, models: ModelSet, names: Names) -> None:
    @app.get("/api/tags", tags=["ollama"])
    async def tags() -> Any:
        """Every model this server serves (router mode: those it can load), with copies."""
        cards = models.cards()
        entries = [await run_in_threadpool(_entry, card["id"], card) for card in cards]
        for copy, source in names.copies.items():
            card = names.card(source, cards)
            if card is not None:
                entries.append(await run_in_threadpool(_entry, copy, card))
        return {"models": entries}

    @app.post("/api/show", tags=["ollama"])
    async def show(body: ModelRequest) -> Any:
        """A model's details, metadata (model_info), chat template, parameters and capabilities."""
        card = _card(names, body.wanted)
        return await run_in_threadpool(_show, card, _served(models, card["id"]))

    @app.get("/api/ps", tags=["ollama"])
    async def ps() -> Any:
        """The loaded models, and when each unloads if no request comes (expires_at)."""
        loaded = [c for c in models.cards() if c["status"]["value"] == "loaded"]
        return {"models": [await run_in_threadpool(_running, models, card) for card in loaded]}

    @app.post("/api/copy", tags=["ollama"])
    async def copy(body: CopyRequest) -> Any:
        """Give a model another name (while the server runs)."""
        _card(names, body.source)
        names.copies[body.destination] = names.copies.get(body.source, body.source)
        return Response(status_code=200)

    @app.delete("/api/delete", tags=["ollama"])
    async def delete(body: ModelRequest) -> Any:
        """Remove a copy, or a pulled hf.co model from the Hugging Face cache."""
        name = body.wanted
        if name in names.copies:
            del names.copies[name]
            return Response(status_code=200)
        spec = hf_spec(name)
        if spec is None:
            raise APIError(400, f"only copies and hf.co/user/repo:QUANT models can be deleted here, not {name!r}; "
                           "`pyllama rm` removes other models")
        card = hf_card(spec, models.cards())
        if card is not None and card["status"]["value"] in ("loaded", "loading"):
            raise APIError(400, f"the model {name!r} is loaded: unload it first (keep_alive 0)")
        await run_in_threadpool(_remove, name, spec)
        return Response(status_code=200)

    @app.post("/api/pull", tags=["ollama"])
    async def pull(body: PullRequest) -> Any:
        """Download hf.co/user/repo:QUANT into the Hugging Face cache (resuming a cut download)."""
        name = body.wanted
        if not name:
            raise APIError(400, "model is required")
        spec = hf_spec(name)
        if spec is None:
            names.model_id(name)  # a model served already needs no pull; anything else cannot be pulled
            return _pulled(body.stream, [{"status": "success"}])
        _check_spec(spec)
        events = _pull_events(name, spec)
        if body.stream:
            return StreamingResponse(events, media_type=MEDIA_TYPE)
        last: dict[str, Any] = {}
        async for line in events:
            last = json.loads(line)
        if "error" in last:
            raise APIError(400, last["error"])
        return last


def _check_spec(spec: str) -> None:
    from ...core.model.resolve import parse_hf_spec

    try:
        parse_hf_spec(spec)
    except PyllamaError as exc:
        raise APIError(400, f"{exc.message}: name a Hugging Face GGUF as hf.co/user/repo:QUANT") from None


def _card(names: Names, name: str) -> dict[str, Any]:
    if not name:
        raise APIError(400, "model is required")
    card = names.card(name)
    if card is None:
        raise not_found(name)
    return card


def _served(models: ModelSet, model_id: str) -> ServedModel | None:
    return next((s for s in models.served() if s.id == model_id), None)


def _pulled(stream: bool, lines: list[dict[str, Any]]) -> Any:
    if not stream:
        return JSONResponse(lines[-1])

    async def body() -> AsyncIterator[bytes]:
        for line in lines:
            yield dumps(line)

    return StreamingResponse(body(), media_type=MEDIA_TYPE)


# ---------------------------------------------------------------- what the GGUF header says


@lru_cache(maxsize=64)
def _header(path: str, mtime: float) -> GGUFFile:
    return read_gguf(path, check_data=False, strings=False)


def header_of(card: dict[str, Any]) -> GGUFFile:
    path = Path(card["path"])
    try:
        return _header(str(path), path.stat().st_mtime)
    except (OSError, PyllamaError) as exc:
        raise APIError(500, f"the model file {path} cannot be read: {getattr(exc, 'message', exc)}") from None


def details(head: GGUFFile) -> dict[str, Any]:
    arch = head.architecture
    return {"parent_model": "", "format": "gguf", "family": arch, "families": [arch],
            "parameter_size": _count(sum(t.n_elements for t in head.tensors)),
            "quantization_level": ftype_name(head.get("general.file_type")) or "unknown"}


def _count(n: int) -> str:
    for size, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def digest(path: Path) -> str:
    """The file's sha256 where the HF cache names its blob by it, else a hash of its path, size and time."""
    blob = path.resolve().name
    if len(blob) == 64 and all(c in "0123456789abcdef" for c in blob):
        return blob
    stat = path.stat()
    return hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()


def _modified(path: Path) -> str:
    return datetime.fromtimestamp(path.stat().st_mtime, timezone.utc).isoformat().replace("+00:00", "Z")


def _entry(name: str, card: dict[str, Any]) -> dict[str, Any]:
    path = Path(card["path"])
    return {"name": name, "model": name, "modified_at": _modified(path), "size": card["size"],
            "digest": digest(path), "details": details(header_of(card))}


def _show(card: dict[str, Any], served: ServedModel | None) -> dict[str, Any]:
    head = header_of(card)
    template = str(head.get("tokenizer.chat_template") or "")
    if served is not None and served.engine.ready:
        template = served.engine.chat_template_text(served.settings.chat_template)
    info: dict[str, Any] = {}
    for key, value in head.metadata.items():
        shown = isinstance(value, (int, float, str, bool)) or (isinstance(value, list) and len(value) <= MODEL_INFO_ARRAY)
        info[key] = value if shown else None
    info["general.parameter_count"] = sum(t.n_elements for t in head.tensors)
    embeds = served.engine.embeddings if served is not None else False
    return {"license": str(head.get("general.license") or ""), "modelfile": f"FROM {card['path']}\n",
            "parameters": _parameters(served), "template": template, "details": details(head),
            "model_info": info, "capabilities": _capabilities(head, template, embeds),
            "modified_at": _modified(Path(card["path"]))}


def _parameters(served: ServedModel | None) -> str:
    if served is None:
        return ""
    s = served.settings.sampling
    lines = [f"temperature {s.temperature:g}", f"top_k {s.top_k}", f"top_p {s.top_p:g}", f"min_p {s.min_p:g}",
             f"repeat_penalty {s.repeat_penalty:g}", f"repeat_last_n {s.repeat_last_n}"]
    lines += [f'stop "{stop}"' for stop in served.settings.stop]
    return "\n".join(lines)


def _capabilities(head: GGUFFile, template: str, embeddings: bool) -> list[str]:
    if embeddings:
        return ["embedding"]
    found = ["completion"]
    if "tools" in template:
        found.append("tools")
    if any(m.start in template or m.end in template for m in KNOWN_MARKERS):
        found.append("thinking")
    if all(head.get(f"tokenizer.ggml.fim_{kind}_token_id") is not None for kind in ("pre", "suf", "mid")):
        found.append("insert")
    return found


def _running(models: ModelSet, card: dict[str, Any]) -> dict[str, Any]:
    path, runtime = Path(card["path"]), card.get("runtime", {})
    return {"name": card["id"], "model": card["id"], "size": runtime.get("memory_bytes", card["size"]),
            "digest": digest(path), "details": details(header_of(card)), "expires_at": _expires(models, card),
            "size_vram": 0, "context_length": runtime.get("n_ctx", 0)}


def _expires(models: ModelSet, card: dict[str, Any]) -> str:
    """When the model unloads if no request comes: its keep-alive (the last request's, else the router's
    idle time) after its last request; far ahead for a model that never unloads."""
    now = datetime.now(timezone.utc)
    pool = getattr(models, "pool", None)
    model = pool.models.get(card["id"]) if pool is not None else None
    limit = -1.0
    if model is not None:
        limit = model.keep_alive if model.keep_alive is not None else pool.idle_seconds
    idle = card.get("runtime", {}).get("idle_s", 0.0)
    when = now + FOREVER if limit < 0 else now + timedelta(seconds=max(limit - idle, 0.0))
    return when.isoformat().replace("+00:00", "Z")


# ---------------------------------------------------------------- pull and delete


async def _pull_events(name: str, spec: str) -> AsyncIterator[bytes]:
    """ollama's pull progress as pyllama downloads: pulling manifest, each file's bytes, success (or error)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()

    def report(line: dict[str, Any] | None) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, line)

    worker = threading.Thread(target=_pull, args=(spec, report), daemon=True, name="ollama-pull")
    worker.start()
    while (line := await queue.get()) is not None:
        yield dumps(line)


def _pull(spec: str, report: Any) -> None:
    """Download `spec` on a thread of its own, reporting each step; None says it ended."""
    from ...core.model.resolve import ModelRequest as HubRequest, parse_hf_spec, remote_model_files, resolve_model

    try:
        report({"status": "pulling manifest"})
        remote_model_files(spec)  # an absent repo or quant fails here, before any progress
        repo, _ = parse_hf_spec(spec)
        resolve_model(HubRequest(hf_repo=spec), tqdm_class=_progress_class(report, repo))
        report({"status": "verifying sha256 digest"})
        report({"status": "writing manifest"})
        report({"status": "success"})
    except Exception as exc:  # noqa: BLE001 - the stream is under way: the error goes in it, as ollama's does
        report({"error": getattr(exc, "message", None) or str(exc)})
    finally:
        report(None)


def _progress_class(report: Any, repo: str) -> type:
    """Progress as ollama's `pulling <digest>` objects, a file's digest standing for its name in `repo`."""
    from ...core.store.download import progress_reporter

    def pulling(file: str, done: int, total: int) -> None:
        digest = "sha256:" + hashlib.sha256(f"{repo}/{file}".encode()).hexdigest()
        report({"status": f"pulling {digest[7:19]}", "digest": digest, "total": total, "completed": done})

    return progress_reporter(pulling)


def _remove(name: str, spec: str) -> None:
    from ...core.store.remove import plan_removal, remove
    from ...errors import ModelNotFound, QuantNotFound

    try:
        remove(plan_removal(spec))
    except (ModelNotFound, QuantNotFound):
        raise not_found(name) from None
    except PyllamaError as exc:
        raise APIError(400, exc.message) from None
