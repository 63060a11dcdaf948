"""Terminal output: data goes to stdout, everything for the human (errors, progress, stats) to stderr.

Progress bars appear only when stderr is a terminal.
"""

from __future__ import annotations

import errno
import io
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import TYPE_CHECKING, Any, BinaryIO

if TYPE_CHECKING:
    from rich.console import Console

STYLES = {"error": "bold red", "hint": "yellow", "muted": "dim", "accent": "cyan", "warn": "yellow"}


# rich is imported when a console is first needed, not at start-up: about 20 ms that a command
# which prints nothing for humans (or only a few plain lines) should not pay.
@lru_cache(maxsize=1)
def err() -> Console:
    """The stderr console (human-facing chrome)."""
    return _console(stderr=True)


@lru_cache(maxsize=1)
def out() -> Console:
    """A stdout console for rendered data (tables); plain text when stdout is not a terminal."""
    return _console(stderr=False)


def _console(*, stderr: bool) -> Console:
    from rich.console import Console
    from rich.theme import Theme

    return Console(stderr=stderr, theme=Theme(STYLES), highlight=False, soft_wrap=True)


def stderr_is_tty() -> bool:
    return sys.stderr.isatty() and os.environ.get("TERM") != "dumb"


def stdout_is_tty() -> bool:
    return sys.stdout.isatty()


def write_all(out: BinaryIO, data: bytes) -> None:
    """Write all of `data` to a binary stream, or raise (BrokenPipeError when a pipe's reader left).

    A write larger than the stream's buffer goes straight to the file and may be cut short (a
    signal, or the reader of a pipe leaving); Python then returns the count written, not an error,
    so the rest is written again until it is all out.
    """
    view = memoryview(data)
    while view:
        view = view[out.write(view):]


def silence_stdout() -> None:
    """Point stdout at /dev/null, so that what is still buffered for a reader who left goes nowhere."""
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError):  # not a real file (captured in tests): nothing reaches a reader anyway
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


class ClosedStream(io.TextIOBase):
    """Stands in for a standard stream the shell closed (`>&-`, `<&-`), where Python leaves None.

    Reading or writing it fails as a closed descriptor does, so a command stops with an error
    instead of its output silently going nowhere (or an AttributeError on None).
    """

    def __init__(self, name: str):
        super().__init__()
        self.label = f"standard {name} is closed"

    @property
    def buffer(self) -> ClosedStream:  # byte-level callers (`sys.stdin.buffer.read()`) fail the same way
        return self

    def _fail(self, *_: Any) -> Any:
        raise OSError(errno.EBADF, self.label)

    read = readline = write = fileno = _fail

    @property
    def closed(self) -> bool:  # code that only looks for piped input (complete -p) passes over it
        return True

    def isatty(self) -> bool:
        return False

    def flush(self) -> None:
        pass


def stand_in_for_closed_streams() -> None:
    """Give Python's None for a closed stdin/stdout a ClosedStream; a closed stderr writes nowhere."""
    if sys.stdin is None:
        sys.stdin = ClosedStream("input")
    if sys.stdout is None:
        sys.stdout = ClosedStream("output")
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - lives for the process


def print_error(message: str, hint: str | None = None) -> None:
    from rich.markup import escape

    console = err()
    console.print(f"[error]Error:[/error] {escape(message)}", highlight=False, emoji=False)
    if hint:
        console.print(f"[hint]Hint:[/hint] {escape(hint)}", highlight=False, emoji=False)


def warn(message: str) -> None:
    from rich.markup import escape

    err().print(f"[warn]Warning:[/warn] {escape(message)}", emoji=False)


def info(message: str) -> None:
    if not stderr_is_tty():  # rich would write the same characters here: no need to import it for them
        sys.stderr.write(message + "\n")
        sys.stderr.flush()
        return
    err().print(message, style="muted", markup=False, emoji=False)


def make_progress(transient: bool = True) -> Any:
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    return Progress(
        TextColumn("[accent]{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
        TimeRemainingColumn(), console=err(), transient=transient,
    )


def download_tqdm() -> type | None:
    """A tqdm-compatible class that draws huggingface_hub downloads as rich bars (None off a terminal)."""
    if not stderr_is_tty():
        return None
    from tqdm.auto import tqdm as base

    progress = make_progress(transient=False)

    class RichTqdm(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any):
            kwargs["disable"] = True  # tqdm draws nothing; rich does
            super().__init__(*args, **kwargs)
            progress.start()
            name = str(kwargs.get("desc") or "download")
            self._task = progress.add_task(name[-40:], total=kwargs.get("total"), completed=kwargs.get("initial", 0))

        def update(self, n: float | None = 1) -> bool | None:
            progress.advance(self._task, n or 0)
            return None

        def close(self) -> None:
            progress.stop()

    return RichTqdm


@contextmanager
def load_progress(label: str) -> Iterator[Callable[[float], None] | None]:
    """A callback for model-load progress (0..1), drawn as a transient bar on terminals."""
    if not stderr_is_tty():
        yield None
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("[accent]{task.description}"), BarColumn(), TimeElapsedColumn(),
                  console=err(), transient=True) as progress:
        task = progress.add_task(label, total=1.0)
        yield lambda fraction: progress.update(task, completed=fraction)


class Advance:
    """Moves a count_progress bar by n with a text beside it; a no-op (and not `active`) off a terminal."""

    def __init__(self, fn: Callable[[int, str], None] | None = None):
        self.fn = fn
        self.active = fn is not None

    def __call__(self, n: int, text: str) -> None:
        if self.fn is not None:
            self.fn(n, text)


@contextmanager
def count_progress(label: str, total: int, unit: str) -> Iterator[Advance]:
    """A transient bar counting `total` `unit`s, with ETA, on stderr (only when stderr is a terminal)."""
    if not stderr_is_tty():
        yield Advance()
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("[accent]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn(unit), TextColumn("{task.fields[value]}"), TimeRemainingColumn(),
                  console=err(), transient=True, redirect_stdout=False, redirect_stderr=False) as bar:
        task = bar.add_task(label, total=total, value="")
        yield Advance(lambda n, text: bar.update(task, advance=n, value=text))


@contextmanager
def quantize_progress(quiet: bool = False) -> Iterator[Callable[[Any], None] | None]:
    """A per-tensor bar for core.quantize's progress reports (weighted by tensor size), on a terminal
    unless `quiet` (llama.cpp's own log is on stderr then); no callback otherwise."""
    if quiet or not stderr_is_tty():
        yield None
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    with Progress(TextColumn("[accent]{task.description:<36.36}"), BarColumn(), TextColumn("{task.fields[count]}"),
                  TimeElapsedColumn(), TimeRemainingColumn(), console=err(), transient=True) as bar:
        task = bar.add_task("reading the model", total=None, count="")

        def update(p: Any) -> None:
            bar.update(task, description=p.current or "reading the model", total=p.total_bytes or None,
                       completed=p.done_bytes, count=f"{p.done}/{p.total} tensors" if p.total else "")

        yield update


@contextmanager
def bench_progress(test_names: list[str], detail: bool) -> Iterator[Callable[[int, int, str], None]]:
    """bench's on-step callback: llama-bench-style lines with --progress, a spinner on a terminal, else nothing."""
    if detail:
        yield lambda index, total, what: print(f"pyllama bench: benchmark {index}/{total}: {what}", file=sys.stderr,
                                               flush=True)
    elif not stderr_is_tty():
        yield lambda index, total, what: None
    else:
        with err().status("starting benchmark") as status:
            yield lambda index, total, what: status.update(
                f"benchmark {index}/{total}  {test_names[index - 1]}  {what}")


def model_progress() -> Any:
    """The download and load bars a command hands to core.model.session.open_model (none off a terminal)."""
    from .core.model.session import Progress

    return Progress(download=download_tqdm(), load=load_progress, warn=warn)


def print_table(columns: list[Any], rows: list[tuple[list[str], bool]], caption: str) -> None:
    """A table on stdout (bench's -o md on a terminal): `columns` have a heading, right, wrap and accent;
    each row is its cells and whether it failed (shown in red)."""
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAVY, caption=caption)
    for col in columns:
        table.add_column(col.heading, justify="right" if col.right else "left", style="accent" if col.accent else None,
                         no_wrap=not col.wrap)
    for cells, failed in rows:
        table.add_row(*cells, style="error" if failed else None)
    out().print(table)


def human_size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.2f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"


def human_count(n: int) -> str:
    for threshold, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= threshold:
            return f"{n / threshold:.2f}{suffix}"
    return str(n)
