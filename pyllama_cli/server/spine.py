"""The one path every generation route takes, whatever API it speaks.

    find the model ─► arriving() ─► can it generate? ─► prepare (inline, or in a thread) ─► stream or body

An API family (openai/, llama_server/, anthropic/, responses_api/...) supplies three functions: its
`prepare` (request body → job, every mistake a 400 before the answer starts), its `stream` (an SSE
response) and its `whole` (one JSON body); `generate` runs them in that order. The model is held from
`ModelSet.get` until the answer is sent (http/leases.py releases it), and `engine.arriving()` makes
the scheduler wait for this request's job before it starts a step without it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from ..core.serving.engine import BROKEN, Engine
from .errors import APIError, loading_error
from .model_set import ServedModel
from .settings import ServerSettings
from .streams import detach as streams

T = TypeVar("T")
# A request body this small is turned into a job on the event loop itself (~0.1 ms: a short prompt to
# tokenize, a small template or schema). Under load the thread pool's hand-off is what costs: its worker
# waits for a CPU that the decode threads hold (measured 2 ms at p50 with 4 streams on 2 cores), and
# that wait lands in every request's time to first token.
INLINE_PREPARE_BYTES = 8192

Prepare = Callable[[Engine, ServerSettings, Any], T]  # (engine, the model's settings, request body) -> prepared
Stream = Callable[[Engine, T, str], Response]  # (engine, prepared, model id) -> an SSE response
Whole = Callable[[Engine, T, str, Request], Awaitable[dict[str, Any]]]  # ... and the request, to see it leave


def ready(engine: Engine) -> Engine:
    """The engine, if it can take jobs now: a 503 while it loads, or once it broke."""
    if engine.state == BROKEN:  # up, answering, but the model can no longer run: a balancer takes it out
        message = getattr(engine.error, "message", str(engine.error))
        raise APIError(503, f"the model can no longer run: {message}; restart the server", code="unavailable")
    if not engine.ready:
        raise loading_error()
    return engine


def generating(engine: Engine) -> Engine:
    """The engine, if it is ready and generates text (not an --embeddings server)."""
    ready(engine)
    if engine.embeddings:
        # 400, not llama-server's 501: clients (OpenAI's included) retry 5xx answers, and retrying cannot help.
        raise APIError(400, "this server was started with --embeddings: it serves /v1/embeddings only",
                       code="not_supported")
    return engine


async def off_loop(request: Request, prepare: Callable[..., T], *args: Any, fetches: bool = False) -> T:
    """Run `prepare` inline for a small request body, in the thread pool for a large one (or one of
    unknown size), so that a long prompt or a big schema never holds up the other connections.
    `fetches` (a server with --media-domains) sends every request there: any may fetch a media URL
    (openai/media_fetch.py), which blocks for as long as the remote host takes."""
    size = request.headers.get("content-length", "")
    if size.isdigit() and int(size) <= INLINE_PREPARE_BYTES and not fetches:
        return prepare(*args)
    return await run_in_threadpool(prepare, *args)


async def generate(find: Awaitable[ServedModel], request: Request, body: Any, prepare: Prepare[T],
                   stream: Stream[T], whole: Whole[T]) -> Response:
    """Answer a generation request: `find` is the family's lookup of the model the request names
    (`models.get(...)`: each API says where a request names it); `body.stream` chooses SSE or one body.

    Each route keeps its own signature, so the OpenAPI schema names its request and response types.
    """
    if body.stream and (conversation := streams.conversation_id(request)):
        served = await streams.model_of(request, conversation, find)  # a DELETE may cancel the wait
    else:
        served = await find
    engine = served.engine
    with engine.arriving():
        generating(engine)
        prepared = await off_loop(request, prepare, engine, served.settings, body,
                                  fetches=bool(served.settings.media.domains))
        if body.stream:
            if conversation := streams.conversation_id(request):  # opted in: the stream outlives its client
                return streams.detached(request, conversation, lambda: stream(engine, prepared, served.id))
            return stream(engine, prepared, served.id)
        return JSONResponse(await whole(engine, prepared, served.id, request))
