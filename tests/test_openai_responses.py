"""`pyllama serve`'s OpenAI Responses API, driven by the official `openai` SDK."""

from __future__ import annotations

import asyncio
import json

import httpx
import jsonschema
import openai
import pytest

from pyllama_cli.server.errors import APIError
from pyllama_cli.server.responses_api.store import ResponseStore
from tests.helpers import hang_up_after, wait_slots_idle
from tests.test_serve import Server

N_SLOTS = 4
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                          "required": ["city"], "additionalProperties": False}}
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 8}, "n": {"type": "integer"}},
          "required": ["answer", "n"], "additionalProperties": False}


@pytest.fixture(scope="module")
def server(four_slot_server: Server) -> Server:
    """conftest.py's server with N_SLOTS slots and -c 2048 (test_serve_parallel's too)."""
    return four_slot_server


def _prompt_tokens(server: Server, messages: list[dict], tools: list[dict] | None = None) -> int:
    body = {"messages": messages, **({"tools": tools} if tools else {})}
    prompt = httpx.post(f"{server.url}/apply-template", json=body, timeout=30).json()["prompt"]
    return len(httpx.post(f"{server.url}/tokenize", json={"content": prompt, "add_special": True}, timeout=30).json()["tokens"])


def test_create_answers_with_a_message_and_usage(server: Server) -> None:
    response = server.client().responses.create(model="gpt-any", instructions="Be brief.", input="hello",
                                                max_output_tokens=6, temperature=0)
    assert response.id.startswith("resp_") and response.object == "response" and response.model == "tiny"
    [item] = response.output
    assert item.type == "message" and item.role == "assistant" and item.content[0].type == "output_text"
    assert response.output_text == item.content[0].text
    assert response.usage.output_tokens <= 6
    assert response.status == ("incomplete" if response.usage.output_tokens == 6 else "completed")
    assert response.usage.input_tokens == _prompt_tokens(server, [{"role": "system", "content": "Be brief."},
                                                                  {"role": "user", "content": "hello"}])


def test_stream_deltas_join_into_output_text(server: Server) -> None:
    with server.client().responses.stream(model="m", input="hello", max_output_tokens=12, temperature=0) as stream:
        events = list(stream)  # not get_final_response: it raises for an incomplete response, as against OpenAI
    final = events[-1].response
    joined = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert joined and joined == final.output_text
    assert final.status == ("incomplete" if final.usage.output_tokens == 12 else "completed")
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          f"response.{final.status}"]  # response.incomplete when max_output_tokens cut it
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_a_function_call_round_trip_through_function_call_output(server: Server) -> None:
    client = server.client()
    question = {"role": "user", "content": "What is the weather in Paris?"}
    first = client.responses.create(model="m", input=[question], tools=[WEATHER], tool_choice="required",
                                    max_output_tokens=60, temperature=0)
    [call] = first.output
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
    second = client.responses.create(model="m", input=[question, call.model_dump(exclude_none=True), result],
                                     tools=[WEATHER], max_output_tokens=4, temperature=0)
    assert second.output[0].type == "message"
    openai_turns = [question, {"role": "assistant", "content": "", "tool_calls": [
        {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"}]
    tools = [{"type": "function", "function": {"name": "get_weather", "description": WEATHER["description"],
                                               "parameters": WEATHER["parameters"]}}]
    assert second.usage.input_tokens == _prompt_tokens(server, openai_turns, tools)


def test_a_streamed_function_call_sends_argument_deltas(server: Server) -> None:
    with server.client().responses.stream(model="m", input="weather?", tools=[WEATHER], tool_choice="required",
                                          max_output_tokens=60, temperature=0) as stream:
        deltas = [e.delta for e in stream if e.type == "response.function_call_arguments.delta"]
        final = stream.get_final_response()
    [call] = final.output
    assert "".join(deltas) == call.arguments
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])


def test_text_format_json_schema_gives_output_that_validates(server: Server) -> None:
    response = server.client().responses.create(
        model="m", input="Give me JSON.", max_output_tokens=80, temperature=0,
        text={"format": {"type": "json_schema", "name": "reply", "schema": SCHEMA, "strict": True}})
    assert response.status == "completed"
    jsonschema.validate(json.loads(response.output_text), SCHEMA)


def test_previous_response_id_continues_the_conversation(server: Server) -> None:
    client = server.client()
    first = client.responses.create(model="m", input="hello", max_output_tokens=4)
    second = client.responses.create(model="m", input="and again", previous_response_id=first.id,
                                     max_output_tokens=4)
    history = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": first.output_text},
               {"role": "user", "content": "and again"}]
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens == _prompt_tokens(server, history)
    assert client.responses.retrieve(second.id).output_text == second.output_text


def test_an_unknown_previous_response_id_is_a_404(server: Server) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        server.client().responses.create(model="m", input="hi", previous_response_id="resp_unknown")
    assert caught.value.status_code == 404
    assert caught.value.body["param"] == "previous_response_id"
    assert caught.value.body["message"].startswith("no response with id 'resp_unknown' is stored here")


def test_a_response_made_with_store_false_is_not_kept(server: Server) -> None:
    client = server.client()
    response = client.responses.create(model="m", input="hi", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)


def test_eight_concurrent_streams_on_four_slots_complete_whole(server: Server) -> None:
    async def one(client: openai.AsyncOpenAI, i: int) -> tuple[str, object]:
        async with client.responses.stream(model="m", input=f"hello {i}", max_output_tokens=16) as stream:
            events = [e async for e in stream]  # the last is response.completed or response.incomplete
            return "".join(e.delta for e in events if e.type == "response.output_text.delta"), events[-1]

    async def main() -> list[tuple[str, object]]:
        client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
        return await asyncio.gather(*[one(client, i) for i in range(8)])

    results = asyncio.run(main())
    assert len(results) == 8
    for joined, last in results:
        assert last.type == f"response.{last.response.status}" and last.response.output_text == joined
        assert last.response.status in ("completed", "incomplete")


def test_a_client_that_disconnects_frees_its_slot(server: Server) -> None:
    body = {"model": "m", "input": "go", "max_output_tokens": 400, "stream": True}
    hang_up_after(f"{server.url}/v1/responses", body, "event: response.output_text.delta")
    slots = wait_slots_idle(server.url)
    assert max(s["n_cached"] for s in slots) < 400


def test_codex_style_tools_namespaces_join_and_hosted_tools_are_left_out(server: Server) -> None:
    namespace = {"type": "namespace", "name": "agents", "description": "Sub-agents.", "tools": [WEATHER]}
    response = server.client().responses.create(
        model="m", input=[{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Hi"}]},
                          {"role": "user", "content": "weather?"}],
        tools=[namespace, {"type": "web_search", "external_web_access": False}], tool_choice="required",
        max_output_tokens=60, temperature=0, extra_body={"include": ["reasoning.encrypted_content"]})
    [call] = response.output
    assert call.type == "function_call" and call.name == "get_weather"
    tools = [{"type": "function", "function": {"name": "get_weather", "description": WEATHER["description"],
                                               "parameters": WEATHER["parameters"]}}]
    assert response.usage.input_tokens == _prompt_tokens(server, [{"role": "system", "content": "Hi"},
                                                                  {"role": "user", "content": "weather?"}], tools)


def test_the_store_forgets_the_oldest_past_its_count_or_its_bytes() -> None:
    store = ResponseStore(max_count=2, max_bytes=400)
    for i in range(3):
        store.put({"id": f"r{i}"}, [{"role": "user", "content": "x"}])
    assert list(store.items) == ["r1", "r2"]
    store.put({"id": "big", "text": "y" * 320}, [])  # its JSON and the bytes object holding it: under 400
    assert list(store.items) == ["big"] and store.size <= 400
    store.put({"id": "huge", "text": "z" * 500}, [])  # larger than the whole store: not kept
    assert list(store.items) == ["big"]
    with pytest.raises(APIError) as caught:
        store.get("r0", "previous_response_id")
    assert (caught.value.status, caught.value.param) == (404, "previous_response_id")
