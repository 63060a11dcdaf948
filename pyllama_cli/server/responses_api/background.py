"""Responses run with `background: true`: they go on without their client, and can be polled, resumed
and cancelled (OpenAI's background mode).

A run copies the response's stream events into a list as they come, and keeps the response body as
GET /v1/responses/{id} shows it: `queued` when made, `in_progress` once its stream starts, then
`completed` (or `incomplete`), `failed` (an error event), or `cancelled`. A reader resumes with
`starting_after=N`: the events whose sequence_number is above N, then live ones until the end. The
store's bounds apply to the runs too: at most its count of them and its bytes of events, the oldest
finished ones forgotten first.

A finished run is packed: its events become one zlib blob (they repeat their ids and field names, so
a 96-token answer's 22 KB become 1.5 KB), its body one JSON document, and it lets go of its job. A
server then holds its store's count of finished runs in a few MiB, not in the store's whole bound.
"""

from __future__ import annotations

import asyncio
import json
import zlib
from array import array
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.responses import StreamingResponse

from ..sse import HEADERS
from .store import ResponseStore

STOP_WAIT_S = 5.0  # how long a cancel waits for the generation to end


@dataclass(eq=False)
class Run:
    _body: dict[str, Any]  # the response as it stands (once packed: `packed_body`)
    cancel_job: Callable[[], None]
    events: list[bytes] = field(default_factory=list)  # events[i] has sequence_number i, until packed
    size: int = 0
    done: bool = False
    cancelled: bool = False
    task: asyncio.Task[Any] | None = None
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    packed_body: bytes = b""
    packed_events: bytes = b""  # zlib of the events joined
    ends: array = field(default_factory=lambda: array("L"))  # where each packed event ends

    @property
    def body(self) -> dict[str, Any]:
        return json.loads(self.packed_body) if self.packed_body else self._body

    @body.setter
    def body(self, value: dict[str, Any]) -> None:
        self._body = value

    async def follow(self, after: int) -> AsyncIterator[bytes]:
        """The events after sequence number `after`, then the live ones until the run ends."""
        index = max(after + 1, 0)
        while not self.done:
            if index < len(self.events):
                index += 1
                yield self.events[index - 1]
            else:
                await self._changed.wait()
        for event in self.finished_events()[index:]:
            yield event

    def finished_events(self) -> list[bytes]:
        joined, bounds = zlib.decompress(self.packed_events), [0, *self.ends]
        return [joined[start:end] for start, end in zip(bounds, bounds[1:])]

    def add(self, chunk: bytes) -> None:
        _, _, data = chunk.partition(b"\ndata: ")
        event = json.loads(data)
        if "response" in event:  # created, in_progress, completed or incomplete: the response as it stands
            self.body = {**event["response"], "background": True}
        elif event.get("type") == "error":
            self.body = {**self.body, "status": "failed",
                         "error": {"code": event.get("code") or "server_error", "message": event.get("message")}}
        self.events.append(chunk)
        self.size += len(chunk)
        self._wake()

    def finish(self) -> None:
        if self.cancelled:
            self.body = {**self.body, "status": "cancelled"}
        self._pack()
        self.done = True
        self._wake()

    def _pack(self) -> None:
        """Keep the finished run small (the module's docstring), and let go of its job."""
        end = 0
        for event in self.events:
            end += len(event)
            self.ends.append(end)
        self.packed_events = zlib.compress(b"".join(self.events), 6)
        self.packed_body = json.dumps(self._body, ensure_ascii=False, separators=(",", ":")).encode()
        self.size = len(self.packed_events) + len(self.packed_body) + self.ends.itemsize * len(self.ends)
        self.events, self._body, self.task, self.cancel_job = [], {}, None, _nothing

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()


def _nothing() -> None:
    """A finished run's job: nothing left to cancel."""


class BackgroundRuns:
    """The background responses of a server (app.state.background_responses)."""

    def __init__(self, store: ResponseStore):
        self.store = store
        self.runs: OrderedDict[str, Run] = OrderedDict()

    def start(self, queued: dict[str, Any], response: StreamingResponse) -> Run:
        """Run `response`'s events in the background; `queued` is the response's body until they start."""
        run = Run({**queued, "background": True}, getattr(response, "on_disconnect", lambda: None))
        self.runs[queued["id"]] = run
        run.task = asyncio.get_running_loop().create_task(self._copy(run, response.body_iterator))
        self._bound()
        return run

    def get(self, response_id: str) -> Run | None:
        return self.runs.get(response_id)

    async def cancel(self, run: Run) -> None:
        """Stop a run that still generates (a finished one stays as it is) and wait until it has ended."""
        if run.done:
            return
        run.cancelled = True
        run.cancel_job()
        if run.task is not None:
            await asyncio.wait([run.task], timeout=STOP_WAIT_S)

    def forget(self, response_id: str) -> Run | None:
        run = self.runs.pop(response_id, None)
        if run is not None and not run.done:
            run.cancelled = True
            run.cancel_job()
        return run

    async def _copy(self, run: Run, events: AsyncIterator[str | bytes]) -> None:
        try:
            async for chunk in events:
                if run.cancelled:
                    break
                run.add(chunk.encode() if isinstance(chunk, str) else bytes(chunk))
        finally:
            close = getattr(events, "aclose", None)
            if close is not None:
                await close()
            run.finish()
            self._bound()

    def _bound(self) -> None:
        """The store's bounds, on the runs: its count of them, its bytes of their events."""
        finished = [key for key, run in self.runs.items() if run.done]
        while finished and (len(self.runs) > self.store.max_count
                            or sum(run.size for run in self.runs.values()) > self.store.max_bytes):
            del self.runs[finished.pop(0)]


def follow(run: Run, after: int) -> StreamingResponse:
    return StreamingResponse(run.follow(after), media_type="text/event-stream", headers=HEADERS)
