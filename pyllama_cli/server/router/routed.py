"""`Router`: the ModelSet of a server of many models, over an `EnginePool` (core/serving/pool.py).

A request names its model by id (the file's stem) or by an alias from the presets; the model is loaded
on first use and held until the answer is sent (leases.py), so it is never unloaded under a request.
A model that failed to load answers its requests with a 500 that says why; the others go on serving.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ...core.serving.engine import Engine
from ...core.serving.jobs import EngineStats
from ...core.serving.pool import FAILED, LOADED, EnginePool, PoolModel
from ..cards import model_card
from ..errors import APIError
from ..http.access_log import note_model
from ..http.leases import hold
from ..metrics import label_pair
from ..model_set import ModelSet, ServedModel
from ..settings import ServerSettings
from .changes import REMOVABLE, Additions, ModelChanges


@dataclass(frozen=True)
class RoutedConfig:
    """What the router keeps per model beside the pool's own: its settings and other names."""

    settings: ServerSettings
    aliases: tuple[str, ...] = ()
    source: str = "file"  # where it was found: file (-m), models_dir, preset, cache (-hf, the HF cache, POST /models)


class Router(ModelSet):
    """Many models, each loaded on first use; see the module docstring."""

    router = True

    def __init__(self, pool: EnginePool, preload: tuple[str, ...] = (), additions: Additions | None = None):
        self.pool = pool
        self.preload = preload
        self._names: dict[str, str] = {}
        for model in pool.models.values():
            for name in (*model.config.aliases, model.id):
                self._names[name] = model.id
        self._tasks: set[asyncio.Task[Any]] = set()
        # GET /props' body of a loaded model (set by that route); kept per model for while it sleeps
        self.describe: Callable[[ServedModel], dict[str, Any]] | None = None
        self._described: dict[str, dict[str, Any]] = {}
        self.changes = ModelChanges(self, additions)  # POST and DELETE /models (changes.py)

    def start(self) -> None:
        self.pool.start()
        for model_id in self.preload:  # load-on-startup in the presets; a failure is reported, not raised
            task = asyncio.get_running_loop().create_task(self.pool.load(model_id))
            task.add_done_callback(lambda done: done.cancelled() or done.exception() or self._remember(done.result()))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def get(self, requested: str | None, keep_alive: float | None = None) -> ServedModel:
        model = self._find(requested)
        note_model(model.id)
        if not model.config.settings.models_autoload and model.state != LOADED:
            raise APIError(400, f"the model {model.id!r} is not loaded, and this server loads models only when "
                           "asked (--no-models-autoload): load it with POST /models/load", param="model",
                           code="model_not_loaded")
        try:
            await self.pool.acquire(model.id, keep_alive)
        except Exception as exc:  # noqa: BLE001 - whatever stopped the load, the client gets it as a 500
            raise _load_error(model, exc) from None
        if not hold(lambda: self.pool.release(model)):
            self.pool.release(model)  # not inside a request: nothing to hold it for
        assert model.engine is not None
        self._remember(model)
        return ServedModel(model.engine, model.config.settings)

    def _remember(self, model: PoolModel) -> None:
        """Keep the model's /props body, shown while it sleeps (llama-server's cached props)."""
        if self.describe is not None and model.id not in self._described and model.engine is not None:
            try:
                self._described[model.id] = self.describe(ServedModel(model.engine, model.config.settings))
            except Exception:  # noqa: BLE001 - a model that cannot describe itself is woken to answer instead
                pass

    def described(self, requested: str | None) -> dict[str, Any] | None:
        """The /props body of the model `requested` names, with is_sleeping (unloaded), without using the
        model: asking must neither wake it nor keep it awake. None until it was first loaded."""
        model = self._find(requested)
        body = self._described.get(model.id)
        return {**body, "is_sleeping": model.state != LOADED} if body is not None else None

    def props(self) -> dict[str, Any] | None:
        """GET /props without a model: the router's own, as llama-server's router answers it (None for a
        lone model that sleeps when idle: it answers as that model)."""
        if len(self.pool.models) == 1:
            return None
        settings = next(iter(self.pool.models.values())).config.settings if self.pool.models else None
        return {"role": "router", "max_instances": self.pool.max_loaded,
                "models_autoload": settings.models_autoload if settings else True,
                "model_alias": "", "model_path": "", "default_generation_settings": {"params": {}, "n_ctx": 0}}

    def served(self) -> Iterator[ServedModel]:
        for model in self.pool.loaded():
            if model.engine is not None:
                yield ServedModel(model.engine, model.config.settings)

    def cards(self) -> list[dict[str, Any]]:
        return [{**model_card(m.id, m.path, m.size, status=m.state, aliases=m.config.aliases,
                              engine=m.engine if m.state == LOADED else None, idle_s=m.idle_seconds(),
                              error=m.error if m.state == FAILED else None),
                 "source": m.config.source, "can_remove": m.config.source == REMOVABLE}
                for m in self.pool.models.values()]

    def pending(self) -> list[dict[str, Any]]:
        return self.changes.cards()

    async def add(self, name: str) -> None:
        await self.changes.add(name)

    async def remove(self, name: str) -> None:
        await self.changes.remove(name)

    def model_events(self) -> Any:
        return self.changes.events

    def lookup(self, name: str) -> PoolModel | None:
        """The model `name` is the id or an alias of (exactly: not a lone model's any-name)."""
        model_id = self._names.get(name)
        return self.pool.models.get(model_id) if model_id is not None else None

    def adopt(self, model: PoolModel) -> None:
        """Serve a model added while serving (POST /models), by its id and aliases."""
        self.pool.add(model)
        for name in (*model.config.aliases, model.id):
            self._names.setdefault(name, model.id)

    async def forget(self, model_id: str) -> PoolModel:
        """Unload a model once its requests end and stop serving it (DELETE /models)."""
        model = await self.pool.remove(model_id)
        self._names = {name: owner for name, owner in self._names.items() if owner != model_id}
        self._described.pop(model_id, None)
        return model

    async def load(self, model_id: str) -> None:
        model = self._find(model_id)
        try:
            await self.pool.load(model.id)
        except Exception as exc:  # noqa: BLE001
            raise _load_error(model, exc) from None
        if model.state == FAILED:
            raise _load_error(model, model.error)

    async def unload(self, model_id: str) -> None:
        model = self._find(model_id)
        if not await self.pool.unload(model.id):
            raise APIError(400, f"the model {model.id!r} is not loaded", param="model", code="model_not_loaded")

    def engines(self) -> list[tuple[str | None, Engine]]:
        return [(m.id, m.engine) for m in self.pool.loaded() if m.engine is not None]

    def lifetime_stats(self) -> list[tuple[str | None, EngineStats]]:
        """Each model's totals since the server started, its unloaded engines' included (llamacpp:*
        series count on across sleeps, as llama-server's do); a lone model's carry no label."""
        out = []
        for m in self.pool.models.values():
            stats = [s for s in (m.retired, m.engine.stats() if m.engine is not None else None) if s is not None]
            if stats:
                out.append((None if len(self.pool.models) == 1 else m.id, stats[0] if len(stats) == 1
                            else stats[0].plus(stats[1])))
        return out

    def model_series(self) -> list[tuple[str, str, str, list[tuple[str, float]]]]:
        models = self.pool.models.values()
        return [
            ("model_loads_total", "counter", "Times each model was loaded.",
             [(label_pair("model", m.id), m.loads) for m in models]),
            ("model_loaded", "gauge", "Whether each model is loaded (1) or not (0).",
             [(label_pair("model", m.id), int(m.state == LOADED)) for m in models]),
        ]

    def asleep(self) -> bool:
        return self.pool.asleep

    def on_sleep(self, hook: Callable[[], None]) -> None:
        self.pool.on_sleep = hook

    def cancel_all(self, reason: BaseException | None = None) -> None:
        self.changes.events.close()  # /models/sse streams end, so the server can stop
        self.pool.cancel_all(reason)

    def close(self) -> None:
        self.pool.close()

    def _find(self, requested: str | None) -> PoolModel:
        models = self.pool.models
        if requested in self.changes.downloading:
            raise APIError(503, f"the model {requested!r} is still downloading", param="model",
                           code="model_downloading")
        if len(models) == 1:  # one model answers to any name, as a one-model server does
            return next(iter(models.values()))
        model_id = self._names.get(requested or "")
        if model_id is None:
            ids = ", ".join(repr(m) for m in models)
            if requested is None:
                raise APIError(400, f"this server serves several models: name one in `model` ({ids})",
                               param="model", code="model_required")
            raise APIError(404, f"the model {requested!r} is not served here; this server serves {ids}",
                           param="model", code="model_not_found")
        return models[model_id]


def _load_error(model: PoolModel, exc: BaseException | None) -> APIError:
    message = getattr(exc, "message", None) or str(exc)
    return APIError(500, f"the model {model.id!r} could not be loaded: {message}", param="model",
                    code="model_load_failed")
