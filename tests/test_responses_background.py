"""OpenAI Responses background mode on `pyllama serve`, driven by the official `openai` SDK: create with
`background=True`, poll, resume the events after a sequence number, cancel."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import openai
import pytest
from starlette.responses import StreamingResponse

from pyllama_cli.server.responses_api.background import BackgroundRuns, Run
from pyllama_cli.server.responses_api.store import ResponseStore
from tests.helpers import wait_slots_idle
from tests.test_serve import Server, _start

# A story of exactly 300 characters: once the grammar has it, only the end token is left, so the tiny
# model's answer ends by itself (`completed`, ~120 tokens) instead of being cut at max_output_tokens.
STORY = {"type": "object", "properties": {"story": {"type": "string", "minLength": 300, "maxLength": 300}},
         "required": ["story"], "additionalProperties": False}
ASK = {"model": "tiny", "input": "Tell me a story.", "temperature": 0, "max_output_tokens": 400,
       "text": {"format": {"type": "json_schema", "name": "story", "schema": STORY, "strict": True}}}
PLAIN = {"model": "tiny", "input": "Tell me a story.", "temperature": 0}


@pytest.fixture(scope="module")
def server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = _start(tiny_model, tmp_path_factory.mktemp("serve-background") / "stderr.log", "-np", "2")
    yield srv
    srv.stop()


def _client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


def _until_finished(client: openai.OpenAI, response_id: str, timeout: float = 30,
                    seen: list[str] | None = None) -> openai.types.responses.Response:
    deadline = time.monotonic() + timeout
    seen = [] if seen is None else seen
    while True:
        response = client.responses.retrieve(response_id)
        seen.append(response.status)
        if response.status not in ("queued", "in_progress"):
            return response
        assert time.monotonic() < deadline, seen
        time.sleep(0.02)


def _text(events: list) -> str:
    return "".join(e.delta for e in events if e.type == "response.output_text.delta")


def test_background_runs_to_completed_and_equals_the_foreground_answer(server: Server) -> None:
    client = _client(server)
    foreground = client.responses.create(**ASK)
    assert foreground.status == "completed" and len(foreground.output_text) > 300
    created = client.responses.create(**ASK, background=True)
    assert created.status == "queued" and created.background is True and created.output == []
    seen: list[str] = []
    done = _until_finished(client, created.id, seen=seen)
    assert done.status == "completed" and done.id == created.id and done.background is True
    assert done.output_text == foreground.output_text
    assert seen == sorted(seen, key=["queued", "in_progress", "completed"].index)  # never back to an earlier status


def test_a_background_response_cut_at_max_output_tokens_ends_incomplete(server: Server) -> None:
    client = _client(server)
    done = _until_finished(client, client.responses.create(**PLAIN, max_output_tokens=8, background=True).id)
    assert (done.status, done.usage.output_tokens, done.incomplete_details.reason) == (
        "incomplete", 8, "max_output_tokens")


def test_stream_resumes_exactly_after_a_sequence_number(server: Server) -> None:
    client = _client(server)
    created = client.responses.create(**ASK, background=True)
    _until_finished(client, created.id)
    every = list(client.responses.retrieve(created.id, stream=True))
    assert [e.sequence_number for e in every] == list(range(len(every)))
    assert every[0].type == "response.created" and every[-1].type == "response.completed"
    assert client.responses.retrieve(created.id).model_dump() == every[-1].response.model_dump()  # as stored
    n = 9  # past the first text deltas
    after = list(client.responses.retrieve(created.id, stream=True, starting_after=n))
    assert [e.model_dump() for e in after] == [e.model_dump() for e in every[n + 1:]]
    assert _text([*every[:n + 1], *after]) == client.responses.create(**ASK).output_text
    assert _text(every) == every[-1].response.output_text


def test_a_streamed_background_response_can_be_dropped_and_resumed(server: Server) -> None:
    client = _client(server)
    foreground = client.responses.create(**ASK).output_text
    first = []
    with client.responses.create(**ASK, background=True, stream=True) as events:
        for event in events:  # the client drops after three text deltas, mid-answer
            first.append(event)
            if sum(e.type == "response.output_text.delta" for e in first) == 3:
                break
    response_id = first[0].response.id
    rest = list(client.responses.retrieve(response_id, stream=True, starting_after=first[-1].sequence_number))
    both = [*first, *rest]
    assert [e.sequence_number for e in both] == list(range(len(both)))  # none lost, none twice
    assert _text(both) == foreground
    assert (rest[-1].type, rest[-1].response.status) == ("response.completed", "completed")
    assert _until_finished(client, response_id).output_text == foreground


def test_cancel_stops_a_running_background_response(server: Server) -> None:
    client = _client(server)
    created = client.responses.create(**PLAIN, max_output_tokens=3800, background=True,
                                      extra_body={"ignore_eos": True})
    deadline = time.monotonic() + 10
    while client.responses.retrieve(created.id).status == "queued":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    cancelled = client.responses.cancel(created.id)
    assert cancelled.status == "cancelled" and cancelled.id == created.id
    assert client.responses.retrieve(created.id).status == "cancelled"
    assert client.responses.cancel(created.id).status == "cancelled"  # again: as it is
    wait_slots_idle(server.url, timeout=2)


def test_background_needs_store_and_only_background_responses_cancel_or_resume(server: Server) -> None:
    client = _client(server)
    with pytest.raises(openai.BadRequestError, match="background responses are stored"):
        client.responses.create(**PLAIN, background=True, store=False)
    plain = client.responses.create(**PLAIN, max_output_tokens=4)
    with pytest.raises(openai.BadRequestError, match="only a response created with background: true can be cancelled"):
        client.responses.cancel(plain.id)
    resumed = httpx.get(f"{server.url}/v1/responses/{plain.id}", params={"stream": "true"})
    assert resumed.status_code == 400
    assert httpx.post(f"{server.url}/v1/responses/resp_nothing/cancel").status_code == 404


def _sse(sequence: int, **fields: object) -> bytes:
    data = {"type": "response.output_text.delta", "sequence_number": sequence, "item_id": "msg_1",
            "output_index": 0, "content_index": 0, "delta": f"word{sequence} ", "logprobs": [], **fields}
    return f"event: {data['type']}\ndata: {json.dumps(data)}\n\n".encode()


def test_a_finished_run_is_packed_replays_the_same_events_and_the_oldest_goes_past_the_count() -> None:
    events = [_sse(0, type="response.created", response={"id": "r", "status": "in_progress"}),
              *(_sse(i) for i in range(1, 60)),
              _sse(60, type="response.completed", response={"id": "r", "status": "completed"})]

    async def answer() -> AsyncIterator[bytes]:
        for event in events:
            yield event
            await asyncio.sleep(0)  # a reader takes its turn: it reads live events, then packed ones

    async def scenario() -> tuple[list[Run], BackgroundRuns, list[bytes], list[bytes]]:
        runs = BackgroundRuns(ResponseStore(max_count=2))
        started = [runs.start({"id": f"resp_{i}", "status": "queued"}, StreamingResponse(answer())) for i in range(3)]
        following = [chunk async for chunk in started[0].follow(-1)]  # live, then packed mid-way
        await asyncio.gather(*(run.task for run in started if run.task))
        after = [chunk async for chunk in started[2].follow(9)]
        return started, runs, following, after

    started, runs, following, after = asyncio.run(scenario())
    assert following == events and after == events[10:]
    assert list(runs.runs) == ["resp_1", "resp_2"]  # the store's count: the oldest finished one went
    run = started[2]
    assert run.done and run.events == [] and run.body == {"id": "r", "status": "completed", "background": True}
    assert run.finished_events() == events and run.size < sum(map(len, events)) / 4
