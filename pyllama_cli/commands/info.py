"""`pyllama info`: what a GGUF holds, read from its header without loading weights."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from ..console import download_tqdm, human_count, human_size, out
from ..core.text.json_text import json_ready
from ..core.model.sizing.fit import ContextShape, parse_fit_target, preview_fit
from ..core.model.info import ModelInfo, describe_model, metadata_summary, read_headers
from ..core.model.settings import KV_CACHE_TYPES
from ..core.model.resolve import ModelRequest, resolve_model
from ..errors import InputError, UsageError
from ..options.load import JsonOpt, model_options
from ..options.hardware.placement import FitCtxOpt, FitTargetOpt, check_fit_ctx

EXAMPLES = """\
Examples:
  pyllama info -m model.gguf
  pyllama info -hf ggml-org/gemma-3-1b-it-GGUF --json
  pyllama info -m model.gguf --template
  pyllama info -m model.gguf --metadata
  pyllama info -m model.gguf --fit -fitt 2048
"""


@model_options(load=False)
def info(
    model: ModelRequest,
    as_json: JsonOpt = False,
    template: Annotated[bool, typer.Option("--template", help="Print the chat template.")] = False,
    metadata: Annotated[bool, typer.Option("--metadata", help="Print every metadata key.")] = False,
    fit: Annotated[bool, typer.Option("--fit", help="Print the context size --fit would choose, and why, "
                                      "without loading the model.", rich_help_panel="Memory fit")] = False,
    fit_target: FitTargetOpt = "1024",
    fit_ctx: FitCtxOpt = 4096,
    ctx_size: Annotated[int, typer.Option("-c", "--ctx-size", help="With --fit: the context size the command "
                                          "would get (0 = unset, --fit chooses).", rich_help_panel="Memory fit")] = 0,
    ubatch_size: Annotated[int, typer.Option("-ub", "--ubatch-size", help="With --fit: the physical batch size.",
                                             rich_help_panel="Memory fit")] = 512,
    cache_type_k: Annotated[str, typer.Option("-ctk", "--cache-type-k", help="With --fit: the K cache type.",
                                              rich_help_panel="Memory fit")] = "f16",
    cache_type_v: Annotated[str, typer.Option("-ctv", "--cache-type-v", help="With --fit: the V cache type.",
                                              rich_help_panel="Memory fit")] = "f16",
) -> None:
    """Show what a GGUF model holds: architecture, size, quantization, vocab, template."""
    given = [flag for flag, on in (("--template", template), ("--metadata", metadata), ("--fit", fit)) if on]
    if len(given) > 1:
        raise UsageError(f"{', '.join(given[:-1])} and {given[-1]} print different things: pick one")
    resolved = resolve_model(model, tqdm_class=download_tqdm())
    if fit:
        _print_fit(preview_fit(read_headers(resolved), _fit_context(ubatch_size, cache_type_k, cache_type_v), n_ctx=ctx_size,
                               margin_bytes=parse_fit_target(fit_target), n_ctx_min=check_fit_ctx(fit_ctx)), as_json)
        return
    details, head = describe_model(resolved)
    if template:
        text = head.get("tokenizer.chat_template")
        if not text:
            raise InputError(f"{details.path} has no chat template",
                             hint="chat and serve then need --chat-template NAME|FILE")
        typer.echo(json.dumps({"chat_template": text}, ensure_ascii=False) if as_json else text)
    elif metadata:
        _print_metadata(metadata_summary(head), as_json)
    elif as_json:
        typer.echo(json.dumps(json_ready(details.to_dict()), indent=2, ensure_ascii=False))
    else:
        _print_info(details)


def _print_metadata(summary: dict[str, Any], as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(json_ready(summary), indent=2, ensure_ascii=False, default=str))
        return
    # json.dumps escapes only C0 controls in values, and keys are not escaped at all.
    keys = [key.translate(_CONTROL_ESCAPES) for key in summary]
    width = max(map(len, keys), default=0)
    for key, value in zip(keys, summary.values()):
        if isinstance(value, dict) and "length" in value:
            shown = f"{value['type']} of {value['length']}: {value['first']} ..."
        else:
            shown = json.dumps(value, ensure_ascii=False) if isinstance(value, (str, list)) else str(value)
        if len(shown) > 200:
            shown = shown[:200] + f"... ({len(shown)} chars)"
        typer.echo(f"{key:<{width}}  {shown.translate(_CONTROL_ESCAPES)}")


def _fit_context(n_ubatch: int, cache_type_k: str, cache_type_v: str) -> ContextShape:
    if n_ubatch < 1:
        raise UsageError(f"-ub {n_ubatch}: must be 1 or more")
    for flag, value in (("-ctk", cache_type_k), ("-ctv", cache_type_v)):
        if value not in KV_CACHE_TYPES:
            raise UsageError(f"{flag} {value!r} is not a cache type", hint=f"allowed values: {', '.join(KV_CACHE_TYPES)}")
    return ContextShape(n_ubatch=n_ubatch, cache_type_k=cache_type_k, cache_type_v=cache_type_v)


def _print_fit(plan: dict[str, Any], as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(plan, indent=2))
        return
    mib = 1024 * 1024
    typer.echo(f"n_ctx: {plan['n_ctx']}")
    typer.echo(f"projected: {plan['projected_bytes'] // mib} MiB of {plan['host_total_bytes'] // mib} MiB "
               f"(margin {plan['margin_bytes'] // mib} MiB)")
    for reason in plan["reasons"]:
        typer.echo(f"why: {reason}")


def _print_info(d: ModelInfo) -> None:
    heads = None if d.head_count is None else (
        f"{d.head_count}" + (f" (kv {d.head_count_kv})" if d.head_count_kv is not None else ""))
    rows = [
        ("Model", None),
        ("name", d.name), ("architecture", d.architecture),
        ("parameters", human_count(d.parameters)), ("file size", human_size(d.file_size)),
        ("quantization", d.quantization), ("layers", d.layers), ("embedding length", d.embedding_length),
        ("feed forward length", d.feed_forward_length), ("attention heads", heads),
        ("context length", d.context_length), ("vocab size", d.vocab_size), ("vocab type", d.vocab_type),
        ("chat template", "yes" if d.chat_template else "no"),
    ]
    if d.split_count > 1:
        rows.append(("split parts", d.split_count))
    if d.projector:  # an mmproj: docs/multimodal.md
        p = d.projector
        rows += [("Projector", None), ("type", p["type"]), ("accepts", ", ".join(p["accepts"]) or "nothing"),
                 ("image size", p["image_size"]), ("patch size", p["patch_size"]),
                 ("encoder width", p["embedding_length"]), ("projection dim", p["projection_dim"])]
    if d.special_tokens:
        rows.append(("Special tokens", None))
        rows += [(name, f"{tok['id']}  {tok['text']!r}" if tok["text"] is not None else tok["id"])
                 for name, tok in d.special_tokens.items()]
    console = out()
    for label, value in rows:
        if value is None and label[0].isupper():
            console.print(f"  [bold]{label}[/bold]")
        elif value is not None:
            console.print(f"    {label:<22}{str(value).translate(_CONTROL_ESCAPES)}", markup=False)


# Metadata is whatever the file's author wrote: an escape sequence in a name must not drive the terminal.
_CONTROL_ESCAPES = {c: f"\\x{c:02x}" for c in [*range(0x20), *range(0x7F, 0xA0)]}
