"""Answers in ollama's shape: one JSON object, or a stream of them, one per line (NDJSON).

Every object names the model and the time it was made (`created_at`); the last one has `done: true`,
`done_reason` and the counts and durations (nanoseconds) of the prompt and the generation. A
generate answer's last object also carries `context`: the prompt's and the answer's tokens, which a
next request sends back to continue. A stream cut by an error ends with `{"error": "..."}`, as
ollama's does.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from datetime import datetime, timezone
from typing import Any

from starlette.requests import Request

from ...core.serving.engine import Engine
from ...core.serving.jobs import JobStream
from ..openai import bodies as r
from ..errors import to_api_error
from ..openai.answers import CALLS, REASONING, TEXT, Running, collect_all, streamed_parts, whole_parts
from ..openai.prepare import PreparedChat
from ..sse import EventStream

MEDIA_TYPE = "application/x-ndjson"
CHAT, GENERATE = "chat", "generate"


class Clock:
    """When a request arrived and how long its model took to be ready, for the final durations."""

    def __init__(self) -> None:
        self.start = time.perf_counter_ns()
        self.load_ns = 0

    def loaded(self) -> None:
        self.load_ns = time.perf_counter_ns() - self.start

    def total(self) -> int:
        return time.perf_counter_ns() - self.start


def created_at() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def dumps(data: Any) -> bytes:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def final_fields(answer: r.Answer, clock: Clock) -> dict[str, Any]:
    s = answer.stats
    return {"done": True, "done_reason": r.finish_reason(s), "total_duration": clock.total(),
            "load_duration": clock.load_ns, "prompt_eval_count": s.n_prompt,
            "prompt_eval_duration": int(s.prompt_ms * 1e6), "eval_count": s.n_generated,
            "eval_duration": int(s.generation_ms * 1e6)}


def tool_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI's calls (arguments as JSON text) as ollama's (arguments as an object)."""
    out = []
    for index, call in enumerate(calls):
        function = call["function"]
        arguments = function["arguments"]
        out.append({"id": call.get("id"), "function": {"index": index, "name": function["name"],
                                                         "arguments": json.loads(arguments) if isinstance(
                                                             arguments, str) else arguments}})
    return out


def status_line(model: str, kind: str, reason: str) -> dict[str, Any]:
    """The one object of a request that only loads or unloads its model (`done_reason` load or unload)."""
    body: dict[str, Any] = {"model": model, "created_at": created_at()}
    body.update({"message": {"role": "assistant", "content": ""}} if kind == CHAT else {"response": ""})
    return {**body, "done": True, "done_reason": reason}


async def whole_body(engine: Engine, prep: PreparedChat, model: str, request: Request, clock: Clock,
                     kind: str) -> dict[str, Any]:
    [answer] = await collect_all(engine, [prep.job], request)
    parts = whole_parts(prep, answer)
    body: dict[str, Any] = {"model": model, "created_at": created_at()}
    if kind == CHAT:
        message: dict[str, Any] = {"role": "assistant", "content": parts.text}
        if parts.reasoning:
            message["thinking"] = parts.reasoning
        if parts.calls:
            message["tool_calls"] = tool_calls(parts.calls)
        body["message"] = message
    else:
        body["response"] = parts.text
        if parts.reasoning:
            body["thinking"] = parts.reasoning
    body.update(final_fields(answer, clock))
    if kind == GENERATE:
        body["context"] = [*prep.job.prompt, *answer.stats.tokens]
    return body


def stream(engine: Engine, prep: PreparedChat, model: str, clock: Clock, kind: str) -> EventStream:
    running = Running()
    job_stream = running.start(engine, prep.job)
    response = EventStream(_lines(job_stream, prep, model, clock, kind), on_disconnect=running.cancel)
    response.headers["content-type"] = MEDIA_TYPE
    return response


class _Line:
    """The bytes of one streamed object, which differ in their time and their text only: the JSON around
    them is written once, so each token costs two string encodes (as sse.TextEvents does for OpenAI)."""

    def __init__(self, model: str, kind: str):
        self.head = b'{"model":' + json.dumps(model, ensure_ascii=False).encode() + b',"created_at":"'
        if kind == CHAT:
            self.text = b'","message":{"role":"assistant","content":', b'},"done":false}\n'
            self.thought = b'","message":{"role":"assistant","content":"","thinking":', b'},"done":false}\n'
        else:
            self.text = b'","response":', b',"done":false}\n'
            self.thought = b'","response":"","thinking":', b',"done":false}\n'

    def of(self, text: str, thinking: bool = False) -> bytes:
        mid, tail = self.thought if thinking else self.text
        return self.head + created_at().encode() + mid + json.dumps(text, ensure_ascii=False).encode() + tail


async def _lines(job_stream: JobStream, prep: PreparedChat, model: str, clock: Clock,
                 kind: str) -> AsyncIterator[bytes]:
    answer, line = r.Answer(), _Line(model, kind)
    try:
        async for part, value in streamed_parts(job_stream, prep, answer):
            if part == TEXT:
                yield line.of(value)
            elif part == REASONING:
                yield line.of(value, thinking=True)
            elif part == CALLS:
                yield dumps({"model": model, "created_at": created_at(),
                             "message": {"role": "assistant", "content": "", "tool_calls": tool_calls(value)},
                             "done": False})
        last: dict[str, Any] = {"model": model, "created_at": created_at()}
        last.update({"message": {"role": "assistant", "content": ""}} if kind == CHAT else {"response": ""})
        last.update(final_fields(answer, clock))
        if kind == GENERATE:
            last["context"] = [*prep.job.prompt, *answer.stats.tokens]
        yield dumps(last)
    except Exception as exc:  # noqa: BLE001 - the status line is gone; report in the stream, as ollama does
        yield dumps({"error": to_api_error(exc).message})
    finally:
        job_stream.cancel()  # a no-op once the job is done; stops it when this stream is torn down early
