"""ollama's `images` (base64) on /api/chat messages and /api/generate, through the official `ollama`
client, on a server with the fixture projector: the same text as the OpenAI route for the same image.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import httpx
import ollama
import pytest

from tests.test_multimodal import images, mmproj  # noqa: F401 - the fixtures
from tests.test_serve import Server, _start

QUESTION = "What is in the image?"
GREEDY = {"temperature": 0, "num_predict": 8}


@pytest.fixture(scope="module")
def vision(tiny_model: Path, mmproj: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:  # noqa: F811
    srv = _start(tiny_model, tmp_path_factory.mktemp("ollama-vision") / "stderr.log", "--mmproj", str(mmproj),
                 "-c", "1024")
    yield srv
    srv.stop()


def client(server: Server) -> ollama.Client:
    return ollama.Client(host=server.url, timeout=60)


def openai_answer(server: Server, image: Path, question: str = QUESTION) -> tuple[str, int]:
    url = "data:image/png;base64," + base64.b64encode(image.read_bytes()).decode()
    answer = server.client().chat.completions.create(model="any", max_tokens=8, temperature=0, messages=[
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                     {"type": "text", "text": question}]}])
    return answer.choices[0].message.content, answer.usage.prompt_tokens


@pytest.mark.parametrize("kind", ["png", "jpeg"])
def test_chat_images_give_the_openai_routes_text(vision: Server, images: dict[str, Path], kind: str) -> None:  # noqa: F811
    # the client reads a path (or bytes) and sends it as base64, as ollama's API takes it
    answer = client(vision).chat(model="any", options=GREEDY, messages=[
        {"role": "user", "content": QUESTION, "images": [images[kind]]}])
    assert (answer.message.content, answer.prompt_eval_count) == openai_answer(vision, images[kind])
    assert answer.prompt_eval_count == 41  # 25 tokens of text, 16 of the image


def test_generate_images_give_the_openai_routes_text(vision: Server, images: dict[str, Path]) -> None:  # noqa: F811
    answer = client(vision).generate(model="any", prompt=QUESTION, images=[images["large"].read_bytes()],
                                     options=GREEDY)
    assert (answer.response, answer.prompt_eval_count) == openai_answer(vision, images["large"])
    streamed = "".join(part.response for part in client(vision).generate(
        model="any", prompt=QUESTION, images=[images["large"]], options=GREEDY, stream=True))
    assert streamed == answer.response


def test_raw_generate_images_give_completions_multimodal_text(vision: Server, images: dict[str, Path]) -> None:  # noqa: F811
    data = base64.b64encode(images["jpeg"].read_bytes()).decode()
    answer = client(vision).generate(model="any", prompt="A picture of", images=[data], raw=True, options=GREEDY)
    native = httpx.post(f"{vision.url}/completion", timeout=60, json={
        "prompt": {"prompt_string": "A picture of", "multimodal_data": [data]}, "n_predict": 8, "temperature": 0}).json()
    assert (answer.response, answer.prompt_eval_count) == (native["content"], native["tokens_evaluated"])


def test_image_errors_are_400s_in_ollamas_shape(vision: Server, tiny_model: Path, tmp_path: Path) -> None:
    not_image = base64.b64encode(b"not an image").decode()
    for path, body, message in [
        ("/api/chat", {"messages": [{"role": "user", "content": "hi", "images": ["AA", not_image]}]},
         "messages[0].images[0] is not valid base64"),
        ("/api/chat", {"messages": [{"role": "user", "content": "hi", "images": [not_image]}]},
         "messages[0].images[0] is not an image"),
        ("/api/generate", {"prompt": "hi", "images": [not_image]}, "images[0] is not an image"),
        ("/api/generate", {"prompt": "hi", "images": [not_image], "suffix": "x"}, "images: not with suffix"),
    ]:
        response = httpx.post(vision.url + path, json={"model": "any", "stream": False, **body}, timeout=30)
        assert response.status_code == 400 and list(response.json()) == ["error"], (path, response.text)
        assert response.json()["error"].startswith(message), response.json()
    text_only = _start(tiny_model, tmp_path / "stderr.log")
    try:
        with pytest.raises(ollama.ResponseError) as caught:
            client(text_only).generate(model="any", prompt="hi", images=[not_image])
        assert caught.value.status_code == 400
        assert caught.value.error.startswith("images: this model cannot see images")
    finally:
        text_only.stop()
