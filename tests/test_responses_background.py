"""OpenAI Responses background mode on `pyllama serve`, driven by the official `openai` SDK: create with
`background=True`, poll, resume the events after a sequence number, cancel."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.helpers import wait_slots_idle
from tests.test_serve import Server, _start

ASK = {"model": "tiny", "input": "Tell me a story.", "temperature": 0, "max_output_tokens": 24}


@pytest.fixture(scope="module")
def server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = _start(tiny_model, tmp_path_factory.mktemp("serve-background") / "stderr.log", "-np", "2")
    yield srv
    srv.stop()


def _client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


def _until_finished(client: openai.OpenAI, response_id: str, timeout: float = 30) -> openai.types.responses.Response:
    deadline = time.monotonic() + timeout
    seen = []
    while True:
        response = client.responses.retrieve(response_id)
        seen.append(response.status)
        if response.status not in ("queued", "in_progress"):
            return response
        assert time.monotonic() < deadline, seen
        time.sleep(0.02)


def test_background_runs_to_completed_and_equals_the_foreground_answer(server: Server) -> None:
    client = _client(server)
    foreground = client.responses.create(**ASK)
    created = client.responses.create(**ASK, background=True)
    assert created.status == "queued" and created.background is True and created.output == []
    done = _until_finished(client, created.id)
    assert done.status == "incomplete" and done.id == created.id and done.background is True
    assert done.output_text == foreground.output_text and done.output_text


def test_stream_resumes_exactly_after_a_sequence_number(server: Server) -> None:
    client = _client(server)
    created = client.responses.create(**ASK, background=True)
    _until_finished(client, created.id)
    every = list(client.responses.retrieve(created.id, stream=True))
    assert [e.sequence_number for e in every] == list(range(len(every)))
    assert every[0].type == "response.created" and every[-1].type == "response.incomplete"
    assert client.responses.retrieve(created.id).model_dump() == every[-1].response.model_dump()  # as stored
    n = 5
    after = list(client.responses.retrieve(created.id, stream=True, starting_after=n))
    assert [e.model_dump() for e in after] == [e.model_dump() for e in every[n + 1:]]
    text = "".join(e.delta for e in [*every[:n + 1], *after] if e.type == "response.output_text.delta")
    assert text == client.responses.create(**ASK).output_text == every[-1].response.output_text


def test_a_streamed_background_response_can_be_dropped_and_resumed(server: Server) -> None:
    client = _client(server)
    foreground = client.responses.create(**ASK).output_text
    first = []
    with client.responses.create(**ASK, background=True, stream=True) as events:
        for event in events:
            first.append(event)
            if len(first) == 4:
                break
    rest = list(client.responses.retrieve(first[0].response.id, stream=True,
                                          starting_after=first[-1].sequence_number))
    joined = "".join(e.delta for e in [*first, *rest] if e.type == "response.output_text.delta")
    assert joined == foreground
    assert (rest[-1].type, rest[-1].response.status) == ("response.incomplete", "incomplete")


def test_cancel_stops_a_running_background_response(server: Server) -> None:
    client = _client(server)
    created = client.responses.create(**{**ASK, "max_output_tokens": 3800}, background=True,
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
        client.responses.create(**ASK, background=True, store=False)
    plain = client.responses.create(**ASK)
    with pytest.raises(openai.BadRequestError, match="only a response created with background: true can be cancelled"):
        client.responses.cancel(plain.id)
    resumed = httpx.get(f"{server.url}/v1/responses/{plain.id}", params={"stream": "true"})
    assert resumed.status_code == 400
    assert httpx.post(f"{server.url}/v1/responses/resp_nothing/cancel").status_code == 404
