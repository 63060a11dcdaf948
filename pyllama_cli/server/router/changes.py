"""Models added and removed while a router serves: llama-server's POST /models, DELETE /models and
GET /models/sse.

POST /models {"model": "user/repo[:QUANT]"} checks the name against the Hub (against the cache when
offline), answers {"success": true} at once and downloads in a thread of its own, as -hf does; the
model is listed as `downloading`, with each file's progress, until it is served under the name it was
asked by (unloaded until its first request). DELETE /models?model=NAME unloads the model once its
requests end, stops serving it and deletes its files from the Hugging Face cache as `pyllama rm` does.
Only a model from the cache can be removed: a -m file, a --models-dir model or a preset's
`model = PATH` is the user's own and is never deleted.

/models/sse streams each change as `data: {"model": NAME, "event": EVENT, "data": {...}}`; the events
are model_status (`{"status": "downloading"}`), download_progress (`{"progress": {URL: {"done",
"total"}}}`, per file), download_finished, download_failed (`{"error": MESSAGE}`) and model_remove.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ...core.model.resolve import ModelRequest, ResolvedModel
from ...core.serving.pool import EnginePool, PoolModel
from ...errors import HubError, ModelNotFound, OfflineMiss, PyllamaError, QuantNotFound, UsageError
from ..cards import OWNER
from ..errors import APIError
from ..http.access_log import note_model

REMOVABLE = "cache"  # the source of the models DELETE /models may delete (llama-server's word)
PROGRESS_EVERY_S = 0.1  # download_progress events per file, at most this often


@dataclass(frozen=True)
class Additions:
    """What a router needs to serve a model it downloads: the -hf request for a name (with the server's
    -hft and --offline), the model's pool entry (the server's flags and presets), and its log."""

    request: Callable[[str], ModelRequest]
    pool_model: Callable[[str, ResolvedModel], PoolModel]
    report: Callable[[str], None]


class Served(Protocol):
    """What changes need of the router (routed.py's Router): its models by name, and adding and forgetting one."""

    pool: EnginePool

    def lookup(self, name: str) -> PoolModel | None: ...

    def adopt(self, model: PoolModel) -> None: ...

    async def forget(self, model_id: str) -> PoolModel: ...


class ModelEvents:
    """The /models/sse subscribers, each a queue of events; None ends a stream (the server stops)."""

    def __init__(self) -> None:
        self._queues: set[asyncio.Queue[dict[str, Any] | None]] = set()

    def subscribe(self) -> asyncio.Queue[dict[str, Any] | None]:
        """A queue that gets every event from now on (taken before the answer starts: none is missed)."""
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self._queues.add(queue)
        return queue

    async def stream(self, queue: asyncio.Queue[dict[str, Any] | None]) -> AsyncIterator[str]:
        try:
            while (event := await queue.get()) is not None:
                yield f"data: {json.dumps(event)}\n\n"
        finally:
            self._queues.discard(queue)

    def publish(self, model: str, event: str, data: dict[str, Any] | None = None) -> None:
        item = {"model": model, "event": event, **({"data": data} if data is not None else {})}
        for queue in self._queues:
            queue.put_nowait(item)

    def close(self) -> None:
        for queue in self._queues:
            queue.put_nowait(None)


class ModelChanges:
    """POST and DELETE /models for one router; see the module docstring."""

    def __init__(self, router: Served, additions: Additions | None):
        self.router = router
        self.additions = additions
        self.events = ModelEvents()
        self.downloading: dict[str, dict[str, dict[str, int]]] = {}  # name -> file's URL -> done, total

    async def add(self, name: str) -> None:
        """Check `name` on the Hub and start its download.

        Raises:
            APIError: 400 for an empty or malformed name or one already served, 404 for a repo or
            quant the Hub (or, offline, the cache) does not have, 502 when the Hub cannot be asked.
        """
        if not name:
            raise APIError(400, "model must be a non-empty string", param="model", code="invalid_value")
        note_model(name)
        if self.additions is None:
            raise APIError(400, "this server cannot download models", code="not_supported")
        self._refuse_taken(name)
        request = self.additions.request(name)
        await asyncio.to_thread(_check, request)
        self._refuse_taken(name)  # another POST of the same name may have started meanwhile
        self.downloading[name] = {}
        self.events.publish(name, "model_status", {"status": "downloading"})
        self.additions.report(f"downloading model {name!r}")
        loop = asyncio.get_running_loop()

        def progress(file: str, done: int, total: int) -> None:
            loop.call_soon_threadsafe(self._progress, name, file, done, total)

        def download() -> None:
            try:
                resolved, error = _download(request, progress), None
            except BaseException as exc:  # noqa: BLE001 - reported as download_failed, never lost
                resolved, error = None, exc
            loop.call_soon_threadsafe(self._finish, name, resolved, error)

        # A daemon thread: a server stopped mid-download exits without waiting for it.
        threading.Thread(target=download, name=f"download {name}", daemon=True).start()

    def _refuse_taken(self, name: str) -> None:
        if self.router.lookup(name) is not None or name in self.downloading:
            raise APIError(400, f"model {name!r} already exists", param="model", code="model_exists")

    def _progress(self, name: str, file: str, done: int, total: int) -> None:
        if name in self.downloading:
            self.downloading[name][file] = {"done": done, "total": total}
            self.events.publish(name, "download_progress", {"progress": dict(self.downloading[name])})

    def _finish(self, name: str, resolved: ResolvedModel | None, error: BaseException | None) -> None:
        assert self.additions is not None
        del self.downloading[name]
        if resolved is not None:
            try:
                self.router.adopt(self.additions.pool_model(name, resolved))
            except Exception as exc:  # noqa: BLE001 - e.g. an alias from the presets taken meanwhile
                error = exc
        if error is not None:
            message = getattr(error, "message", None) or str(error)
            self.additions.report(f"downloading model {name!r} failed: {message}")
            self.events.publish(name, "download_failed", {"error": message})
            return
        self.additions.report(f"model {name!r} downloaded; it loads on first use")
        self.events.publish(name, "download_finished")

    async def remove(self, name: str) -> None:
        """Unload the model, stop serving it, and delete its files from the Hugging Face cache.

        Raises:
            APIError: 400 for an empty name or a model that is not from the cache, 404 for a name not
            served, 409 while it downloads, 500 when its files cannot be deleted.
        """
        if not name:
            raise APIError(400, "model must be a non-empty string", param="model", code="invalid_value")
        note_model(name)
        if name in self.downloading:
            raise APIError(409, f"the model {name!r} is still downloading: remove it once it is listed as unloaded",
                           param="model", code="model_downloading")
        model = self.router.lookup(name)
        if model is None:
            raise APIError(404, f"the model {name!r} is not served here", param="model", code="model_not_found")
        source = model.config.source
        if source != REMOVABLE:
            raise APIError(400, f"the model {model.id!r} is not removable: it is {_SOURCES.get(source, source)}, "
                           "and this server deletes only models of the Hugging Face cache", param="model",
                           code="model_not_removable")
        try:
            await self.router.forget(model.id)
        except KeyError:  # a DELETE of the same model that came first
            raise APIError(404, f"the model {name!r} is not served here", param="model",
                           code="model_not_found") from None
        kept = {part for other in self.router.pool.models.values() for part in other.parts}
        if not kept & set(model.parts):  # the same file served under another name stays
            await asyncio.to_thread(_delete, model)
        if self.additions is not None:
            self.additions.report(f"model {model.id!r} removed")
        self.events.publish(model.id, "model_remove")

    def cards(self) -> list[dict[str, Any]]:
        """The /v1/models entries of the models being downloaded."""
        return [{"id": name, "object": "model", "created": int(time.time()), "owned_by": OWNER, "aliases": [],
                 "tags": [], "status": {"value": "downloading"}, "progress": dict(files), "source": REMOVABLE,
                 "can_remove": False} for name, files in self.downloading.items()]


_SOURCES = {"file": "a file named with -m", "models_dir": "a file of --models-dir",
            "preset": "a file named by --models-preset"}


def _check(request: ModelRequest) -> None:
    """The name resolves to a GGUF on the Hub (offline: in the cache), without downloading it."""
    from ...core.model.resolve import offline_requested, remote_model_files, resolve_hf

    try:
        if offline_requested(request):
            resolve_hf(request)
        else:
            remote_model_files(request.hf_repo or "", request.hf_token)
    except UsageError as exc:
        raise APIError(400, _with_hint(exc), param="model", code="invalid_value") from None
    except (ModelNotFound, QuantNotFound, OfflineMiss) as exc:
        raise APIError(404, _with_hint(exc), param="model", code="model_not_found") from None
    except HubError as exc:
        raise APIError(502, _with_hint(exc), param="model", code="hub_error") from None


def _with_hint(exc: PyllamaError) -> str:
    return f"{exc.message}; {exc.hint}" if exc.hint else exc.message


def _download(request: ModelRequest, progress: Callable[[str, int, int], None]) -> ResolvedModel:
    """The model downloaded as -hf downloads it; each file's progress reported by its URL (as llama-server's)."""
    from ...core.model.resolve import hub_file_url, parse_hf_spec, resolve_model

    repo, _ = parse_hf_spec(request.hf_repo or "")
    return resolve_model(request, tqdm_class=_progress_class(
        lambda file, done, total: progress(hub_file_url(repo, file), done, total)))


def _progress_class(progress: Callable[[str, int, int], None]) -> type:
    """Each file's bytes as download_progress: when it starts, at most every PROGRESS_EVERY_S, and whole."""
    from ...core.store.download import progress_reporter

    return progress_reporter(progress, every_s=PROGRESS_EVERY_S)


def _delete(model: PoolModel) -> None:
    """The model's files out of the Hugging Face cache, as `pyllama rm FILE` deletes them."""
    from ...core.store.remove import plan_removal, remove

    try:
        remove(plan_removal(str(model.path)))
    except ModelNotFound:
        return  # already gone
    except (PyllamaError, OSError) as exc:
        message = getattr(exc, "message", None) or str(exc)
        raise APIError(500, f"the model {model.id!r} is no longer served, but its files could not be deleted: "
                       f"{message}", param="model", code="model_remove_failed") from None
