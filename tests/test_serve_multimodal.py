"""serve with --mmproj: OpenAI image_url parts give complete --image's text, and hostile media get a 400.

The server runs the fixture projector (tests/fixtures/make_mmproj.py); `complete --chat --image` with
the same question renders the same ChatML prompt, so both answer with the same greedy text.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from tests.fixtures.make_mmproj import image_bytes
from tests.helpers import run_cli
from tests.test_audio import audio_part, clips  # noqa: F401 - a fixture
from tests.test_multimodal import images, mmproj  # noqa: F401 - the fixtures
from tests.test_serve import Server, _start

QUESTION = "What is in the image?"


@pytest.fixture(scope="module")
def vision(tiny_model: Path, mmproj: Path, images: dict[str, Path],  # noqa: F811
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    # 3 MiB of images a request: the large PNG (2.7 MB) fits once, not twice; file: URLs from the images' folder
    srv = _start(tiny_model, tmp_path_factory.mktemp("serve-vision") / "stderr.log", "--mmproj", str(mmproj),
                 "-c", "1024", "--media-max-image-size", "3M", "--media-path", str(images["png"].parent))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def text_only(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = _start(tiny_model, tmp_path_factory.mktemp("serve-text") / "stderr.log", "-c", "512")  # the JPEG (1.7 KiB) fits, the PNG (4.9 KiB) does not
    yield srv
    srv.stop()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def ask(url: str, text: str = QUESTION) -> list[dict]:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": text}]}]


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def expected(tiny_model: Path, mmproj: Path, images: dict[str, Path]) -> dict[str, tuple[str, int]]:  # noqa: F811
    """complete --chat --image's text and prompt tokens for each image."""
    out = {}
    for kind, image in images.items():
        local = run_cli("complete", "-m", str(tiny_model), "--mmproj", str(mmproj), "--image", str(image), "--chat",
                        "-p", QUESTION, "-n", "8", "--temp", "0", "-c", "1024", "--json")
        assert local.exit_code == 0, local.stderr
        out[kind] = local.stdout, int(local.stderr.split('"prompt_tokens": ')[1].split(",")[0])
    assert len({text for text, _ in out.values()}) == 3  # each image makes its own answer
    return out


def mime(kind: str) -> str:
    return "image/jpeg" if kind == "jpeg" else "image/png"


@pytest.mark.parametrize("kind", ["png", "jpeg", "large"])
def test_openai_image_url_gives_complete_images_text(vision: Server, images: dict[str, Path],  # noqa: F811
                                                     expected: dict[str, tuple[str, int]], kind: str) -> None:
    answer = vision.client().chat.completions.create(
        model="any", messages=ask(data_url(images[kind].read_bytes(), mime(kind))), max_tokens=8, temperature=0)
    assert (answer.choices[0].message.content, answer.usage.prompt_tokens) == expected[kind]
    assert answer.usage.prompt_tokens == 41  # 25 tokens of the chat turn's text, 16 of the image


@pytest.mark.parametrize("kind", ["png", "jpeg", "large"])
def test_anthropic_image_block_gives_complete_images_text(vision: Server, images: dict[str, Path],  # noqa: F811
                                                          expected: dict[str, tuple[str, int]], kind: str) -> None:
    client = anthropic.Anthropic(base_url=vision.url, api_key="unused", max_retries=0, timeout=60)
    source = {"type": "base64", "media_type": mime(kind),
              "data": base64.b64encode(images[kind].read_bytes()).decode()}
    message = client.messages.create(model="any", max_tokens=8, extra_body={"temperature": 0}, messages=[
        {"role": "user", "content": [{"type": "image", "source": source}, {"type": "text", "text": QUESTION}]}])
    usage = message.usage  # input_tokens leaves out what the slot's cache held (an earlier test's same prompt)
    n_prompt = usage.input_tokens + (usage.cache_read_input_tokens or 0)
    assert (message.content[0].text, n_prompt) == expected[kind]


@pytest.mark.parametrize("kind", ["png", "jpeg", "large"])
def test_responses_input_image_gives_complete_images_text(vision: Server, images: dict[str, Path],  # noqa: F811
                                                          expected: dict[str, tuple[str, int]], kind: str) -> None:
    url = data_url(images[kind].read_bytes(), mime(kind))
    response = vision.client().responses.create(model="any", max_output_tokens=8, temperature=0, input=[
        {"role": "user", "content": [{"type": "input_image", "image_url": url},
                                     {"type": "input_text", "text": QUESTION}]}])
    assert (response.output_text, response.usage.input_tokens) == expected[kind]


def test_anthropic_hostile_image_is_its_400(vision: Server, images: dict[str, Path]) -> None:  # noqa: F811
    client = anthropic.Anthropic(base_url=vision.url, api_key="unused", max_retries=0, timeout=60)
    source = {"type": "base64", "media_type": "image/png", "data": base64.b64encode(b"not an image").decode()}
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model="any", max_tokens=8, messages=[
            {"role": "user", "content": [{"type": "image", "source": source}, {"type": "text", "text": "hi"}]}])
    assert caught.value.body["type"] == "error"
    assert caught.value.body["error"]["type"] == "invalid_request_error"
    assert caught.value.body["error"]["message"].startswith("messages[0].content[0] is not an image")


def test_the_same_image_twice_reuses_the_cache_and_answers_the_same(vision: Server,
                                                                     images: dict[str, Path]) -> None:  # noqa: F811
    messages = ask(data_url(images["png"].read_bytes()))
    first = vision.client().chat.completions.create(model="any", messages=messages, max_tokens=8, temperature=0)
    again = vision.client().chat.completions.create(model="any", messages=messages, max_tokens=8, temperature=0)
    assert again.choices[0].message.content == first.choices[0].message.content


def hostile_bodies(png: bytes) -> dict[str, tuple[str, str]]:
    """name -> (image URL, the start of the 400's message)."""
    huge = (b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR" + (20000).to_bytes(4, "big") * 2 + b"\x08\x02\0\0\0" + b"\0" * 4)
    tiny = (b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR" + (1).to_bytes(4, "big") * 2 + b"\x08\x02\0\0\0" + b"\0" * 4)
    svg = b'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"/>'
    where = "messages[0].content[0]"
    return {
        "truncated": (data_url(png[:100]), f"{where} could not be decoded as a PNG image"),
        "one pixel header only": (data_url(tiny), f"{where} could not be decoded as a PNG image"),
        "20000x20000 header only": (data_url(huge), f"{where} is a PNG image of 20000x20000 pixels"),
        "text with an image type": (data_url(b"hello, I am not a picture"), f"{where} is not an image"),
        "svg": (data_url(svg, "image/svg+xml"), f"{where} is not an image or audio format that can be read (SVG"),
        "http": ("http://127.0.0.1:9/cat.png", f"{where}.image_url.url: remote media URLs are refused"),
        "file": ("file:///etc/passwd", f"{where}.image_url.url: no such file in --media-path"),
        "ftp": ("ftp://127.0.0.1/cat.png", f"{where}.image_url.url: ftp: URLs are refused"),
        "bad base64": ("data:image/png;base64,@@@", f"{where}.image_url.url is not valid base64"),
    }


def test_hostile_media_get_400_and_the_server_keeps_its_memory(vision: Server,
                                                               images: dict[str, Path]) -> None:  # noqa: F811
    cases = hostile_bodies(images["png"].read_bytes())
    client = vision.client()
    for name, (url, message) in cases.items():
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="any", messages=ask(url), max_tokens=4)
        error = caught.value.body
        assert error["message"].startswith(message), (name, error)
        assert error["type"] == "invalid_request_error"
    before = rss_kib(vision.proc.pid)
    bodies = list(cases.values())
    with httpx.Client(timeout=30) as http:
        for i in range(100):
            url = bodies[i % len(bodies)][0]
            response = http.post(f"{vision.url}/v1/chat/completions", json={"messages": ask(url), "max_tokens": 4})
            assert response.status_code == 400, response.text
    assert rss_kib(vision.proc.pid) <= before * 1.10
    assert vision.proc.poll() is None


def test_image_to_a_model_without_projector(text_only: Server, images: dict[str, Path]) -> None:  # noqa: F811
    with pytest.raises(openai.BadRequestError) as caught:
        text_only.client().chat.completions.create(
            model="any", messages=ask(data_url(images["jpeg"].read_bytes(), "image/jpeg")), max_tokens=4)
    assert caught.value.body["message"] == ("messages[0]: content parts of type 'image_url' are not supported: this "
                                            "model cannot see images or hear audio: the server has no multimodal "
                                            "projector (start it with --mmproj)")


def test_media_domains_flag_is_in_the_help() -> None:
    result = run_cli("serve", "--help")
    assert "--media-domains" in result.stdout and "--mmproj" in result.stdout


def test_completion_multimodal_data_gives_the_raw_prompts_text(vision: Server, tiny_model: Path, mmproj: Path,  # noqa: F811
                                                               images: dict[str, Path]) -> None:  # noqa: F811
    """llama-server's /completion with {"prompt_string", "multimodal_data"}: complete --image without --chat."""
    prompt = "<__media__>The picture shows"
    body = {"prompt": {"prompt_string": prompt, "multimodal_data": [base64.b64encode(images["jpeg"].read_bytes())
                                                                     .decode()]},
            "n_predict": 8, "temperature": 0}
    answer = httpx.post(f"{vision.url}/completion", json=body, timeout=60).json()
    local = run_cli("complete", "-m", str(tiny_model), "--mmproj", str(mmproj), "--image", str(images["jpeg"]),
                    "-p", prompt, "-n", "8", "--temp", "0", "-c", "1024", "--json")
    assert local.exit_code == 0, local.stderr
    assert answer["content"] == local.stdout
    assert f'"prompt_tokens": {answer["tokens_evaluated"]}' in local.stderr


def test_completion_multimodal_data_errors(vision: Server, text_only: Server) -> None:
    bad = {"prompt": {"prompt_string": "x", "multimodal_data": ["bm90IGFuIGltYWdl"]}, "n_predict": 2}
    response = httpx.post(f"{vision.url}/completion", json=bad, timeout=30)
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith("prompt.multimodal_data[0] is not an image")
    png = base64.b64encode(image_bytes(8, 8, "PNG")).decode()
    response = httpx.post(f"{text_only.url}/completion", timeout=30,
                          json={"prompt": {"prompt_string": "x", "multimodal_data": [png]}, "n_predict": 2})
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith("this model cannot see images")


def test_props_and_models_report_the_modalities(vision: Server, text_only: Server) -> None:
    assert httpx.get(f"{vision.url}/props", timeout=30).json()["modalities"] == {"vision": True, "audio": False}
    assert httpx.get(f"{text_only.url}/props", timeout=30).json()["modalities"] == {"vision": False, "audio": False}
    card = httpx.get(f"{vision.url}/v1/models", timeout=30).json()["data"][0]
    assert card["meta"]["modalities"] == {"vision": True, "audio": False}


def test_image_tokens_count_against_the_context(vision: Server, images: dict[str, Path]) -> None:  # noqa: F811
    """70 images of 16 tokens each do not fit a 1024-token context: the usual context error, a 400."""
    part = {"type": "image_url", "image_url": {"url": data_url(images["png"].read_bytes())}}
    messages = [{"role": "user", "content": [part] * 70 + [{"type": "text", "text": QUESTION}]}]
    response = httpx.post(f"{vision.url}/v1/chat/completions", json={"messages": messages, "max_tokens": 4},
                          timeout=60)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["message"].startswith("the request (1145 tokens) exceeds the available context size")


def test_serve_hf_model_brings_its_projector(tiny_model: Path, mmproj: Path,  # noqa: F811
                                             tmp_path_factory: pytest.TempPathFactory) -> None:
    from tests.fixtures.fake_hf import FakeHub
    from tests.test_serve import spawn_serve

    with FakeHub() as hub:
        hub.add_repo("org/vl-GGUF", {"vl-F32.gguf": tiny_model, "mmproj-vl-f16.gguf": mmproj})
        srv = spawn_serve(tmp_path_factory.mktemp("serve-hf-vision") / "stderr.log",
                          ["-hf", "org/vl-GGUF:F32", "-c", "512"], env={"HF_ENDPOINT": hub.url})
        try:
            props = httpx.get(f"{srv.url}/props", timeout=30).json()
            assert props["modalities"] == {"vision": True, "audio": False}
        finally:
            srv.stop()


def test_media_bytes_per_request_are_limited(vision: Server, images: dict[str, Path]) -> None:  # noqa: F811
    large = images["large"].read_bytes()
    part = {"type": "image_url", "image_url": {"url": data_url(large)}}
    messages = [{"role": "user", "content": [part, part, {"type": "text", "text": QUESTION}]}]
    response = httpx.post(f"{vision.url}/v1/chat/completions", timeout=60, json={"messages": messages, "max_tokens": 4})
    assert response.status_code == 400
    assert response.json()["error"]["message"] == (f"the request's image data is {2 * len(large)} bytes, more than "
                                                   "the 3145728 this server takes (--media-max-image-size)")


def test_file_urls_only_inside_media_path(vision: Server, images: dict[str, Path],  # noqa: F811
                                          expected: dict[str, tuple[str, int]]) -> None:
    """--media-path lets file: URLs name files in that folder, and nothing outside it (.. and all)."""
    answer = vision.client().chat.completions.create(model="any", messages=ask(f"file://{images['png']}"),
                                                     max_tokens=8, temperature=0)
    assert (answer.choices[0].message.content, answer.usage.prompt_tokens) == expected["png"]
    where = "messages[0].content[0].image_url.url"
    for url in (f"file://{images['png'].parent}/../../../etc/passwd", "file:///etc/passwd"):
        response = httpx.post(f"{vision.url}/v1/chat/completions", timeout=30,
                              json={"messages": ask(url), "max_tokens": 4})
        assert response.status_code == 400
        assert response.json()["error"]["message"] == f"{where}: no such file in --media-path"


def test_router_preset_gives_a_model_its_projector(tiny_model: Path, mmproj: Path, images: dict[str, Path],  # noqa: F811
                                                   expected: dict[str, tuple[str, int]],
                                                   tmp_path_factory: pytest.TempPathFactory) -> None:
    import shutil

    from tests.test_serve import spawn_serve

    folder = tmp_path_factory.mktemp("router-vision")
    for name in ("vis.gguf", "txt.gguf"):
        shutil.copy(tiny_model, folder / name)
    presets = folder.parent / "presets.ini"
    presets.write_text(f"[vis]\nmmproj = {mmproj}\nc = 1024\n")
    srv = spawn_serve(folder.parent / "router.log", ["--models-dir", str(folder), "--models-preset", str(presets)])
    try:
        url = data_url(images["png"].read_bytes())
        seen = srv.client().chat.completions.create(model="vis", messages=ask(url), max_tokens=8, temperature=0)
        assert (seen.choices[0].message.content, seen.usage.prompt_tokens) == expected["png"]
        with pytest.raises(openai.BadRequestError) as caught:
            srv.client().chat.completions.create(model="txt", messages=ask(url), max_tokens=8)
        assert "this model cannot see images" in caught.value.body["message"]
    finally:
        srv.stop()


def test_token_counts_and_apply_template_take_images(vision: Server, text_only: Server,
                                                     images: dict[str, Path],  # noqa: F811
                                                     expected: dict[str, tuple[str, int]]) -> None:
    """count_tokens, /v1/chat/completions/input_tokens and /apply-template read image parts as the
    generating routes do: the image's 16 tokens counted, its marker in the rendered prompt."""
    data = images["jpeg"].read_bytes()
    source = {"type": "base64", "media_type": "image/jpeg", "data": base64.b64encode(data).decode()}
    client = anthropic.Anthropic(base_url=vision.url, api_key="unused", max_retries=0, timeout=60)
    counted = client.messages.count_tokens(model="any", messages=[
        {"role": "user", "content": [{"type": "image", "source": source}, {"type": "text", "text": QUESTION}]}])
    assert counted.input_tokens == expected["jpeg"][1] == 41
    messages = ask(data_url(data, "image/jpeg"))
    counted = httpx.post(f"{vision.url}/v1/chat/completions/input_tokens", json={"messages": messages}, timeout=30)
    assert counted.json() == {"input_tokens": 41, "object": "response.input_tokens"}
    rendered = httpx.post(f"{vision.url}/apply-template", json={"messages": messages}, timeout=30).json()
    assert rendered == {"prompt": f"<|im_start|>user\n<__media__>{QUESTION}<|im_end|>\n<|im_start|>assistant\n"}

    hostile = httpx.post(f"{vision.url}/apply-template", json={"messages": ask(data_url(b"not an image"))})
    assert hostile.status_code == 400
    assert hostile.json()["error"]["message"].startswith("messages[0].content[0] is not an image")
    refused = httpx.post(f"{text_only.url}/v1/messages/count_tokens", timeout=30, json={"model": "any", "messages": [
        {"role": "user", "content": [{"type": "image", "source": source}, {"type": "text", "text": QUESTION}]}]})
    assert refused.status_code == 400 and "cannot see images" in refused.json()["error"]["message"]


def test_audio_to_an_image_projector_is_a_400(vision: Server, clips: dict[str, Path]) -> None:  # noqa: F811
    """An input_audio part (tests/test_audio.py's clip) to this vision-only projector."""
    messages = [{"role": "user", "content": [audio_part(clips["short"]), {"type": "text", "text": QUESTION}]}]
    with pytest.raises(openai.BadRequestError) as caught:
        vision.client().chat.completions.create(model="any", messages=messages, max_tokens=4)
    error = caught.value.body
    assert (error["message"], error["type"]) == ("the projector mmproj-tiny.gguf does not take audio",
                                                 "invalid_request_error")


def test_an_image_in_a_tool_result_reaches_the_model(vision: Server, images: dict[str, Path]) -> None:  # noqa: F811
    """An Anthropic tool_result holding an image is a tool message with an image part, as llama-server
    converts it: the rendered prompt carries the marker, the count has its 16 tokens, and the greedy answer
    is /completion's for that prompt and image."""
    data = base64.b64encode(images["jpeg"].read_bytes()).decode()
    result = [{"type": "text", "text": "File: shot.jpeg"},
              {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": data}}]
    messages = [{"role": "user", "content": QUESTION},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "read", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": result}]}]
    body = {"model": "any", "max_tokens": 8, "temperature": 0, "messages": messages}
    answer = httpx.post(f"{vision.url}/v1/messages", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    counted = httpx.post(f"{vision.url}/v1/messages/count_tokens", json={"model": "any", "messages": messages},
                         timeout=30).json()["input_tokens"]
    without = [*messages[:2], {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                                            "content": result[:1]}]}]
    assert counted - httpx.post(f"{vision.url}/v1/messages/count_tokens", json={"model": "any", "messages": without},
                                timeout=30).json()["input_tokens"] == 16  # the image's tokens
    openai_form = [{"role": "user", "content": QUESTION},
                   {"role": "assistant", "content": "", "tool_calls": [
                       {"id": "t1", "type": "function", "function": {"name": "read", "arguments": "{}"}}]},
                   {"role": "tool", "tool_call_id": "t1", "content": [
                       {"type": "text", "text": "File: shot.jpeg"},
                       {"type": "image_url", "image_url": {"url": f"data:image/jpeg;base64,{data}"}}]}]
    prompt = httpx.post(f"{vision.url}/apply-template", json={"messages": openai_form}, timeout=30).json()["prompt"]
    assert "File: shot.jpeg<__media__>" in prompt
    raw = httpx.post(f"{vision.url}/completion", timeout=60, json={
        "prompt": {"prompt_string": prompt, "multimodal_data": [data]}, "n_predict": 8, "temperature": 0}).json()
    assert answer.json()["content"][0]["text"] == raw["content"]
    assert counted == raw["tokens_evaluated"]
