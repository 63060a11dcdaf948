"""The GGUF models already on this machine: in the Hugging Face cache and in model folders.

`cached_models()` reads the Hugging Face cache through huggingface_hub's cache API (`scan_cache_dir`),
never by walking its folders by hand; `models_in_dir()` scans a plain folder. Both give one
`LocalModel` per model, a split model as one entry (its first part, every part's bytes). No network.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

SPLIT_PART = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
_QUANT_IN_NAME = re.compile(
    r"(?<![A-Za-z0-9])(I?Q\d(?:_[A-Z0-9]+)*|BF16|F16|F32|MXFP4(?:_MOE)?)(?=[.-])", re.IGNORECASE
)


@dataclass(frozen=True)
class LocalModel:
    """One model on disk. `id` is the file stem (a split model's without -00001-of-0000N), as `serve`
    names models; `path` is the file to load (the first part); `size` counts every part's bytes."""

    id: str
    path: Path
    parts: tuple[Path, ...]
    size: int
    quant: str | None
    modified: float  # newest part's mtime, seconds since the epoch
    repo: str | None = None  # Hugging Face repo id, for cached models
    filename: str | None = None  # the first part's path inside the repo
    files: tuple[Any, ...] = field(default=(), compare=False, repr=False)  # huggingface_hub CachedFileInfo, all revisions

    @cached_property
    def file_type(self) -> str | None:
        """The quantization the GGUF header states (`general.file_type`), whatever the file is called;
        None for a file whose header does not say, or cannot be read."""
        from ..gguf.ftypes import ftype_name
        from ..gguf.reader import read_metadata
        from ...errors import InvalidGGUF

        try:
            return ftype_name(read_metadata(self.path).get("general.file_type"))
        except (InvalidGGUF, OSError):
            return None

    @property
    def name(self) -> str:
        """`repo:QUANT` for a cached model (what -hf takes), else the file's path."""
        if self.repo is None:
            return str(self.path)
        return f"{self.repo}:{self.quant or self.id}"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "id": self.id, "repo": self.repo, "file": self.filename, "quant": self.quant,
                "path": str(self.path), "parts": len(self.parts), "size": self.size, "modified": self.modified}


def quant_in_name(filename: str) -> str | None:
    """The quant tag in a GGUF file's name (Q4_K_M in model-Q4_K_M.gguf), upper-cased; None if there is none."""
    match = _QUANT_IN_NAME.search(filename.rsplit("/", 1)[-1])
    return match.group(1).upper() if match else None


def model_stem(filename: str) -> str:
    """A model's id from its file name: no folder, no .gguf, no split suffix."""
    name = filename.rsplit("/", 1)[-1]
    match = SPLIT_PART.search(name)
    if match:
        return name[: match.start()]
    return name[: -len(".gguf")] if name.lower().endswith(".gguf") else name


def is_model_file(filename: str) -> bool:
    """A GGUF that holds a model to run: not a vision projector (mmproj), not a later split part."""
    lower = filename.lower()
    if not lower.endswith(".gguf") or "mmproj" in lower.rsplit("/", 1)[-1]:
        return False
    match = SPLIT_PART.search(filename)
    return not match or match.group(1) == "00001"


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache, found from the environment at call time, as huggingface_hub does."""
    env = os.environ
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(var):
            return Path(env[var]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    return Path(env.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "huggingface" / "hub"


def scan_hub_cache() -> Any:
    """huggingface_hub's HFCacheInfo for the cache, or None when there is no cache yet."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        return scan_cache_dir(hub_cache_dir())
    except (CacheNotFound, ValueError):  # no cache folder yet, or a file in its place
        return None


def current_revision(repo_info: Any) -> Any:
    """The revision `main` points at, else the newest one cached (what -hf uses offline)."""
    revisions = sorted(repo_info.revisions, key=lambda r: r.last_modified, reverse=True)
    return next((r for r in revisions if "main" in r.refs), revisions[0] if revisions else None)


def repo_files(revision: Any) -> dict[str, Any]:
    """A cached revision's files by their path inside the repo."""
    return {f.file_path.relative_to(revision.snapshot_path).as_posix(): f for f in revision.files}


def cached_models(repo: str | None = None) -> list[LocalModel]:
    """Every GGUF model in the Hugging Face cache (or in `repo`'s), sorted by repo and file name."""
    cache = scan_hub_cache()
    if cache is None:
        return []
    found = []
    for repo_info in cache.repos:
        if repo_info.repo_type != "model" or (repo is not None and repo_info.repo_id != repo):
            continue
        revision = current_revision(repo_info)
        found += _models_in_revision(repo_info, revision) if revision else []
    return sorted(found, key=lambda m: (m.repo or "", m.filename or ""))


def _models_in_revision(repo_info: Any, revision: Any) -> list[LocalModel]:
    files = repo_files(revision)
    models = []
    for name in sorted(files):
        if not is_model_file(name):
            continue
        part_names = split_part_names(name)
        if any(p not in files for p in part_names):
            continue  # a split model whose parts are not all downloaded yet
        parts = [files[p] for p in part_names]
        every_revision = [f for rev in repo_info.revisions for p in part_names
                          for f in rev.files if f.file_path.relative_to(rev.snapshot_path).as_posix() == p]
        models.append(LocalModel(
            id=model_stem(name), path=parts[0].file_path, parts=tuple(f.file_path for f in parts),
            size=sum(f.size_on_disk for f in parts), quant=quant_in_name(name),
            modified=max(f.blob_last_modified for f in parts), repo=repo_info.repo_id, filename=name,
            files=tuple(every_revision)))
    return models


def split_part_names(name: str) -> list[str]:
    """Every part's name for the first part of a split model; [name] for a single file."""
    match = SPLIT_PART.search(name)
    if not match:
        return [name]
    stem, count = name[: match.start()], int(match.group(2))
    return [f"{stem}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]


def models_in_dir(folder: Path) -> list[LocalModel]:
    """Every GGUF model directly in `folder` (split models as one, when all parts are there), by name."""
    names = {p.name for p in folder.iterdir() if p.is_file()} if folder.is_dir() else set()
    models = []
    for name in sorted(names):
        if not is_model_file(name):
            continue
        part_names = split_part_names(name)
        if any(p not in names for p in part_names):
            continue
        parts = tuple(folder / p for p in part_names)
        stats = [p.stat() for p in parts]
        models.append(LocalModel(id=model_stem(name), path=parts[0], parts=parts, size=sum(s.st_size for s in stats),
                                 quant=quant_in_name(name), modified=max(s.st_mtime for s in stats)))
    return models
