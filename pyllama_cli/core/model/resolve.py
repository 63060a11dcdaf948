"""Turn what the user named (`-m FILE` or `-hf user/repo[:quant]`) into local GGUF file(s).

This is the only module that talks to the Hugging Face Hub. Resolution follows llama.cpp's `-hf`:
the quant tag is matched case-insensitively against the repo's `.gguf` files; with no tag, Q4_K_M
if present, else the first GGUF; `-hff` names an exact file; split models download every part.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import (
    HubError,
    InvalidGGUF,
    ModelNotFound,
    NoModelGiven,
    OfflineMiss,
    QuantNotFound,
    UsageError,
)
from ..gguf.reader import read_gguf
from ..gguf.vocab_check import VOCAB_KEYS, check_vocab
from ..store.catalog import SPLIT_PART as _SPLIT
from ..store.catalog import cached_models, current_revision, hub_cache_dir, quant_in_name, repo_files, scan_hub_cache

__all__ = ["hub_cache_dir"]  # also imported from here by the completion tests

DEFAULT_QUANT = "Q4_K_M"
FIRST_CHOICE_REPO = "ggml-org/gemma-3-1b-it-GGUF"
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class ModelRequest:
    """How the user named a model; exactly one of `model` and `hf_repo` is set."""

    model: str | None = None
    hf_repo: str | None = None
    hf_file: str | None = None
    hf_token: str | None = None
    offline: bool = False


@dataclass(frozen=True)
class ModelRequests:
    """Several models named at once (serve's router mode: -m and -hf may each be given several times);
    -hff, -hft and --offline hold for every -hf repo."""

    paths: tuple[str, ...] = ()
    hf_repos: tuple[str, ...] = ()
    hf_file: str | None = None
    hf_token: str | None = None
    offline: bool = False

    @property
    def count(self) -> int:
        return len(self.paths) + len(self.hf_repos)

    def first(self) -> ModelRequest:
        """The first model named (the first -m, else the first -hf) as a request of its own."""
        return ModelRequest(model=self.paths[0] if self.paths else None,
                            hf_repo=None if self.paths or not self.hf_repos else self.hf_repos[0],
                            hf_file=self.hf_file, hf_token=self.hf_token, offline=self.offline)

    def for_repo(self, repo: str) -> ModelRequest:
        """One -hf repo as a request of its own."""
        return ModelRequest(hf_repo=repo, hf_file=self.hf_file, hf_token=self.hf_token, offline=self.offline)


@dataclass(frozen=True)
class ResolvedModel:
    """A model on local disk: `path` is the file to load (the first part of a split model)."""

    path: Path
    parts: tuple[Path, ...]
    repo: str | None = None
    filename: str | None = None

    @property
    def display_name(self) -> str:
        return f"{self.repo}:{self.filename}" if self.repo else str(self.path)


def resolve_model(request: ModelRequest, *, tqdm_class: Any = None, tokenizer: bool = True) -> ResolvedModel:
    """Resolve a model request to local, checked GGUF file(s), downloading if needed.

    Args:
        request: what the user named.
        tqdm_class: a tqdm-compatible class that renders download progress (None: no progress).
        tokenizer: the caller will load the tokenizer, so check it (quantize does not; it neither
            decodes nor checks the vocabulary).

    Raises:
        NoModelGiven, UsageError, ModelNotFound, InvalidGGUF, QuantNotFound, OfflineMiss, HubError.
    """
    if request.model and request.hf_repo:
        raise UsageError("give either -m/--model or -hf/--hf-repo, not both")
    if request.hf_file and not request.hf_repo:
        raise UsageError("-hff/--hf-file needs -hf/--hf-repo to say which repo it is in")
    if request.model:
        return resolve_local(Path(request.model).expanduser(), tokenizer=tokenizer)
    if request.hf_repo:
        return resolve_hf(request, tqdm_class=tqdm_class, tokenizer=tokenizer)
    raise no_model_error()


def resolve_local(path: Path, *, tokenizer: bool = True) -> ResolvedModel:
    """Check a local model path and the parts of a split model."""
    if not path.exists():
        raise ModelNotFound(f"model file not found: {path}", hint="check the path, or use -hf user/repo to download one")
    if path.is_dir():
        ggufs = sorted(p.name for p in path.glob("*.gguf"))
        hint = f"pick a file in it, e.g. -m {path / ggufs[0]}" if ggufs else "give the path of a .gguf file"
        raise InvalidGGUF(f"{path} is a directory, not a GGUF file", hint=hint)
    _require_regular(path)
    try:
        # Only the texts check_vocab reads are decoded (not a BPE vocabulary's merges); none for quantize.
        header = read_gguf(path, strings=VOCAB_KEYS if tokenizer else False)
    except PermissionError as exc:
        raise ModelNotFound(f"cannot read {path}: permission denied", hint="check the file's permissions") from exc
    if tokenizer:
        check_vocab(header)
    parts = _split_parts(path, header.get("split.count", 1))
    for part in parts[1:]:
        if not part.exists():
            raise ModelNotFound(f"split model part missing: {part}", hint=f"all {len(parts)} parts must sit beside the first")
        _require_regular(part)
        read_gguf(part, strings=frozenset() if tokenizer else False)  # no vocabulary past the first part
    return ResolvedModel(path=path, parts=parts)


def _require_regular(path: Path) -> None:
    """A model is read at offsets and mapped into memory: a FIFO or a device would block or fail midway."""
    if not path.is_file():
        raise InvalidGGUF(f"{path} is not a regular file, so not a GGUF model", hint="give the path of a .gguf file")


def _split_parts(first: Path, count: Any) -> tuple[Path, ...]:
    match = _SPLIT.search(first.name)
    if not isinstance(count, int) or count <= 1 or not match:
        return (first,)
    stem = first.name[: match.start()]
    return tuple(first.with_name(f"{stem}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1))


def parse_hf_spec(spec: str) -> tuple[str, str | None]:
    """Split `user/repo[:quant]` into the repo id and the tag (None when absent)."""
    repo, _, tag = spec.partition(":")
    repo = repo.strip()
    if not _REPO_ID.match(repo) or repo.count("/") != 1:
        raise UsageError(
            f"invalid Hugging Face repo {spec!r}", hint="write it as user/repo or user/repo:QUANT, e.g. -hf " + FIRST_CHOICE_REPO
        )
    return repo, (tag.strip() or None)


def offline_requested(request: ModelRequest) -> bool:
    return request.offline or os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def resolve_hf(request: ModelRequest, *, tqdm_class: Any = None, tokenizer: bool = True) -> ResolvedModel:
    repo, tag = parse_hf_spec(request.hf_repo or "")
    if offline_requested(request):
        # Say how the user asked for offline mode, so the hint names what to undo.
        online = "without --offline" if request.offline else "with HF_HUB_OFFLINE unset"
        files = _cached_repo_files(repo)
        if not files:
            raise OfflineMiss(
                f"offline mode: {repo} is not in the local Hugging Face cache ({hub_cache_dir()})",
                hint=f"run once {online} to download it: -hf {request.hf_repo}",
            )
        names = pick_gguf_files(list(files), tag, request.hf_file, repo)
        missing = [n for n in names if n not in files]
        if missing:
            raise OfflineMiss(f"offline mode: {missing[0].rsplit('/', 1)[-1]} of {repo} is not in the local cache",
                              hint=f"run once {online} to download it")
        paths = tuple(files[n] for n in names)
    else:
        files = _list_repo_files(repo, request.hf_token)
        names = pick_gguf_files(files, tag, request.hf_file, repo)
        paths = tuple(_download(repo, n, request.hf_token, tqdm_class) for n in names)
    for i, p in enumerate(paths):
        header = read_gguf(p, strings=(VOCAB_KEYS if i == 0 else frozenset()) if tokenizer else False)
        if i == 0 and tokenizer:
            check_vocab(header)
    return ResolvedModel(path=paths[0], parts=paths, repo=repo, filename=names[0])


def pick_gguf_files(files: list[str], tag: str | None, hf_file: str | None, repo: str) -> list[str]:
    """Choose the GGUF file(s) to use from a repo's file list; all parts of a split model.

    Raises:
        ModelNotFound: the repo has no GGUF files, or `hf_file` is not among them.
        QuantNotFound: no file matches `tag`; the error lists the quants present.
    """
    ggufs = sorted(f for f in files if f.lower().endswith(".gguf") and "mmproj" not in f.lower())
    if not ggufs:
        raise ModelNotFound(f"{repo} has no GGUF files", hint="pyllama runs GGUF models; look for a repo whose name ends in -GGUF")
    if hf_file:
        chosen = next((f for f in ggufs if f == hf_file or f.rsplit("/", 1)[-1] == hf_file), None)
        if chosen is None:
            raise ModelNotFound(f"{repo} has no file {hf_file!r}", hint="files: " + ", ".join(ggufs[:12]))
    elif tag:
        chosen = _match_tag(ggufs, tag)
        if chosen is None:
            raise QuantNotFound(
                f"{repo} has no GGUF file for quant {tag!r}",
                hint=f"quants in {repo}: {', '.join(available_quants(ggufs))} (use -hf {repo}:QUANT)",
            )
    else:
        chosen = _match_tag(ggufs, DEFAULT_QUANT) or _first_model_file(ggufs)
    return _with_split_parts(chosen, ggufs)


def pick_projector(files: list[str], model_file: str, tag: str | None = None) -> str | None:
    """The repo's multimodal projector for `model_file`, as llama.cpp's -hf picks it: a .gguf whose name
    holds "mmproj", in the model's folder or one above it; the deepest such folder first, then a name
    with the -hf tag (`-Q8_0.`), then the quant whose bits are closest to the tag's (or the model's)."""
    model_dir = model_file.split("/")[:-1]
    wanted_bits = _quant_bits(tag) if tag else _quant_bits(_name_tag(model_file))
    best: tuple[int, bool, int] | None = None
    chosen = None
    for name in sorted(files):
        sib_dir = name.split("/")[:-1]
        if not name.lower().endswith(".gguf") or "mmproj" not in name or model_dir[:len(sib_dir)] != sib_dir:
            continue
        exact = bool(tag) and f"-{tag.upper()}." in name.upper()
        rank = (len(sib_dir), exact, -abs(_quant_bits(_name_tag(name)) - wanted_bits))
        if best is None or rank > best:
            best, chosen = rank, name
    return chosen


def _name_tag(name: str) -> str:
    """What follows a file name's last "-" (its quant, as llama.cpp reads it): Q4_K_M in model-Q4_K_M.gguf."""
    stem = _SPLIT.sub("", name.rsplit("/", 1)[-1]).removesuffix(".gguf")
    return stem.rsplit("-", 1)[-1]


def _quant_bits(tag: str) -> int:
    digits = re.search(r"\d+", tag)
    return int(digits.group()) if digits else 0


def resolve_hf_projector(request: ModelRequest, model_file: str, *, tqdm_class: Any = None) -> Path | None:
    """The projector beside an -hf model, downloaded into the HF cache (pick_projector chooses); None
    when the repo has none."""
    repo, tag = parse_hf_spec(request.hf_repo or "")
    if offline_requested(request):
        cached = _cached_repo_files(repo)
        name = pick_projector(list(cached), model_file, tag)
        return cached.get(name) if name else None
    name = pick_projector(_list_repo_files(repo, request.hf_token), model_file, tag)
    return _download(repo, name, request.hf_token, tqdm_class) if name else None


def _match_tag(ggufs: list[str], tag: str) -> str | None:
    pattern = re.compile(r"(?<![A-Za-z0-9])" + re.escape(tag) + r"(?=[.-])", re.IGNORECASE)
    matches = [f for f in ggufs if pattern.search(f.rsplit("/", 1)[-1])]
    # Prefer the first part of a split model, then the shortest name (a plain file over a variant).
    matches.sort(key=lambda f: (bool(_SPLIT.search(f)) and "-00001-of-" not in f, len(f), f))
    return matches[0] if matches else None


def _first_model_file(ggufs: list[str]) -> str:
    for f in ggufs:
        m = _SPLIT.search(f)
        if not m or m.group(1) == "00001":
            return f
    return ggufs[0]


def _with_split_parts(chosen: str, ggufs: list[str]) -> list[str]:
    m = _SPLIT.search(chosen)
    if not m:
        return [chosen]
    stem, count = chosen[: m.start()], int(m.group(2))
    parts = [f"{stem}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]
    absent = [p for p in parts if p not in ggufs]
    if absent:
        raise ModelNotFound(f"split model part missing from the repo: {absent[0]}")
    return parts


def available_quants(ggufs: list[str]) -> list[str]:
    """The distinct quant names found in GGUF file names, in file order."""
    seen: dict[str, None] = {}
    for f in ggufs:
        seen[quant_in_name(f) or f.rsplit("/", 1)[-1]] = None
    return list(seen)


def _cached_repo_files(repo: str) -> dict[str, Path]:
    """The files of `repo`'s current cached revision, by path in the repo (empty when not cached)."""
    from huggingface_hub import try_to_load_from_cache

    cache = scan_hub_cache()
    repo_info = next((r for r in cache.repos if r.repo_id == repo and r.repo_type == "model"), None) if cache else None
    revision = current_revision(repo_info) if repo_info else None
    if revision is None:
        return {}
    found = {}
    for name in repo_files(revision):
        # The cache API's own lookup: the snapshot entry for this commit, if the file is complete.
        path = try_to_load_from_cache(repo, name, cache_dir=hub_cache_dir(), revision=revision.commit_hash)
        if isinstance(path, str):
            found[name] = Path(path)
    return found


def no_model_error() -> NoModelGiven:
    cached = cached_models()
    if not cached:
        hint = f"no GGUF models in your Hugging Face cache yet; a small first choice: -hf {FIRST_CHOICE_REPO}"
    else:
        lines = [f"  -hf {c.repo} -hff {c.filename}  ({c.size / 2**20:.1f} MiB)" for c in cached[:20]]
        hint = "models in your Hugging Face cache:\n" + "\n".join(lines)
    return NoModelGiven("no model given: use -m FILE.gguf or -hf user/repo[:quant]", hint=hint)


def _hub_endpoint() -> str | None:
    return os.environ.get("HF_ENDPOINT") or None


def hub_file_url(repo: str, filename: str) -> str:
    """The address a file of a repo's main branch downloads from (HF_ENDPOINT's, else the Hub's)."""
    return f"{_hub_endpoint() or 'https://huggingface.co'}/{repo}/resolve/main/{filename}"


def _token(explicit: str | None) -> str | None:
    return explicit or os.environ.get("HF_TOKEN") or None


def remote_model_files(spec: str, token: str | None = None) -> tuple[list[str], int]:
    """The file(s) `-hf spec` would download and their size in bytes, from the Hub's file listing."""
    repo, tag = parse_hf_spec(spec)
    sizes = _list_repo_tree(repo, token)
    names = pick_gguf_files(list(sizes), tag, None, repo)
    return names, sum(sizes[n] for n in names)


def _list_repo_files(repo: str, token: str | None) -> list[str]:
    return list(_list_repo_tree(repo, token))


def _list_repo_tree(repo: str, token: str | None) -> dict[str, int]:
    """The repo's file paths and sizes, in one attempt: an unreachable Hub fails at once instead of after the
    client's ~20 s of retries (HfApi.list_repo_files retries connection errors five times)."""
    from urllib.parse import quote

    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    _quiet_hub_logging()
    url = f"{_hub_endpoint() or 'https://huggingface.co'}/api/models/{quote(repo)}/tree/main"
    params: dict[str, str] | None = {"recursive": "true", "expand": "false"}
    files: dict[str, int] = {}
    with _hub_errors(repo):
        while url:
            response = get_session().get(url, params=params, headers=build_hf_headers(token=_token(token)),
                                         timeout=30, follow_redirects=True)
            hf_raise_for_status(response)
            files.update({e["path"]: int(e.get("size") or 0) for e in response.json() if e.get("type") == "file"})
            url, params = (response.links.get("next") or {}).get("url"), None
    return files


def _quiet_hub_logging() -> None:
    # huggingface_hub logs retries and warnings through `logging`, which would land on stderr.
    from huggingface_hub.utils import logging as hub_logging

    hub_logging.set_verbosity_error()


def _download(repo: str, filename: str, token: str | None, tqdm_class: Any) -> Path:
    from ..store.download import download_to_cache

    _quiet_hub_logging()
    with _hub_errors(repo, filename):
        return download_to_cache(repo, filename, token=_token(token), endpoint=_hub_endpoint(), tqdm_class=tqdm_class)


class _hub_errors:
    """Translate huggingface_hub and network exceptions into pyllama errors."""

    def __init__(self, repo: str, filename: str | None = None):
        self.repo, self.filename = repo, filename

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        if exc is None:
            return False
        mapped = translate_hub_error(exc, self.repo, self.filename)
        if mapped is None:
            return False
        raise mapped from exc


def translate_hub_error(exc: BaseException, repo: str, filename: str | None) -> Exception | None:
    from huggingface_hub import errors as hub

    endpoint = _hub_endpoint() or "https://huggingface.co"
    if isinstance(exc, hub.GatedRepoError):
        return HubError(f"{repo} is gated: your token has no access to it",
                        hint=f"accept its terms at {endpoint}/{repo}, then set HF_TOKEN or --hf-token")
    if isinstance(exc, hub.RepositoryNotFoundError):
        return ModelNotFound(f"Hugging Face repo not found: {repo}",
                             hint="check the name; for a private repo set HF_TOKEN or --hf-token")
    if isinstance(exc, (hub.EntryNotFoundError, hub.RemoteEntryNotFoundError)):
        return ModelNotFound(f"{repo} has no file {filename!r}")
    if isinstance(exc, hub.HfHubHTTPError):
        return HubError(f"Hugging Face request for {repo} failed: {str(exc).splitlines()[0]}")
    if isinstance(exc, OSError) and getattr(exc, "errno", None) == 28:
        return HubError(f"disk full while downloading {filename} of {repo}", hint=f"free space in {hub_cache_dir()}")
    if isinstance(exc, OSError) and getattr(exc, "errno", None) in (errno.EACCES, errno.EPERM, errno.EROFS):
        return HubError(f"cannot write to the Hugging Face cache: {exc.filename or hub_cache_dir()} "
                        f"({exc.strerror or 'permission denied'})", hint="set HF_HUB_CACHE to a writable directory")
    if _is_network_error(exc):
        return HubError(f"cannot reach {endpoint} to resolve {repo}",
                        hint="check your connection, or use --offline to use the local cache")
    return None


def _is_network_error(exc: BaseException) -> bool:
    # huggingface_hub's HTTP stack (httpx or its successor httpx2) raises TransportError subclasses.
    transport = any(cls.__name__ == "TransportError" for cls in type(exc).__mro__)
    return transport or isinstance(exc, (ConnectionError, TimeoutError)) or type(exc).__name__ in {
        "OfflineModeIsEnabled", "LocalEntryNotFoundError",
    }
