"""A request's hold on the models it uses, from finding the model until its answer is fully sent.

`LeaseMiddleware` gives each HTTP request a list of release callbacks; a `ModelSet` that must know
when a model is in use (the router never unloads a model a request holds, even between finding the
model and submitting the job, or while a stream is still being written) adds one with `hold()`.
They run once the response has been sent, or the client has gone.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

_HELD: contextvars.ContextVar[list[Callable[[], None]] | None] = contextvars.ContextVar("pyllama_held",
                                                                                         default=None)


def hold(release: Callable[[], None]) -> bool:
    """Call `release` when the current request ends; False (and no call) outside a request."""
    held = _HELD.get()
    if held is None:
        return False
    held.append(release)
    return True


def keep() -> Callable[[], None]:
    """Move the current request's holds out of it: the caller runs the returned release when its work
    ends (a detached stream outlives its request, and holds its model until then)."""
    held = _HELD.get()
    taken = list(held or ())
    if held:
        held.clear()

    def release() -> None:
        for each in taken:
            each()

    return release


class LeaseMiddleware:
    """Runs each request's release callbacks after its response."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        held: list[Callable[[], None]] = []
        token = _HELD.set(held)
        try:
            await self.app(scope, receive, send)
        finally:
            _HELD.reset(token)
            for release in held:
                release()
