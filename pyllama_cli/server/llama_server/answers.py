"""Run native jobs and answer in llama-server's shapes: /completion bodies, stream chunks, timings.

A request of several prompts runs them all at once (each on its own slot when there are enough)
and answers with a list; a stream tags each chunk with its prompt's `index`.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.requests import Request

from ...core.generate.decide import STOP_CONTEXT, STOP_EOS, STOP_GRAMMAR, STOP_LENGTH, STOP_STOP
from ...core.generate.stats import GenerationStats
from ...core.serving.engine import Engine
from ...core.media.settings import MEDIA_MARKER
from ...core.serving.jobs import GenerationJob, JobStream, TokenProb
from ..sse import DONE, EventStream, error_event, event
from ..timings import progress_timings, timings

if TYPE_CHECKING:
    from .prepare import NativeJobs

STOP_TYPES = {STOP_EOS: "eos", STOP_GRAMMAR: "eos", STOP_STOP: "word", STOP_LENGTH: "limit", STOP_CONTEXT: "limit"}
DISCONNECT_POLL_S = 0.25


@dataclass
class Result:
    """One prompt's answer as it accumulates."""

    job: GenerationJob
    text: list[str] = field(default_factory=list)
    probs: list[TokenProb] = field(default_factory=list)
    stats: GenerationStats = field(default_factory=GenerationStats)
    timed_out: bool = False


class Streams:
    """The jobs of one request, so that a client leaving, or a time limit, stops them."""

    def __init__(self, engine: Engine, jobs: list[GenerationJob]):
        self.streams = [engine.submit(job) for job in jobs]

    def cancel(self) -> None:
        for stream in self.streams:
            stream.cancel()


async def native_body(engine: Engine, prep: NativeJobs, model: str, request: Request) -> Any:
    """The whole answer: one body, or a list of bodies for a list of prompts."""
    streams = Streams(engine, prep.jobs)
    watcher = asyncio.create_task(_watch_disconnect(request, streams))
    try:
        results = await asyncio.gather(*[_collect(s, prep) for s in streams.streams])
    finally:
        watcher.cancel()
        streams.cancel()
    bodies = [_pick(completion_body(engine, r, prep, model, i, stream=False), prep.request.response_fields)
              for i, r in enumerate(results)]
    return bodies[0] if len(bodies) == 1 else bodies


async def _collect(stream: JobStream, prep: NativeJobs) -> Result:
    result = Result(stream.job)  # type: ignore[arg-type]
    deadline = _deadline(prep)
    async for ev in stream:
        result.text.append(ev.text)
        result.probs.extend(ev.probs)
        if ev.done and ev.stats is not None:
            result.stats = ev.stats
        if deadline is not None and ev.tokens and time.perf_counter() > deadline and not ev.done:
            result.timed_out = True
            stream.cancel()
    return result


def _deadline(prep: NativeJobs) -> float | None:
    limit = prep.request.t_max_predict_ms
    return time.perf_counter() + limit / 1000 if limit else None


async def _watch_disconnect(request: Request, streams: Streams) -> None:
    while not await request.is_disconnected():
        await asyncio.sleep(DISCONNECT_POLL_S)
    streams.cancel()


def native_stream(engine: Engine, prep: NativeJobs, model: str) -> EventStream:
    streams = Streams(engine, prep.jobs)
    return EventStream(_events(engine, streams, prep, model), on_disconnect=streams.cancel)


async def _events(engine: Engine, streams: Streams, prep: NativeJobs, model: str) -> AsyncIterator[bytes]:
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()

    async def pump(index: int, stream: JobStream) -> None:
        try:
            async for chunk in _stream_chunks(engine, stream, prep, model, index):
                await queue.put(chunk)
        except Exception as exc:  # noqa: BLE001 - the status line is gone; report in the stream
            await queue.put(error_event(exc))
        await queue.put(None)

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams.streams)]
    try:
        running = len(tasks)
        while running:
            chunk = await queue.get()
            if chunk is None:
                running -= 1
            else:
                yield chunk
    finally:
        streams.cancel()
        for task in tasks:
            task.cancel()
    yield DONE


async def _stream_chunks(engine: Engine, stream: JobStream, prep: NativeJobs, model: str,
                         index: int) -> AsyncIterator[bytes]:
    result = Result(stream.job)  # type: ignore[arg-type]
    deadline, started = _deadline(prep), time.perf_counter()
    post = prep.request.post_sampling_probs
    first_progress = 0.0
    async for ev in stream:
        if ev.progress is not None:
            total, cache, processed = ev.progress
            chunk = {"index": index, "content": "", "tokens": [], "stop": False, "prompt_progress": {
                "total": total, "cache": cache, "processed": processed,
                "time_ms": int((time.perf_counter() - started) * 1000)}}
            if prep.request.timings_per_token:  # the prompt so far: the first update has decoded nothing
                now = time.perf_counter()
                first_progress = first_progress or now
                chunk["timings"] = progress_timings(processed - cache, (now - first_progress) * 1000)
            yield event(chunk)
        if ev.text or ev.tokens:
            result.stats.n_generated += len(ev.tokens)
            chunk = {"index": index, "content": ev.text, "tokens": ev.tokens, "stop": False,
                     "id_slot": stream.job.id_slot, "tokens_predicted": result.stats.n_generated,  # type: ignore[union-attr]
                     "tokens_evaluated": len(stream.job.prompt)}  # type: ignore[union-attr]
            if ev.probs:
                chunk["completion_probabilities"] = [prob_entry(p, post) for p in ev.probs]
            yield event(chunk)
        if ev.done and ev.stats is not None:
            result.stats = ev.stats
        if deadline is not None and ev.tokens and time.perf_counter() > deadline and not ev.done:
            result.timed_out = True
            stream.cancel()
    if result.stats.end_token >= 0:  # llama-server sends the end token in a chunk of its own
        yield event({"index": index, "content": "", "tokens": [result.stats.end_token], "stop": False,
                     "id_slot": stream.job.id_slot, "tokens_predicted": result.stats.n_generated + 1,  # type: ignore[union-attr]
                     "tokens_evaluated": len(stream.job.prompt)})  # type: ignore[union-attr]
    body = completion_body(engine, result, prep, model, index, stream=True)
    yield event(_pick({**body, "content": "", "tokens": []}, prep.request.response_fields))


# ---------------------------------------------------------------- shapes


def prompt_text(engine: Engine, prompt: tuple[int, ...]) -> str:
    """The prompt as text; each image in it (a run of negative placeholder ids) as its media marker."""
    text, run = [], []
    for k, token in enumerate(prompt):
        if token >= 0:
            run.append(token)
        elif k == 0 or prompt[k - 1] != token:  # a new medium starts
            text.append(engine.detokenize(run) + MEDIA_MARKER)
            run = []
    return "".join(text) + engine.detokenize(run)


def completion_body(engine: Engine, result: Result, prep: NativeJobs, model: str, index: int,
                    *, stream: bool) -> dict[str, Any]:
    stats, job, req = result.stats, result.job, prep.request
    text = "".join(result.text)
    stop_type = "limit" if result.timed_out else STOP_TYPES.get(stats.stop_reason, "none")
    ended = [stats.end_token] if stats.end_token >= 0 else []  # llama-server returns and counts the end token
    n_predicted = stats.n_generated + len(ended)
    body: dict[str, Any] = {
        "index": index, "content": text, "tokens": [*stats.tokens, *ended] if req.return_tokens else [],
        "id_slot": stats.id_slot, "stop": True, "model": model, "tokens_predicted": n_predicted,
        "tokens_evaluated": stats.n_prompt, "generation_settings": generation_settings(job, prep, stream),
        "prompt": prompt_text(engine, job.prompt), "has_new_line": "\n" in text, "truncated": False,
        "stop_type": stop_type, "stopping_word": _stopping_word(engine, stats, job) if stop_type == "word" else "",
        "tokens_cached": stats.n_prompt + max(n_predicted - 1, 0), "timings": timings(stats),
    }
    if job.n_probs > 0 and not stream:
        body["completion_probabilities"] = [prob_entry(p, req.post_sampling_probs) for p in result.probs]
    return body


def prob_entry(p: TokenProb, post_sampling: bool) -> dict[str, Any]:
    """A token's entry in `completion_probabilities`: log-probabilities, or probabilities after sampling."""
    def one(token: int, piece: bytes, logprob: float) -> dict[str, Any]:
        entry: dict[str, Any] = {"id": token, "token": piece.decode("utf-8", errors="replace"), "bytes": list(piece)}
        if post_sampling:
            entry["prob"] = math.exp(logprob)
        else:
            entry["logprob"] = logprob
        return entry

    top = [one(*t) for t in p.top]
    return {**one(p.token, p.piece, p.logprob), ("top_probs" if post_sampling else "top_logprobs"): top}


def generation_settings(job: GenerationJob, prep: NativeJobs, stream: bool) -> dict[str, Any]:
    """The settings the job ran with, under llama-server's names (fixed ones at llama.cpp's defaults)."""
    s = job.sampling
    return {
        "seed": s.seed, "temperature": s.temperature, "dynatemp_range": s.dynatemp_range,
        "dynatemp_exponent": s.dynatemp_exponent, "top_k": s.top_k, "top_p": s.top_p, "min_p": s.min_p,
        "top_n_sigma": s.top_n_sigma, "xtc_probability": s.xtc_probability, "xtc_threshold": s.xtc_threshold,
        "typical_p": s.typical_p, "repeat_last_n": s.repeat_last_n,
        "repeat_penalty": s.repeat_penalty, "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty, "dry_multiplier": s.dry_multiplier, "dry_base": s.dry_base,
        "dry_allowed_length": s.dry_allowed_length, "dry_penalty_last_n": s.dry_penalty_last_n,
        "dry_sequence_breakers": list(s.dry_sequence_breakers), "mirostat": s.mirostat, "mirostat_tau": s.mirostat_ent,
        "mirostat_eta": s.mirostat_lr, "adaptive_target": s.adaptive_target, "adaptive_decay": s.adaptive_decay,
        "stop": list(job.stop),
        "max_tokens": prep.n_predict, "n_predict": prep.n_predict, "n_keep": 0, "n_discard": 0,
        "ignore_eos": s.ignore_eos, "stream": stream, "logit_bias": [
            {"bias": bias if math.isfinite(bias) else None, "token": token} for token, bias in s.logit_bias],
        "n_probs": max(job.n_probs, 0), "min_keep": 0, "grammar": s.grammar or "",
        "samplers": list(s.samplers),
        "timings_per_token": prep.request.timings_per_token, "post_sampling_probs": job.post_sampling,
    }


def _stopping_word(engine: Engine, stats: GenerationStats, job: GenerationJob) -> str:
    """The stop string that ended the text: the one that starts first in what the model wrote."""
    written = engine.detokenize(stats.tokens)
    found = [(written.find(s), s) for s in job.stop if s in written]
    return min(found)[1] if found else ""


def _pick(body: dict[str, Any], fields: list[str] | None) -> dict[str, Any]:
    """Only the fields asked for, each under its path ("generation_settings/n_predict")."""
    if not fields:
        return body
    out = {}
    for path in fields:
        value: Any = body
        for key in path.split("/"):
            value = value.get(key) if isinstance(value, dict) else None
        if value is not None:
            out[path] = value
    return out
