"""`pyllama serve`'s Anthropic Messages API, driven by the official `anthropic` SDK."""

from __future__ import annotations

import asyncio

import anthropic
import httpx
import jsonschema
import pytest

from tests.helpers import SHARED_API_KEY, hang_up_after, wait_slots_idle
from tests.test_serve import Server

KEY = SHARED_API_KEY
N_SLOTS = 4
WEATHER = {"name": "get_weather", "description": "The weather in a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                            "required": ["city"], "additionalProperties": False}}
HEADERS = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
GREEDY = {"temperature": 0}  # where a test needs text or a whole tool call: sampled, the end token may come first


@pytest.fixture(scope="module")
def server(keyed_server: Server) -> Server:
    """conftest.py's server with N_SLOTS slots, -c 2048 and PYLLAMA_API_KEY=KEY (test_ollama's too)."""
    return keyed_server


def _client(server: Server, key: str = KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=key, max_retries=0, timeout=60)


def _prompt_tokens(server: Server, messages: list[dict], tools: list[dict] | None = None) -> int:
    """Tokens of the prompt llama-server's /apply-template renders for OpenAI-style messages."""
    body = {"messages": messages, **({"tools": tools} if tools else {})}
    prompt = httpx.post(f"{server.url}/apply-template", json=body, headers=HEADERS, timeout=30).json()["prompt"]
    ids = httpx.post(f"{server.url}/tokenize", json={"content": prompt, "add_special": True}, headers=HEADERS,
                     timeout=30).json()["tokens"]
    return len(ids)


def test_create_with_a_system_prompt_answers_a_message(server: Server) -> None:
    client = _client(server)
    message = client.messages.create(model="claude-any", max_tokens=6, system="Be brief.", extra_body=GREEDY,
                                     messages=[{"role": "user", "content": "hello"}])
    assert message.id.startswith("msg_") and message.type == "message" and message.role == "assistant"
    assert message.model == "tiny"
    assert [block.type for block in message.content] == ["text"]
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert (message.stop_reason == "max_tokens") == (message.usage.output_tokens == 6)
    assert _input(message.usage) == _prompt_tokens(server, [{"role": "system", "content": "Be brief."},
                                                            {"role": "user", "content": "hello"}])


def test_a_forced_tool_gives_input_that_validates_then_its_result_is_answered(server: Server) -> None:
    client = _client(server)
    question = {"role": "user", "content": "What is the weather in Paris?"}
    call = client.messages.create(model="m", max_tokens=60, tools=[WEATHER], messages=[question], extra_body=GREEDY,
                                  tool_choice={"type": "tool", "name": "get_weather"})
    assert call.stop_reason == "tool_use"
    [block] = call.content
    assert block.type == "tool_use" and block.name == "get_weather" and block.id.startswith("toolu_")
    jsonschema.validate(block.input, WEATHER["input_schema"])
    turns = [question, {"role": "assistant", "content": [block.model_dump()]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": block.id, "content": "sunny, 21 C"}]}]
    answer = client.messages.create(model="m", max_tokens=6, tools=[WEATHER], messages=turns, extra_body=GREEDY)
    assert answer.stop_reason in ("end_turn", "max_tokens")
    assert answer.content and answer.content[0].type == "text"
    openai_turns = [question, {"role": "assistant", "content": "", "tool_calls": [
        {"id": block.id, "type": "function", "function": {"name": "get_weather", "arguments": block.input}}]},
        {"role": "tool", "tool_call_id": block.id, "content": "sunny, 21 C"}]
    tools = [{"type": "function", "function": {"name": "get_weather", "description": WEATHER["description"],
                                               "parameters": WEATHER["input_schema"]}}]
    assert _input(answer.usage) == _prompt_tokens(server, openai_turns, tools)


def test_a_streamed_forced_tool_sends_its_input_as_json_deltas(server: Server) -> None:
    with _client(server).messages.stream(model="m", max_tokens=60, tools=[WEATHER], extra_body=GREEDY,
                                         tool_choice={"type": "tool", "name": "get_weather"},
                                         messages=[{"role": "user", "content": "weather?"}]) as stream:
        kinds = [(event.type, getattr(getattr(event, "delta", None), "type", None)) for event in stream]
        final = stream.get_final_message()
    assert ("content_block_delta", "input_json_delta") in kinds
    assert final.stop_reason == "tool_use"
    jsonschema.validate(final.content[0].input, WEATHER["input_schema"])


def test_stream_text_deltas_join_into_the_final_message(server: Server) -> None:
    with _client(server).messages.stream(model="m", max_tokens=12, extra_body=GREEDY,
                                         messages=[{"role": "user", "content": "hello"}]) as stream:
        joined = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert joined and final.content[0].text == joined
    assert final.usage.output_tokens <= 12 and final.stop_reason in ("end_turn", "max_tokens")


def test_stream_events_come_in_anthropics_order(server: Server) -> None:
    body = {"model": "m", "max_tokens": 3, "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": "hi"}]}
    with httpx.stream("POST", f"{server.url}/v1/messages", json=body, headers=HEADERS, timeout=60) as response:
        names = [line[7:] for line in response.iter_lines() if line.startswith("event: ")]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-4:] == ["content_block_delta", "content_block_stop", "message_delta", "message_stop"]


def test_count_tokens_equals_the_prompt_tokens_a_message_reports(server: Server) -> None:
    client = _client(server)
    request = {"system": [{"type": "text", "text": "You are terse."}], "tools": [WEATHER],
               "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                            {"role": "user", "content": [{"type": "text", "text": "weather?"}]}]}
    counted = client.messages.count_tokens(model="m", **request)
    message = client.messages.create(model="m", max_tokens=2, **request)
    assert counted.input_tokens == _input(message.usage) > 20


def test_a_bad_role_is_a_400_in_anthropics_shape(server: Server) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        _client(server).messages.create(model="m", max_tokens=4, messages=[{"role": "robot", "content": "hi"}])
    assert caught.value.status_code == 400
    assert caught.value.body == {"type": "error", "error": {
        "type": "invalid_request_error",
        "message": "messages[0].role: Input should be 'user', 'assistant' or 'system'"}}


def test_a_missing_max_tokens_is_a_400_naming_it(server: Server) -> None:
    response = httpx.post(f"{server.url}/v1/messages", headers=HEADERS, timeout=30,
                          json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 400
    assert response.json() == {"type": "error", "error": {"type": "invalid_request_error",
                                                          "message": "max_tokens: this field is required"}}


def test_a_wrong_x_api_key_is_a_401_in_anthropics_shape(server: Server) -> None:
    with pytest.raises(anthropic.AuthenticationError) as caught:
        _client(server, key="wrong").messages.create(model="m", max_tokens=4,
                                                     messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 401
    assert caught.value.body == {"type": "error", "error": {"type": "authentication_error",
                                                            "message": "invalid API key"}}


def test_eight_concurrent_streams_on_four_slots_complete_whole(server: Server) -> None:
    async def one(client: anthropic.AsyncAnthropic, i: int) -> tuple[str, object]:
        async with client.messages.stream(model="m", max_tokens=16, extra_body=GREEDY,
                                          messages=[{"role": "user", "content": f"hello {i}"}]) as stream:
            joined = "".join([text async for text in stream.text_stream])
            return joined, await stream.get_final_message()

    async def main() -> list[tuple[str, object]]:
        client = anthropic.AsyncAnthropic(base_url=server.url, api_key=KEY, max_retries=0, timeout=120)
        return await asyncio.gather(*[one(client, i) for i in range(8)])

    results = asyncio.run(main())
    assert len(results) == 8
    for joined, final in results:
        assert final.stop_reason in ("end_turn", "max_tokens")
        assert final.content[0].text == joined


def test_a_client_that_disconnects_frees_its_slot(server: Server) -> None:
    body = {"model": "m", "max_tokens": 400, "stream": True, "messages": [{"role": "user", "content": "go"}]}
    hang_up_after(f"{server.url}/v1/messages", body, "event: content_block_delta", headers=HEADERS)
    slots = wait_slots_idle(server.url, headers=HEADERS)
    assert max(s["n_cached"] for s in slots) < 400


def test_agent_requests_pass_tools_no_grammar_can_enforce_and_mid_conversation_system_turns(server: Server) -> None:
    # What Claude Code sends: a tool schema with "propertyNames", and a system message between turns.
    tool = {"name": "tag", "input_schema": {"type": "object", "properties": {
        "labels": {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}}}}}
    turns = [{"role": "user", "content": "hi"}, {"role": "system", "content": "Context: none."}]
    client = _client(server)
    message = client.messages.create(model="m", max_tokens=2, tools=[tool], messages=turns)
    assert _input(message.usage) == client.messages.count_tokens(model="m", tools=[tool],
                                                                 messages=turns).input_tokens
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model="m", max_tokens=2, tools=[tool], messages=turns,
                               tool_choice={"type": "tool", "name": "tag"})
    assert caught.value.body["error"]["message"].endswith('"propertyNames" is not supported: a grammar cannot '
                                                          'enforce it')


def _input(usage: anthropic.types.Usage) -> int:
    """All the prompt's tokens: those evaluated (input_tokens) and those the prompt cache supplied."""
    assert usage.cache_creation_input_tokens == 0
    return usage.input_tokens + (usage.cache_read_input_tokens or 0)
