"""`pyllama rm`: what a name (`user/repo[:quant]` or a GGUF file) deletes, whether a server has it
loaded, and the deletion itself.

Cached models are deleted through huggingface_hub's cache API: a whole repo with
`HFCacheInfo.delete_revisions` (every cached revision), one quant of a repo that holds others with
`HFCacheInfo.delete_files` (its snapshot entries, and each blob no other file points at).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import InputError, ModelInUse, ModelNotFound, QuantNotFound, ServerError
from .catalog import LocalModel, cached_models, hub_cache_dir, is_model_file, models_in_dir, scan_hub_cache
from .servers import model_status, running_servers, server_models


@dataclass(frozen=True)
class Removal:
    """A deletion planned and not yet done."""

    name: str  # what the user named, as `list` shows it
    models: tuple[LocalModel, ...]
    how: str  # what goes, in words: "the whole repo", "these files; ... stay"
    size: int  # bytes freed
    strategy: Any = None  # huggingface_hub's DeleteCacheStrategy; None for a file outside the cache

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "deleted": [m.name for m in self.models], "how": self.how, "freed": self.size,
                "paths": [str(p) for m in self.models for p in m.parts]}


def plan_removal(target: str) -> Removal:
    """What deleting `target` means.

    Raises:
        ModelNotFound: no such file, or the repo is not in the cache. QuantNotFound: no cached file
        for that quant. InputError: a file that is not a GGUF model.
    """
    path = Path(target).expanduser()
    if path.exists() or target.lower().endswith(".gguf"):
        return _plan_file(path)
    from .resolve import parse_hf_spec

    repo, tag = parse_hf_spec(target)
    return _plan_cached(target, repo, tag)


def _plan_cached(target: str, repo: str, tag: str | None) -> Removal:
    in_repo = cached_models(repo)
    if not in_repo:
        raise ModelNotFound(f"{repo} is not in the Hugging Face cache ({hub_cache_dir()})",
                            hint="`pyllama list` shows the models there")
    chosen = in_repo if tag is None else [m for m in in_repo if tag.upper() in (m.quant, m.id.upper())]
    if not chosen:
        quants = ", ".join(m.quant or m.id for m in in_repo)
        raise QuantNotFound(f"{repo} has no cached GGUF for quant {tag!r}", hint=f"cached quants of {repo}: {quants}")
    return _cache_removal(target, repo, chosen, whole_repo=len(chosen) == len(in_repo))


def _cache_removal(name: str, repo: str, chosen: list[LocalModel], *, whole_repo: bool) -> Removal:
    cache = scan_hub_cache()
    repo_info = next(r for r in cache.repos if r.repo_id == repo and r.repo_type == "model")
    if whole_repo:
        strategy = cache.delete_revisions(*(r.commit_hash for r in repo_info.revisions))
        how = f"the whole repo, {repo_info.repo_path}"
    else:
        strategy = cache.delete_files(*(f for m in chosen for f in m.files))
        how = f"{sum(len(m.parts) for m in chosen)} file(s) of the repo; its other quants stay"
    return Removal(name, tuple(chosen), how, strategy.expected_freed_size, strategy)


def _plan_file(path: Path) -> Removal:
    if not path.is_file():
        raise ModelNotFound(f"no such file: {path}", hint="`pyllama list` shows the models on this machine")
    if not is_model_file(path.name):
        raise InputError(f"{path} is not a GGUF model (or is a later part of a split model)",
                         hint="name a .gguf model file, or the first part of a split model")
    cached = [m for m in cached_models() if _same_file(path, m.path)]
    if cached:  # a file inside the HF cache goes through the cache API too
        model = cached[0]
        others = [m for m in cached_models(model.repo) if m != model]
        return _cache_removal(str(path), model.repo or "", [model], whole_repo=not others)
    model = next(m for m in models_in_dir(path.parent) if m.path.name == path.name)
    return Removal(str(path), (model,), f"{len(model.parts)} file(s)", model.size)


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or a.absolute() == b.absolute()
    except OSError:
        return False


def check_not_loaded(removal: Removal, api_key: str | None) -> None:
    """Refuse to delete a model a running `pyllama serve` has loaded (or is loading).

    Raises:
        ModelInUse: a server has it. ServerError: a server that needs an API key we were not given.
    """
    for server in running_servers():
        try:
            cards = server_models(server.url, api_key)
        except ServerError as exc:
            if server.api_key_required:
                raise ServerError(f"cannot ask the server at {server.url} what it has loaded: it needs an API key",
                                  hint="give it with --api-key or PYLLAMA_API_KEY, or --force to delete anyway") from exc
            continue  # starting or stopping: it has nothing loaded to lose
        for card in cards:
            model = _card_model(card, removal.models)
            if model is not None and model_status(card) in ("loaded", "loading"):
                raise ModelInUse(f"{model.name} is loaded by the server at {server.url} (model {card['id']!r})",
                                 hint=f"unload it first: pyllama stop {card['id']} --url {server.url}; "
                                      "or delete anyway with --force")


def _card_model(card: dict[str, Any], models: tuple[LocalModel, ...]) -> LocalModel | None:
    """The model among `models` that a server's model card is; by path when the card has one, else by id."""
    if card.get("path"):
        return next((m for m in models if any(_same_file(Path(card["path"]), p) for p in m.parts)), None)
    return next((m for m in models if card["id"] in (m.id, m.path.stem)), None)


def remove(removal: Removal) -> None:
    """Delete what `removal` planned: through the cache API, or the files of a model outside it."""
    if removal.strategy is not None:
        removal.strategy.execute()
        return
    for model in removal.models:
        for part in model.parts:
            part.unlink(missing_ok=True)
