"""The values `/set NAME VALUE` takes in chat: every sampling parameter a user may set, its aliases
(llama.cpp's and ollama's spellings), its type and range, as the command-line flags check them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.model.settings import INT32_MAX, UINT32_MAX
from ..errors import InputError
from .chain_values import CHAIN_VALUE_PARSERS


@dataclass(frozen=True)
class _Param:
    kind: type
    low: float | None = None
    high: float | None = None


# Every SamplingSettings field a user may set, with llama.cpp/ollama spellings as aliases. The limits
# are the command-line flags': integers also fit the C fields llama.cpp keeps them in.
PARAMS: dict[str, _Param] = {
    "temperature": _Param(float, 0), "top_k": _Param(int, 0, INT32_MAX), "top_p": _Param(float, 0, 1),
    "min_p": _Param(float, 0, 1), "typical_p": _Param(float, 0, 1), "repeat_penalty": _Param(float, 0),
    "repeat_last_n": _Param(int, -1, INT32_MAX), "presence_penalty": _Param(float),
    "frequency_penalty": _Param(float), "mirostat": _Param(int, 0, 2), "mirostat_lr": _Param(float, 0),
    "mirostat_ent": _Param(float, 0), "seed": _Param(int, -1, UINT32_MAX), "ignore_eos": _Param(bool),
    "logit_bias": _Param(str), "grammar": _Param(str), "max_tokens": _Param(int, -1, INT32_MAX),
    "stop": _Param(str),
    # llama.cpp's newer samplers and the chain's order (llama-server's names and limits)
    "dry_multiplier": _Param(float), "dry_base": _Param(float, 1), "dry_allowed_length": _Param(int, 0, INT32_MAX),
    "dry_penalty_last_n": _Param(int, 0, INT32_MAX), "dry_sequence_breakers": _Param(str),
    "xtc_probability": _Param(float, 0, 1), "xtc_threshold": _Param(float, 0, 1), "top_n_sigma": _Param(float),
    "dynatemp_range": _Param(float), "dynatemp_exponent": _Param(float), "adaptive_target": _Param(float, None, 1),
    "adaptive_decay": _Param(float, 0, 0.99), "samplers": _Param(str),
}
PARAM_ALIASES = {"temp": "temperature", "typical": "typical_p", "n": "max_tokens", "n_predict": "max_tokens",
                 "num_predict": "max_tokens", "mirostat_eta": "mirostat_lr", "mirostat_tau": "mirostat_ent",
                 "reverse_prompt": "stop", "dynatemp_exp": "dynatemp_exponent", "top_nsigma": "top_n_sigma",
                 "dry_sequence_breaker": "dry_sequence_breakers", "sampler_seq": "samplers"}
_TRUE, _FALSE = {"1", "true", "on", "yes"}, {"0", "false", "off", "no"}
_NONE = {"none", "off", "-", ""}


def parse_param(name: str, value: str) -> tuple[str, Any]:
    """The canonical parameter name and the typed value of `/set NAME VALUE`.

    Raises:
        InputError: an unknown name or a value of the wrong type or out of range.
    """
    key = name.lower().replace("-", "_")
    key = PARAM_ALIASES.get(key, key)
    spec = PARAMS.get(key)
    if spec is None:
        raise InputError(f"unknown parameter {name!r}", hint="parameters: " + ", ".join(PARAMS))
    if key == "logit_bias":
        return key, _parse_logit_bias(value)
    if key == "grammar":
        return key, _parse_grammar(value)
    if key == "stop":
        return key, () if value.lower() in _NONE else (value,)
    if key in CHAIN_VALUE_PARSERS:
        return key, CHAIN_VALUE_PARSERS[key](value)
    try:
        typed = _convert(value, spec.kind)
    except ValueError:
        wanted = {bool: "true or false", int: "a whole number"}.get(spec.kind, "a number")
        raise InputError(f"{key} needs {wanted}, not {value!r}") from None
    if spec.kind is float and not math.isfinite(typed):  # nan passes every range check
        raise InputError(f"{key} needs a finite number, not {value}")
    if (spec.low is not None and typed < spec.low) or (spec.high is not None and typed > spec.high):
        raise InputError(f"{key} must be {_span(spec)}, not {value}")
    return key, _seed_as_the_flag_reads_it(typed) if key == "seed" else typed


def _span(spec: _Param) -> str:
    if spec.high is None:
        return f"at least {spec.low:g}"
    if spec.low is None:
        return f"at most {spec.high:g}"
    return f"between {spec.low:g} and {spec.high}" if spec.kind is int else f"between {spec.low:g} and {spec.high:g}"


def _convert(value: str, kind: type) -> Any:
    if kind is bool:
        if value.lower() in _TRUE | _FALSE:
            return value.lower() in _TRUE
        raise ValueError(value)
    if kind is int:
        return int(value)
    return float(value)


def _seed_as_the_flag_reads_it(seed: int) -> int:
    from ..options.sampling import random_if_default

    return random_if_default(seed)


def _parse_logit_bias(value: str) -> tuple[tuple[int, float], ...]:
    from ..options.sampling import parse_logit_bias

    if value.lower() in _NONE:
        return ()
    return parse_logit_bias(value.replace(",", " ").split(), "/set logit_bias")  # shown like any failed command


def _parse_grammar(value: str) -> str | None:
    from ..core.constrain.grammar import resolve_grammar

    if value.lower() in _NONE:
        return None
    path = Path(value).expanduser()
    return resolve_grammar(grammar_file=path) if path.is_file() else resolve_grammar(grammar=value)
