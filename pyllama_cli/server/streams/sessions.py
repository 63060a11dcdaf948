"""The replay sessions of one server, by conversation id: their bounds, grace, replacement and lookup.

A session is one detached generation: its buffer, the job's cancel, and the task that copies the job's
SSE bytes into the buffer. The registry holds at most `max_sessions`; a new one takes the place of
the oldest finished session, and gets a 503 that says why when every session is still generating.
A finished session stays readable for `grace_s` seconds, then is freed; lookup reports only the running.

Before its session exists, a request may wait for its model (router mode: loading, or waiting for
room under --models-max). It is registered as waiting meanwhile, so that a reader gets a 503 (retry
later) rather than a 404, and a DELETE (or a newer request of the same id) cancels it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import APIError
from .buffer import ReplayBuffer

STOP_WAIT_S = 5.0  # how long DELETE waits for a stopped generation to give back its slot


@dataclass(eq=False)
class Session:
    conversation_id: str
    buffer: ReplayBuffer
    cancel: Callable[[], None]  # stops the generation (the family's disconnect handler)
    started_at: float = field(default_factory=time.time)
    completed_at: float | None = None
    task: asyncio.Task[Any] | None = None
    expiry: asyncio.TimerHandle | None = None  # frees it once its grace has passed

    def forget(self) -> None:
        """It left the registry: its grace timer must not hold its buffer for the rest of the grace."""
        if self.expiry is not None:
            self.expiry.cancel()

    @property
    def done(self) -> bool:
        return self.completed_at is not None

    def view(self) -> dict[str, Any]:
        """The session as POST /v1/streams/lookup reports it (llama-server's fields)."""
        return {"conversation_id": self.conversation_id, "is_done": self.done, "total_bytes": len(self.buffer),
                "started_at": int(self.started_at),
                "completed_at": int(self.completed_at) if self.completed_at is not None else None}


class StreamSessions:
    """Every replay session of a server (app.state.streams)."""

    def __init__(self, max_sessions: int, max_bytes: int, grace_s: float):
        self.max_sessions = max_sessions
        self.max_bytes = max_bytes
        self.grace_s = grace_s
        self._sessions: dict[str, Session] = {}
        self._waiting: dict[str, asyncio.Future[Any]] = {}  # requests of an id still waiting for their model

    def __len__(self) -> int:
        return len(self._sessions)

    def make_room(self, conversation_id: str) -> None:
        """Room for a new session of `conversation_id`: its old session is stopped and replaced, the oldest
        finished one goes if the registry is full; a 503 if all of them are still generating."""
        self.stop(conversation_id)
        if len(self._sessions) < self.max_sessions:
            return
        finished = [s for s in self._sessions.values() if s.done]
        if not finished:
            raise APIError(503, f"all {self.max_sessions} stream sessions are still generating "
                                "(--stream-sessions); retry once one finishes, or stop one with DELETE /v1/stream",
                           code="unavailable")
        oldest = min(finished, key=lambda s: s.completed_at or 0.0)
        del self._sessions[oldest.conversation_id]
        oldest.forget()

    def add(self, session: Session) -> None:
        self._sessions[session.conversation_id] = session

    def get(self, conversation_id: str) -> Session | None:
        return self._sessions.get(conversation_id)

    def waiting(self, conversation_id: str) -> bool:
        """Whether a request of this id is still waiting for its model (its session is yet to come)."""
        return conversation_id in self._waiting

    def wait_for_model(self, conversation_id: str, find: asyncio.Future[Any]) -> None:
        """`find` (the request's wait for its model) now holds the id: a waiting request before it is
        cancelled, as a running session is replaced."""
        earlier = self._waiting.pop(conversation_id, None)
        if earlier is not None:
            earlier.cancel()
        self._waiting[conversation_id] = find

    def model_found(self, conversation_id: str, find: asyncio.Future[Any]) -> bool:
        """The wait ended: False when a DELETE or a newer request took the id meanwhile (the request is
        then answered with an error, and no session is made)."""
        if self._waiting.get(conversation_id) is not find:
            return False
        del self._waiting[conversation_id]
        return not find.cancelled()

    def lookup(self, conversation_ids: list[str]) -> list[dict[str, Any]]:
        """The running sessions of the ids named: each id matches itself and its `ID::model` forms, nothing
        else. A finished one is left out (it may still be replayed during its grace)."""
        found: list[Session] = []
        for wanted in conversation_ids:
            found += [s for key, s in self._sessions.items()
                      if (key == wanted or key.startswith(wanted + "::")) and not s.done and s not in found]
        return [s.view() for s in found]

    def stop(self, conversation_id: str) -> Session | None:
        """Stop a session's generation (or a request still waiting for its model) and forget it
        (idempotent); the stopped session, if there was one."""
        waiting = self._waiting.pop(conversation_id, None)
        if waiting is not None:
            waiting.cancel()
        return self._stop_session(conversation_id)

    def _stop_session(self, conversation_id: str) -> Session | None:
        session = self._sessions.pop(conversation_id, None)
        if session is not None and not session.done:
            session.cancel()
        if session is not None:
            session.forget()
        return session

    async def stop_and_wait(self, conversation_id: str) -> None:
        """`stop`, then wait (a few seconds at most) until the generation has ended and its slot is free."""
        session = self.stop(conversation_id)
        if session is not None and session.task is not None and not session.task.done():
            await asyncio.wait([session.task], timeout=STOP_WAIT_S)

    def finished(self, session: Session) -> None:
        """The session's generation ended: keep it readable for the grace period, then free it."""
        session.completed_at = time.time()
        session.buffer.finish()
        session.cancel, session.task = _nothing, None  # let go of the job: only the buffer is kept
        if self._sessions.get(session.conversation_id) is session:  # not stopped, replaced or evicted meanwhile
            session.expiry = asyncio.get_running_loop().call_later(self.grace_s, self._expire, session)

    def _expire(self, session: Session) -> None:
        if self._sessions.get(session.conversation_id) is session:
            del self._sessions[session.conversation_id]

    def stop_all(self) -> None:
        """Stop every generation (the server is closing)."""
        for waiting in self._waiting.values():
            waiting.cancel()
        for session in list(self._sessions.values()):
            if not session.done:
                session.cancel()


def _nothing() -> None:
    """A finished session's cancel: there is nothing left to stop."""
