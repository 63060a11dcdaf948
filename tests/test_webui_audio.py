"""The chat page with audio: on a server whose projector hears (the Ultravox fixture of test_audio.py)
it attaches a clip, shows it as a chip, sends it as an OpenAI input_audio part, keeps it across a
reload and sends it again on later turns; a file the model cannot take is refused on the page.

Headless Chromium as in tests/test_webui.py (skipped where selenium, chromium or chromedriver is missing).
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.make_audio_proj import flac_bytes, wav_bytes
from tests.test_audio import audio_proj, clips  # noqa: F401 - the fixtures
from tests.test_multimodal import images  # noqa: F401 - the fixture
from tests.test_serve import Server, _start
from tests.test_webui import api_answer, open_page, send, stored_chats, texts, wait, wait_answered

QUESTION = "What do you hear?"
ATTACHED = "#attachments .clip"


@pytest.fixture(scope="module")
def hearing(tiny_model: Path, audio_proj: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:  # noqa: F811
    srv = _start(tiny_model, tmp_path_factory.mktemp("webui-audio") / "stderr.log", "--mmproj", str(audio_proj),
                 "-c", "1024")
    yield srv
    srv.stop()


def audio_part(data: bytes, fmt: str) -> dict:
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": fmt}}


def chips(driver: Any, selector: str) -> list[tuple[str, str]]:
    """Each chip's name and the length its player read (empty until the player has read it)."""
    found = driver.execute_script("return [...document.querySelectorAll(arguments[0])].map(c => "
                                  "[c.querySelector('.name').textContent, c.querySelector('.duration')?.textContent ?? null])",
                                  selector)
    return [tuple(chip) for chip in found]


def open_hearing_page(driver: Any, server: Server) -> None:
    open_page(driver, server.url)
    wait(driver, lambda d: d.execute_script("return !document.getElementById('attach').hidden"))


def chat_requests(driver: Any) -> list[str]:
    return driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)"
                                 ".filter(n => n.includes('chat/completions'))")


def test_an_attached_clip_is_answered_as_the_api_answers_survives_a_reload_and_goes_again(
        browser: Any, hearing: Server, clips: dict[str, Path]) -> None:  # noqa: F811
    from selenium.webdriver.common.by import By

    open_hearing_page(browser, hearing)
    assert browser.find_element(By.ID, "attach").text == "Audio"
    assert browser.find_element(By.ID, "attach-file").get_attribute("accept").endswith(".wav,.mp3,.flac")
    wav = clips["short"].read_bytes()
    browser.find_element(By.ID, "attach-file").send_keys(str(clips["short"]))
    wait(browser, lambda d: chips(d, ATTACHED) == [("a.wav", "0:01")])  # shown while the message is written
    send(browser, QUESTION)
    wait_answered(browser)
    assert chips(browser, ATTACHED) == []  # it went with the message
    wait(browser, lambda d: chips(d, ".message.user .clip") == [("a.wav", "0:01")])  # its player reads the length

    part = audio_part(wav, "wav")
    text = api_answer(hearing, [{"role": "user", "content": [part, {"type": "text", "text": QUESTION}]}])[
        "choices"][0]["message"]["content"]
    without_clip = api_answer(hearing, [{"role": "user", "content": QUESTION}])["choices"][0]["message"]["content"]
    assert text and text != without_clip  # the clip made the answer
    [chat] = stored_chats(browser)
    clip = {"name": "a.wav", "format": "wav", "data": part["input_audio"]["data"]}
    assert chat["messages"] == [{"role": "user", "content": QUESTION, "audio": [clip]},
                                {"role": "assistant", "content": text, "stats": chat["messages"][1]["stats"]}]

    browser.refresh()
    wait(browser, lambda d: chips(d, ".message.user .clip") == [("a.wav", "0:01")])
    assert browser.execute_script("return document.querySelector('.message.user audio').src") == (
        "data:audio/wav;base64," + clip["data"])
    send(browser, "And then?")
    wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".message.assistant")) == 2)
    wait_answered(browser)
    again = api_answer(hearing, [{"role": "user", "content": [part, {"type": "text", "text": QUESTION}]},
                                 {"role": "assistant", "content": text}, {"role": "user", "content": "And then?"}])
    assert stored_chats(browser)[0]["messages"][3]["content"] == again["choices"][0]["message"]["content"]
    assert browser.get_log("browser") == []


PASTE_AND_DROP = """
const [wav, flac] = [...arguments].map((b64) => Uint8Array.from(atob(b64), (c) => c.charCodeAt(0)));
const holding = (file) => { const t = new DataTransfer(); t.items.add(file); return t; };
// A WAV with no MIME type (its name says what it is), pasted; a FLAC dropped on the page.
document.getElementById("input").dispatchEvent(new ClipboardEvent("paste",
  {clipboardData: holding(new File([wav], "pasted.wav", {type: ""})), bubbles: true, cancelable: true}));
const main = document.querySelector("main");
const drop = holding(new File([flac], "dropped.flac", {type: "audio/flac"}));
main.dispatchEvent(new DragEvent("dragover", {dataTransfer: drop, bubbles: true, cancelable: true}));
main.dispatchEvent(new DragEvent("drop", {dataTransfer: drop, bubbles: true, cancelable: true}));
"""

# The bodies the page posts to /v1/chat/completions, as the server gets them.
RECORD_REQUESTS = """
window.__sent = [];
const send = window.fetch;
window.fetch = (path, options) => {
  if (String(path).includes("chat/completions")) window.__sent.push(JSON.parse(options.body));
  return send(path, options);
};
"""


def test_paste_and_drop_attach_clips_the_cross_removes_one_and_flac_goes_as_flac(
        browser: Any, hearing: Server) -> None:
    from selenium.webdriver.common.by import By

    open_hearing_page(browser, hearing)
    flac = flac_bytes(2.0, 660.0, 16000, 3)
    browser.execute_script(PASTE_AND_DROP, base64.b64encode(wav_bytes(1.0, 330.0)).decode(),
                           base64.b64encode(flac).decode())
    wait(browser, lambda d: sorted(chips(d, ATTACHED)) == [("dropped.flac", "0:02"), ("pasted.wav", "0:01")])
    names = [name for name, _ in chips(browser, ATTACHED)]
    browser.find_elements(By.CSS_SELECTOR, f"{ATTACHED} .remove")[names.index("pasted.wav")].click()
    # the chips are drawn again: the new player reads the clip's length a moment later
    wait(browser, lambda d: chips(d, ATTACHED) == [("dropped.flac", "0:02")])
    browser.execute_script(RECORD_REQUESTS)
    send(browser, QUESTION)
    wait_answered(browser)
    part = audio_part(flac, "flac")
    [sent] = browser.execute_script("return window.__sent")
    assert sent["messages"] == [{"role": "user", "content": [part, {"type": "text", "text": QUESTION}]}]
    expected = api_answer(hearing, [{"role": "user", "content": [part, {"type": "text", "text": QUESTION}]}])
    [user, answer] = stored_chats(browser)[0]["messages"]
    assert user["audio"] == [{"name": "dropped.flac", "format": "flac", "data": part["input_audio"]["data"]}]
    assert answer["content"] == expected["choices"][0]["message"]["content"]
    assert browser.get_log("browser") == []


def test_an_image_offered_to_a_model_that_only_hears_is_refused_on_the_page(
        browser: Any, hearing: Server, images: dict[str, Path]) -> None:  # noqa: F811
    from selenium.webdriver.common.by import By

    open_hearing_page(browser, hearing)
    browser.find_element(By.ID, "attach-file").send_keys(str(images["png"]))
    wait(browser, lambda d: texts(d, "#status") == [
        f"Cannot attach {images['png'].name}: this model cannot see images; it takes WAV, MP3 or FLAC clips."])
    browser.find_element(By.ID, "send").click()
    assert browser.execute_script("return document.getElementById('attachments').children.length") == 0
    assert texts(browser, ".message") == [] and chat_requests(browser) == []
    assert browser.get_log("browser") == []


DROP_CLIP = """
const t = new DataTransfer();
t.items.add(new File([new Uint8Array(64)], "clip.wav", {type: "audio/wav"}));
const main = document.querySelector("main");
main.dispatchEvent(new DragEvent("dragover", {dataTransfer: t, bubbles: true, cancelable: true}));
main.dispatchEvent(new DragEvent("drop", {dataTransfer: t, bubbles: true, cancelable: true}));
"""


def test_a_clip_dropped_on_a_model_without_a_projector_is_refused_on_the_page(
        browser: Any, server: Server) -> None:
    open_page(browser, server.url)
    wait(browser, lambda d: d.execute_script("return document.getElementById('model').value") != "")
    assert browser.execute_script("return document.getElementById('attach').hidden") is True
    browser.execute_script(DROP_CLIP)
    assert texts(browser, "#status") == ["This model takes no images or audio (it has no projector, --mmproj)."]
    assert browser.execute_script("return document.getElementById('attachments').hidden") is True
    assert chat_requests(browser) == []
    assert browser.get_log("browser") == []


def test_a_clip_too_big_to_keep_is_answered_then_named_but_not_kept_after_a_reload(
        browser: Any, hearing: Server, tmp_path: Path) -> None:
    """Past MAX_KEPT_CLIP (2 MiB of base64, media.js) the clip is sent, but the stored conversation keeps
    only its name: after a reload the chip says so and the next turn goes without it."""
    from selenium.webdriver.common.by import By

    big = tmp_path / "long.wav"
    big.write_bytes(wav_bytes(70.0, 220.0))  # 2.24 MB, 2.99 MB as base64
    open_hearing_page(browser, hearing)
    browser.find_element(By.ID, "attach-file").send_keys(str(big))
    wait(browser, lambda d: chips(d, ATTACHED) == [("long.wav", "1:10")])
    assert texts(browser, f"{ATTACHED} .hint") == ["too big to keep: gone after a reload"]
    send(browser, QUESTION)
    wait_answered(browser)
    part = audio_part(big.read_bytes(), "wav")
    text = api_answer(hearing, [{"role": "user", "content": [part, {"type": "text", "text": QUESTION}]}])[
        "choices"][0]["message"]["content"]
    [user, answer] = stored_chats(browser)[0]["messages"]
    assert (user["audio"], answer["content"]) == ([{"name": "long.wav", "format": "wav"}], text)

    browser.refresh()
    wait(browser, lambda d: chips(d, ".message.user .clip") == [("long.wav", None)])
    assert texts(browser, ".message.user .clip .hint") == ["not kept (too big for this browser's storage)"]
    send(browser, "And then?")
    wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".message.assistant")) == 2)
    wait_answered(browser)
    again = api_answer(hearing, [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": text},
                                 {"role": "user", "content": "And then?"}])
    assert stored_chats(browser)[0]["messages"][3]["content"] == again["choices"][0]["message"]["content"]
    assert browser.get_log("browser") == []



def test_a_routers_page_offers_clips_for_the_chosen_model_once_it_is_loaded(
        browser: Any, tiny_model: Path, audio_proj: Path, clips: dict[str, Path],  # noqa: F811
        tmp_path: Path) -> None:
    """--models-dir with a preset giving `ear` the audio projector: the button follows the picked model's
    modalities, known once that model has loaded (its first answer)."""
    import shutil

    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.select import Select

    from tests.test_serve import spawn_serve

    folder = tmp_path / "models"
    folder.mkdir()
    for name in ("ear.gguf", "txt.gguf"):
        shutil.copy(tiny_model, folder / name)
    presets = tmp_path / "presets.ini"
    presets.write_text(f"[ear]\nmmproj = {audio_proj}\nc = 1024\n")
    srv = spawn_serve(tmp_path / "router.log", ["--models-dir", str(folder), "--models-preset", str(presets)])
    try:
        open_page(browser, srv.url)
        picker = Select(browser.find_element(By.ID, "model"))
        picker.select_by_visible_text("ear")
        assert browser.find_element(By.ID, "attach").is_displayed() is False  # not loaded: not known yet
        browser.execute_script(DROP_CLIP)
        assert texts(browser, "#status") == ["This model is not loaded yet, so what it takes is not known: "
                                             "send it a message first."]
        send(browser, "hello")
        wait_answered(browser)
        wait(browser, lambda d: d.find_element(By.ID, "attach").text == "Audio")
        browser.find_element(By.ID, "attach-file").send_keys(str(clips["short"]))
        wait(browser, lambda d: chips(d, ATTACHED) == [("a.wav", "0:01")])
        send(browser, QUESTION)
        wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".message.assistant")) == 2)
        wait_answered(browser)
        first = stored_chats(browser)[0]["messages"][1]["content"]
        expected = api_answer(srv, [{"role": "user", "content": "hello"}, {"role": "assistant", "content": first},
                                    {"role": "user", "content": [audio_part(clips["short"].read_bytes(), "wav"),
                                                                 {"type": "text", "text": QUESTION}]}], model="ear")
        assert stored_chats(browser)[0]["messages"][3]["content"] == expected["choices"][0]["message"]["content"]
        picker.select_by_visible_text("txt")
        assert browser.find_element(By.ID, "attach").is_displayed() is False
        assert browser.get_log("browser") == []
    finally:
        srv.stop()
