"""A streamed generation made into a replay session: the request's `X-Conversation-Id` opts in.

`detached` starts the family's SSE response as usual, then copies its bytes into the session's buffer
in a task of its own, and answers the request by following that buffer from byte 0. The client
leaving ends only its reading; the generation goes on, holding its slot and its model (the request's
lease moves to the session) until it ends, is stopped by DELETE, or overflows the byte bound, which
ends it with the API's error event rather than a silently shortened stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from fastapi import Request
from fastapi.responses import Response
from starlette.responses import StreamingResponse

from ..errors import APIError
from ..http.leases import keep
from ..sse import DONE, HEADERS, anthropic_error_event, error_event
from .buffer import BufferFull, ReplayBuffer
from .sessions import Session, StreamSessions

HEADER = "x-conversation-id"
T = TypeVar("T")


def conversation_id(request: Request) -> str:
    """The request's conversation id ("" when it did not opt in)."""
    return request.headers.get(HEADER, "").strip()


def sessions_of(request: Request) -> StreamSessions:
    return request.app.state.streams


async def model_of(request: Request, conversation: str, find: Awaitable[T]) -> T:
    """Await `find` (the request's model, which in router mode may have to load first) as the waiting
    request of `conversation`: meanwhile a reader of the id gets a 503, and a DELETE of it cancels this
    request with a 400, as llama-server's router does. The wait does not end with the client: like the
    session that follows, it is stopped only by a DELETE or a newer request of the same id."""
    sessions = sessions_of(request)
    waiting = asyncio.ensure_future(find)
    sessions.wait_for_model(conversation, waiting)
    try:
        await asyncio.wait([waiting])
    except asyncio.CancelledError:  # the request itself was cancelled (the server is closing)
        waiting.cancel()
        sessions.model_found(conversation, waiting)  # forgets the wait
        raise
    if not sessions.model_found(conversation, waiting):
        raise APIError(400, "request cancelled by a stop while the model was loading", code="cancelled")
    return waiting.result()


def detached(request: Request, conversation: str, start: Callable[[], Response]) -> Response:
    """Run `start()` (the family's stream) as the session of `conversation`, and follow it."""
    sessions = sessions_of(request)
    response = start()
    cancel = getattr(response, "on_disconnect", None)
    if cancel is None or not response.headers.get("content-type", "").startswith("text/event-stream"):
        return response  # not an SSE stream (ollama's NDJSON...): served as it is, bound to its client
    try:
        sessions.make_room(conversation)
    except APIError:  # all sessions still generating: this job is not run
        cancel()
        raise
    session = Session(conversation, ReplayBuffer(sessions.max_bytes), cancel)
    sessions.add(session)
    ending = _anthropic_ending if request.url.path.startswith("/v1/messages") else _openai_ending
    session.task = asyncio.get_running_loop().create_task(
        _copy(response.body_iterator, session, sessions, ending, keep()))
    return follow(session, 0)


def follow(session: Session, offset: int) -> StreamingResponse:
    """The session's bytes from `offset`, live until it ends; the reader leaving does not stop it."""
    return StreamingResponse(session.buffer.follow(offset), media_type="text/event-stream",
                             headers={**HEADERS, "X-Conversation-Id": session.conversation_id})


async def _copy(body: AsyncIterator[str | bytes], session: Session, sessions: StreamSessions,
                ending: Callable[[BaseException], bytes], release: Callable[[], None]) -> None:
    try:
        async for chunk in body:
            data = chunk.encode() if isinstance(chunk, str) else bytes(chunk)
            try:
                session.buffer.append(data)
            except BufferFull as full:
                session.cancel()
                session.buffer.force(ending(APIError(500, str(full), code="stream_buffer_full")))
                break
    except Exception as exc:  # noqa: BLE001 - families end their streams themselves; this is the last guard
        session.buffer.force(ending(exc))
    finally:
        close = getattr(body, "aclose", None)
        if close is not None:
            await close()
        release()
        sessions.finished(session)


def _openai_ending(exc: BaseException) -> bytes:
    return error_event(exc) + DONE


def _anthropic_ending(exc: BaseException) -> bytes:
    return anthropic_error_event(exc)
