"""The models a server answers for: which engine, with which settings, a request's `model` names.

Routes never hold an engine of their own: they ask the app's `ModelSet` with the request's `model`
field and get a `ServedModel` (the engine and that model's settings: id, sampling defaults, chat
template). `OneModel` is a server of one model, which answers to any name, as llama-server does (the
OpenAI client sends names such as "gpt-4o-mini"); a server of several models chooses by name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass

from ..core.serving.engine import Engine
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

    @abstractmethod
    def start(self) -> None:
        """Begin whatever loading happens at startup (returns at once)."""

    @abstractmethod
    async def get(self, requested: str | None) -> ServedModel:
        """The model a request names (None: the default one), ready to take jobs or loading.

        Raises:
            APIError: 404 for a name this server does not serve.
        """

    @abstractmethod
    def served(self) -> Iterator[ServedModel]:
        """Every model, for listings (/v1/models, /metrics)."""

    @abstractmethod
    def cancel_all(self) -> None:
        """Stop every running and queued job of every model (a server shutting down)."""

    @abstractmethod
    def close(self) -> None:
        """Stop and free every model."""


class OneModel(ModelSet):
    """A server of one model: every `model` name reaches it, and answers name its real id."""

    def __init__(self, engine: Engine, settings: ServerSettings):
        self.model = ServedModel(engine, settings)

    def start(self) -> None:
        self.model.engine.start()

    async def get(self, requested: str | None) -> ServedModel:
        return self.model

    def served(self) -> Iterator[ServedModel]:
        yield self.model

    def cancel_all(self) -> None:
        self.model.engine.cancel_all()

    def close(self) -> None:
        self.model.engine.close()
