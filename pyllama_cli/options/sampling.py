"""Sampling and output-constraint flags shared by `complete`, `chat` and `serve`, with llama.cpp's names.

Declared once so a flag has one name, help text and default everywhere. A command either uses the
aliases directly and calls `sampling_settings(...)`, or declares a `sampling: SamplingOptions`
parameter and decorates itself with `@sampling_options()`, which adds every flag below and builds
the object. The seed is not declared here: it is `-s/--seed` from the load options.

    @model_options(load=True)     # outermost, so -s/--seed reaches `load`
    @sampling_options()
    def complete(model: ModelRequest, load: LoadSettings, sampling: SamplingOptions, ...) -> None:
        settings = sampling.settings  # SamplingSettings, seed taken from -s, grammar already checked
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any

import typer

from ..core.generate.sampling import (
    DEFAULT_MIN_P,
    DEFAULT_MIROSTAT_ENT,
    DEFAULT_MIROSTAT_LR,
    DEFAULT_REPEAT_LAST_N,
    DEFAULT_REPEAT_PENALTY,
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_K,
    DEFAULT_TOP_P,
    DEFAULT_TYPICAL_P,
    RANDOM_SEED,
    SamplingSettings,
)
from ..core.model.settings import INT32_MAX, UINT32_MAX
from ..errors import UsageError
from .context import ContextShiftOpt, KeepOpt, check_keep
from .llama_env import with_llama_env
from .load import check_fits, option_param, with_flags
from .sampler_chain import CHAIN_PARAMS, chain_settings

SAMPLING_PANEL = "Sampling"
CONSTRAINT_PANEL = "Output constraints"
DEFAULT_N_PREDICT = -1

NPredictOpt = Annotated[int, typer.Option(
    "-n", "--n-predict", min=-1, help="Tokens to generate (-1 = until end of generation or a full context).",
    rich_help_panel=SAMPLING_PANEL)]
TempOpt = Annotated[float, typer.Option(
    "--temp", min=0.0, help="Temperature (0 = greedy: always the most likely token).", rich_help_panel=SAMPLING_PANEL)]
TopKOpt = Annotated[int, typer.Option(
    "--top-k", min=0, help="Keep the K most likely tokens (0 = off).", rich_help_panel=SAMPLING_PANEL)]
TopPOpt = Annotated[float, typer.Option(
    "--top-p", min=0.0, max=1.0, help="Nucleus sampling: keep tokens up to this total probability (1.0 = off).",
    rich_help_panel=SAMPLING_PANEL)]
MinPOpt = Annotated[float, typer.Option(
    "--min-p", min=0.0, max=1.0, help="Drop tokens less likely than this fraction of the best one (0 = off).",
    rich_help_panel=SAMPLING_PANEL)]
TypicalOpt = Annotated[float, typer.Option(
    "--typical", min=0.0, max=1.0, help="Locally typical sampling p (1.0 = off).", rich_help_panel=SAMPLING_PANEL)]
RepeatPenaltyOpt = Annotated[float, typer.Option(
    "--repeat-penalty", min=0.0, help="Penalize repeating recent tokens (1.0 = off).", rich_help_panel=SAMPLING_PANEL)]
RepeatLastNOpt = Annotated[int, typer.Option(
    "--repeat-last-n", min=-1, help="How many recent tokens the penalties look at (0 = off, -1 = the context).",
    rich_help_panel=SAMPLING_PANEL)]
PresencePenaltyOpt = Annotated[float, typer.Option(
    "--presence-penalty", help="Penalty for any token already present (0 = off).", rich_help_panel=SAMPLING_PANEL)]
FrequencyPenaltyOpt = Annotated[float, typer.Option(
    "--frequency-penalty", help="Penalty growing with how often a token appeared (0 = off).",
    rich_help_panel=SAMPLING_PANEL)]
MirostatOpt = Annotated[int, typer.Option(
    "--mirostat", min=0, max=2, help="Mirostat sampling: 0 = off, 1 = Mirostat, 2 = Mirostat 2.0 "
    "(replaces top-k/top-p/min-p/typical).", rich_help_panel=SAMPLING_PANEL)]
MirostatLrOpt = Annotated[float, typer.Option(
    "--mirostat-lr", help="Mirostat learning rate (eta).", rich_help_panel=SAMPLING_PANEL)]
MirostatEntOpt = Annotated[float, typer.Option(
    "--mirostat-ent", help="Mirostat target entropy (tau).", rich_help_panel=SAMPLING_PANEL)]
IgnoreEosOpt = Annotated[bool, typer.Option(
    "--ignore-eos", help="Never stop at end-of-generation tokens (their logits are set to -inf).",
    rich_help_panel=SAMPLING_PANEL)]
ReversePromptOpt = Annotated[list[str] | None, typer.Option(
    "-r", "--reverse-prompt", help="Stop when this text is generated; it is not printed. Repeatable.",
    rich_help_panel=SAMPLING_PANEL, show_default=False)]
LogitBiasOpt = Annotated[list[str] | None, typer.Option(
    "--logit-bias", help="Change a token's likelihood: TOKEN_ID(+|-)BIAS, e.g. 15043+1 or 2-inf. Repeatable.",
    rich_help_panel=SAMPLING_PANEL, show_default=False)]
GrammarOpt = Annotated[str | None, typer.Option(
    "--grammar", help="Constrain output with a GBNF grammar: inline text, or the name of a shipped grammar "
    "(json, json_arr, list, yes_no, arithmetic, c_identifier, chess).", rich_help_panel=CONSTRAINT_PANEL,
    show_default=False)]
GrammarFileOpt = Annotated[Path | None, typer.Option(
    "--grammar-file", help="Constrain output with the GBNF grammar in this file.", rich_help_panel=CONSTRAINT_PANEL,
    show_default=False, dir_okay=False)]
JsonSchemaOpt = Annotated[str | None, typer.Option(
    "-j", "--json-schema", help="Constrain output to JSON matching this JSON schema ('{}' = any object).",
    rich_help_panel=CONSTRAINT_PANEL, show_default=False)]
JsonSchemaFileOpt = Annotated[Path | None, typer.Option(
    "-jf", "--json-schema-file", help="Constrain output to JSON matching the JSON schema in this file.",
    rich_help_panel=CONSTRAINT_PANEL, show_default=False, dir_okay=False)]


@dataclass(frozen=True)
class SamplingOptions:
    """What the sampling flags ask for: how to pick tokens, how many, and where to stop."""

    settings: SamplingSettings
    n_predict: int = DEFAULT_N_PREDICT
    stop: tuple[str, ...] = ()
    context_shift: bool = False  # complete's --context-shift and --keep (shift_options)
    keep: int = 0


_LOGIT_BIAS = re.compile(r"^\s*(\d+)\s*([+-])\s*(inf|\d+(?:\.\d*)?|\.\d+)\s*$", re.IGNORECASE)


def parse_logit_bias(values: list[str] | None, name: str = "--logit-bias") -> tuple[tuple[int, float], ...]:
    """Parse llama.cpp's `ID+BIAS` / `ID-BIAS` strings (e.g. `15043+1`, `2-inf`); `name` is the flag or
    setting they came from, for errors."""
    pairs = []
    for value in values or ():
        match = _LOGIT_BIAS.match(value)
        if not match:
            raise UsageError(f"{name} {value!r} is not TOKEN_ID+BIAS or TOKEN_ID-BIAS",
                             hint=f"for example {name} 15043+1 (more likely) or {name} 2-inf (never)")
        bias = float(match.group(3))
        pairs.append((int(match.group(1)), -bias if match.group(2) == "-" else bias))
    return tuple(pairs)


def sampling_settings(
    *,
    temp: float = DEFAULT_TEMPERATURE,
    top_k: int = DEFAULT_TOP_K,
    top_p: float = DEFAULT_TOP_P,
    min_p: float = DEFAULT_MIN_P,
    typical: float = DEFAULT_TYPICAL_P,
    repeat_penalty: float = DEFAULT_REPEAT_PENALTY,
    repeat_last_n: int = DEFAULT_REPEAT_LAST_N,
    presence_penalty: float = 0.0,
    frequency_penalty: float = 0.0,
    mirostat: int = 0,
    mirostat_lr: float = DEFAULT_MIROSTAT_LR,
    mirostat_ent: float = DEFAULT_MIROSTAT_ENT,
    ignore_eos: bool = False,
    logit_bias: list[str] | None = None,
    grammar: str | None = None,
    grammar_file: Path | None = None,
    json_schema: str | None = None,
    json_schema_file: Path | None = None,
    seed: int = RANDOM_SEED,
) -> SamplingSettings:
    """Build SamplingSettings from flag values; the grammar is resolved and syntax-checked here.

    Raises:
        UsageError: more than one of --grammar/--grammar-file/-j/-jf.
        InputError: a grammar or schema that cannot be read or does not parse (with line and column).
    """
    from ..core.constrain.grammar import resolve_grammar

    _check_finite(temp=temp, top_p=top_p, min_p=min_p, typical=typical, repeat_penalty=repeat_penalty,
                  presence_penalty=presence_penalty, frequency_penalty=frequency_penalty, mirostat_lr=mirostat_lr,
                  mirostat_ent=mirostat_ent)
    gbnf = resolve_grammar(grammar=grammar, grammar_file=grammar_file, json_schema=json_schema,
                           json_schema_file=json_schema_file)
    return SamplingSettings(
        temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p, typical_p=typical, repeat_penalty=repeat_penalty,
        repeat_last_n=repeat_last_n, presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
        mirostat=mirostat, mirostat_lr=mirostat_lr, mirostat_ent=mirostat_ent, seed=random_if_default(seed),
        ignore_eos=ignore_eos,
        logit_bias=parse_logit_bias(logit_bias), grammar=gbnf,
    )


def random_if_default(seed: int) -> int:
    """-1 for 4294967295: llama.cpp's samplers draw a fresh seed for that value (LLAMA_DEFAULT_SEED, what its -s -1
    becomes), so passed on it would make runs differ while --stats reported a seed that does not reproduce them."""
    return RANDOM_SEED if seed == UINT32_MAX else seed


def _check_finite(**values: float) -> None:
    """Refuse nan and infinities: a range check lets nan through (every comparison with it is false)."""
    for name, value in values.items():
        if not math.isfinite(value):
            raise UsageError(f"--{name.replace('_', '-')} {value}: not a finite number", hint="give a number such as 0.8")


# Parameter names double as sampling_settings() keywords.
_SAMPLING_PARAMS = [
    option_param("n_predict", NPredictOpt, DEFAULT_N_PREDICT),
    option_param("temp", TempOpt, DEFAULT_TEMPERATURE),
    option_param("top_k", TopKOpt, DEFAULT_TOP_K),
    option_param("top_p", TopPOpt, DEFAULT_TOP_P),
    option_param("min_p", MinPOpt, DEFAULT_MIN_P),
    option_param("typical", TypicalOpt, DEFAULT_TYPICAL_P),
    option_param("repeat_penalty", RepeatPenaltyOpt, DEFAULT_REPEAT_PENALTY),
    option_param("repeat_last_n", RepeatLastNOpt, DEFAULT_REPEAT_LAST_N),
    option_param("presence_penalty", PresencePenaltyOpt, 0.0),
    option_param("frequency_penalty", FrequencyPenaltyOpt, 0.0),
    option_param("mirostat", MirostatOpt, 0),
    option_param("mirostat_lr", MirostatLrOpt, DEFAULT_MIROSTAT_LR),
    option_param("mirostat_ent", MirostatEntOpt, DEFAULT_MIROSTAT_ENT),
    option_param("ignore_eos", IgnoreEosOpt, False),
    option_param("reverse_prompt", ReversePromptOpt, None),
    option_param("logit_bias", LogitBiasOpt, None),
    option_param("grammar", GrammarOpt, None),
    option_param("grammar_file", GrammarFileOpt, None),
    option_param("json_schema", JsonSchemaOpt, None),
    option_param("json_schema_file", JsonSchemaFileOpt, None),
]
# DRY, XTC, top-n-sigma, dynamic temperature, adaptive-p and the chain's order: their own module.
_SAMPLING_PARAMS += CHAIN_PARAMS
_SAMPLING_PARAMS = with_llama_env(_SAMPLING_PARAMS)  # LLAMA_ARG_TEMPERATURE and the others llama.cpp reads


def sampling_options_from(kwargs: dict[str, Any]) -> SamplingOptions:
    """Pop the sampling flags out of a command's keyword arguments and build SamplingOptions.

    The seed comes from `load` (a LoadSettings) when model_options already built it, else from `seed`.
    """
    values = {p.name: kwargs.pop(p.name) for p in _SAMPLING_PARAMS}
    chain = chain_settings(values)
    check_fits(n_predict=("-n", INT32_MAX), top_k=("--top-k", INT32_MAX), repeat_last_n=("--repeat-last-n", INT32_MAX),
               values=values)
    n_predict = values.pop("n_predict")
    stop = tuple(values.pop("reverse_prompt") or ())
    load = kwargs.get("load")
    seed = load.seed if load is not None else kwargs.get("seed", RANDOM_SEED)
    settings = replace(sampling_settings(**values, seed=seed), **chain)
    return SamplingOptions(settings=settings, n_predict=n_predict, stop=stop)


def sampling_options() -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command every sampling/constraint flag; it declares a `sampling: SamplingOptions` parameter.

    Put it under `@model_options(...)` so that the seed (-s/--seed) is read from the load settings.
    """

    def build(kwargs: dict[str, Any]) -> None:
        kwargs["sampling"] = sampling_options_from(kwargs)

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        return with_flags(fn, ("sampling",), _SAMPLING_PARAMS, build)

    return decorate


def shift_options() -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command `--context-shift` and `--keep`, carried on its `sampling` (put it under `@sampling_options()`,
    whose SamplingOptions it completes)."""
    params = [option_param("context_shift", ContextShiftOpt, False), option_param("keep", KeepOpt, 0)]

    def build(kwargs: dict[str, Any]) -> None:
        kwargs["sampling"] = replace(kwargs["sampling"], context_shift=kwargs.pop("context_shift"),
                                     keep=check_keep(kwargs.pop("keep")))

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        return with_flags(fn, (), params, build)

    return decorate
