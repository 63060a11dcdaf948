"""The models a server answers for: which engine, with which settings, a request's `model` names.

Routes never hold an engine of their own: they ask the app's `ModelSet` with the request's `model`
field and get a `ServedModel` (the engine and that model's settings: id, sampling defaults, chat
template). `OneModel` is a server of one model, which answers to any name, as llama-server does (the
OpenAI client sends names such as "gpt-4o-mini"); a server of several models chooses by name.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.serving.engine import BROKEN, CLOSED, FAILED, READY, Engine
from ..core.serving.jobs import EngineStats
from .cards import model_card
from .errors import APIError
from .http.access_log import note_model
from .http.leases import hold
from .settings import ServerSettings


@dataclass(frozen=True)
class ServedModel:
    """One model as requests see it: its engine and its settings."""

    engine: Engine
    settings: ServerSettings

    @property
    def id(self) -> str:
        return self.settings.alias


class ModelSet(ABC):
    """Every model one server answers for."""

    router = False  # whether requests choose among several models

    @abstractmethod
    def start(self) -> None:
        """Begin whatever loading happens at startup (returns at once)."""

    async def named(self, request: Any, name: str | None = None) -> ServedModel:
        """The model a request names: `name` (its body's `model` field), else its `?model=` (routes with no
        body), else the default one."""
        return await self.get(name if name is not None else request.query_params.get("model"))

    @abstractmethod
    async def get(self, requested: str | None, keep_alive: float | None = None) -> ServedModel:
        """The model a request names (None: the default one), ready to take jobs or loading; it is the
        request's until its answer is sent. `keep_alive` (seconds) is how long it stays loaded after.

        Raises:
            APIError: 404 for a name this server does not serve.
        """

    @abstractmethod
    def cards(self) -> list[dict[str, Any]]:
        """Every model's entry in /v1/models (see cards.py)."""

    @abstractmethod
    async def load(self, model_id: str) -> None:
        """POST /models/load: load the model now (waits until loaded)."""

    @abstractmethod
    async def unload(self, model_id: str) -> None:
        """POST /models/unload: unload the model (once its running requests end)."""

    def pending(self) -> list[dict[str, Any]]:
        """/v1/models' entries of models not served yet (a router's downloads: status `downloading`)."""
        return []

    async def add(self, name: str) -> None:
        """POST /models: download a model from the Hugging Face Hub and serve it (router mode)."""
        raise _not_router("add models")

    async def remove(self, name: str) -> None:
        """DELETE /models: stop serving a model and delete its downloaded files (router mode)."""
        raise _not_router("remove models")

    def model_events(self) -> Any:
        """GET /models/sse: the router's ModelEvents (router/changes.py)."""
        raise _not_router("stream model events")

    def engines(self) -> list[tuple[str | None, Engine]]:
        """The loaded engines for /metrics, each with its model label (None: no label, one model)."""
        return [(None, served.engine) for served in self.served()]

    def lifetime_stats(self) -> list[tuple[str | None, EngineStats]]:
        """Each model's totals since the server started (llamacpp:* series), with its label as engines()."""
        return [(label, engine.stats()) for label, engine in self.engines()]

    def model_series(self) -> list[tuple[str, str, str, list[tuple[str, float]]]]:
        """Extra /metrics series about the models themselves: (name, type, help, samples)."""
        return []

    def asleep(self) -> bool:
        """Whether every model is unloaded for idleness (--sleep-idle-seconds): llama-server's sleep."""
        return False

    def on_sleep(self, hook: Callable[[], None]) -> None:
        """Run `hook` as the server falls asleep, just before its last model unloads (a server that never
        sleeps never runs it)."""
        del hook

    @abstractmethod
    def served(self) -> Iterator[ServedModel]:
        """Every model, for listings (/v1/models, /metrics)."""

    @abstractmethod
    def cancel_all(self, reason: BaseException | None = None) -> None:
        """Stop every running and queued job of every model (a server shutting down: `reason`)."""

    @abstractmethod
    def close(self) -> None:
        """Stop and free every model."""


class OneModel(ModelSet):
    """A server of one model: every `model` name reaches it, and answers name its real id."""

    def __init__(self, engine: Engine, settings: ServerSettings):
        self.model = ServedModel(engine, settings)
        self._requests = 0
        self._last_used = time.monotonic()

    def start(self) -> None:
        self.model.engine.start()

    async def get(self, requested: str | None, keep_alive: float | None = None) -> ServedModel:
        note_model(self.model.id)
        if hold(self._release):
            self._requests += 1
        return self.model

    def _release(self) -> None:
        self._requests -= 1
        self._last_used = time.monotonic()

    def served(self) -> Iterator[ServedModel]:
        yield self.model

    def cards(self) -> list[dict[str, Any]]:
        engine = self.model.engine
        status = {READY: "loaded", FAILED: "failed", BROKEN: "failed", CLOSED: "unloaded"}.get(engine.state, "loading")
        idle = 0.0 if self._requests else time.monotonic() - self._last_used
        settings = self.model.settings
        return [model_card(self.model.id, engine.path, file_size(engine.path), status=status, engine=engine,
                           aliases=settings.aliases, tags=settings.tags,
                           idle_s=idle, error=engine.error if status == "failed" else None)]

    async def load(self, model_id: str) -> None:
        engine = self.model.engine
        if engine.state in (FAILED, BROKEN):
            message = getattr(engine.error, "message", None) or str(engine.error)
            raise APIError(500, f"the model failed to load: {message}", code="model_load_failed")

    async def unload(self, model_id: str) -> None:
        raise APIError(400, "this server serves one model; stop the server instead", code="not_router")

    def cancel_all(self, reason: BaseException | None = None) -> None:
        self.model.engine.cancel_all(reason)

    def close(self) -> None:
        self.model.engine.close()


def file_size(path: Path) -> int:
    """A model's bytes on disk, every part of a split model included."""
    from ..core.store.catalog import split_part_names

    parts = [path.with_name(name) for name in split_part_names(path.name)]
    return sum(p.stat().st_size for p in parts if p.exists())


def _not_router(what: str) -> APIError:
    return APIError(400, f"this server serves one model and cannot {what}: start it in router mode "
                    "(several models, --models-dir, or no model at all)", code="not_router")
