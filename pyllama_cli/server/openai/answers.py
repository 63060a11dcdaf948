"""Run prepared jobs on the engine and answer in OpenAI's shape: whole bodies, or SSE streams.

A client that goes away stops its job at once: streams through `EventStream`'s disconnect watch,
whole-body requests through a watcher that polls the connection while the job runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from ...core.constrain.tools import ToolPlan, may_be_call, parse_tool_calls
from ...core.serving.engine import Engine
from ...core.serving.jobs import Event, GenerationJob, JobStream
from ..sse import DONE, EventStream, TextEvents, error_event, event
from ..timings import timings
from . import bodies as r
from . import extras
from .prepare import PreparedChat

DISCONNECT_POLL_S = 0.25


class Running:
    """The job a response is waiting on, so a disconnect can cancel it (and any that would follow)."""

    def __init__(self) -> None:
        self.stream: JobStream | None = None
        self.cancelled = False

    def start(self, engine: Engine, job: GenerationJob) -> JobStream:
        self.stream = engine.submit(job)
        if self.cancelled:
            self.stream.cancel()
        return self.stream

    def cancel(self) -> None:
        self.cancelled = True
        if self.stream is not None:
            self.stream.cancel()


async def collect(stream: JobStream) -> r.Answer:
    """Read a job's events to the end."""
    answer = r.Answer()
    parts: list[str] = []
    async for ev in stream:
        parts.append(ev.text)
        answer.probs.extend(ev.probs)
        if ev.done and ev.stats is not None:
            answer.stats = ev.stats
    answer.text = "".join(parts)
    return answer


async def collect_all(engine: Engine, jobs: list[GenerationJob], request: Request) -> list[r.Answer]:
    """Run jobs one after another, stopping them if the client disconnects meanwhile."""
    running = Running()
    watcher = asyncio.create_task(_watch_disconnect(request, running))
    try:
        return [await collect(running.start(engine, job)) for job in jobs]
    finally:
        watcher.cancel()


async def _watch_disconnect(request: Request, running: Running | _Together) -> None:
    while not await request.is_disconnected():
        await asyncio.sleep(DISCONNECT_POLL_S)
    running.cancel()


# ---------------------------------------------------------------- chat


async def chat_body(engine: Engine, prep: PreparedChat, model: str, request: Request) -> dict[str, Any]:
    header = r.Header.new("chatcmpl", model)
    answers = await collect_together(engine, extras.choice_jobs(prep.job, prep.extras.n), request)
    bodies = [_chat_choice(header, answer, prep) for answer in answers]
    return extras.whole_body(bodies, answers, prep.extras)


def _chat_choice(header: r.Header, answer: r.Answer, prep: PreparedChat) -> dict[str, Any]:
    """One choice's body: its reasoning cut out (where the server separates it), then its tool calls read."""
    reasoning = ""
    if prep.thinking is not None:
        reasoning, answer.text = prep.thinking.split(answer.text)
    calls = parse_tool_calls(answer.text, prep.tools) if prep.tools is not None else None
    body = r.chat_completion(header, answer, calls, prep.logprobs, reasoning)
    if calls is None and cut_call(answer.text, prep.tools, answer.stats):
        body["choices"][0]["message"]["content"] = None  # half a call is no answer (finish_reason: length)
    return body


def cut_call(text: str, plan: ToolPlan | None, stats: Any) -> bool:
    """Whether `text` is a tool call the token limit cut short: forced, or one it could still have become.
    Clients (the Agents SDK) took such text for the final answer."""
    return (plan is not None and bool(text.strip()) and stats is not None and r.finish_reason(stats) == "length"
            and (plan.forced or may_be_call(text)))


async def collect_together(engine: Engine, jobs: list[GenerationJob], request: Request) -> list[r.Answer]:
    """Run jobs at once (each on a slot of its own while there are enough), stopping them all if the
    client disconnects meanwhile."""
    together = _Together([engine.submit(job) for job in jobs])
    watcher = asyncio.create_task(_watch_disconnect(request, together))
    try:
        return list(await asyncio.gather(*[collect(stream) for stream in together.streams]))
    finally:
        watcher.cancel()


class _Together:
    def __init__(self, streams: list[JobStream]):
        self.streams = streams

    def cancel(self) -> None:
        for stream in self.streams:
            stream.cancel()


def chat_stream(engine: Engine, prep: PreparedChat, model: str, include_usage: bool) -> EventStream:
    if prep.extras.n > 1:
        return extras.choices_stream(engine, prep, r.Header.new("chatcmpl", model), include_usage)
    running = Running()
    stream = running.start(engine, prep.job)
    return EventStream(_chat_events(stream, prep, r.Header.new("chatcmpl", model), include_usage),
                       on_disconnect=running.cancel)


async def _chat_events(stream: JobStream, prep: PreparedChat, header: r.Header,
                       include_usage: bool) -> AsyncIterator[bytes]:
    answer = r.Answer()
    held = HeldForTools(prep.tools)
    split = SplitReasoning(prep)
    timer = extras.StreamTimer()
    try:
        yield event(r.chat_chunk(header, {"role": "assistant", "content": None}))
        content = TextEvents(r.chat_chunk(header, {"content": TextEvents.MARK}))
        thoughts = TextEvents(r.chat_chunk(header, {"reasoning_content": TextEvents.MARK}))
        async for ev in stream:
            timer.count(len(ev.tokens))
            if ev.progress is not None:
                yield event({**r.chat_chunk(header, {}), "choices": [], "prompt_progress": timer.progress(ev.progress)})
            answer.probs.extend(ev.probs)
            if ev.done and ev.stats is not None:
                answer.stats = ev.stats
            for is_reasoning, piece in split.feed(ev.text, ev.done):
                if is_reasoning:
                    yield thoughts.event(piece)
                    continue
                for text, probs in held.feed(piece, ev.probs):
                    if prep.logprobs or prep.extras.timings_per_token:
                        chunk = r.chat_chunk(header, {"content": text},
                                             logprobs=r.chat_logprobs(probs) if prep.logprobs else None)
                        yield event({**chunk, "timings": timer.token()}
                                    if prep.extras.timings_per_token else chunk)
                    else:
                        yield content.event(text)
        calls, rest = held.finish(answer.stats)
        if rest is not None:
            text, probs = rest
            chunk = r.chat_chunk(header, {"content": text}, logprobs=r.chat_logprobs(probs) if prep.logprobs else None)
            yield event({**chunk, "timings": timer.token()} if prep.extras.timings_per_token else chunk)
        for delta in r.tool_call_deltas(calls or []):
            yield event(r.chat_chunk(header, delta))
        yield event({**r.chat_chunk(header, {}, finish="tool_calls" if calls else r.finish_reason(answer.stats)),
                     "timings": r.timings([answer])})
        if include_usage:
            yield event({**r.usage_chunk(header, "chat.completion.chunk", [answer]),
                         "timings": timings(answer.stats)})
    except Exception as exc:  # noqa: BLE001 - the status line is gone; report in the stream, as OpenAI does
        yield error_event(exc)
    finally:
        stream.cancel()  # a no-op once the job is done; stops it when this stream is torn down early
    yield DONE


class SplitReasoning:
    """A stream's text as (is_reasoning, text) parts: cut at the think markers when the server separates
    reasoning, whole otherwise. White space around the reasoning and newlines before the answer are dropped, as
    `Thinking.split` drops them from a whole answer, so the joined deltas equal the whole answer."""

    def __init__(self, prep: PreparedChat):
        self.splitter = prep.thinking.splitter() if prep.thinking is not None else None
        self.inside = prep.thinking is not None and prep.thinking.inside
        self.answer_started = False
        self.thought = False  # whether any reasoning was sent
        self.space = ""  # reasoning's trailing white space, sent only if more reasoning follows

    def feed(self, text: str, done: bool) -> list[tuple[bool, str]]:
        if self.splitter is None:
            return [(False, text)] if text else []
        out = []
        for is_reasoning, piece in self.splitter.feed(text) + (self.splitter.flush() if done else []):
            if is_reasoning:
                piece = self.space + piece if self.thought else piece.lstrip()
                body = piece.rstrip()
                self.space = piece[len(body):]
                piece, self.thought = body, self.thought or bool(body)
            elif not self.answer_started and (self.thought or self.inside):
                piece = piece.lstrip("\n")
            if piece:
                self.answer_started |= not is_reasoning
                out.append((is_reasoning, piece))
        return out


class HeldForTools:
    """Decides what streamed text is content, holding back text that may be a tool call.

    Without tools everything passes through. With a forced call everything is held and read as a
    call at the end; with tool_choice "auto" text is held only while it could still be one.
    """

    def __init__(self, plan: ToolPlan | None):
        self.plan = plan
        self.holding = plan is not None
        self.text = ""
        self.probs: list[Any] = []

    def feed(self, text: str, probs: list[Any]) -> list[tuple[str, list[Any]]]:
        if not self.holding:
            return [(text, probs)] if text or probs else []
        self.text += text
        self.probs += probs
        if self.plan is not None and not self.plan.forced and not may_be_call(self.text):
            self.holding = False
            out, self.text, self.probs = [(self.text, self.probs)], "", []
            return out
        return []

    def finish(self, stats: Any) -> tuple[list[dict[str, Any]] | None, tuple[str, list[Any]] | None]:
        """(tool calls, or None; held text to send as content, or None: none either for a call cut short)."""
        if not self.holding or self.plan is None:
            return None, None
        calls = parse_tool_calls(self.text, self.plan)
        if calls:
            return calls, None
        if cut_call(self.text, self.plan, stats):
            return None, None
        return None, (self.text, self.probs) if self.text or self.probs else None


# ---------------------------------------------------------------- the parts other APIs build answers from


@dataclass(frozen=True)
class Parts:
    """A whole answer cut into what the APIs for agents show apart: thinking, text, tool calls."""

    reasoning: str
    text: str
    calls: list[dict[str, Any]] | None
    cut_call: bool = False  # the answer was a tool call cut short by the token limit (text holds none of it)


def whole_parts(prep: PreparedChat, answer: r.Answer) -> Parts:
    reasoning, text = prep.thinking.split(answer.text) if prep.thinking is not None else ("", answer.text)
    calls = parse_tool_calls(text, prep.tools) if prep.tools is not None else None
    cut = calls is None and cut_call(text, prep.tools, answer.stats)
    return Parts(reasoning, "" if calls or cut else text, calls, cut)


REASONING, TEXT, CALLS, PING = "reasoning", "text", "calls", "ping"
PROGRESS, TOKENS = "progress", "tokens"  # only with streamed_parts(..., progress=True)


async def streamed_parts(stream: JobStream, prep: PreparedChat, answer: r.Answer,
                         ping_s: float | None = None, progress: bool = False) -> AsyncIterator[tuple[str, Any]]:
    """A job's answer as it streams: (REASONING, text), (TEXT, text), then (CALLS, calls) if the answer is
    tool calls; (PING, None) after each `ping_s` without an event (a long prompt still being read).
    With `progress`, also (PROGRESS, (total, cache, processed)) as the prompt is read and (TOKENS, n)
    for each event's generated tokens (whose text may be held back). `answer` gets the statistics."""
    split, held = SplitReasoning(prep), HeldForTools(prep.tools)
    async for ev in _with_pings(stream, ping_s):
        if ev is None:
            yield PING, None
            continue
        if ev.done and ev.stats is not None:
            answer.stats = ev.stats
        if progress and ev.progress is not None:
            yield PROGRESS, ev.progress
        if progress and ev.tokens:
            yield TOKENS, len(ev.tokens)
        for is_reasoning, piece in split.feed(ev.text, ev.done):
            if is_reasoning:
                yield REASONING, piece
            else:
                for text, _ in held.feed(piece, []):
                    yield TEXT, text
    calls, rest = held.finish(answer.stats)
    if rest is not None and rest[0]:
        yield TEXT, rest[0]
    if calls:
        yield CALLS, calls


async def _with_pings(stream: JobStream, ping_s: float | None) -> AsyncIterator[Event | None]:
    """The stream's events, with None each time `ping_s` pass without one."""
    if ping_s is None:
        async for ev in stream:
            yield ev
        return
    waiting: asyncio.Future[Event] | None = None
    try:
        while True:
            waiting = asyncio.ensure_future(anext(stream))
            while not (await asyncio.wait({waiting}, timeout=ping_s))[0]:
                yield None
            try:
                ev = waiting.result()
            except StopAsyncIteration:
                return
            yield ev
    finally:
        if waiting is not None and not waiting.done():
            waiting.cancel()


# ---------------------------------------------------------------- text completions


async def completion_body(engine: Engine, jobs: list[GenerationJob], model: str, request: Request) -> dict[str, Any]:
    answers = await collect_all(engine, jobs, request)
    logprobs = jobs[0].n_probs >= 0
    return r.text_completion(r.Header.new("cmpl", model), answers, logprobs)


def completion_stream(engine: Engine, jobs: list[GenerationJob], model: str, include_usage: bool) -> EventStream:
    running = Running()
    first = running.start(engine, jobs[0])
    return EventStream(_completion_events(engine, jobs, first, running, r.Header.new("cmpl", model), include_usage),
                       on_disconnect=running.cancel)


async def _completion_events(engine: Engine, jobs: list[GenerationJob], first: JobStream, running: Running,
                             header: r.Header, include_usage: bool) -> AsyncIterator[bytes]:
    answers = []
    logprobs = jobs[0].n_probs >= 0
    try:
        stream = first
        for index, job in enumerate(jobs):
            if index:
                stream = running.start(engine, job)
            answer, offset = r.Answer(), 0
            texts = TextEvents(r.text_chunk(header, index, TextEvents.MARK))
            async for ev in stream:
                if ev.done and ev.stats is not None:
                    answer.stats = ev.stats
                if logprobs and (ev.text or ev.probs):
                    lp = r.completion_logprobs(ev.probs, offset)
                    offset += len(ev.text)
                    yield event(r.text_chunk(header, index, ev.text, logprobs=lp))
                elif ev.text:
                    yield texts.event(ev.text)
            answers.append(answer)
            yield event({**r.text_chunk(header, index, "", finish=r.finish_reason(answer.stats)),
                         "timings": r.timings([answer])})
        if include_usage:
            yield event(r.usage_chunk(header, "text_completion", answers))
    except Exception as exc:  # noqa: BLE001 - the status line is gone; report in the stream, as OpenAI does
        yield error_event(exc)
    finally:
        running.cancel()
    yield DONE
