"""Answers in the Responses API's shape: a `response` object with output items, or its SSE events.

Output items are a `reasoning` item (the thinking), a `message` with one `output_text` part, and one
`function_call` item per tool call, in that order. A stream announces each item
(`response.output_item.added`), sends its deltas and its `.done` events, and ends with
`response.completed`, whose response is the whole object. A response cut by max_output_tokens has
status "incomplete" and says why in incomplete_details; its stream ends with `response.incomplete`
instead, as OpenAI's does, so that clients (the Agents SDK, the OpenAI SDK's get_final_response) treat
the cut answer as the failure it is rather than as a finished empty one.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.requests import Request

from ...core.generate.decide import STOP_CONTEXT, STOP_LENGTH
from ...core.serving.engine import Engine
from ...core.serving.jobs import JobStream
from ..openai import bodies as r
from ..errors import to_api_error
from ..openai.answers import (CALLS, PROGRESS, REASONING, TEXT, TOKENS, Parts, Running, collect_all, cut_call,
                              streamed_parts, whole_parts)
from ..openai.extras import StreamTimer
from ..timings import summed_timings
from ..openai.prepare import PreparedChat
from ..sse import EventStream
from .schemas import ResponsesRequest

Finished = Callable[[dict[str, Any], Parts], None]  # called with each finished response (to store it)


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


class ResponseShape:
    """The fields of one response that do not depend on the answer, and its output items."""

    def __init__(self, req: ResponsesRequest, model: str):
        self.id, self.created = _id("resp"), int(time.time())
        self.req, self.model = req, model
        self.item_ids = {"reasoning": _id("rs"), "message": _id("msg")}

    def body(self, status: str, output: list[dict[str, Any]], answer: r.Answer | None) -> dict[str, Any]:
        req = self.req
        truncated = answer is not None and answer.stats.stop_reason in (STOP_LENGTH, STOP_CONTEXT)
        if status == "completed" and truncated:
            status = "incomplete"
        text = "".join(part["text"] for item in output if item["type"] == "message" for part in item["content"])
        return {
            "id": self.id, "object": "response", "created_at": self.created, "status": status, "model": self.model,
            "output": output, "output_text": text, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "previous_response_id": req.previous_response_id, "temperature": req.temperature, "top_p": req.top_p,
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "tool_choice": _dump(req.tool_choice) or "auto", "tools": [_dump(t) for t in req.tools or ()],
            "text": {"format": _dump(req.text.format) if req.text and req.text.format else {"type": "text"}},
            "store": req.store is not False, "background": bool(req.background), "metadata": req.metadata or {},
            "usage": _usage(answer) if answer is not None else None,
        }

    def reasoning(self, text: str, status: str = "completed") -> dict[str, Any]:
        content = [{"type": "reasoning_text", "text": text}] if text else []
        return {"id": self.item_ids["reasoning"], "type": "reasoning", "summary": [], "content": content,
                "status": status}

    def message(self, text: str | None, status: str = "completed") -> dict[str, Any]:
        content = [_text_part(text)] if text is not None else []
        return {"id": self.item_ids["message"], "type": "message", "role": "assistant", "status": status,
                "content": content}

    def output(self, parts: Parts) -> list[dict[str, Any]]:
        items = [self.reasoning(parts.reasoning)] if parts.reasoning else []
        if parts.text or not (parts.calls or parts.cut_call):
            items.append(self.message(parts.text))
        return items + [function_call(c) for c in parts.calls or ()]


def function_call(call: dict[str, Any]) -> dict[str, Any]:
    return {"id": f"fc_{call['id'].removeprefix('call_')}", "type": "function_call", "call_id": call["id"],
            "name": call["function"]["name"], "arguments": call["function"]["arguments"], "status": "completed"}


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _dump(value: Any) -> Any:
    return value.model_dump(by_alias=True, exclude_none=True) if hasattr(value, "model_dump") else value


def _usage(answer: r.Answer) -> dict[str, Any]:
    stats = answer.stats
    return {"input_tokens": stats.n_prompt, "input_tokens_details": {"cached_tokens": stats.n_cached},
            "output_tokens": stats.n_generated, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": stats.n_prompt + stats.n_generated}


async def response_body(engine: Engine, prep: PreparedChat, shape: ResponseShape, request: Request,
                        finished: Finished) -> dict[str, Any]:
    [answer] = await collect_all(engine, [prep.job], request)
    parts = whole_parts(prep, answer)
    body = shape.body("completed", shape.output(parts), answer)
    finished(body, parts)
    return body


def response_stream(engine: Engine, prep: PreparedChat, shape: ResponseShape, finished: Finished) -> EventStream:
    running = Running()
    stream = running.start(engine, prep.job)
    return EventStream(_events(stream, prep, shape, finished), on_disconnect=running.cancel)


class _Events:
    """Numbers the events of one stream and shapes them as SSE."""

    def __init__(self) -> None:
        self.sequence = 0

    def __call__(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        body = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
        return f"event: {kind}\ndata: {body}\n\n".encode()


async def _events(stream: JobStream, prep: PreparedChat, shape: ResponseShape,
                  finished: Finished) -> AsyncIterator[bytes]:
    ev, answer = _Events(), r.Answer()
    texts = {REASONING: "", TEXT: ""}
    order: list[str] = []  # the kinds of output item opened, in order; the last may still be open
    calls: list[dict[str, Any]] = []
    timer, per_token = StreamTimer(), shape.req.timings_per_token
    try:
        yield ev("response.created", response=shape.body("in_progress", [], None))
        yield ev("response.in_progress", response=shape.body("in_progress", [], None))
        async for kind, value in streamed_parts(stream, prep, answer, progress=True):
            if kind == CALLS:
                calls = value
                continue
            if kind == TOKENS:
                timer.count(value)
                continue
            if kind == PROGRESS:  # llama-server's: an in_progress event that carries the prompt's progress
                timer.prompt_n = value[2] - value[1]
                yield ev("response.in_progress", response=shape.body("in_progress", [], None),
                         prompt_progress=timer.progress(value))
                continue
            if not order or order[-1] != kind:
                for chunk in [*_close(ev, shape, order, texts), *_open(ev, shape, kind, len(order))]:
                    yield chunk
                order.append(kind)
            texts[kind] += value
            delta = "response.reasoning_text.delta" if kind == REASONING else "response.output_text.delta"
            extra = {} if kind == REASONING else {"logprobs": []}
            if per_token:
                extra["timings"] = timer.running()
            yield ev(delta, item_id=shape.item_ids["reasoning" if kind == REASONING else "message"],
                     output_index=len(order) - 1, content_index=0, delta=value, **extra)
        closing = _close(ev, shape, order, texts)
        cut = not calls and not texts[TEXT] and cut_call("{", prep.tools, answer.stats)  # its text was held back
        if not calls and TEXT not in order and not cut:  # an answer with no text is still one (empty) message
            closing += _open(ev, shape, TEXT, len(order))
            order.append(TEXT)
            closing += _close(ev, shape, order, texts)
        for chunk in closing:
            yield chunk
        for call in calls:
            for chunk in _call_events(ev, function_call(call), len(order)):
                yield chunk
            order.append(CALLS)
        parts = Parts(texts[REASONING], texts[TEXT], calls or None, cut)
        body = shape.body("completed", shape.output(parts), answer)
        finished(body, parts)
        last = {"timings": summed_timings([answer.stats])} if per_token else {}
        yield ev(f"response.{body['status']}", response=body, **last)  # response.completed or .incomplete
    except Exception as exc:  # noqa: BLE001 - the status line is gone; report in the stream, as OpenAI does
        error = to_api_error(exc)
        yield ev("error", code=error.code, message=error.message, param=error.param)
    finally:
        stream.cancel()  # a no-op once the job is done; stops it when this stream is torn down early


def _open(ev: _Events, shape: ResponseShape, kind: str, index: int) -> list[bytes]:
    if kind == REASONING:
        return [ev("response.output_item.added", output_index=index, item=shape.reasoning("", "in_progress"))]
    item_id = shape.item_ids["message"]
    return [ev("response.output_item.added", output_index=index, item=shape.message(None, "in_progress")),
            ev("response.content_part.added", item_id=item_id, output_index=index, content_index=0,
               part=_text_part(""))]


def _close(ev: _Events, shape: ResponseShape, order: list[str], texts: dict[str, str]) -> list[bytes]:
    """The .done events of the item opened last (none before the first)."""
    if not order:
        return []
    kind, index = order[-1], len(order) - 1
    if kind == REASONING:
        item_id = shape.item_ids["reasoning"]
        return [ev("response.reasoning_text.done", item_id=item_id, output_index=index, content_index=0,
                   text=texts[REASONING]),
                ev("response.output_item.done", output_index=index, item=shape.reasoning(texts[REASONING]))]
    item_id, text = shape.item_ids["message"], texts[TEXT]
    return [ev("response.output_text.done", item_id=item_id, output_index=index, content_index=0, text=text,
               logprobs=[]),
            ev("response.content_part.done", item_id=item_id, output_index=index, content_index=0,
               part=_text_part(text)),
            ev("response.output_item.done", output_index=index, item=shape.message(text))]


def _call_events(ev: _Events, item: dict[str, Any], index: int) -> list[bytes]:
    return [ev("response.output_item.added", output_index=index, item={**item, "arguments": "",
                                                                       "status": "in_progress"}),
            ev("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
               delta=item["arguments"]),
            ev("response.function_call_arguments.done", item_id=item["id"], output_index=index,
               name=item["name"], arguments=item["arguments"]),
            ev("response.output_item.done", output_index=index, item=item)]
