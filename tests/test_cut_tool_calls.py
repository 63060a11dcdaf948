"""A tool call the token limit cuts short is no answer: chat says "length", Responses "incomplete",
Anthropic "max_tokens", and none of them shows the half-written call as text, streamed or not.

Before, `{"name" : "get` came back as the message's content (Responses: output_text), and the
OpenAI Agents SDK took it for the agent's final answer."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.test_serve import Server

PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
HI = [{"role": "user", "content": "What is the weather in Paris?"}]
LIMIT = 12  # tokens: the forced call is cut inside the function's name


def _post(server: Server, path: str, body: dict) -> httpx.Response:
    response = httpx.post(f"{server.url}{path}", json={**body, "temperature": 0}, timeout=120)
    assert response.status_code == 200, response.text
    return response


def _events(response: httpx.Response) -> list[dict]:
    return [json.loads(line[5:]) for line in response.text.splitlines()
            if line.startswith("data:") and line != "data: [DONE]"]


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_chat_says_length_and_shows_no_content(server: Server, tool_choice: object) -> None:
    body = {"messages": HI, "max_tokens": LIMIT, "tool_choice": tool_choice,
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": PARAMETERS}}]}
    [choice] = _post(server, "/v1/chat/completions", body).json()["choices"]
    assert choice["finish_reason"] == "length"
    assert choice["message"] == {"role": "assistant", "content": None, "refusal": None}
    chunks = _events(_post(server, "/v1/chat/completions", {**body, "stream": True}))
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert [d for d in deltas if d.get("content") or d.get("tool_calls")] == []
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"


def test_responses_is_incomplete_with_no_output(server: Server) -> None:
    body = {"input": HI, "max_output_tokens": LIMIT, "tool_choice": "required",
            "tools": [{"type": "function", "name": "get_weather", "parameters": PARAMETERS}]}
    whole = _post(server, "/v1/responses", body).json()
    assert (whole["status"], whole["incomplete_details"]) == ("incomplete", {"reason": "max_output_tokens"})
    assert (whole["output"], whole["output_text"]) == ([], "")
    events = _events(_post(server, "/v1/responses", {**body, "stream": True}))
    assert [e["type"] for e in events] == ["response.created", "response.in_progress", "response.incomplete"]
    final = events[-1]["response"]
    assert (final["status"], final["incomplete_details"], final["output"]) == (
        "incomplete", {"reason": "max_output_tokens"}, [])


def test_the_openai_stream_helper_refuses_a_cut_response_as_against_openai(server: Server) -> None:
    """Its stream ends with response.incomplete, so get_final_response raises (it wants response.completed),
    and the Agents SDK's streamed run fails as it does against OpenAI instead of finishing with nothing."""
    tool = {"type": "function", "name": "get_weather", "parameters": PARAMETERS}
    with server.client().responses.stream(model="m", input=HI, max_output_tokens=LIMIT, tool_choice="required",
                                          tools=[tool], temperature=0) as stream:
        last = [event for event in stream][-1]
        with pytest.raises(RuntimeError, match="Didn't receive a `response.completed` event"):
            stream.get_final_response()
    assert (last.type, last.response.status, last.response.incomplete_details.reason) == (
        "response.incomplete", "incomplete", "max_output_tokens")


def test_anthropic_says_max_tokens_with_no_text(server: Server) -> None:
    body = {"model": "tiny", "messages": HI, "max_tokens": LIMIT, "tool_choice": {"type": "any"},
            "tools": [{"name": "get_weather", "input_schema": PARAMETERS}]}
    whole = _post(server, "/v1/messages", body).json()
    assert (whole["stop_reason"], whole["content"]) == ("max_tokens", [])
    events = _events(_post(server, "/v1/messages", {**body, "stream": True}))
    assert [e["type"] for e in events] == ["message_start", "ping", "message_delta", "message_stop"]
    assert events[2]["delta"]["stop_reason"] == "max_tokens"
