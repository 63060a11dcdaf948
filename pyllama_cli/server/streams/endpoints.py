"""The replay buffer's routes, llama-server's: GET /v1/stream (replay from a byte offset, then live),
POST /v1/streams/lookup (the running sessions of the ids named, never a list of all), DELETE /v1/stream (stop,
idempotent: 204). The id travels as `?conv_id=` (llama-server's form: an id may hold a model name
with slashes) or as the path's last part, /v1/stream/ID.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

from ..errors import OPENAPI_ERRORS, APIError
from .detach import follow, sessions_of


class LookupRequest(BaseModel):
    conversation_ids: list[str] = Field(default_factory=list, description="The conversation ids to report.")


def add_stream_routes(app: FastAPI) -> None:
    @app.get("/v1/stream", responses=OPENAPI_ERRORS, tags=["Streams"])
    @app.get("/v1/stream/{conv_id:path}", responses=OPENAPI_ERRORS, tags=["Streams"])
    async def replay(request: Request, conv_id: str = "") -> Any:
        """The stream of a conversation from byte `from` (default 0), then live until it ends."""
        sessions, conversation = sessions_of(request), _conversation(request, conv_id)
        session = sessions.get(conversation)
        if sessions.waiting(conversation):  # its request waits for its model: the id is about to be taken
            raise APIError(503, "the stream's model is loading; retry later", code="model_loading")
        if session is None:
            raise APIError(404, "stream not found or expired", code="not_found")
        offset = request.query_params.get("from", "0")
        if not offset.isdigit():
            raise APIError(400, f"invalid 'from' offset {offset!r}: a byte offset (0 or more)", param="from")
        return follow(session, int(offset))

    @app.post("/v1/streams/lookup", responses=OPENAPI_ERRORS, tags=["Streams"])
    async def lookup(body: LookupRequest, request: Request) -> Any:
        """The running sessions of the conversation ids named (and their `ID::model` forms); a finished one is left out."""
        return JSONResponse(sessions_of(request).lookup([i for i in body.conversation_ids if i]))

    @app.delete("/v1/stream", status_code=204, response_class=Response, responses=OPENAPI_ERRORS, tags=["Streams"])
    @app.delete("/v1/stream/{conv_id:path}", status_code=204, response_class=Response, include_in_schema=False)
    async def stop(request: Request, conv_id: str = "") -> Response:
        """Stop a conversation's generation and free its buffer (204 whether or not it existed)."""
        await sessions_of(request).stop_and_wait(_conversation(request, conv_id))
        return Response(status_code=204)


def _conversation(request: Request, in_path: str) -> str:
    conversation = in_path or request.query_params.get("conv_id", "")
    if not conversation:
        raise APIError(400, "missing conversation id: /v1/stream?conv_id=ID or /v1/stream/ID", param="conv_id")
    return conversation
