"""/set values of llama.cpp's newer samplers that are not plain numbers: DRY's sequence breakers (a JSON
array of strings, as llama-server takes them) and the chain's order (names, or --sampler-seq letters)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import InputError, UsageError


def parse_breakers(value: str) -> tuple[str, ...]:
    """A JSON array of strings, as llama-server's dry_sequence_breakers (e.g. ["\\n", ":"]); [] for none."""
    import json

    try:
        breakers = json.loads(value)
    except ValueError:
        breakers = None
    if not isinstance(breakers, list) or not all(isinstance(b, str) for b in breakers):
        raise InputError(f"dry_sequence_breakers needs a JSON array of strings, not {value!r}",
                         hint='for example /set dry_sequence_breakers ["\\n", ":", "*"]')
    return tuple(breakers)


def parse_samplers(value: str) -> tuple[str, ...]:
    """Names separated by ';' (top_k;temperature), or --sampler-seq's letters (kt)."""
    from ..core.generate.sampler_names import SAMPLER_ALIASES, samplers_from_letters, samplers_from_text

    try:
        if ";" in value or value.strip().lower() in SAMPLER_ALIASES:
            return samplers_from_text(value, "samplers")
        return samplers_from_letters(value.strip(), "samplers")
    except UsageError as exc:
        raise InputError(exc.message, hint=exc.hint) from None


CHAIN_VALUE_PARSERS: dict[str, Callable[[str], Any]] = {"dry_sequence_breakers": parse_breakers,
                                                        "samplers": parse_samplers}
