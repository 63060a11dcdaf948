"""Requests between reaching the server and their submit, which the scheduler's next step may wait for.

Clients often send requests together (4 streams that end in the same step send their next 4
requests at once), but the server parses and tokenizes them one after another. Starting the first
alone would put it a step ahead of the others for good, and from then on every step in which one of
them ends runs with a slot short. So while a slot is free, a step waits (at most ARRIVAL_WAIT_S per
request) for requests already inside `arriving()`.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

# How long a step may wait for a request that reached the server but is not submitted yet.
ARRIVAL_WAIT_S = 0.003


class _Arrival:
    """A request between reaching the server and its submit."""

    __slots__ = ("since",)

    def __init__(self) -> None:
        self.since = time.perf_counter()


_ARRIVING: contextvars.ContextVar[_Arrival | None] = contextvars.ContextVar("pyllama_arriving", default=None)


class Arrivals:
    """The requests on their way to one engine's submit; guarded by the engine's condition `cond`."""

    def __init__(self, cond: threading.Condition):
        self._cond = cond
        self._pending: set[_Arrival] = set()

    def __len__(self) -> int:
        return len(self._pending)

    @contextmanager
    def arriving(self) -> Iterator[None]:
        """The block in which a request is parsed and submitted (a submit inside it ends its wait)."""
        arrival = _Arrival()
        with self._cond:
            self._pending.add(arrival)
        token = _ARRIVING.set(arrival)
        try:
            yield
        finally:
            _ARRIVING.reset(token)
            with self._cond:
                if arrival in self._pending:  # it ended without a submit (a bad request)
                    self._pending.discard(arrival)
                    self._cond.notify()

    def submitted(self) -> None:
        """The current request was submitted (call with the condition held)."""
        self._pending.discard(_ARRIVING.get())  # type: ignore[arg-type]

    def seconds_left(self) -> float:
        """How much longer a step may wait: ARRIVAL_WAIT_S after the newest arrival (<= 0: no more)."""
        if not self._pending:
            return 0.0
        return max(a.since for a in self._pending) + ARRIVAL_WAIT_S - time.perf_counter()
