"""The chat page reattaches to an answer still generating on the server after a reload (X-Conversation-Id,
docs/streams.md), in a real headless Chromium (conftest.py's browser; skipped without it)."""

from __future__ import annotations

from typing import Any

import httpx

from tests.test_serve import Server
from tests.test_webui import api_answer, open_page, send, stored_chats, wait, wait_answered

STORY = [{"role": "user", "content": "tell me a long story"}]


def test_a_reload_mid_answer_reattaches_and_finishes_the_same_answer(browser: Any, server: Server) -> None:
    open_page(browser, server.url, max_tokens="1500", extra='{"ignore_eos": true}')
    send(browser, STORY[0]["content"])
    wait(browser, lambda d: len(d.execute_script(
        "return document.querySelector('.message.assistant .body').textContent")) > 20)
    before = stored_chats(browser)[0]["messages"][1]
    chat_id = stored_chats(browser)[0]["id"]
    assert before["stream"] == chat_id and "stats" not in before
    browser.refresh()
    wait(browser, lambda d: d.execute_script("return document.body.classList.contains('running')"))
    assert browser.execute_script("return document.querySelector('.chat.current').classList.contains('generating')")
    wait_answered(browser)
    expected = api_answer(server, STORY, max_tokens=1500, ignore_eos=True)["choices"][0]["message"]["content"]
    [chat] = stored_chats(browser)
    answer = chat["messages"][1]
    assert answer["content"] == expected and len(expected) > len(before["content"])
    assert "stream" not in answer and answer["stats"]["tokens"] == 1500
    assert browser.execute_script("return document.querySelector('.chat.current.generating')") is None
    lookup = httpx.post(f"{server.url}/v1/streams/lookup", json={"conversation_ids": [chat_id]}).json()
    assert lookup == []  # finished: no longer reported as running
    assert browser.get_log("browser") == []


def test_an_answer_that_finished_while_the_page_was_away_is_read_back(browser: Any, server: Server) -> None:
    open_page(browser, server.url, max_tokens="600", extra='{"ignore_eos": true}')
    send(browser, STORY[0]["content"])
    wait(browser, lambda d: len(d.execute_script(
        "return document.querySelector('.message.assistant .body').textContent")) > 20)
    chat_id = stored_chats(browser)[0]["id"]
    browser.get("about:blank")  # the page goes; the answer finishes without it
    wait(browser, lambda d: httpx.post(f"{server.url}/v1/streams/lookup",
                                       json={"conversation_ids": [chat_id]}).json() == [])
    browser.get(server.url + "/")
    wait_answered(browser)
    expected = api_answer(server, STORY, max_tokens=600, ignore_eos=True)["choices"][0]["message"]["content"]
    [chat] = stored_chats(browser)
    assert chat["messages"][1]["content"] == expected
    assert "stream" not in chat["messages"][1] and chat["messages"][1]["stats"]["tokens"] == 600
    assert browser.get_log("browser") == []
