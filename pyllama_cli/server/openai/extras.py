"""llama-server's extras on /v1/chat/completions: assistant prefill, n choices, timings, progress, verbose.

- A conversation that ends with an assistant message is continued, not closed: the prompt is the
  conversation before it, with the generation prompt, and then that message's text. vLLM's pair
  `continue_final_message` / `add_generation_prompt` says the same explicitly (both true is a 400).
- `n` > 1 runs n jobs at once (streamed, each chunk names its choice); a fixed seed moves on by one
  per choice, so the choices differ.
- `timings` (llama-server's prompt and generation figures) come with every answer, and per token
  with `timings_per_token`; `return_progress` streams the prompt's evaluation; `verbose` adds
  `__verbose` with the rendered prompt.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Any

from ...core.serving.engine import Engine
from ...core.serving.jobs import Event, GenerationJob, JobStream
from ..errors import APIError
from ..job_rules import check_slot
from ..sse import DONE, EventStream, error_event, event
from ..timings import timings
from . import bodies as r
from .bodies import Answer, usage


@dataclass(frozen=True)
class ChatShape:
    """What to render (messages, whether to open the assistant's turn) and the text that continues it."""

    messages: list[dict[str, Any]]
    add_generation_prompt: bool
    prefill: str


@dataclass(frozen=True)
class ChatExtras:
    """The llama-server switches a chat answer honours."""

    n: int = 1
    prompt: str = ""
    timings_per_token: bool = False
    verbose: bool = False


def chat_shape(engine: Engine, req: Any, messages: list[dict[str, Any]]) -> ChatShape:
    """The prompt's shape for a request; the mistakes llama-server refuses are 400s here too."""
    if req.add_generation_prompt and req.continue_final_message:
        raise APIError(400, "add_generation_prompt and continue_final_message cannot both be true: one opens a new "
                       "assistant turn, the other continues the last message", param="continue_final_message",
                       code="invalid_value")
    check_slot(engine, req.id_slot)
    if req.n and req.n > 1 and req.stream and req.tools:
        raise APIError(400, "n > 1 with tools is answered whole: send it without stream", param="n",
                       code="unsupported_value")
    last = messages[-1]
    if last["role"] == "assistant" and len(messages) > 1 and messages[-2]["role"] == "assistant":
        raise APIError(400, "the conversation ends with two assistant messages: only the last one can be continued",
                       param="messages", code="invalid_value")
    continues = last["role"] == "assistant" and not last.get("tool_calls") and req.add_generation_prompt is not False \
        or bool(req.continue_final_message)
    if continues:
        if last["role"] != "assistant":
            raise APIError(400, "continue_final_message needs a conversation that ends with an assistant message",
                           param="continue_final_message", code="invalid_value")
        return ChatShape(messages[:-1], True, last["content"])
    return ChatShape(messages, req.add_generation_prompt is not False, "")


def extras_of(req: Any, prompt: str) -> ChatExtras:
    return ChatExtras(req.n or 1, prompt, req.timings_per_token, req.verbose)


def choice_jobs(job: GenerationJob, n: int) -> list[GenerationJob]:
    """The jobs of n choices: a fixed seed moves on by one per choice, so that choices differ."""
    out = [job]
    for i in range(1, n):
        seed = job.sampling.seed
        out.append(job if seed < 0 else replace(job, sampling=replace(job.sampling, seed=(seed + i) % (2**32 - 1))))
    return out


def whole_body(bodies: list[dict[str, Any]], answers: list[Answer], extras: ChatExtras) -> dict[str, Any]:
    """One chat.completion of every choice, with llama-server's timings (and __verbose when asked)."""
    body = bodies[0]
    if len(bodies) > 1:
        choices = [{**b["choices"][0], "index": i} for i, b in enumerate(bodies)]
        body = {**body, "choices": choices, "usage": _usage(answers)}
    body["timings"] = timings(answers[0].stats)
    if extras.verbose:
        body["__verbose"] = {"prompt": extras.prompt, "content": answers[0].text,
                             "tokens_predicted": answers[0].stats.n_generated,
                             "tokens_evaluated": answers[0].stats.n_prompt}
    return body


def choices_stream(engine: Engine, prep: Any, header: r.Header, include_usage: bool) -> EventStream:
    """n choices streamed together, each chunk naming its choice's index (no tools: see chat_shape)."""
    streams = [engine.submit(job) for job in choice_jobs(prep.job, prep.extras.n)]

    def cancel() -> None:
        for stream in streams:
            stream.cancel()

    return EventStream(_choice_events(streams, prep, header, include_usage, cancel), on_disconnect=cancel)


async def _choice_events(streams: list[JobStream], prep: Any, header: r.Header, include_usage: bool,
                         cancel: Callable[[], None]) -> AsyncIterator[bytes]:
    queue: asyncio.Queue[tuple[int, Event | BaseException | None]] = asyncio.Queue()

    async def pump(index: int, stream: JobStream) -> None:
        try:
            async for ev in stream:
                await queue.put((index, ev))
        except Exception as exc:  # noqa: BLE001 - reported in the stream below
            await queue.put((index, exc))
        await queue.put((index, None))

    def chunk(index: int, delta: dict[str, Any], **kwargs: Any) -> bytes:
        body = r.chat_chunk(header, delta, **kwargs)
        body["choices"][0]["index"] = index
        return event(body)

    tasks = [asyncio.create_task(pump(i, stream)) for i, stream in enumerate(streams)]
    answers = [Answer() for _ in streams]
    try:
        for i in range(len(streams)):
            yield chunk(i, {"role": "assistant", "content": None})
        running = len(streams)
        while running:
            index, ev = await queue.get()
            if ev is None:
                running -= 1
                yield chunk(index, {}, finish=r.finish_reason(answers[index].stats))
            elif isinstance(ev, BaseException):
                yield error_event(ev)
            else:
                if ev.done and ev.stats is not None:
                    answers[index].stats = ev.stats
                if ev.text:
                    yield chunk(index, {"content": ev.text}, logprobs=r.chat_logprobs(ev.probs) if prep.logprobs
                                else None)
        if include_usage:
            yield event({**r.usage_chunk(header, "chat.completion.chunk", answers), "usage": _usage(answers),
                         "timings": timings(answers[0].stats)})
    finally:
        cancel()
        for task in tasks:
            task.cancel()
    yield DONE


def _usage(answers: list[Answer]) -> dict[str, Any]:
    """Usage of n choices: the prompt counted once, as OpenAI counts it, and every choice's tokens."""
    counted = usage(answers)
    prompt = answers[0].stats.n_prompt
    counted.update(prompt_tokens=prompt, total_tokens=prompt + counted["completion_tokens"],
                   prompt_tokens_details={"cached_tokens": answers[0].stats.n_cached})
    return counted


class StreamTimer:
    """Timings of a stream as it goes (the engine reports its own only at the end)."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.first: float | None = None
        self.n = 0
        self.prompt_n = 0  # prompt tokens read so far (from the progress events)

    def progress(self, progress: tuple[int, int, int]) -> dict[str, Any]:
        total, cache, processed = progress
        return {"total": total, "cache": cache, "processed": processed,
                "time_ms": int((time.perf_counter() - self.started) * 1000)}

    def count(self, n_tokens: int) -> None:
        """Count a stream event's tokens, whether or not its text is sent yet (a token may be held back, as an
        incomplete character or a possible stop string, and its text sent with a later one)."""
        if n_tokens and self.first is None:
            self.first = time.perf_counter()
        self.n += n_tokens

    def running(self) -> dict[str, Any]:
        """The whole `timings` object so far (prompt and generation), for streams that send it entire."""
        now = self.token()
        return {"prompt_n": self.prompt_n, "prompt_per_token_ms": now["prompt_ms"] / self.prompt_n if self.prompt_n
                else 0.0, "prompt_per_second": 1000 * self.prompt_n / now["prompt_ms"] if now["prompt_ms"] > 0 else 0.0,
                **now}

    def token(self) -> dict[str, Any]:
        """The timings a chunk carries: the tokens generated so far, as llama-server counts them."""
        now = time.perf_counter()
        first = self.first if self.first is not None else now
        ms = (now - first) * 1000
        prompt_ms = (first - self.started) * 1000
        return {"prompt_ms": prompt_ms, "predicted_n": self.n, "predicted_ms": ms,
                "predicted_per_token_ms": ms / self.n if self.n else 0.0,
                "predicted_per_second": 1000 * self.n / ms if ms > 0 else 0.0}
