"""Context flags of every command that loads a model, with llama.cpp's names: RoPE and YaRN scaling
(`--rope-scaling`, `--rope-scale`, `--rope-freq-base`, `--rope-freq-scale`, `--yarn-*`); and complete's
`--context-shift` and `--keep` (the prompt tokens a shift keeps), which `sampling.shift_options()` adds.
(`-tb/--threads-batch` is main's, in options/hardware/cpu.py.)

`CONTEXT_PARAMS` join the load flags (load.py); `context_settings(kwargs)` pops their values and
returns the `LoadSettings` fields they set.
"""

from __future__ import annotations

import inspect
import math
from typing import Annotated, Any

import typer

from ..core.model.settings import INT32_MAX, ROPE_SCALING_TYPES
from ..errors import UsageError

CONTEXT_PANEL = "Context"

RopeScalingOpt = Annotated[str | None, typer.Option(
    "--rope-scaling", metavar="{none,linear,yarn}", help="RoPE frequency scaling method (default: the model's, "
    "else linear).", rich_help_panel=CONTEXT_PANEL, show_default=False)]
RopeScaleOpt = Annotated[float | None, typer.Option(
    "--rope-scale", metavar="N", help="RoPE context scaling factor: expands the context by N (sets "
    "--rope-freq-scale to 1/N).", rich_help_panel=CONTEXT_PANEL, show_default=False)]
RopeFreqBaseOpt = Annotated[float, typer.Option(
    "--rope-freq-base", metavar="N", help="RoPE base frequency (0 = the model's).", rich_help_panel=CONTEXT_PANEL)]
RopeFreqScaleOpt = Annotated[float, typer.Option(
    "--rope-freq-scale", metavar="N", help="RoPE frequency scaling factor: expands the context by 1/N "
    "(0 = the model's).", rich_help_panel=CONTEXT_PANEL)]
YarnOrigCtxOpt = Annotated[int, typer.Option(
    "--yarn-orig-ctx", metavar="N", min=0, max=INT32_MAX, help="YaRN: the model's original context size "
    "(0 = its training context).", rich_help_panel=CONTEXT_PANEL)]
YarnExtFactorOpt = Annotated[float, typer.Option(
    "--yarn-ext-factor", metavar="N", help="YaRN: extrapolation mix factor (0.0 = full interpolation, "
    "-1 = the model's).", rich_help_panel=CONTEXT_PANEL)]
YarnAttnFactorOpt = Annotated[float, typer.Option(
    "--yarn-attn-factor", metavar="N", help="YaRN: attention magnitude scale (-1 = the model's).",
    rich_help_panel=CONTEXT_PANEL)]
YarnBetaSlowOpt = Annotated[float, typer.Option(
    "--yarn-beta-slow", metavar="N", help="YaRN: high correction dim or alpha (-1 = the model's).",
    rich_help_panel=CONTEXT_PANEL)]
YarnBetaFastOpt = Annotated[float, typer.Option(
    "--yarn-beta-fast", metavar="N", help="YaRN: low correction dim or beta (-1 = the model's).",
    rich_help_panel=CONTEXT_PANEL)]
ContextShiftOpt = Annotated[bool, typer.Option(
    "--context-shift/--no-context-shift", help="When the context is full, keep the first --keep prompt tokens, "
    "drop half of the rest and go on generating (llama.cpp's context shift).", rich_help_panel=CONTEXT_PANEL)]
KeepOpt = Annotated[int, typer.Option(
    "--keep", metavar="N", help="Prompt tokens a context shift keeps, after BOS (-1 = the whole prompt; "
    "needs --context-shift).", rich_help_panel=CONTEXT_PANEL)]


def _param(name: str, annotation: Any, default: Any) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)


CONTEXT_PARAMS = [
    _param("rope_scaling", RopeScalingOpt, None),
    _param("rope_scale", RopeScaleOpt, None),
    _param("rope_freq_base", RopeFreqBaseOpt, 0.0),
    _param("rope_freq_scale", RopeFreqScaleOpt, 0.0),
    _param("yarn_orig_ctx", YarnOrigCtxOpt, 0),
    _param("yarn_ext_factor", YarnExtFactorOpt, -1.0),
    _param("yarn_attn_factor", YarnAttnFactorOpt, -1.0),
    _param("yarn_beta_slow", YarnBetaSlowOpt, -1.0),
    _param("yarn_beta_fast", YarnBetaFastOpt, -1.0),
]
_FLOATS = ("rope_freq_base", "rope_freq_scale", "yarn_ext_factor", "yarn_attn_factor", "yarn_beta_slow",
           "yarn_beta_fast")


def context_settings(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Pop the context flags out of a command's keyword arguments, as LoadSettings fields."""
    values = {p.name: kwargs.pop(p.name) for p in CONTEXT_PARAMS}
    for name in (*_FLOATS, "rope_scale"):
        if values[name] is not None and not math.isfinite(values[name]):
            raise UsageError(f"--{name.replace('_', '-')} {values[name]}: not a finite number", hint="give a number")
    scaling = values.pop("rope_scaling")
    if scaling is not None and scaling not in ROPE_SCALING_TYPES:
        raise UsageError(f"--rope-scaling {scaling!r} is not a RoPE scaling method",
                         hint=f"allowed values: {', '.join(ROPE_SCALING_TYPES)}")
    scale = values.pop("rope_scale")
    if scale is not None:
        if scale <= 0:
            raise UsageError(f"--rope-scale {scale:g}: must be above 0", hint="e.g. --rope-scale 2 doubles the context")
        values["rope_freq_scale"] = 1.0 / scale  # llama.cpp: the later of --rope-scale and --rope-freq-scale wins
    return {"rope_scaling": scaling, **values}


def check_keep(keep: int) -> int:
    """--keep as llama.cpp takes it: -1 (the whole prompt) or a count."""
    if not -1 <= keep <= INT32_MAX:
        raise UsageError(f"--keep {keep}: must be -1 (the whole prompt) or 0 or more",
                         hint="the number of prompt tokens a context shift keeps")
    return keep
