"""The chat page with images: on a server started with --mmproj it attaches an image, sends it as an
OpenAI image_url part, and keeps its thumbnail across a reload; without a projector it offers no button.

Headless Chromium as in tests/test_webui.py (skipped where selenium, chromium or chromedriver is missing).
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.test_multimodal import images, mmproj  # noqa: F401 - the fixtures
from tests.test_serve import Server, _start
from tests.test_webui import api_answer, open_page, send, stored_chats, texts, wait, wait_answered

QUESTION = "What is in the image?"


@pytest.fixture(scope="module")
def vision(tiny_model: Path, mmproj: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:  # noqa: F811
    srv = _start(tiny_model, tmp_path_factory.mktemp("webui-vision") / "stderr.log", "--mmproj", str(mmproj))
    yield srv
    srv.stop()


def thumbnails(driver: Any, selector: str) -> list[str]:
    return driver.execute_script("return [...document.querySelectorAll(arguments[0])].map(i => i.src)", selector)


def test_an_attached_image_is_answered_as_the_api_answers_and_its_thumbnail_survives_a_reload(
        browser: Any, vision: Server, images: dict[str, Path]) -> None:  # noqa: F811
    from selenium.webdriver.common.by import By

    open_page(browser, vision.url)
    wait(browser, lambda d: d.execute_script("return !document.getElementById('attach').hidden"))
    url = "data:image/png;base64," + base64.b64encode(images["png"].read_bytes()).decode()
    browser.find_element(By.ID, "attach-file").send_keys(str(images["png"]))
    wait(browser, lambda d: thumbnails(d, "#attachments img.thumb") == [url])  # shown while the message is written
    send(browser, QUESTION)
    wait_answered(browser)
    assert thumbnails(browser, "#attachments img.thumb") == []  # it went with the message
    assert thumbnails(browser, ".message.user img.thumb") == [url]

    expected = api_answer(vision, [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": QUESTION}]}])
    text = expected["choices"][0]["message"]["content"]
    without_image = api_answer(vision, [{"role": "user", "content": QUESTION}])
    assert text and text != without_image["choices"][0]["message"]["content"]  # the image made the answer
    [chat] = stored_chats(browser)
    assert chat["messages"] == [{"role": "user", "content": QUESTION, "images": [url]},
                                {"role": "assistant", "content": text, "stats": chat["messages"][1]["stats"]}]

    browser.refresh()
    wait(browser, lambda d: thumbnails(d, ".message.user img.thumb") == [url])
    assert texts(browser, ".message.user .body") == [QUESTION]
    assert browser.get_log("browser") == []


def test_a_second_turn_sends_the_first_image_again(browser: Any, vision: Server, images: dict[str, Path]) -> None:  # noqa: F811
    from selenium.webdriver.common.by import By

    open_page(browser, vision.url)
    wait(browser, lambda d: d.execute_script("return !document.getElementById('attach').hidden"))
    url = "data:image/jpeg;base64," + base64.b64encode(images["jpeg"].read_bytes()).decode()
    browser.find_element(By.ID, "attach-file").send_keys(str(images["jpeg"]))
    wait(browser, lambda d: len(thumbnails(d, "#attachments img.thumb")) == 1)
    send(browser, QUESTION)
    wait_answered(browser)
    send(browser, "And then?")
    wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".message.assistant")) == 2)
    wait_answered(browser)
    first = stored_chats(browser)[0]["messages"][1]["content"]
    expected = api_answer(vision, [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": QUESTION}]},
        {"role": "assistant", "content": first}, {"role": "user", "content": "And then?"}])
    assert stored_chats(browser)[0]["messages"][3]["content"] == expected["choices"][0]["message"]["content"]


def test_a_model_without_a_projector_offers_no_image_button(browser: Any, server: Server) -> None:  # noqa: F811
    open_page(browser, server.url)
    wait(browser, lambda d: d.execute_script("return document.getElementById('model').value") != "")
    assert browser.execute_script("return document.getElementById('attach').hidden") is True
    assert browser.get_log("browser") == []


PASTE_AND_DROP = """
const [b64, kind] = arguments;
const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
const files = () => { const t = new DataTransfer(); t.items.add(new File([bytes], "x.png", {type: "image/png"})); return t; };
document.getElementById("input").dispatchEvent(new ClipboardEvent("paste", {clipboardData: files(), bubbles: true, cancelable: true}));
const main = document.querySelector("main");
const drop = files();
main.dispatchEvent(new DragEvent("dragover", {dataTransfer: drop, bubbles: true, cancelable: true}));
main.dispatchEvent(new DragEvent("drop", {dataTransfer: drop, bubbles: true, cancelable: true}));
"""


def test_paste_and_drop_attach_images_and_the_cross_removes_one(
        browser: Any, vision: Server, images: dict[str, Path]) -> None:  # noqa: F811
    from selenium.webdriver.common.by import By

    open_page(browser, vision.url)
    wait(browser, lambda d: d.execute_script("return !document.getElementById('attach').hidden"))
    b64 = base64.b64encode(images["png"].read_bytes()).decode()
    browser.execute_script(PASTE_AND_DROP, b64)
    wait(browser, lambda d: thumbnails(d, "#attachments img.thumb") == ["data:image/png;base64," + b64] * 2)
    browser.find_element(By.CSS_SELECTOR, "#attachments .remove").click()
    assert len(thumbnails(browser, "#attachments img.thumb")) == 1
    assert browser.get_log("browser") == []
