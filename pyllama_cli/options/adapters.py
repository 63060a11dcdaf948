"""The files loaded beside a model, with llama.cpp's flag names: the adapters (--lora, --lora-scaled,
--lora-init-without-apply, --control-vector, --control-vector-scaled, --control-vector-layer-range)
and the multimodal projector (-mm/--mmproj, --no-mmproj, --mmproj-offload, --image-min/max-tokens:
`media_options`, on chat, complete and serve).

Each file flag may be repeated and takes a comma-separated list. LoRA ids (serve's /lora-adapters)
count the --lora files first, then the --lora-scaled ones, each in the order given.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated, Any

import typer

from ..core.media.settings import DEFAULT_IMAGE_TOKENS, ProjectorSettings
from ..core.model.adapters import AdapterFile, AdapterSettings
from ..errors import UsageError

ADAPTER_PANEL = "Adapters"

LoraOpt = Annotated[list[str] | None, typer.Option(
    "--lora", metavar="FNAME", help="LoRA adapter to apply at scale 1 (repeat, or comma-separated for several).",
    rich_help_panel=ADAPTER_PANEL, show_default=False)]
LoraScaledOpt = Annotated[list[str] | None, typer.Option(
    "--lora-scaled", metavar="FNAME:SCALE", help="LoRA adapter with its scale (repeat, or comma-separated).",
    rich_help_panel=ADAPTER_PANEL, show_default=False)]
LoraInitWithoutApplyOpt = Annotated[bool, typer.Option(
    "--lora-init-without-apply",
    help="Load the LoRA adapters at scale 0 (serve: apply them later with POST /lora-adapters).",
    rich_help_panel=ADAPTER_PANEL)]
ControlVectorOpt = Annotated[list[str] | None, typer.Option(
    "--control-vector", metavar="FNAME", help="Control vector to add at scale 1 (repeat, or comma-separated).",
    rich_help_panel=ADAPTER_PANEL, show_default=False)]
ControlVectorScaledOpt = Annotated[list[str] | None, typer.Option(
    "--control-vector-scaled", metavar="FNAME:SCALE", help="Control vector with its scale (repeat, or comma-separated).",
    rich_help_panel=ADAPTER_PANEL, show_default=False)]
ControlVectorLayerRangeOpt = Annotated[tuple[int, int] | None, typer.Option(
    "--control-vector-layer-range", metavar="START END",
    help="Layers to apply the control vectors to, both inclusive (default: all).",
    rich_help_panel=ADAPTER_PANEL, show_default=False)]


def _param(name: str, annotation: Any, default: Any) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)


ADAPTER_PARAMS = [
    _param("lora", LoraOpt, None),
    _param("lora_scaled", LoraScaledOpt, None),
    _param("lora_init_without_apply", LoraInitWithoutApplyOpt, False),
    _param("control_vector", ControlVectorOpt, None),
    _param("control_vector_scaled", ControlVectorScaledOpt, None),
    _param("control_vector_layer_range", ControlVectorLayerRangeOpt, None),
]


def _items(values: list[str] | None) -> list[str]:
    return [item.strip() for value in values or [] for item in value.split(",") if item.strip()]


def parse_scaled(value: str, flag: str) -> AdapterFile:
    """FNAME:SCALE (the last colon splits, so a path may hold colons)."""
    path, colon, scale = value.rpartition(":")
    if not colon or not path:
        raise UsageError(f"{flag} {value!r} has no scale", hint=f"write {flag} FNAME:SCALE, e.g. adapter.gguf:0.5")
    try:
        number = float(scale)
    except ValueError:
        raise UsageError(f"{flag} {value!r}: the scale {scale!r} is not a number",
                         hint=f"write {flag} FNAME:SCALE, e.g. adapter.gguf:0.5") from None
    return AdapterFile(Path(path), number)


def lora_files(lora: list[str] | None, lora_scaled: list[str] | None) -> tuple[AdapterFile, ...]:
    """--lora files (scale 1), then --lora-scaled ones, in the order given: their ids."""
    files = [AdapterFile(Path(p)) for p in _items(lora)]
    return tuple(files + [parse_scaled(v, "--lora-scaled") for v in _items(lora_scaled)])


def adapter_settings(kwargs: dict[str, Any]) -> AdapterSettings:
    """Pop the adapter flags out of a command's keyword arguments."""
    loras = lora_files(kwargs.pop("lora"), kwargs.pop("lora_scaled"))
    vectors = [AdapterFile(Path(p)) for p in _items(kwargs.pop("control_vector"))]
    vectors += [parse_scaled(v, "--control-vector-scaled") for v in _items(kwargs.pop("control_vector_scaled"))]
    layer_range = kwargs.pop("control_vector_layer_range")
    if layer_range is not None and layer_range[0] > layer_range[1] > 0:
        raise UsageError(f"--control-vector-layer-range {layer_range[0]} {layer_range[1]}: START is after END",
                         hint="give the first layer, then the last (both inclusive, from 1)")
    return AdapterSettings(loras=tuple(loras), lora_init_without_apply=kwargs.pop("lora_init_without_apply"),
                           control_vectors=tuple(vectors),
                           cvec_layer_range=tuple(layer_range) if layer_range else None)


MEDIA_PANEL = "Multimodal"

MmprojOpt = Annotated[Path | None, typer.Option(
    "-mm", "--mmproj", metavar="FILE", help="Multimodal projector (mmproj GGUF): lets the model see images.",
    rich_help_panel=MEDIA_PANEL, show_default=False, dir_okay=False)]
MmprojAutoOpt = Annotated[bool, typer.Option(
    "--mmproj-auto/--no-mmproj", help="Use the multimodal projector (--no-mmproj: text only, even with --mmproj).",
    rich_help_panel=MEDIA_PANEL)]
MmprojOffloadOpt = Annotated[bool, typer.Option(
    "--mmproj-offload/--no-mmproj-offload", help="Run the projector on the GPU when there is one.",
    rich_help_panel=MEDIA_PANEL)]
ImageMinTokensOpt = Annotated[int, typer.Option(
    "--image-min-tokens", metavar="N", help="Fewest tokens an image may take (dynamic-resolution models; -1: the "
    "projector's own).", rich_help_panel=MEDIA_PANEL)]
ImageMaxTokensOpt = Annotated[int, typer.Option(
    "--image-max-tokens", metavar="N", help="Most tokens an image may take (dynamic-resolution models; -1: the "
    "projector's own).", rich_help_panel=MEDIA_PANEL)]

MediaFileOpt = Annotated[list[Path] | None, typer.Option(
    "--image", "--audio", metavar="FILE", help="An image or audio file for the model (repeat for several; needs "
    "--mmproj). The prompt marks where each goes with <__media__>, or they come first.",
    show_default=False, dir_okay=False)]

MEDIA_PARAMS = [
    _param("mmproj", MmprojOpt, None),
    _param("mmproj_auto", MmprojAutoOpt, True),
    _param("mmproj_offload", MmprojOffloadOpt, True),
    _param("image_min_tokens", ImageMinTokensOpt, DEFAULT_IMAGE_TOKENS),
    _param("image_max_tokens", ImageMaxTokensOpt, DEFAULT_IMAGE_TOKENS),
]


def projector_settings(kwargs: dict[str, Any]) -> ProjectorSettings:
    """Pop the projector flags out of a command's keyword arguments."""
    return ProjectorSettings(path=kwargs.pop("mmproj"), auto=kwargs.pop("mmproj_auto"),
                             offload=kwargs.pop("mmproj_offload"), image_min_tokens=kwargs.pop("image_min_tokens"),
                             image_max_tokens=kwargs.pop("image_max_tokens"))

