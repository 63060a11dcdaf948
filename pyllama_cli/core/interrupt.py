"""Turn Ctrl-C into a flag that long-running native work polls, instead of an exception.

A KeyboardInterrupt raised inside a ctypes callback cannot unwind through C; a flag can be polled
by llama.cpp's abort callback (mid-decode) and by the token loop (between tokens).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class StopFlag:
    """Set by Ctrl-C (or by code, e.g. a client disconnect); polled by the generation loop."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()

    def clear(self) -> None:
        self._event.clear()

    def __bool__(self) -> bool:
        return self._event.is_set()


@contextmanager
def catch_sigint(flag: StopFlag) -> Iterator[StopFlag]:
    """While the block runs, Ctrl-C sets `flag` instead of raising (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, lambda *_: flag.set())
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)


@contextmanager
def remembered_sigint() -> Iterator[StopFlag]:
    """While the block runs, Ctrl-C raises KeyboardInterrupt as usual and also sets the flag it yields.

    A KeyboardInterrupt that lands inside a ctypes callback (llama.cpp's log or abort callback) is
    swallowed there; the flag is not, so a loop that checks it between steps still stops.
    """
    flag = StopFlag()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def interrupt(*_: object) -> None:
        flag.set()
        raise KeyboardInterrupt

    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, interrupt)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)
