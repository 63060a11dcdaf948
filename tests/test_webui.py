"""`pyllama serve`'s chat page, driven in a real headless Chromium (Debian's chromium + chromium-driver).

One browser and one server for the module; each test opens the page afresh with empty storage. The
tests skip where selenium, chromium or chromedriver is missing. `PYLLAMA_SCREENSHOT=1` also writes
docs/webui.png from the rendered-answer test.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from pyllama_cli.core.generate.conversation import Conversation
from pyllama_cli.server.errors import APIError
from pyllama_cli.server.webui.render import MAX_RENDER_CHARS, RenderLimiter, render_markdown
from pyllama_cli.server.webui.routes import ASSETS
from tests.fixtures.make_gguf import TINY, write_llama_gguf
from tests.helpers import REPO_ROOT
from tests.test_serve import N_CTX, Server, _metric, _start

API_KEY = "page-key"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
STATS = re.compile(r"^(\d+) tokens · [\d.]+ t/s · TTFT \d+ ms · context (\d+)/(\d+)$")
# An answer with a code block, a list and a table, forced by a grammar: what the screenshot shows.
RICH_ANSWER = ("Here is the **plan**:\n\n1. Load the model\n2. Stream the answer\n3. Render it safely\n\n"
               "| step | time |\n|---|---|\n| prompt | 12 ms |\n| answer | 85 ms |\n\n"
               "```python\ndef greet(name: str) -> str:\n    return f\"Hello, {name}!\"  # friendly\n```\n")
XSS_ANSWER = '<img src=x onerror=alert(1)> [click me](javascript:alert(2)) <script>alert(3)</script>'


def _gbnf_literal(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'root ::= "{escaped}"'


# ---------------------------------------------------------------- the browser and the servers
# Both are conftest.py's (session-wide; test_webui_streams uses them too).


def open_page(driver: Any, url: str, **settings: Any) -> None:
    """The page with empty storage, greedy sampling and `settings`, once it has listed the models."""
    driver.get(url + "/")
    stored = {"temperature": "0", "max_tokens": "24", "system": "", "top_p": "", "extra": "", **settings}
    driver.execute_script("localStorage.clear(); localStorage.setItem('pyllama.settings', arguments[0])",
                          json.dumps(stored))
    driver.get_log("browser")  # from here on, the log is the test's own (each reading empties it)
    driver.get(url + "/")
    wait(driver, lambda d: d.execute_script("return document.getElementById('model').options.length") > 0)


def wait(driver: Any, condition: Any, timeout: float = 20) -> Any:
    from selenium.webdriver.support.wait import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.02).until(condition)


def send(driver: Any, text: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    box = driver.find_element(By.ID, "input")
    box.send_keys(text)
    box.send_keys(Keys.ENTER)


def wait_answered(driver: Any) -> None:
    """Until the answer is complete, its stats line is shown and its Markdown is rendered."""
    wait(driver, lambda d: d.execute_script(
        "return !document.body.classList.contains('running') && "
        "document.querySelector('.message.assistant:last-child .stats')?.textContent !== '' && "
        "!document.querySelector('.message.assistant .body.plain')"))


def stored_chats(driver: Any) -> list[dict]:
    return json.loads(driver.execute_script("return localStorage.getItem('pyllama.conversations')"))


def texts(driver: Any, selector: str) -> list[str]:
    """The text of each element `selector` matches, without the line breaks around rendered blocks."""
    return driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map(e => e.textContent.trim())", selector)


def api_answer(server: Server, messages: list[dict], **fields: Any) -> dict:
    body = {"messages": messages, "temperature": 0, "max_tokens": 24, **fields}
    return httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60).json()


# ---------------------------------------------------------------- the page itself


def test_page_is_small_has_a_strict_csp_and_paints_fast(browser: Any, server: Server) -> None:
    page = httpx.get(server.url + "/", headers={"Accept": "text/html"})  # what a browser sends
    assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
    csp = page.headers["content-security-policy"]
    assert "script-src 'self';" in csp and "style-src 'self';" in csp and "default-src 'none';" in csp
    assert "unsafe-inline" not in csp and "http" not in csp
    assert re.findall(r'(?:src|href)="(webui/[^"]+)"', page.text) == ["webui/style.css", "webui/app.js"]
    assert "<script>" not in page.text and not re.search(r"\son\w+=", page.text)  # no inline script at all

    open_page(browser, server.url)
    paint = wait(browser, lambda d: d.execute_script(
        "return performance.getEntriesByName('first-contentful-paint')[0]?.startTime"))
    assert 0 < paint < 300, f"first contentful paint after {paint} ms"
    resources = browser.execute_script("return performance.getEntriesByType('resource')"
                                       ".map(e => [e.name, e.decodedBodySize, e.initiatorType])")
    assert {re.match(r"https?://[^/]+", name).group(0) for name, _, _ in resources} == {server.url}
    files = [(name, size) for name, size, kind in resources if kind != "fetch"]  # not the API calls
    # What the page loads: the files of server/webui (app.js imports the other modules), from this
    # server only, so it works offline; together with the HTML, under 100 KB.
    assert sorted(name for name, _ in files) == sorted(server.url + path for path in ASSETS)
    sizes = {server.url + path: len(httpx.get(server.url + path).content) for path in ASSETS}
    assert dict(files) == sizes
    assert len(page.content) + sum(sizes.values()) < 100 * 1024
    assert browser.get_log("browser") == []  # no script error, no CSP violation


def test_send_streams_the_answer_then_shows_the_stats_line(browser: Any, server: Server) -> None:
    open_page(browser, server.url, max_tokens="120")
    # Every text the answer shows while it streams, as the browser sees it change.
    browser.execute_script("""
        window.__seen = [];
        new MutationObserver(() => {
          const body = document.querySelector('.message.assistant:last-child .body');
          if (body && body.textContent) window.__seen.push(body.textContent);
        }).observe(document.getElementById('messages'), {subtree: true, childList: true, characterData: true});
    """)
    send(browser, "hello")
    wait_answered(browser)
    expected = api_answer(server, [{"role": "user", "content": "hello"}], max_tokens=120)
    text = expected["choices"][0]["message"]["content"]
    [stats] = texts(browser, ".message.assistant .stats")
    tokens, context, n_ctx = map(int, STATS.match(stats).groups())
    assert (tokens, context, n_ctx) == (120, expected["usage"]["total_tokens"], N_CTX)
    seen = [s for s in dict.fromkeys(browser.execute_script("return window.__seen"))]
    assert len(seen) >= 4, seen  # it came in pieces, each a prefix of the whole answer
    assert all(text.startswith(s) for s in seen[:-1])
    [chat] = stored_chats(browser)
    assert chat["title"] == "hello"
    assert [(m["role"], m["content"]) for m in chat["messages"]] == [("user", "hello"), ("assistant", text)]
    assert browser.get_log("browser") == []


def test_escape_stops_the_answer_and_keeps_the_partial_text(browser: Any, server: Server) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    open_page(browser, server.url, max_tokens="3000", extra='{"ignore_eos": true}')
    send(browser, "tell me a long story")
    wait(browser, lambda d: len(d.execute_script(
        "return document.querySelector('.message.assistant .body').textContent")) > 40)
    assert browser.execute_script("return document.getElementById('stop').hidden") is False, (stored_chats(browser), texts(browser, "#status"), texts(browser, ".stats"))
    ActionChains(browser).send_keys(Keys.ESCAPE).perform()
    wait_answered(browser)
    [stats] = texts(browser, ".message.assistant .stats")
    assert stats.endswith(" · stopped")
    kept = stored_chats(browser)[0]["messages"][1]["content"]
    assert 40 < len(kept) and int(stats.split()[0]) < 3000
    time.sleep(0.3)
    assert stored_chats(browser)[0]["messages"][1]["content"] == kept  # nothing more arrived
    # The server stopped generating: its slot is idle again, the job counted as cancelled.
    deadline = time.monotonic() + 5
    while _metric(server, "requests_processing") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _metric(server, "requests_processing") == 0


def test_regenerate_asks_again_and_edit_resends_from_that_message(browser: Any, server: Server) -> None:
    from selenium.webdriver.common.by import By

    open_page(browser, server.url, max_tokens="12")
    send(browser, "hello")
    wait_answered(browser)
    # Fewer tokens now: the regenerated answer is the same question answered under the new setting.
    browser.execute_script("localStorage.setItem('pyllama.settings', JSON.stringify({temperature: '0', "
                           "max_tokens: '5', system: '', top_p: '', extra: ''}))")
    browser.refresh()
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, ".regenerate"))
    browser.find_element(By.CSS_SELECTOR, ".regenerate").click()
    wait_answered(browser)
    short = api_answer(server, [{"role": "user", "content": "hello"}], max_tokens=5)["choices"][0]["message"]
    messages = stored_chats(browser)[0]["messages"]
    assert [(m["role"], m["content"]) for m in messages] == [("user", "hello"), ("assistant", short["content"])]
    assert texts(browser, ".message.assistant .stats")[0].startswith("5 tokens · ")

    browser.find_element(By.CSS_SELECTOR, ".message.user .edit").click()
    box = browser.find_element(By.CSS_SELECTOR, ".edit-box")
    box.clear()
    box.send_keys("hi there\n")
    wait_answered(browser)
    edited = api_answer(server, [{"role": "user", "content": "hi there"}], max_tokens=5)["choices"][0]["message"]
    messages = stored_chats(browser)[0]["messages"]
    assert [(m["role"], m["content"]) for m in messages] == [("user", "hi there"), ("assistant", edited["content"])]


def test_reload_keeps_the_conversations_and_the_settings(browser: Any, server: Server) -> None:
    from selenium.webdriver.common.by import By

    open_page(browser, server.url, system="Answer briefly.")
    send(browser, "first question")
    wait_answered(browser)
    before = (texts(browser, ".message .body"), texts(browser, ".stats"))
    browser.find_element(By.ID, "new-chat").click()
    send(browser, "second question")
    wait_answered(browser)
    browser.refresh()
    wait(browser, lambda d: texts(d, ".message.assistant .stats"))
    assert texts(browser, "#conversations .title") == ["second question", "first question"]
    browser.find_elements(By.CSS_SELECTOR, "#conversations .title")[1].click()
    assert (texts(browser, ".message .body"), texts(browser, ".stats")) == before
    browser.find_element(By.ID, "open-settings").click()
    assert browser.find_element(By.ID, "set-system").get_attribute("value") == "Answer briefly."
    assert browser.find_element(By.ID, "set-max-tokens").get_attribute("value") == "24"


def test_conversations_rename_and_delete(browser: Any, server: Server) -> None:
    from selenium.webdriver.common.by import By

    open_page(browser, server.url)
    send(browser, "hello")
    wait_answered(browser)
    browser.find_element(By.CSS_SELECTOR, ".chat.current button:nth-of-type(2)").click()  # Rename
    browser.find_element(By.CSS_SELECTOR, "input.rename").send_keys("Greetings\n")  # the old name is selected
    assert texts(browser, "#conversations .title") == ["Greetings"] and texts(browser, "#title") == ["Greetings"]
    assert stored_chats(browser)[0]["title"] == "Greetings"
    delete = browser.find_element(By.CSS_SELECTOR, ".chat.current .danger")
    delete.click()
    assert stored_chats(browser)[0]["title"] == "Greetings"  # the first click only asks
    browser.find_element(By.CSS_SELECTOR, ".chat.current .danger").click()
    assert [c["title"] for c in stored_chats(browser)] == ["New chat"] and texts(browser, ".message") == []


def test_a_chat_is_named_from_its_first_messages_plain_text(browser: Any, server: Server) -> None:
    # Before: the first 40 raw characters, Markdown and all ("**robot** wit"); and with one model the
    # page never said which model answered.
    from selenium.webdriver.common.by import By

    open_page(browser, server.url)
    assert browser.find_element(By.ID, "model").is_displayed() and texts(browser, "#model") == ["tiny"]
    send(browser, "Tell me about a **robot** with a _hat_, in [three](http://x) lines")
    wait_answered(browser)
    assert texts(browser, "#conversations .title") == ["Tell me about a robot with a hat, in…"]


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
@pytest.mark.parametrize(("text", "title"), [
    ("**robot** with a _hat_ and `code`", "robot with a hat and code"),
    ("# Plan\n- buy *milk*\n- see [the docs](https://example.com)", "Plan buy milk see the docs"),
    ("```python\nprint(1)\n```", "print(1)"),
    ("a message that goes on and on past the forty characters", "a message that goes on and on past the…"),
    ("  \n ", "New chat"),
])
def test_chat_titles_are_plain_text(text: str, title: str) -> None:
    import subprocess

    script = ('import {chatTitle} from "./pyllama_cli/server/webui/util.js";'
              "process.stdout.write(chatTitle(JSON.parse(process.argv[1])));")
    proc = subprocess.run(["node", "--input-type=module", "-e", script, json.dumps(text)], capture_output=True,
                          text=True, cwd=REPO_ROOT, timeout=60)
    assert (proc.returncode, proc.stdout) == (0, title), proc.stderr


def test_export_and_import_use_the_json_of_chat_save_and_load(browser: Any, server: Server,
                                                              tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    open_page(browser, server.url, system="You are terse.")
    send(browser, "hello")
    wait_answered(browser)
    answer = stored_chats(browser)[0]["messages"][1]["content"]
    browser.find_element(By.ID, "export").click()
    exported = browser.downloads / "hello.json"
    wait(browser, lambda _: exported.exists() and exported.read_text().endswith("]\n"))
    loaded = Conversation()
    loaded.load(exported)  # what `pyllama chat`'s /load does with it
    assert loaded.system == "You are terse."
    assert loaded.messages == [{"role": "user", "content": "hello"}, {"role": "assistant", "content": answer}]

    saved = Conversation(system="Be kind.", messages=[{"role": "user", "content": "What is 2+2?"},
                                                      {"role": "assistant", "content": "It is **4**."}])
    saved.save(tmp_path / "arithmetic.json")  # what `pyllama chat`'s /save writes
    browser.find_element(By.ID, "import-file").send_keys(str(tmp_path / "arithmetic.json"))
    wait(browser, lambda d: texts(d, "#title") == ["arithmetic"])
    assert texts(browser, "#conversations .title") == ["arithmetic", "hello"]
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, ".message.assistant .body strong"))
    assert texts(browser, ".message .body") == ["What is 2+2?", "It is 4."]
    chat = stored_chats(browser)[0]
    assert chat["system"] == "Be kind." and [m["content"] for m in chat["messages"]] == ["What is 2+2?", "It is **4**."]

    (tmp_path / "bad.json").write_text('[{"role": "tool", "content": "x"}]')
    browser.find_element(By.ID, "import-file").send_keys(str(tmp_path / "bad.json"))
    wait(browser, lambda d: texts(d, "#status")[0].startswith("Cannot import bad.json"))
    assert texts(browser, "#status") == ['Cannot import bad.json: message 0 has the role "tool", which is not one '
                                         'a chat takes']


# ---------------------------------------------------------------- rendering, safely


def test_model_output_renders_inert(browser: Any, server: Server) -> None:
    from selenium.common.exceptions import NoAlertPresentException

    open_page(browser, server.url, max_tokens="200", extra=json.dumps({"grammar": _gbnf_literal(XSS_ANSWER)}))
    send(browser, "attack")
    wait_answered(browser)
    wait(browser, lambda d: d.execute_script("return !document.querySelector('.message.assistant .body.plain')"))
    assert stored_chats(browser)[0]["messages"][1]["content"] == XSS_ANSWER
    # Shown as text: the tags are characters on the screen, the link is not a link.
    assert texts(browser, ".message.assistant .body") == [XSS_ANSWER]
    found = browser.execute_script("""
        const box = document.getElementById('messages');
        return [box.querySelectorAll('img, script, iframe, [onerror], [onclick]').length,
                [...box.querySelectorAll('a')].map(a => a.getAttribute('href'))];""")
    assert found == [0, []]
    time.sleep(0.2)  # an image that failed to load would have fired its handler by now
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert  # noqa: B018 - reading it is the check
    assert browser.get_log("browser") == []  # no script error, no CSP violation


def test_the_renderer_keeps_markup_out_of_any_answer() -> None:
    assert render_markdown("<b onclick=x>hi</b>") == "<p>&lt;b onclick=x&gt;hi&lt;/b&gt;</p>\n"
    assert render_markdown("[a](javascript:alert(1)) [b](https://example.org/)") == (
        '<p>[a](javascript:alert(1)) <a href="https://example.org/" rel="noopener noreferrer nofollow">b</a></p>\n')
    assert render_markdown("![x](https://example.org/i.png)") == "<p></p>\n"  # no remote images
    assert render_markdown("<https://example.org/>") == (
        '<p><a href="https://example.org/" rel="noopener noreferrer nofollow">https://example.org/</a></p>\n')


def test_render_refuses_oversized_text_and_bounds_its_queue(server: Server) -> None:
    response = httpx.post(f"{server.url}/render", json={"text": "x" * (MAX_RENDER_CHARS + 1)})
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"
    assert httpx.post(f"{server.url}/render", json={"txt": "x"}).status_code == 400

    async def crowd() -> list[str]:
        limiter = RenderLimiter(slots=1, queue=2)
        release = asyncio.Event()
        outcomes: list[str] = []

        async def one() -> None:
            try:
                async with limiter:
                    outcomes.append("ran")
                    await release.wait()
            except APIError as exc:
                outcomes.append(str(exc.status))

        tasks = [asyncio.create_task(one()) for _ in range(5)]
        await asyncio.sleep(0.01)  # one runs, two wait, the other two are refused
        release.set()
        await asyncio.gather(*tasks)
        return outcomes

    assert sorted(asyncio.run(crowd())) == ["429", "429", "ran", "ran", "ran"]


def test_a_rendered_answer_has_code_a_list_a_table_and_copy_buttons(browser: Any, server: Server) -> None:
    from selenium.webdriver.common.by import By

    open_page(browser, server.url, max_tokens="400", extra=json.dumps({"grammar": _gbnf_literal(RICH_ANSWER)}))
    send(browser, "How does the page show an answer?")
    wait_answered(browser)
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, ".message.assistant .body table"))
    shape = browser.execute_script("""
        const body = document.querySelector('.message.assistant .body');
        return [[...body.querySelectorAll('ol > li')].map(li => li.textContent),
                [...body.querySelectorAll('tr')].map(tr => [...tr.children].map(c => c.textContent)),
                body.querySelector('pre code').textContent,
                body.querySelectorAll('pre span[class^="tok-"]').length > 5,
                [...body.querySelectorAll('.copy-code')].map(b => b.textContent)];""")
    assert shape == [["Load the model", "Stream the answer", "Render it safely"],
                     [["step", "time"], ["prompt", "12 ms"], ["answer", "85 ms"]],
                     'def greet(name: str) -> str:\n    return f"Hello, {name}!"  # friendly\n', True, ["Copy"]]
    if os.environ.get("PYLLAMA_SCREENSHOT") == "1":
        browser.save_screenshot(str(Path(REPO_ROOT) / "docs" / "webui.png"))
    browser.find_element(By.CSS_SELECTOR, ".copy-code").click()
    wait(browser, lambda d: texts(d, ".copy-code") == ["Copied"])
    # The dark theme is one click away and changes the page's colours.
    light = browser.execute_script("return getComputedStyle(document.body).backgroundColor")
    browser.find_element(By.ID, "theme").click()  # auto -> light
    browser.find_element(By.ID, "theme").click()  # light -> dark
    assert texts(browser, "#theme") == ["Dark"]
    assert browser.execute_script("return getComputedStyle(document.body).backgroundColor") != light


# ---------------------------------------------------------------- API key and --no-webui


def test_the_model_picker_switches_model_on_a_two_model_server(browser: Any, tiny_model: Path,
                                                                tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.select import Select

    other = write_llama_gguf(tmp_path / "other.gguf", replace(TINY, seed=7))
    srv = _start(tiny_model, tmp_path / "stderr.log", "-m", str(other))
    try:
        open_page(browser, srv.url, max_tokens="8")
        assert browser.find_element(By.ID, "model").is_displayed()
        assert [o.text for o in Select(browser.find_element(By.ID, "model")).options] == ["tiny", "other"]
        answers = {}
        for model in ("other", "tiny"):
            Select(browser.find_element(By.ID, "model")).select_by_visible_text(model)
            if answers:
                browser.find_element(By.CSS_SELECTOR, ".regenerate").click()
            else:
                send(browser, "hello")
            wait_answered(browser)
            answers[model] = stored_chats(browser)[0]["messages"][1]["content"]
            expected = api_answer(srv, [{"role": "user", "content": "hello"}], model=model, max_tokens=8)
            assert answers[model] == expected["choices"][0]["message"]["content"]
        assert answers["tiny"] != answers["other"]
        assert browser.execute_script("return localStorage.getItem('pyllama.model')") == '"tiny"'
    finally:
        srv.stop()


def test_with_an_api_key_the_page_loads_and_asks_for_the_key(browser: Any, tiny_model: Path,
                                                             tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    srv = _start(tiny_model, tmp_path / "stderr.log", env={"PYLLAMA_API_KEY": API_KEY})
    try:
        assert httpx.get(srv.url + "/").status_code == 200
        assert httpx.get(srv.url + "/webui/app.js").status_code == 200
        assert httpx.post(srv.url + "/render", json={"text": "hi"}).status_code == 401
        browser.get(srv.url + "/")
        browser.execute_script("localStorage.clear()")
        browser.refresh()
        wait(browser, lambda d: d.find_element(By.ID, "key-dialog").get_attribute("open") is not None)
        key = browser.find_element(By.ID, "key-input")
        key.send_keys("wrong\n")
        wait(browser, lambda d: texts(d, "#key-error") == ["The server said: invalid API key"])
        key.send_keys(API_KEY + "\n")
        wait(browser, lambda d: d.execute_script("return document.getElementById('model').options.length") == 1)
        send(browser, "hello")
        wait_answered(browser)
        assert STATS.match(texts(browser, ".stats")[0])
    finally:
        srv.stop()


def test_no_webui_leaves_only_the_api(tiny_model: Path, tmp_path: Path) -> None:
    srv = _start(tiny_model, tmp_path / "stderr.log", "--no-webui")
    try:
        page = httpx.get(srv.url + "/", headers={"Accept": "text/html"})
        assert page.status_code == 200 and page.text == "Ollama is running"  # ollama's answer, not the page
        assert httpx.get(srv.url + "/webui/app.js").status_code == 404
        assert httpx.post(srv.url + "/render", json={"text": "hi"}).status_code == 404
        assert httpx.get(srv.url + "/v1/models").json()["data"][0]["id"] == "tiny"
    finally:
        srv.stop()
