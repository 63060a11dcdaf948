"""Downloads into the Hugging Face cache that pick up where an interrupted one stopped.

huggingface_hub (since 1.x) downloads each file to a fresh, process-unique temporary file, so a
download killed at 90% starts again from zero. A GGUF is often gigabytes, so pyllama fetches the
blob itself into `blobs/<etag>.incomplete` (the name the cache API reports as an incomplete file),
asking only for the missing bytes with an HTTP Range, and moves it to `blobs/<etag>` when whole.
`hf_hub_download` then finds the blob there and does the cache's bookkeeping (the snapshot entry
and the ref), so the cache stays exactly as huggingface_hub would have written it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...errors import HubError
from .catalog import hub_cache_dir

CHUNK = 1024 * 1024  # bytes written (and flushed) at a time: what a kill can lose at most
TIMEOUT_S = 30


def download_to_cache(repo: str, filename: str, *, token: str | None, endpoint: str | None,
                      tqdm_class: Any = None) -> Path:
    """The cached path of `filename` in `repo`, downloading (or finishing the download of) its blob first.

    Raises:
        huggingface_hub's errors (the caller translates them), HubError: another pyllama is
        downloading the same file, or the Hub sent fewer bytes than it announced.
    """
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url, try_to_load_from_cache

    cache = hub_cache_dir()
    cached = try_to_load_from_cache(repo, filename, cache_dir=cache)
    if isinstance(cached, str):
        return Path(cached)
    metadata = get_hf_file_metadata(hf_hub_url(repo, filename, endpoint=endpoint), token=token)
    if metadata.etag and metadata.size:
        blob = cache / ("models--" + repo.replace("/", "--")) / "blobs" / metadata.etag
        if not blob.exists():
            _fetch_blob(metadata.location, blob, metadata.size, token, tqdm_class, filename)
    # With the blob in place this only links it into the snapshot; without (no etag) it downloads.
    return Path(hf_hub_download(repo, filename, cache_dir=cache, token=token, endpoint=endpoint,
                                tqdm_class=tqdm_class))


def _fetch_blob(url: str, blob: Path, size: int, token: str | None, tqdm_class: Any, label: str) -> None:
    import fcntl

    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    partial = blob.with_name(blob.name + ".incomplete")
    blob.parent.mkdir(parents=True, exist_ok=True)
    with partial.open("ab") as out:
        try:
            fcntl.flock(out, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise HubError(f"another download of {label} is under way ({partial})",
                           hint="wait for it to finish, then run this again") from None
        have = out.tell()
        if have > size:  # not the file we expect: start over
            out.truncate(0)
            have = 0
        headers = build_hf_headers(token=token)
        if have:
            headers["Range"] = f"bytes={have}-"
        if have < size:
            with get_session().stream("GET", url, headers=headers, follow_redirects=True, timeout=TIMEOUT_S) as answer:
                hf_raise_for_status(answer)
                if have and answer.status_code != 206:  # the server sent the whole file instead
                    out.truncate(0)
                    have = 0
                have = _write_body(answer, out, have, size, tqdm_class, label)
        if have != size:
            raise HubError(f"the download of {label} ended early ({have} of {size} bytes)",
                           hint="run the command again: it resumes where this one stopped")
        os.replace(partial, blob)


def _write_body(answer: Any, out: Any, have: int, size: int, tqdm_class: Any, label: str) -> int:
    bar = tqdm_class(total=size, initial=have, desc=label, unit="B", unit_scale=True) if tqdm_class else None
    try:
        for chunk in answer.iter_bytes(CHUNK):
            out.write(chunk)
            out.flush()
            have += len(chunk)
            if bar is not None:
                bar.update(len(chunk))
    finally:
        if bar is not None:
            bar.close()
    return have


def progress_reporter(report: Callable[[str, int, int], None], every_s: float = 0.0) -> type:
    """A tqdm stand-in for `tqdm_class` that draws nothing: `report(file, bytes done, bytes in all)` when
    each file's download starts, when it is whole, and after a chunk at most every `every_s` seconds (a
    server turns it into its API's progress events)."""

    class Progress:
        def __init__(self, *args: Any, total: int | None = None, initial: int = 0, desc: str = "", **_: Any):
            self.file, self.total, self.n = str(desc or "model"), int(total or 0), int(initial or 0)
            self.said = time.monotonic()
            report(self.file, self.n, self.total)

        def update(self, n: float | None = 1) -> None:
            self.n += int(n or 0)
            if self.n >= self.total or time.monotonic() - self.said >= every_s:
                self.said = time.monotonic()
                report(self.file, self.n, self.total)

        def close(self) -> None:
            pass

        def __enter__(self) -> Any:
            return self

        def __exit__(self, *exc: Any) -> None:
            self.close()

        def __getattr__(self, name: str) -> Any:  # anything else tqdm offers is a no-op here
            return lambda *args, **kwargs: None

    return Progress
