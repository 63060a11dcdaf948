"""llama.cpp's newer sampler flags and the chain's order, joined to the sampling flags (sampling.py):
DRY (`--dry-*`), XTC (`--xtc-*`), `--top-n-sigma`, dynamic temperature (`--dynatemp-*`), adaptive-p
(`--adaptive-*`), and `--samplers` / `--sampler-seq`.

`CHAIN_PARAMS` are the flags; `chain_settings(values)` pops theirs and returns the `SamplingSettings`
fields they set (checked: one error line naming the flag and what it takes).
"""

from __future__ import annotations

import inspect
import math
from typing import Annotated, Any

import typer

from ..core.generate.sampler_names import (
    DEFAULT_DRY_SEQUENCE_BREAKERS,
    DEFAULT_SAMPLER_SEQ,
    DEFAULT_SAMPLERS,
    samplers_from_letters,
    samplers_from_text,
)
from ..core.generate.sampling import (
    DEFAULT_ADAPTIVE_DECAY,
    DEFAULT_DRY_ALLOWED_LENGTH,
    DEFAULT_DRY_BASE,
    DEFAULT_DRY_PENALTY_LAST_N,
    DEFAULT_XTC_THRESHOLD,
)
from ..core.model.settings import INT32_MAX
from ..errors import UsageError

SAMPLING_PANEL = "Sampling"

SamplersOpt = Annotated[str | None, typer.Option(
    "--samplers", metavar="SAMPLERS", help="Samplers in the order they run, separated by ';' "
    f"(default: {';'.join(DEFAULT_SAMPLERS)}).", rich_help_panel=SAMPLING_PANEL, show_default=False)]
SamplerSeqOpt = Annotated[str | None, typer.Option(
    "--sampler-seq", "--sampling-seq", metavar="SEQUENCE", help="The sampler order as one letter each "
    f"(default: {DEFAULT_SAMPLER_SEQ}).", rich_help_panel=SAMPLING_PANEL, show_default=False)]
TopNSigmaOpt = Annotated[float, typer.Option(
    "--top-n-sigma", "--top-nsigma", help="Keep tokens within N standard deviations of the best logit (-1 = off).",
    rich_help_panel=SAMPLING_PANEL)]
XtcProbabilityOpt = Annotated[float, typer.Option(
    "--xtc-probability", help="XTC: chance of removing the most likely tokens (0 = off).", rich_help_panel=SAMPLING_PANEL)]
XtcThresholdOpt = Annotated[float, typer.Option(
    "--xtc-threshold", help="XTC: tokens at least this likely may be removed (above 0.5 = off).",
    rich_help_panel=SAMPLING_PANEL)]
DryMultiplierOpt = Annotated[float, typer.Option(
    "--dry-multiplier", help="DRY repetition penalty multiplier (0 = off).", rich_help_panel=SAMPLING_PANEL)]
DryBaseOpt = Annotated[float, typer.Option(
    "--dry-base", help="DRY penalty base (values below 1 are ignored).", rich_help_panel=SAMPLING_PANEL)]
DryAllowedLengthOpt = Annotated[int, typer.Option(
    "--dry-allowed-length", help="DRY: repetitions longer than this are penalized.", rich_help_panel=SAMPLING_PANEL)]
DryPenaltyLastNOpt = Annotated[int, typer.Option(
    "--dry-penalty-last-n", help="DRY: how many recent tokens to scan (0 = off).", rich_help_panel=SAMPLING_PANEL)]
DrySequenceBreakerOpt = Annotated[list[str] | None, typer.Option(
    "--dry-sequence-breaker", metavar="STRING", help="A DRY sequence breaker; the first one replaces the defaults "
    "('\\n', ':', '\"', '*'), 'none' leaves none. Repeatable.", rich_help_panel=SAMPLING_PANEL, show_default=False)]
DynatempRangeOpt = Annotated[float, typer.Option(
    "--dynatemp-range", help="Dynamic temperature: the temperature may go this far either side of --temp, "
    "by the candidates' entropy (0 = off).", rich_help_panel=SAMPLING_PANEL)]
DynatempExpOpt = Annotated[float, typer.Option(
    "--dynatemp-exp", help="Dynamic temperature exponent.", rich_help_panel=SAMPLING_PANEL)]
AdaptiveTargetOpt = Annotated[float, typer.Option(
    "--adaptive-target", help="Adaptive-p: pick tokens near this probability, 0.0 to 1.0 (negative = off; "
    "runs when --samplers names adaptive_p).", rich_help_panel=SAMPLING_PANEL)]
AdaptiveDecayOpt = Annotated[float, typer.Option(
    "--adaptive-decay", help="Adaptive-p: decay of its running average, 0.0 to 0.99.", rich_help_panel=SAMPLING_PANEL)]


def _param(name: str, annotation: Any, default: Any) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)


CHAIN_PARAMS = [
    _param("samplers", SamplersOpt, None),
    _param("sampler_seq", SamplerSeqOpt, None),
    _param("top_n_sigma", TopNSigmaOpt, -1.0),
    _param("xtc_probability", XtcProbabilityOpt, 0.0),
    _param("xtc_threshold", XtcThresholdOpt, DEFAULT_XTC_THRESHOLD),
    _param("dry_multiplier", DryMultiplierOpt, 0.0),
    _param("dry_base", DryBaseOpt, DEFAULT_DRY_BASE),
    _param("dry_allowed_length", DryAllowedLengthOpt, DEFAULT_DRY_ALLOWED_LENGTH),
    _param("dry_penalty_last_n", DryPenaltyLastNOpt, DEFAULT_DRY_PENALTY_LAST_N),
    _param("dry_sequence_breaker", DrySequenceBreakerOpt, None),
    _param("dynatemp_range", DynatempRangeOpt, 0.0),
    _param("dynatemp_exp", DynatempExpOpt, 1.0),
    _param("adaptive_target", AdaptiveTargetOpt, -1.0),
    _param("adaptive_decay", AdaptiveDecayOpt, DEFAULT_ADAPTIVE_DECAY),
]
CHAIN_NAMES = tuple(p.name for p in CHAIN_PARAMS)


def chain_settings(values: dict[str, Any]) -> dict[str, Any]:
    """Pop the chain flags out of `values` (a command's keyword arguments) as SamplingSettings fields."""
    v = {name: values.pop(name) for name in CHAIN_NAMES}
    for name in ("top_n_sigma", "xtc_probability", "xtc_threshold", "dry_multiplier", "dry_base", "dynatemp_range",
                 "dynatemp_exp", "adaptive_target", "adaptive_decay"):
        if not math.isfinite(v[name]):
            raise UsageError(f"--{name.replace('_', '-')} {v[name]}: not a finite number", hint="give a number such as 0.8")
    if not 0 <= v["dry_penalty_last_n"] <= INT32_MAX:
        raise UsageError(f"--dry-penalty-last-n {v['dry_penalty_last_n']}: must be 0 or more",
                         hint="the number of recent tokens DRY scans (0 = off)")
    if not -INT32_MAX <= v["dry_allowed_length"] <= INT32_MAX:
        raise UsageError(f"--dry-allowed-length {v['dry_allowed_length']} is too large")
    fields: dict[str, Any] = {
        "top_n_sigma": v["top_n_sigma"], "xtc_probability": v["xtc_probability"], "xtc_threshold": v["xtc_threshold"],
        "dry_multiplier": v["dry_multiplier"], "dry_allowed_length": v["dry_allowed_length"],
        "dry_penalty_last_n": v["dry_penalty_last_n"], "dynatemp_range": v["dynatemp_range"],
        "dynatemp_exponent": v["dynatemp_exp"], "adaptive_target": v["adaptive_target"],
        "adaptive_decay": v["adaptive_decay"], "dry_sequence_breakers": dry_breakers(v["dry_sequence_breaker"]),
    }
    if v["dry_base"] >= 1.0:  # llama.cpp keeps its default for a base below 1
        fields["dry_base"] = v["dry_base"]
    if v["samplers"] is not None:
        fields["samplers"] = samplers_from_text(v["samplers"])
    if v["sampler_seq"] is not None:  # llama.cpp reads flags in order; here the letters win when both are given
        fields["samplers"] = samplers_from_letters(v["sampler_seq"])
    return fields


def dry_breakers(given: list[str] | None) -> tuple[str, ...]:
    """--dry-sequence-breaker values: the defaults when none is given; 'none' clears the list."""
    if not given:
        return DEFAULT_DRY_SEQUENCE_BREAKERS
    breakers: list[str] = []
    for value in given:
        if value == "none":
            breakers.clear()
        else:
            breakers.append(value)
    return tuple(breakers)
