"""Speculative decoding flags of `complete`, `chat` and `serve`, with llama.cpp's names.

A command declares a `speculative: SpeculativeOptions` parameter and decorates itself with
`@speculative_options()` (under `@model_options(...)`, so the draft model is fetched with the same
--hf-token and --offline as the model). `SpeculativeOptions.settings` holds --spec-type and its
numbers; `draft` names the -md/-hfd model, which the command resolves (a download shows its bar).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from ..core.generate.speculative import (
    DEFAULT_DRAFT_N_MAX,
    DEFAULT_DRAFT_N_MIN,
    DEFAULT_DRAFT_P_MIN,
    DEFAULT_NGRAM_MIN_HITS,
    DEFAULT_NGRAM_SIZE_M,
    DEFAULT_NGRAM_SIZE_N,
    SPEC_NGRAM_MAP_K,
    SPEC_NONE,
    SPEC_TYPES,
    SpeculativeSettings,
    check_spec_type,
)
from ..core.model.resolve import ModelRequest
from ..errors import UsageError
from .load import option_param, with_flags

SPEC_PANEL = "Speculative decoding"

SpecTypeOpt = Annotated[str, typer.Option(
    "--spec-type", help=f"Speculative decoding: {', '.join(SPEC_TYPES)} (ngram-cache is not implemented). "
    "Drafted tokens are checked by the model in one batch; the text is the same as without.",
    rich_help_panel=SPEC_PANEL)]
ModelDraftOpt = Annotated[str | None, typer.Option(
    "-md", "--model-draft", "--spec-draft-model", help="Draft model for draft-simple (a GGUF with the model's "
    "vocabulary; given alone, it turns draft-simple on).", rich_help_panel=SPEC_PANEL, show_default=False)]
HfRepoDraftOpt = Annotated[str | None, typer.Option(
    "-hfd", "--hf-repo-draft", "--spec-draft-hf", help="Same as -hf, for the draft model: user/repo[:quant].",
    rich_help_panel=SPEC_PANEL, show_default=False)]
DraftNMaxOpt = Annotated[int, typer.Option(
    "--spec-draft-n-max", min=0, help="Tokens to draft at most per step.", rich_help_panel=SPEC_PANEL)]
DraftNMinOpt = Annotated[int, typer.Option(
    "--spec-draft-n-min", min=0, help="Fewer drafted tokens than this are not checked.", rich_help_panel=SPEC_PANEL)]
DraftPMinOpt = Annotated[float, typer.Option(
    "--spec-draft-p-min", "--draft-p-min", min=0.0, max=1.0,
    help="Stop drafting where the draft model's top token is less likely than this (greedy).",
    rich_help_panel=SPEC_PANEL)]


def _ngram_option(kind: str, what: str, help_text: str) -> Any:
    return Annotated[int, typer.Option(f"--spec-ngram-{kind}-{what}", min=1, help=help_text,
                                       rich_help_panel=SPEC_PANEL)]


_NGRAM_HELP = {"size-n": "length of the n-gram looked up", "size-m": "length of the m-gram drafted after it",
               "min-hits": "times a continuation must have been seen"}


@dataclass(frozen=True)
class SpeculativeOptions:
    settings: SpeculativeSettings
    draft: ModelRequest | None  # -md/-hfd, to resolve (None: no draft model)


def _params() -> list[Any]:
    params = [
        option_param("spec_type", SpecTypeOpt, SPEC_NONE),
        option_param("model_draft", ModelDraftOpt, None),
        option_param("hf_repo_draft", HfRepoDraftOpt, None),
        option_param("spec_draft_n_max", DraftNMaxOpt, DEFAULT_DRAFT_N_MAX),
        option_param("spec_draft_n_min", DraftNMinOpt, DEFAULT_DRAFT_N_MIN),
        option_param("spec_draft_p_min", DraftPMinOpt, DEFAULT_DRAFT_P_MIN),
    ]
    defaults = {"size-n": DEFAULT_NGRAM_SIZE_N, "size-m": DEFAULT_NGRAM_SIZE_M, "min-hits": DEFAULT_NGRAM_MIN_HITS}
    for kind, label in (("simple", "ngram-simple"), ("map-k", "ngram-map-k")):
        for what, default in defaults.items():
            name = f"spec_ngram_{kind}_{what}".replace("-", "_")
            params.append(option_param(name, _ngram_option(kind, what, f"{label}: {_NGRAM_HELP[what]}."), default))
    return params


_SPEC_PARAMS = _params()


def speculative_options_from(kwargs: dict[str, Any]) -> SpeculativeOptions:
    """Pop the speculative flags out of a command's keyword arguments."""
    values = {p.name: kwargs.pop(p.name) for p in _SPEC_PARAMS}
    md, hfd = values["model_draft"], values["hf_repo_draft"]
    if md and hfd:
        raise UsageError("give either -md/--model-draft or -hfd/--hf-repo-draft, not both")
    spec_type = check_spec_type(values["spec_type"], has_draft=bool(md or hfd))
    kind = "map_k" if spec_type == SPEC_NGRAM_MAP_K else "simple"
    settings = SpeculativeSettings(
        type=spec_type, n_max=values["spec_draft_n_max"], n_min=values["spec_draft_n_min"],
        p_min=values["spec_draft_p_min"], ngram_size_n=values[f"spec_ngram_{kind}_size_n"],
        ngram_size_m=values[f"spec_ngram_{kind}_size_m"], ngram_min_hits=values[f"spec_ngram_{kind}_min_hits"])
    model: ModelRequest | None = kwargs.get("model")
    draft = None
    if md or hfd:
        draft = ModelRequest(model=md, hf_repo=hfd, hf_token=model.hf_token if model else None,
                             offline=model.offline if model else False)
    return SpeculativeOptions(settings, draft)


def speculative_options() -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command the speculative decoding flags; it declares a `speculative: SpeculativeOptions` parameter."""

    def build(kwargs: dict[str, Any]) -> None:
        kwargs["speculative"] = speculative_options_from(kwargs)

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        return with_flags(fn, ("speculative",), _SPEC_PARAMS, build)

    return decorate
