"""Weight placement flags of every command that loads a model, with llama.cpp's names:
`-ot/--override-tensor PATTERN=BUFTYPE,...`, `-cmoe/--cpu-moe`, `-ncmoe/--n-cpu-moe N`,
`-sm/--split-mode`, `-mg/--main-gpu`; and the memory fit flags, `-fit/--fit on|off`,
`-fitt/--fit-target MiB,...`, `-fitc/--fit-ctx N` (with -c unset, the context is reduced from the trained one
until the projected memory leaves the -fitt margin free: core/model/fit.py).

`PLACEMENT_PARAMS` and `FIT_PARAMS` join the load flags (load.py); `placement_settings(kwargs)` and
`fit_settings(kwargs)` pop their values and return the `LoadSettings` fields they set. Buffer type names are checked when the model loads,
against the devices there are then (RPC servers' included).
"""

from __future__ import annotations

import inspect
from typing import Annotated, Any

import typer

from ...core.model.sizing.fit import DEFAULT_FIT_CTX, DEFAULT_FIT_TARGET_MIB, parse_fit_target
from ...core.model.settings import INT32_MAX, SPLIT_MODES, parse_overrides
from ...errors import UsageError

PLACEMENT_PANEL = "Devices"

OverrideTensorOpt = Annotated[list[str] | None, typer.Option(
    "-ot", "--override-tensor", metavar="PATTERN=BUFTYPE,...", help="Put the weights whose name matches PATTERN "
    "(a regular expression) in buffer type BUFTYPE (CPU, CUDA0, ...), e.g. -ot 'exps=CPU'. Repeatable.",
    rich_help_panel=PLACEMENT_PANEL, show_default=False)]
CpuMoeOpt = Annotated[bool, typer.Option(
    "-cmoe", "--cpu-moe", help="Keep every Mixture-of-Experts expert weight in the CPU.", rich_help_panel=PLACEMENT_PANEL)]
NCpuMoeOpt = Annotated[int, typer.Option(
    "-ncmoe", "--n-cpu-moe", metavar="N", help="Keep the expert weights of the first N layers in the CPU.",
    rich_help_panel=PLACEMENT_PANEL)]
SplitModeOpt = Annotated[str | None, typer.Option(
    "-sm", "--split-mode", metavar="{none,layer,row,tensor}", help="How to split the model across GPUs: none (one "
    "GPU), layer (default), row, tensor.", rich_help_panel=PLACEMENT_PANEL, show_default=False)]
MainGpuOpt = Annotated[int | None, typer.Option(
    "-mg", "--main-gpu", metavar="INDEX", help="The GPU for the whole model with -sm none, or for intermediate "
    "results and the KV cache with -sm row (default: 0).", rich_help_panel=PLACEMENT_PANEL, show_default=False)]


def _param(name: str, annotation: Any, default: Any) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)


PLACEMENT_PARAMS = [
    _param("override_tensor", OverrideTensorOpt, None),
    _param("cpu_moe", CpuMoeOpt, False),
    _param("n_cpu_moe", NCpuMoeOpt, 0),
    _param("split_mode", SplitModeOpt, None),
    _param("main_gpu", MainGpuOpt, None),
]


# bench's, as llama-bench's: configurations separated by commas (a sweep), the overrides of one by ';'.
BenchOverrideTensorOpt = Annotated[list[str] | None, typer.Option(
    "-ot", "--override-tensor", metavar="PATTERN=BUFTYPE;...,...", help="Tensor buffer overrides: PATTERN=BUFTYPE "
    "items separated by ';' per configuration, configurations separated by commas (an empty one: none).",
    rich_help_panel=PLACEMENT_PANEL, show_default=False)]


def placement_settings(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Pop the placement flags out of a command's keyword arguments, as LoadSettings fields."""
    split_mode, n_cpu_moe, main_gpu = kwargs.pop("split_mode"), kwargs.pop("n_cpu_moe"), kwargs.pop("main_gpu")
    if split_mode is not None and split_mode not in SPLIT_MODES:
        raise UsageError(f"-sm {split_mode!r} is not a split mode", hint=f"allowed values: {', '.join(SPLIT_MODES)}")
    if not 0 <= n_cpu_moe <= INT32_MAX:
        raise UsageError(f"--n-cpu-moe {n_cpu_moe}: must be 0 or more", hint="the number of layers whose experts stay "
                         "in the CPU")
    if main_gpu is not None and not 0 <= main_gpu <= INT32_MAX:
        raise UsageError(f"-mg {main_gpu}: must be a GPU index, 0 or more")
    return {"tensor_overrides": parse_overrides(kwargs.pop("override_tensor")), "cpu_moe": kwargs.pop("cpu_moe"),
            "n_cpu_moe": n_cpu_moe, "split_mode": split_mode, "main_gpu": main_gpu}


FIT_PANEL = "Memory fit"
ON_OFF = ("on", "off")

FitOpt = Annotated[str, typer.Option(
    "-fit", "--fit", metavar="[on|off]", help="Whether to adjust unset arguments (the context size, -c 0) to fit "
    "in memory.", rich_help_panel=FIT_PANEL, autocompletion=lambda: list(ON_OFF))]
FitTargetOpt = Annotated[str, typer.Option(
    "-fitt", "--fit-target", metavar="MiB0,MiB1,...", help="Memory to leave free per device for --fit, in MiB "
    "(one value is used for all; with no GPU, the host's total memory is the budget).", rich_help_panel=FIT_PANEL)]
FitCtxOpt = Annotated[int, typer.Option(
    "-fitc", "--fit-ctx", metavar="N", help="The smallest context size --fit may choose.", rich_help_panel=FIT_PANEL)]


FIT_PARAMS = [
    _param("fit", FitOpt, "on"),
    _param("fit_target", FitTargetOpt, str(DEFAULT_FIT_TARGET_MIB)),
    _param("fit_ctx", FitCtxOpt, DEFAULT_FIT_CTX),
]


def parse_fit_switch(value: str) -> bool:
    if value.lower() not in ON_OFF:
        raise UsageError(f"--fit {value!r}: unknown value", hint="allowed values: on, off")
    return value.lower() == "on"


def check_fit_ctx(value: int) -> int:
    if not 0 <= value <= INT32_MAX:
        raise UsageError(f"--fit-ctx {value}: must be a context size, 0 or more")
    return value


def fit_settings(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Pop the fit flags out of a command's keyword arguments, as LoadSettings fields."""
    return {"fit": parse_fit_switch(kwargs.pop("fit")), "fit_margin": parse_fit_target(kwargs.pop("fit_target")),
            "fit_ctx": check_fit_ctx(kwargs.pop("fit_ctx"))}
