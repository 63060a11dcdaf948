"""ollama's model names onto the models this server serves.

ollama clients send names such as `llama3.2:3b`, `tiny:latest` or `hf.co/user/repo:Q4_K_M`. A server of
one model answers to any name, as on the OpenAI routes. In router mode a name is a model id or an alias
(a `:latest` tag is dropped), a copy made by /api/copy, or `hf.co/user/repo[:QUANT]`, which names the
model that `-hf user/repo[:QUANT]` would: the GGUF of that repo and quant in the Hugging Face cache.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...core.store.catalog import quant_in_name
from ..errors import APIError
from ..model_set import ModelSet, ServedModel

HF_PREFIXES = ("hf.co/", "huggingface.co/")
PREFERRED_QUANT = "Q4_K_M"  # what -hf picks when the name has no quant


def not_found(name: str) -> APIError:
    return APIError(404, f'model "{name}" not found, try pulling it first', code="model_not_found")


def hf_spec(name: str) -> str | None:
    """`hf.co/user/repo:QUANT` as the -hf spec `user/repo:QUANT` (None for another kind of name)."""
    for prefix in HF_PREFIXES:
        if name.lower().startswith(prefix):
            spec = name[len(prefix):]
            return spec[: -len(":latest")] if spec.endswith(":latest") else spec
    return None


class Names:
    """The names a server's ollama routes answer to, copies (/api/copy) included."""

    def __init__(self, models: ModelSet):
        self.models = models
        self.copies: dict[str, str] = {}  # a copy's name -> the name it copies

    async def get(self, name: str, keep_alive: float | None = None) -> ServedModel:
        """The model `name` names, as `ModelSet.get` gives it (loaded in router mode).

        Raises:
            APIError: 400 with no name, 404 (ollama's text) for a name this server does not serve.
        """
        return await self.models.get(self.model_id(name), keep_alive)

    def model_id(self, name: str) -> str:
        if not name:
            raise APIError(400, "model is required", param="model")
        name = self.copies.get(name, name)
        cards = self.models.cards()
        if not self.models.router or len(cards) == 1:
            return cards[0]["id"] if cards else name
        card = self.card(name, cards)
        if card is None:
            raise not_found(name)
        return card["id"]

    def card(self, name: str, cards: list[dict[str, Any]] | None = None) -> dict[str, Any] | None:
        """The /v1/models card of the model `name` names (any name with one model), or None."""
        name = self.copies.get(name, name)
        cards = self.models.cards() if cards is None else cards
        if len(cards) == 1 and not self.models.router:
            return cards[0]
        bare = name[: -len(":latest")] if name.endswith(":latest") else name
        for card in cards:
            if bare in (card["id"], *card.get("aliases", ())) or name in card.get("aliases", ()):
                return card
        spec = hf_spec(name)
        if spec is not None:
            return hf_card(spec, cards)
        return cards[0] if len(cards) == 1 else None


def hf_card(spec: str, cards: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The card of the model whose file `-hf spec` names in the Hugging Face cache, if one is served."""
    repo, _, quant = spec.partition(":")
    folder = "models--" + repo.replace("/", "--")
    in_repo = [c for c in cards if folder.lower() in str(c.get("path", "")).lower()]
    if quant:
        return next((c for c in in_repo if (quant_in_name(Path(c["path"]).name) or "").upper() == quant.upper()),
                    None)
    preferred = [c for c in in_repo if quant_in_name(Path(c["path"]).name) == PREFERRED_QUANT]
    return (preferred or in_repo or [None])[0]
