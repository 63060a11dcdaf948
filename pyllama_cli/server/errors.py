"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}` with the matching HTTP status.

Route code raises `APIError` (or lets a core `PyllamaError` through); `handle_error`, installed for
every exception class, is the one place that turns them into responses, so a bad request never
crashes the server and every error has the same shape.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from ..core.text.chat_template import TemplateError
from ..errors import ContextOverflow, InputError, PyllamaError, ServerShutdown, UsageError

ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
    405: "invalid_request_error", 413: "invalid_request_error", 500: "server_error", 501: "not_supported_error",
    503: "unavailable_error",
}
SHUTDOWN_ERROR = "server_shutdown"  # the error type of a request the server cut short (never a finished answer)
RETRY_AFTER_S = 5  # what a cut request's 503 tells the client to wait before trying again
# Routes of Anthropic's Messages API answer errors in Anthropic's shape (its clients read no other).
ANTHROPIC_PATHS = ("/v1/messages",)
# Routes of ollama's API answer errors as ollama does: `{"error": "message"}`.
OLLAMA_PATHS = ("/api/",)
ANTHROPIC_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
    405: "invalid_request_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
    503: "overloaded_error", 529: "overloaded_error",
}
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Tags pydantic puts in an error location for the member of a union that failed.
_UNION_TAGS = {"str", "int", "float", "bool", "dict", "list", "none", "tuple"}



class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """The error body, for the OpenAPI schema (`OPENAPI_ERRORS`); `APIError.body()` builds it."""

    error: ErrorDetail


# What a route's `responses=` documents: the statuses a request can get wrong or meet while the model loads.
OPENAPI_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": kind} for status, kind in ERROR_TYPES.items()
    if status in (400, 401, 404, 413, 503)
}

class APIError(Exception):
    """An error to answer with: HTTP status, message, and the OpenAI `param`/`code` fields."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 error_type: str | None = None, extra: dict[str, Any] | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.error_type = error_type or ERROR_TYPES.get(status, "invalid_request_error" if status < 500
                                                       else "server_error")
        self.extra = extra or {}
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        error = {"message": self.message, "type": self.error_type, "param": self.param, "code": self.code}
        return {"error": {**error, **self.extra}}

    def anthropic_body(self) -> dict[str, Any]:
        kind = ANTHROPIC_TYPES.get(self.status, "api_error" if self.status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": self.message}}

    def response(self, headers: dict[str, str] | None = None, path: str = "") -> JSONResponse:
        """The answer, in Anthropic's or ollama's shape on their routes' `path`s and OpenAI's elsewhere."""
        body = self.anthropic_body() if path.startswith(ANTHROPIC_PATHS) else \
            {"error": self.message} if path.startswith(OLLAMA_PATHS) else self.body()
        return JSONResponse(body, status_code=self.status, headers={**self.headers, **(headers or {})})


def loading_error() -> APIError:
    return APIError(503, "Loading model", code="model_loading")


def to_api_error(exc: BaseException, request: Request | None = None) -> APIError:
    """The APIError that answers `exc`."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, RequestValidationError):
        return _validation_error(exc)
    if isinstance(exc, HTTPException):
        return _http_error(exc, request)
    if isinstance(exc, ServerShutdown):
        return APIError(503, exc.message, error_type=SHUTDOWN_ERROR, code=SHUTDOWN_ERROR,
                        headers={"Retry-After": str(RETRY_AFTER_S)})
    if isinstance(exc, ContextOverflow):
        return APIError(400, exc.message, code="context_length_exceeded")
    if isinstance(exc, TemplateError):
        return APIError(400, exc.message, param="messages", code="invalid_template")
    if isinstance(exc, (InputError, UsageError)):
        return APIError(400, exc.message)
    if isinstance(exc, UnicodeEncodeError) and exc.reason == "surrogates not allowed":
        # JSON's \ud800-style escapes can carry half a UTF-16 pair, which is no text llama.cpp can take.
        return APIError(400, f"the request holds a lone UTF-16 surrogate ({exc.object[exc.start]!r}), which is not "
                        "valid Unicode", code="invalid_value")
    if isinstance(exc, PyllamaError):
        return APIError(500, exc.message)
    return APIError(500, f"internal server error ({type(exc).__name__}: {exc})")


async def handle_error(request: Request, exc: Exception) -> JSONResponse:
    """The exception handler for everything raised while answering a request."""
    error = to_api_error(exc, request)
    if not isinstance(exc, _ANSWERED_INSIDE):
        # Starlette answers other exceptions from its outermost layer, past the metrics middleware.
        metrics = getattr(request.app.state, "metrics", None)
        if metrics is not None:
            metrics.observe(request.url.path, error.status)
    return error.response(path=request.url.path)


# UnicodeEncodeError: utf-8 fails only on the lone surrogates a JSON body can carry, a client error (400).
_ANSWERED_INSIDE = (APIError, RequestValidationError, HTTPException, PyllamaError, UnicodeEncodeError)


def install_error_handlers(app: FastAPI) -> None:
    for cls in (*_ANSWERED_INSIDE, Exception):
        app.add_exception_handler(cls, handle_error)


def _http_error(exc: HTTPException, request: Request | None) -> APIError:
    where = f"{request.method} {request.url.path}" if request is not None else "this request"
    if exc.status_code == 404:
        return APIError(404, f"no such endpoint: {where}", code="not_found")
    if exc.status_code == 405:
        return APIError(405, f"method not allowed: {where}", code="method_not_allowed")
    if exc.status_code == 400 and exc.__cause__ is not None:  # FastAPI's "error parsing the body"
        return body_error(exc.__cause__)
    return APIError(exc.status_code, str(exc.detail))


def body_error(cause: BaseException) -> APIError:
    """Why a body that is no JSON document failed to parse (FastAPI only says that it did)."""
    if isinstance(cause, UnicodeDecodeError):
        reason = f"it is not valid UTF-8 (byte 0x{cause.object[cause.start]:02x} at offset {cause.start})"
    elif isinstance(cause, RecursionError):
        reason = "it nests arrays or objects too deeply"
    else:
        reason = f"{type(cause).__name__}: {cause}"
    return APIError(400, f"the request body is not valid JSON: {reason}", code="invalid_json")


def _validation_error(exc: RequestValidationError) -> APIError:
    errors = exc.errors()
    first = errors[0] if errors else {"type": "", "loc": (), "msg": "invalid request"}
    kind, loc = first.get("type", ""), tuple(first.get("loc", ()))
    if kind == "json_invalid":
        where = f" (at character {loc[1]})" if len(loc) > 1 else ""
        detail = (first.get("ctx") or {}).get("error", "")
        return APIError(400, f"the request body is not valid JSON: {detail}{where}", code="invalid_json")
    param = _param_name(loc)
    if not param:
        if kind == "missing":
            return APIError(400, "the request body is empty: send a JSON object", code="invalid_json")
        # Also what a JSON object sent with another Content-Type (text/plain) arrives as: unparsed text.
        return APIError(400, "the request body must be a JSON object, sent with Content-Type: application/json",
                        code="invalid_json")
    message = str(first.get("msg", "invalid value"))
    if kind == "missing":
        message = "this field is required"
    return APIError(400, f"{param}: {message}", param=param, code="invalid_value")


def _param_name(loc: tuple[Any, ...]) -> str:
    """`("body", "messages", 0, "content")` -> `messages[0].content` (union member tags dropped)."""
    name = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(part, int):
            name += f"[{part}]"
        elif _IDENTIFIER.match(str(part)) and str(part) not in _UNION_TAGS:
            name += f".{part}" if name else str(part)
        else:
            break
    return name
