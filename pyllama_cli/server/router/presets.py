"""`--models-preset FILE`: per-model settings in llama-server's INI format.

    version = 1
    [*]                 ; every model
    c = 8192
    [qwen2.5-0.5b-instruct-q4_k_m]   ; one model, by id
    alias = qwen, small
    temp = 0.2
    [custom]            ; a model of its own: needs `model = PATH`
    model = /models/custom.gguf

Keys are the serve flags without dashes (long or short form, or llama-server's LLAMA_ARG_ names for
the main ones). A model's section wins over `[*]`, and a flag given on the command line wins over
both. Any mistake is one error naming the file's line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...core.model.adapters import AdapterFile, AdapterSettings
from ...core.model.settings import KV_CACHE_TYPES
from ...errors import UsageError

def preset_loras(value: str) -> AdapterSettings:
    """`lora = a.gguf, b.gguf`: the model's LoRA adapters at scale 1 (paths relative to the working folder)."""
    return AdapterSettings(loras=tuple(AdapterFile(Path(item.strip()).expanduser().resolve())
                                       for item in value.split(",") if item.strip()))


# key (every spelling) -> (setting, type). Settings: LoadSettings fields, `parallel`, sampling fields
# (SamplingSettings), the server's own (`n_predict`, `chat_template`, `aliases`) and `model`, `load_on_startup`.
_KEYS: dict[tuple[str, ...], tuple[str, type]] = {
    ("c", "ctx-size", "LLAMA_ARG_CTX_SIZE"): ("n_ctx", int),
    ("np", "parallel", "LLAMA_ARG_N_PARALLEL"): ("parallel", int),
    ("t", "threads", "LLAMA_ARG_THREADS"): ("n_threads", int),
    ("ngl", "n-gpu-layers", "gpu-layers", "LLAMA_ARG_N_GPU_LAYERS"): ("n_gpu_layers", int),
    ("b", "batch-size", "LLAMA_ARG_BATCH"): ("n_batch", int),
    ("ub", "ubatch-size", "LLAMA_ARG_UBATCH"): ("n_ubatch", int),
    ("fa", "flash-attn", "LLAMA_ARG_FLASH_ATTN"): ("flash_attn", str),
    ("chat-template", "LLAMA_ARG_CHAT_TEMPLATE"): ("chat_template", str),
    ("a", "alias", "LLAMA_ARG_ALIAS"): ("aliases", tuple),
    ("n", "n-predict", "predict", "LLAMA_ARG_N_PREDICT"): ("n_predict", int),
    ("temp", "temperature"): ("temperature", float),
    ("top-k",): ("top_k", int),
    ("top-p",): ("top_p", float),
    ("min-p",): ("min_p", float),
    ("typical", "typical-p"): ("typical_p", float),
    ("repeat-penalty",): ("repeat_penalty", float),
    ("repeat-last-n",): ("repeat_last_n", int),
    ("presence-penalty",): ("presence_penalty", float),
    ("frequency-penalty",): ("frequency_penalty", float),
    ("s", "seed"): ("seed", int),
    ("m", "model", "LLAMA_ARG_MODEL"): ("model", Path),
    ("load-on-startup",): ("load_on_startup", bool),
    ("lora", "LLAMA_ARG_LORA"): ("adapters", preset_loras),
    ("mm", "mmproj", "LLAMA_ARG_MMPROJ"): ("mmproj", Path),  # the model's projector (docs/multimodal.md)
    # KV cache types and llama.cpp's newer samplers
    ("ctk", "cache-type-k", "LLAMA_ARG_CACHE_TYPE_K"): ("cache_type_k", str),
    ("ctv", "cache-type-v", "LLAMA_ARG_CACHE_TYPE_V"): ("cache_type_v", str),
    ("dry-multiplier",): ("dry_multiplier", float),
    ("dry-base",): ("dry_base", float),
    ("dry-allowed-length",): ("dry_allowed_length", int),
    ("dry-penalty-last-n",): ("dry_penalty_last_n", int),
    ("xtc-probability",): ("xtc_probability", float),
    ("xtc-threshold",): ("xtc_threshold", float),
    ("top-n-sigma", "top-nsigma"): ("top_n_sigma", float),
    ("dynatemp-range",): ("dynatemp_range", float),
    ("dynatemp-exp",): ("dynatemp_exponent", float),
}
# Settings that take one of a few names, checked when the file is read (a bad one would fail at load).
_CHOICES = {"cache_type_k": KV_CACHE_TYPES, "cache_type_v": KV_CACHE_TYPES}
KEYS = {spelling: target for spellings, target in _KEYS.items() for spelling in spellings}
# The command-line parameter each setting comes from, for "a flag given on the command line wins".
CLI_PARAMS = {"n_ctx": "ctx_size", "parallel": "parallel", "n_threads": "threads", "n_gpu_layers": "n_gpu_layers",
              "n_batch": "batch_size", "n_ubatch": "ubatch_size", "flash_attn": "flash_attn",
              "chat_template": "chat_template", "n_predict": "n_predict", "temperature": "temp", "top_k": "top_k",
              "top_p": "top_p", "min_p": "min_p", "typical_p": "typical", "repeat_penalty": "repeat_penalty",
              "repeat_last_n": "repeat_last_n", "presence_penalty": "presence_penalty",
              "frequency_penalty": "frequency_penalty", "seed": "seed", "cache_type_k": "cache_type_k",
              "cache_type_v": "cache_type_v", "dry_multiplier": "dry_multiplier", "dry_base": "dry_base",
              "dry_allowed_length": "dry_allowed_length", "dry_penalty_last_n": "dry_penalty_last_n",
              "xtc_probability": "xtc_probability", "xtc_threshold": "xtc_threshold", "top_n_sigma": "top_n_sigma",
              "dynatemp_range": "dynatemp_range", "dynatemp_exponent": "dynatemp_exp", "adapters": "lora"}
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


@dataclass
class Section:
    """One `[name]` of the file: its settings, and the line of each key (for later errors)."""

    name: str
    line: int
    values: dict[str, Any] = field(default_factory=dict)


@dataclass
class Presets:
    path: Path
    every: Section  # [*]
    models: dict[str, Section]  # by section name

    def settings_for(self, model_id: str) -> dict[str, Any]:
        """`[*]`'s settings with the model's own section's on top."""
        own = self.models.get(model_id)
        return {**self.every.values, **(own.values if own else {})}

    def check_known(self, ids: set[str]) -> None:
        """A section must name a served model, or give a `model = PATH` of its own."""
        for section in self.models.values():
            if section.name not in ids and "model" not in section.values:
                known = ", ".join(sorted(ids)) or "none"
                raise UsageError(f"{self.path}:{section.line}: [{section.name}] names no model this server has "
                                 f"(its ids: {known})", hint="name a section by model id, or give it `model = PATH`")


def load_presets(path: Path) -> Presets:
    """Parse a presets file.

    Raises:
        UsageError: the file cannot be read, or a line is wrong (the error names it).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read --models-preset {path}: {getattr(exc, 'strerror', None) or exc}") from None
    every = Section("*", 0)
    models: dict[str, Section] = {}
    current: Section | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] in ";#":
            continue
        where = f"{path}:{number}"
        if line.startswith("["):
            current = _section(line, where, number, every, models)
            continue
        key, sep, value = line.partition("=")
        key, value = key.strip(), _unquote(value.strip())
        if not sep or not key:
            raise UsageError(f"{where}: {raw.strip()!r} is neither [section] nor key = value")
        if current is None:
            if key == "version":
                continue
            raise UsageError(f"{where}: {key!r} comes before any [section]", hint="put it under [*] for every model")
        setting, kind = _setting(key, where)
        current.values[setting] = _convert(value, kind, key, where)
        if setting in _CHOICES and value not in _CHOICES[setting]:
            raise UsageError(f"{where}: {key} = {value!r} is not one of {', '.join(_CHOICES[setting])}")
    return Presets(path, every, models)


def _section(line: str, where: str, number: int, every: Section, models: dict[str, Section]) -> Section:
    if not line.endswith("]") or not line[1:-1].strip():
        raise UsageError(f"{where}: {line!r} is not a [section] header")
    name = line[1:-1].strip()
    if name == "*":
        return every
    if name in models:
        raise UsageError(f"{where}: [{name}] appears twice (first on line {models[name].line})")
    models[name] = Section(name, number)
    return models[name]


def _setting(key: str, where: str) -> tuple[str, type]:
    found = KEYS.get(key) or KEYS.get(key.lstrip("-"))
    if found is None:
        raise UsageError(f"{where}: unknown key {key!r}",
                         hint="keys are serve's flags without dashes: c, np, chat-template, alias, temp, top-k, "
                              "top-p, min-p, n-predict, ngl, t, model, ...")
    return found


def _convert(value: str, kind: type, key: str, where: str) -> Any:
    try:
        if kind is bool:
            if value.lower() not in _TRUE | _FALSE:
                raise ValueError
            return value.lower() in _TRUE
        if kind is tuple:
            return tuple(name.strip() for name in value.split(",") if name.strip())
        if kind is Path:  # relative to the server's working folder, as llama-server takes it
            return Path(value).expanduser().resolve()
        return kind(value)
    except ValueError:
        wanted = {int: "a whole number", float: "a number", bool: "true or false"}.get(kind, "a value")
        raise UsageError(f"{where}: {key} = {value!r} is not {wanted}") from None


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value

