"""serve's access log: one line on stderr per request, as llama-server and ollama print by default.

Each line names the method, the path (a key in its query string masked by redact.py; no header),
the model that answered, the status, the prompt and generated tokens, and the time taken; a
failed request adds the reason its error body (or its stream's error event) gave. `--log-format
json` writes one JSON object per line instead, for log collectors; `-q` turns the log off.

The model is noted when a route finds it (`note_model`), the tokens when its jobs finish (the
`JOB_STATS` list core/serving/jobs.py fills for whoever reads the job), both through a context
variable that lives as long as the request.
"""

from __future__ import annotations

import contextvars
import json
import sys
import time
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ...core.serving.jobs import JOB_STATS
from .redact import redact

TEXT, JSON = "text", "json"
FORMATS = (TEXT, JSON)
# Polled by load balancers and clients every second or so: their lines would bury the real ones.
QUIET_PATHS = frozenset({"/health", "/v1/health"})
_ERROR_BODY_LIMIT = 64 * 1024  # bytes of an error body kept to read its message


@dataclass
class _Request:
    model: str | None = None
    stats: list[Any] = field(default_factory=list)
    parts: str | None = None  # -v: the prompt's tokens by part


_CURRENT: contextvars.ContextVar[_Request | None] = contextvars.ContextVar("pyllama_access", default=None)


def note_model(model_id: str) -> None:
    """Record the model that answers the current request (a no-op outside one)."""
    current = _CURRENT.get()
    if current is not None:
        current.model = model_id


def note_prompt_parts(count: Callable[[str, bool], int], prompt: str, without_tools: str,
                      messages: list[dict[str, Any]]) -> None:
    """Record, for -v, how many of the prompt's tokens are the tools' text, the system messages, the
    other messages and the template's own markup (what agents' long prompts are made of)."""
    current = _CURRENT.get()
    if current is None:
        return
    total, bare = count(prompt, True), count(without_tools, True)  # as prompts: BOS included
    system = sum(count(_text_of(m), False) for m in messages if m.get("role") in ("system", "developer"))
    other = sum(count(_text_of(m), False) for m in messages if m.get("role") not in ("system", "developer"))
    current.parts = (f"prompt {total} tokens: tools {total - bare}, system {system}, messages {other}, "
                     f"template {bare - system - other}")


def _text_of(message: dict[str, Any]) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else ""


class AccessLogMiddleware:
    """Writes each HTTP request's line once its response has been sent (or its client has gone)."""

    def __init__(self, app: ASGIApp, log_format: str = TEXT, verbose: bool = False):
        self.app = app
        self.log_format = log_format
        self.verbose = verbose  # adds the prompt's parts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in QUIET_PATHS:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        current = _Request()
        token, stats_token = _CURRENT.set(current), JOB_STATS.set(current.stats)
        response = _Response()
        try:
            await self.app(scope, receive, response.watching(send))
        finally:
            _CURRENT.reset(token)
            JOB_STATS.reset(stats_token)
            self._write(scope, current, response, time.perf_counter() - started)

    def _write(self, scope: Scope, current: _Request, response: _Response, seconds: float) -> None:
        prompt = sum(s.n_prompt for s in current.stats) if current.stats else None
        generated = sum(s.n_generated for s in current.stats) if current.stats else None
        query = scope.get("query_string", b"").decode("latin-1")
        fields = {"method": scope["method"], "path": scope["path"] + (f"?{query}" if query else ""), "model": current.model,
                  "status": response.status, "prompt_tokens": prompt, "generated_tokens": generated,
                  "time_ms": round(seconds * 1000, 1), "error": response.error()}
        if self.verbose:
            fields["prompt_parts"] = current.parts
        line = redact(json.dumps(fields, ensure_ascii=False) if self.log_format == JSON else _text(fields))
        try:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):  # stderr closed: the server keeps serving
            pass


def _text(f: dict[str, Any]) -> str:
    def shown(value: Any) -> str:
        return "-" if value is None else str(value)

    line = (f"{f['method']} {f['path']} {shown(f['status'])} model={shown(f['model'])} "
            f"prompt={shown(f['prompt_tokens'])} generated={shown(f['generated_tokens'])} {f['time_ms']:.0f}ms")
    line += f" ({f['prompt_parts']})" if f.get("prompt_parts") else ""
    return line + (f" error: {f['error']}" if f["error"] else "")


class _Response:
    """What the log needs of a response: its status, and the message of an error it carries."""

    def __init__(self) -> None:
        self.status: int | None = None
        self.streamed = False
        self._body = bytearray()
        self._stream_error: str | None = None

    def watching(self, send: Send) -> Send:
        async def watched(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.status = message["status"]
                headers = dict(message.get("headers") or [])
                self.streamed = headers.get(b"content-type", b"").startswith(b"text/event-stream")
            elif message["type"] == "http.response.body":
                self._see(message.get("body", b""))
            await send(message)

        return watched

    def _see(self, chunk: bytes) -> None:
        if self.streamed:
            if self._stream_error is None and b"error" in chunk:
                self._stream_error = _stream_error(chunk)
        elif self.status is not None and self.status >= 400 and len(self._body) < _ERROR_BODY_LIMIT:
            self._body += chunk[:_ERROR_BODY_LIMIT]

    def error(self) -> str | None:
        if self.streamed:
            return self._stream_error
        if self.status is None or self.status < 400:
            return None
        try:
            return _message(json.loads(self._body)) or f"HTTP {self.status}"
        except ValueError:
            return self._body.decode("utf-8", "replace").strip()[:200] or f"HTTP {self.status}"


def _stream_error(chunk: bytes) -> str | None:
    """The message of an error event in a chunk of an SSE stream (OpenAI's `data: {"error": ...}`,
    Anthropic's `event: error`), if there is one."""
    for line in chunk.decode("utf-8", "replace").splitlines():
        if line.startswith("data:") and "error" in line:
            try:
                message = _message(json.loads(line[5:]))
            except ValueError:
                continue
            if message:
                return message
    return None


def _message(body: Any) -> str | None:
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return str(error.get("message") or error.get("type") or "") or None
    if isinstance(error, str):
        return error
    detail = body.get("detail") if isinstance(body, dict) else None  # a route FastAPI answered itself
    return str(detail) if detail else None
