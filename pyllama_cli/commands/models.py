"""`pyllama list`, `pull` and `rm`: the GGUF models on this machine, fetching one, deleting one."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from ..console import download_tqdm, human_size, info
from ..core.store.catalog import LocalModel
from ..errors import UsageError
from ..options.load import HfFileOpt, HfTokenOpt, JsonOpt

LIST_MODELS_EXAMPLES = """\
Examples:
  pyllama list
  pyllama ls --models-dir ~/models --json
"""
PULL_EXAMPLES = """\
Examples:
  pyllama pull -hf ggml-org/gemma-3-1b-it-GGUF
  pyllama pull -hf ggml-org/gemma-3-1b-it-GGUF:Q8_0
"""
RM_EXAMPLES = """\
Examples:
  pyllama rm ggml-org/gemma-3-1b-it-GGUF:Q8_0
  pyllama rm ggml-org/gemma-3-1b-it-GGUF -y
  pyllama rm ~/models/tiny.gguf
"""

ModelsDirOpt = Annotated[list[Path] | None, typer.Option(
    "--models-dir", help="Also list the GGUF models in this folder (may be repeated).", show_default=False,
    file_okay=False)]
PullHfOpt = Annotated[str, typer.Option(
    "-hf", "--hf-repo", help="Hugging Face repo as user/repo[:quant] (default quant: Q4_K_M, else the first GGUF).",
    show_default=False)]
ApiKeyOpt = Annotated[str | None, typer.Option(
    "--api-key", envvar="PYLLAMA_API_KEY", help="The servers' API key, sent as 'Authorization: Bearer KEY'.",
    show_default=False)]


def list_models(models_dir: ModelsDirOpt = None, as_json: JsonOpt = False) -> None:
    """List the GGUF models in the Hugging Face cache and in --models-dir folders (a split model is one row)."""
    from ..core.store.catalog import cached_models, hub_cache_dir, models_in_dir

    folders = models_dir or []
    for folder in folders:
        if not folder.is_dir():
            raise UsageError(f"--models-dir {folder}: no such folder")
    found = cached_models() + [m for folder in folders for m in models_in_dir(folder)]
    if as_json:
        typer.echo(json.dumps([_as_dict(m) for m in found], indent=2, ensure_ascii=False))
    elif not found:
        where = f"{hub_cache_dir()}" + "".join(f" or {f}" for f in folders)
        info(f"No GGUF models in {where} yet; fetch one with: pyllama pull -hf user/repo[:quant]")
    else:
        _print_table(found)


def _as_dict(model: LocalModel) -> dict[str, Any]:
    return {**model.to_dict(), "quant": model.file_type or model.quant, "modified": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(model.modified))}


def _print_table(models: list[LocalModel]) -> None:
    rows = [("NAME", "QUANT", "SIZE", "PARTS", "MODIFIED")] + [
        (m.name, m.file_type or m.quant or "-", human_size(m.size), str(len(m.parts)),
         time.strftime("%Y-%m-%d %H:%M", time.localtime(m.modified))) for m in models]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        typer.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[4])


def pull(
    hf_repo: PullHfOpt,
    hf_file: HfFileOpt = None,
    hf_token: HfTokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Download a model from Hugging Face into its cache (an interrupted download resumes); print its path."""
    from ..core.model.resolve import ModelRequest, resolve_model

    model = resolve_model(ModelRequest(hf_repo=hf_repo, hf_file=hf_file, hf_token=hf_token),
                          tqdm_class=download_tqdm())
    if as_json:
        size = sum(p.stat().st_size for p in model.parts)
        typer.echo(json.dumps({"repo": model.repo, "file": model.filename, "path": str(model.path),
                               "parts": [str(p) for p in model.parts], "size": size}, indent=2))
    else:
        typer.echo(str(model.path))


def rm(
    target: Annotated[str, typer.Argument(
        help="user/repo (every cached file of it), user/repo:QUANT (that quant), or a GGUF file.",
        show_default=False)],
    yes: Annotated[bool, typer.Option("-y", "--yes", help="Delete without asking.")] = False,
    force: Annotated[bool, typer.Option(
        "--force", help="Delete even a model that a running pyllama serve has loaded.")] = False,
    api_key: ApiKeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Delete a downloaded model (through huggingface_hub's cache API) or a GGUF file; asks first on a terminal."""
    from ..core.store.remove import check_not_loaded, plan_removal, remove

    removal = plan_removal(target)
    if not force:
        check_not_loaded(removal, api_key)
    what = f"{', '.join(m.name for m in removal.models)} ({human_size(removal.size)}: {removal.how})"
    if not yes:
        if not sys.stdin.isatty():
            raise UsageError("rm asks before deleting, and stdin is not a terminal",
                             hint=f"add -y to delete without asking: pyllama rm {target} -y")
        if not typer.confirm(f"Delete {what}?", err=True):
            info("Nothing deleted.")
            return
    remove(removal)
    if as_json:
        typer.echo(json.dumps(removal.to_dict(), indent=2, ensure_ascii=False))
    else:
        info(f"Deleted {what}")
