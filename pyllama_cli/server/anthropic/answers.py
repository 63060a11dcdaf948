"""Answers in Anthropic's Messages shape: a whole `message`, or its stream of named SSE events.

A stream is `message_start`, then for each content block (thinking, text, tool_use) its
`content_block_start`, deltas and `content_block_stop`, then `message_delta` (stop reason, usage)
and `message_stop`; `ping` events keep the connection alive while a long prompt is read.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request

from ...core.generate.decide import STOP_CONTEXT, STOP_LENGTH, STOP_STOP
from ...core.serving.engine import Engine
from ...core.serving.jobs import JobStream
from ..openai import bodies as r
from ..openai.answers import CALLS, PING, REASONING, TEXT, Running, collect_all, streamed_parts, whole_parts
from ..openai.prepare import PreparedChat
from ..sse import EventStream, anthropic_error_event

PING_S = 5.0  # a ping this long after the last event, while a long prompt is still being read


def named_event(name: str, data: dict[str, Any]) -> bytes:
    """One SSE event with an `event:` line, as Anthropic streams them."""
    body = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"event: {name}\ndata: {body}\n\n".encode()


def _message(msg_id: str, model: str, content: list[dict[str, Any]], stop_reason: str | None,
             stop_sequence: str | None, usage: dict[str, int]) -> dict[str, Any]:
    return {"id": msg_id, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": stop_reason, "stop_sequence": stop_sequence, "usage": usage}


def _usage(prompt: int, generated: int) -> dict[str, int]:
    return {"input_tokens": prompt, "output_tokens": generated}


def _stop(answer: r.Answer, prep: PreparedChat, calls: Any) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence). When several stop sequences were given, the one that matched is
    not recorded by the engine: the first is named."""
    reason = answer.stats.stop_reason
    if calls:
        return "tool_use", None
    if reason == STOP_STOP:
        return "stop_sequence", prep.job.stop[0] if prep.job.stop else None
    if reason in (STOP_LENGTH, STOP_CONTEXT):
        return "max_tokens", None
    return "end_turn", None


def _tool_use(call: dict[str, Any]) -> dict[str, Any]:
    function = call["function"]
    return {"type": "tool_use", "id": f"toolu_{call['id'].removeprefix('call_')}", "name": function["name"],
            "input": json.loads(function["arguments"])}


def _new_id() -> str:
    return f"msg_{uuid.uuid4().hex[:24]}"


async def message_body(engine: Engine, prep: PreparedChat, model: str, request: Request) -> dict[str, Any]:
    [answer] = await collect_all(engine, [prep.job], request)
    parts = whole_parts(prep, answer)
    content: list[dict[str, Any]] = []
    if parts.reasoning:
        content.append({"type": "thinking", "thinking": parts.reasoning, "signature": ""})
    if parts.text:
        content.append({"type": "text", "text": parts.text})
    content.extend(_tool_use(c) for c in parts.calls or ())
    reason, sequence = _stop(answer, prep, parts.calls)
    return _message(_new_id(), model, content, reason, sequence,
                    _usage(answer.stats.n_prompt, answer.stats.n_generated))


def message_stream(engine: Engine, prep: PreparedChat, model: str) -> EventStream:
    running = Running()
    stream = running.start(engine, prep.job)
    return EventStream(_events(stream, prep, model), on_disconnect=running.cancel)


class _Blocks:
    """The content blocks of a stream: opens one when the kind of delta changes, closes the last."""

    START = {"thinking": {"type": "thinking", "thinking": "", "signature": ""}, "text": {"type": "text", "text": ""}}
    DELTA = {"thinking": "thinking_delta", "text": "text_delta"}

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None

    def delta(self, kind: str, text: str) -> list[bytes]:
        out = [] if self.open == kind else [*self.close(), self._start(self.START[kind])]
        self.open = kind
        out.append(named_event("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                                       "delta": {"type": self.DELTA[kind], kind: text}}))
        return out

    def tool_use(self, block: dict[str, Any]) -> list[bytes]:
        out = [*self.close(), self._start({**block, "input": {}})]
        partial = json.dumps(block["input"], ensure_ascii=False)
        out.append(named_event("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                                       "delta": {"type": "input_json_delta", "partial_json": partial}}))
        self.open = "tool_use"
        return [*out, *self.close()]

    def close(self) -> list[bytes]:
        if self.open is None:
            return []
        self.open = None
        return [named_event("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def _start(self, block: dict[str, Any]) -> bytes:
        self.index += 1
        return named_event("content_block_start", {"type": "content_block_start", "index": self.index,
                                                   "content_block": block})


async def _events(stream: JobStream, prep: PreparedChat, model: str) -> AsyncIterator[bytes]:
    answer, blocks, msg_id = r.Answer(), _Blocks(), _new_id()
    n_prompt = len(prep.job.prompt)
    try:
        start = _message(msg_id, model, [], None, None, _usage(n_prompt, 0))
        yield named_event("message_start", {"type": "message_start", "message": start})
        yield named_event("ping", {"type": "ping"})
        calls = None
        async for kind, value in streamed_parts(stream, prep, answer, PING_S):
            if kind == PING:
                yield named_event("ping", {"type": "ping"})
            elif kind in (REASONING, TEXT):
                for chunk in blocks.delta("thinking" if kind == REASONING else "text", value):
                    yield chunk
            elif kind == CALLS:
                calls = value
                for call in calls:
                    for chunk in blocks.tool_use(_tool_use(call)):
                        yield chunk
        for chunk in blocks.close():
            yield chunk
        reason, sequence = _stop(answer, prep, calls)
        yield named_event("message_delta", {"type": "message_delta",
                                            "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                            "usage": _usage(answer.stats.n_prompt, answer.stats.n_generated)})
        yield named_event("message_stop", {"type": "message_stop"})
    except Exception as exc:  # noqa: BLE001 - the status line is gone; report in the stream, as Anthropic does
        yield anthropic_error_event(exc)
    finally:
        stream.cancel()  # a no-op once the job is done; stops it when this stream is torn down early
