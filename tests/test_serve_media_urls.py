"""Remote media URLs: a host --media-domains lists is fetched; everything else is a 400 in the API's shape.

One vision server (the fixture projector) lists two 127.0.0.1 ports: the tiny HTTP server below, and a
port where nothing listens. A URL's answer must be the same as the same bytes' as a data: URL.
"""

from __future__ import annotations

import asyncio
import base64
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import anthropic
import httpx
import pytest

from pyllama_cli.server.openai import media_fetch
from pyllama_cli.server.openai.media_fetch import fetch_media, host_rule
from tests.helpers import free_port, run_cli
from tests.test_multimodal import images, mmproj  # noqa: F401 - the fixtures
from tests.test_serve import Server, _start

QUESTION = "What is in the image?"
LIMIT = 65536  # the server's --media-max-image-size
HALF = 40000  # /half.png's size: one fits in LIMIT, two do not
STREAMED = 64 * 2**20  # what /stream.png would send without Content-Length if nobody stopped it
WAV = (b"RIFF" + (36).to_bytes(4, "little") + b"WAVEfmt " + (16).to_bytes(4, "little") + (1).to_bytes(2, "little")
       + (1).to_bytes(2, "little") + (16000).to_bytes(4, "little") + (32000).to_bytes(4, "little")
       + (2).to_bytes(2, "little") + (16).to_bytes(2, "little") + b"data" + (0).to_bytes(4, "little"))


class MediaHost(ThreadingHTTPServer):
    """127.0.0.1:PORT serving /a.png, /clip.wav, /big.png (Content-Length past LIMIT), /stream.png (no
    length, STREAMED bytes), /half.png (HALF bytes), /text.png (not an image), /missing.png (404), /slow.png, /gzip.png,
    /here (a redirect to /a.png) and /away (a redirect to another port)."""

    daemon_threads = True

    def __init__(self, png: bytes, other_port: int):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.png, self.other_port, self.streamed = png, other_port, -1

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: MediaHost

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        files = {"/a.png": self.server.png, "/clip.wav": WAV, "/text.png": b"hello, I am not a picture",
                 "/big.png": self.server.png + b"\0" * (2 * LIMIT), "/half.png": self.server.png.ljust(HALF, b"\0")}
        if self.path in files:
            self._send(200, files[self.path], {"Content-Length": str(len(files[self.path]))})
        elif self.path == "/stream.png":
            self._stream()
        elif self.path in ("/here", "/away"):
            where = "/a.png" if self.path == "/here" else f"http://127.0.0.1:{self.server.other_port}/a.png"
            self._send(302, b"", {"Location": where, "Content-Length": "0"})
        elif self.path == "/slow.png":
            time.sleep(3)
            self._send(200, self.server.png, {})
        elif self.path == "/gzip.png":
            self._send(200, self.server.png, {"Content-Encoding": "gzip"})
        else:
            self._send(404, b"not here", {"Content-Length": "8"})

    def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        try:
            self.wfile.write(body)
        except OSError:  # the client gave up first (the slow host's test)
            pass

    def _stream(self) -> None:
        """A body that ends when the connection does (HTTP/1.0, no length); counts what got out."""
        self.send_response(200)
        self.end_headers()
        sent = 0
        try:
            self.wfile.write(self.server.png)
            while sent < STREAMED:
                self.wfile.write(b"\0" * 65536)
                sent += 65536
        except OSError:
            pass
        self.server.streamed = sent

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def host(images: dict[str, Path]) -> Iterator[MediaHost]:  # noqa: F811
    server = MediaHost(images["png"].read_bytes(), free_port())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def dead_port() -> int:
    return free_port()  # listed in --media-domains, nothing listens there


@pytest.fixture(scope="module")
def fetcher(tiny_model: Path, mmproj: Path, host: MediaHost, dead_port: int,  # noqa: F811
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    port = host.server_address[1]
    srv = _start(tiny_model, tmp_path_factory.mktemp("serve-media-urls") / "stderr.log", "--mmproj", str(mmproj),
                 "-c", "1024", "--media-max-image-size", str(LIMIT),
                 "--media-domains", f"127.0.0.1:{port},127.0.0.1:{dead_port}")
    yield srv
    srv.stop()


def data_url(data: bytes) -> str:
    return f"data:image/png;base64,{base64.b64encode(data).decode()}"


def ask(url: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": QUESTION}]}]


def chat(server: Server, url: str) -> tuple[str, int]:
    answer = server.client().chat.completions.create(model="any", messages=ask(url), max_tokens=8, temperature=0)
    return answer.choices[0].message.content, answer.usage.prompt_tokens


def test_a_listed_hosts_url_answers_as_its_bytes_do(fetcher: Server, host: MediaHost) -> None:
    inline = chat(fetcher, data_url(host.png))
    assert inline[1] == 41  # 25 tokens of text, 16 of the image
    assert chat(fetcher, f"{host.url}/a.png") == inline
    assert chat(fetcher, f"{host.url}/here") == inline  # a redirect on the same listed host is followed


def test_responses_and_anthropic_urls_answer_as_their_bytes_do(fetcher: Server, host: MediaHost) -> None:
    def respond(url: str) -> tuple[str, int]:
        response = fetcher.client().responses.create(model="any", max_output_tokens=8, temperature=0, input=[
            {"role": "user", "content": [{"type": "input_image", "image_url": url},
                                         {"type": "input_text", "text": QUESTION}]}])
        return response.output_text, response.usage.input_tokens

    def message(source: dict) -> tuple[str, int]:
        client = anthropic.Anthropic(base_url=fetcher.url, api_key="unused", max_retries=0, timeout=60)
        content = [{"type": "image", "source": source}, {"type": "text", "text": QUESTION}]
        answer = client.messages.create(model="any", max_tokens=8, extra_body={"temperature": 0},
                                        messages=[{"role": "user", "content": content}])
        return answer.content[0].text, answer.usage.input_tokens + (answer.usage.cache_read_input_tokens or 0)

    assert respond(f"{host.url}/a.png") == respond(data_url(host.png))
    b64 = {"type": "base64", "media_type": "image/png", "data": base64.b64encode(host.png).decode()}
    assert message({"type": "url", "url": f"{host.url}/a.png"}) == message(b64)


def test_token_counts_and_templates_fetch_urls_too(fetcher: Server, host: MediaHost) -> None:
    url = f"{host.url}/a.png"
    counted = httpx.post(f"{fetcher.url}/v1/messages/count_tokens", timeout=30, json={"model": "any", "messages": [
        {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": url}},
                                     {"type": "text", "text": QUESTION}]}]})
    assert counted.json() == {"input_tokens": 41}
    counted = httpx.post(f"{fetcher.url}/v1/chat/completions/input_tokens", json={"messages": ask(url)}, timeout=30)
    assert counted.json() == {"input_tokens": 41, "object": "response.input_tokens"}
    rendered = httpx.post(f"{fetcher.url}/apply-template", json={"messages": ask(url)}, timeout=30)
    assert rendered.json() == {"prompt": f"<|im_start|>user\n<__media__>{QUESTION}<|im_end|>\n<|im_start|>assistant\n"}


def failures(host: MediaHost, dead_port: int) -> dict[str, tuple[str, str]]:
    """name -> (URL, the 400's message after "messages[0].content[0].image_url.url: ")."""
    inline = "send the bytes inline as a data: URL"
    return {
        "off the list": (f"http://127.0.0.1:{host.other_port}/a.png",
                         f"remote media URLs are refused (127.0.0.1:{host.other_port} is not in --media-domains); "
                         f"list 127.0.0.1:{host.other_port} in --media-domains, or {inline}"),
        "default port of a listed address": ("http://127.0.0.1/a.png", "remote media URLs are refused (127.0.0.1:80 "
                                             f"is not in --media-domains); list 127.0.0.1:80 in --media-domains, or {inline}"),
        "unreachable": (f"http://127.0.0.1:{dead_port}/a.png", f"cannot reach 127.0.0.1:{dead_port} (Connection "
                        f"refused); check that the host is up, or {inline}"),
        "404": (f"{host.url}/missing.png", f"{host.url}/missing.png answered 404 Not Found; check the URL, or {inline}"),
        "too big": (f"{host.url}/big.png", f"{host.url}/big.png is larger than the {LIMIT} bytes this request may "
                    "still take (--media-max-image-size); send a smaller file, or raise the flag"),
        "redirect off the list": (f"{host.url}/away", f"{host.url}/away redirects to 127.0.0.1:{host.other_port}, "
                                  "which is not in --media-domains; list "
                                  f"127.0.0.1:{host.other_port} in --media-domains, or {inline}"),
        "compressed": (f"{host.url}/gzip.png", f"{host.url}/gzip.png sent a gzip-compressed body, which is not "
                       f"unpacked; serve the file uncompressed, or {inline}"),
        "other scheme": ("ftp://127.0.0.1/a.png", "ftp: URLs are refused; send the image inline as a data: URL"),
    }


def test_each_failure_is_a_400_in_openais_shape(fetcher: Server, host: MediaHost, dead_port: int) -> None:
    where = "messages[0].content[0].image_url.url"
    for name, (url, message) in failures(host, dead_port).items():
        response = httpx.post(f"{fetcher.url}/v1/chat/completions", json={"messages": ask(url), "max_tokens": 4},
                              timeout=30)
        assert (response.status_code, response.json()) == (400, {"error": {
            "message": f"{where}: {message}", "type": "invalid_request_error", "param": where,
            "code": "invalid_value"}}), name


def test_not_an_image_is_the_inline_400(fetcher: Server, host: MediaHost) -> None:
    response = httpx.post(f"{fetcher.url}/v1/chat/completions", timeout=30,
                          json={"messages": ask(f"{host.url}/text.png"), "max_tokens": 4})
    assert response.status_code == 400
    assert response.json()["error"]["message"] == ("messages[0].content[0] is not an image or audio format that can "
                                                   "be read (it starts with b'hello, I'); send a PNG, JPEG, GIF or BMP image, or a WAV, MP3 or FLAC clip")


def test_failures_in_anthropic_and_responses_shapes(fetcher: Server, host: MediaHost) -> None:
    url = f"{host.url}/missing.png"
    answer = httpx.post(f"{fetcher.url}/v1/messages", timeout=30, json={"model": "any", "max_tokens": 4, "messages": [
        {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": url}},
                                     {"type": "text", "text": QUESTION}]}]})
    message = (f"messages[0].content[0].image_url.url: {url} answered 404 Not Found; check the URL, or send the "
               "bytes inline as a data: URL")
    assert (answer.status_code, answer.json()) == (400, {"type": "error", "error": {
        "type": "invalid_request_error", "message": message}})
    answer = httpx.post(f"{fetcher.url}/v1/responses", timeout=30, json={"model": "any", "input": [
        {"role": "user", "content": [{"type": "input_image", "image_url": url}]}]})
    assert answer.status_code == 400
    assert answer.json()["error"]["message"] == message


def test_a_body_past_the_limit_is_cut_off_while_it_streams(fetcher: Server, host: MediaHost) -> None:
    started = time.monotonic()
    response = httpx.post(f"{fetcher.url}/v1/chat/completions", timeout=30,
                          json={"messages": ask(f"{host.url}/stream.png"), "max_tokens": 4})
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith(
        f"messages[0].content[0].image_url.url: {host.url}/stream.png is larger than the {LIMIT} bytes")
    deadline = time.monotonic() + 10
    while host.streamed < 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert 0 <= host.streamed < STREAMED // 4  # the sender met a closed connection long before the end
    assert time.monotonic() - started < 10


def test_a_url_gets_what_the_requests_earlier_images_left(fetcher: Server, host: MediaHost) -> None:
    part = {"type": "image_url", "image_url": {"url": f"{host.url}/half.png"}}
    response = httpx.post(f"{fetcher.url}/v1/chat/completions", timeout=30, json={"max_tokens": 4, "messages": [
        {"role": "user", "content": [part, part, {"type": "text", "text": QUESTION}]}]})
    assert response.status_code == 400
    assert response.json()["error"]["message"] == (
        f"messages[0].content[1].image_url.url: {host.url}/half.png is larger than the {LIMIT - HALF} bytes this "
        "request may still take (--media-max-image-size); send a smaller file, or raise the flag")


def test_input_audio_takes_a_url(fetcher: Server, host: MediaHost) -> None:
    """input_audio's `url` (or a URL in `data`) is fetched as llama-server does: the clip reaches the
    projector, which refuses it (the fixture's is vision only)."""
    for key in ("url", "data"):
        part = {"type": "input_audio", "input_audio": {key: f"{host.url}/clip.wav", "format": "wav"}}
        response = httpx.post(f"{fetcher.url}/v1/chat/completions", timeout=30, json={
            "messages": [{"role": "user", "content": [part, {"type": "text", "text": "hi"}]}], "max_tokens": 4})
        assert response.status_code == 400
        assert response.json()["error"]["message"] == "the projector mmproj-tiny.gguf does not take audio"
    part = {"type": "input_audio", "input_audio": {"url": f"http://127.0.0.1:{host.other_port}/clip.wav"}}
    response = httpx.post(f"{fetcher.url}/v1/chat/completions", timeout=30, json={
        "messages": [{"role": "user", "content": [part, {"type": "text", "text": "hi"}]}], "max_tokens": 4})
    assert response.json()["error"]["message"].startswith("messages[0].content[0].input_audio.url: remote media URLs "
                                                          "are refused")


def test_a_slow_host_times_out(host: MediaHost, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(media_fetch, "FETCH_TIMEOUT_S", 0.5)
    port = host.server_address[1]
    with pytest.raises(media_fetch.APIError) as caught:
        fetch_media(f"{host.url}/slow.png", "p", (f"127.0.0.1:{port}",), LIMIT, "--media-max-image-size")
    assert caught.value.message == (f"p: 127.0.0.1:{port} did not send {host.url}/slow.png within 0.5 s; try a faster "
                                    "host, or send the bytes inline as a data: URL")


def test_fetching_on_the_event_loop_is_refused(host: MediaHost) -> None:
    async def on_the_loop() -> bytes:
        return fetch_media(f"{host.url}/a.png", "p", (f"127.0.0.1:{host.server_address[1]}",), LIMIT, "flag")

    with pytest.raises(RuntimeError, match="fetched on the event loop"):
        asyncio.run(on_the_loop())


@pytest.mark.parametrize(("entry", "url", "allowed"), [
    ("images.example.com", "https://images.example.com/a.png", True),
    ("images.example.com", "http://IMAGES.example.com./a.png", True),  # case and a trailing dot do not matter
    ("images.example.com", "https://images.example.com:8443/a.png", False),  # no port: 80 and 443 only
    ("images.example.com:8443", "https://images.example.com:8443/a.png", True),
    ("images.example.com", "https://cdn.images.example.com/a.png", False),
    ("*.example.com", "https://cdn.images.example.com/a.png", True),
    ("*.example.com", "https://example.com/a.png", False),
    ("*.example.com", "https://badexample.com/a.png", False),
    ("example.com", "http://example.com@evil.test/a.png", False),  # the host httpx connects to is checked
    ("127.0.0.1", "http://2130706433/a.png", False),  # names as written: no other spelling of an address
    ("[::1]:8080", "http://[0:0::1]:8080/a.png", True),
])
def test_media_domains_rules(entry: str, url: str, allowed: bool) -> None:
    assert media_fetch.listed(httpx.URL(url), [host_rule(entry)]) is allowed


def test_a_bad_media_domains_entry_is_one_error_line() -> None:
    result = run_cli("serve", "-m", "missing.gguf", "--media-domains", "*")
    assert result.exit_code != 0
    assert result.stderr.splitlines()[:2] == ["Error: --media-domains *: not a host name or address",
                                              "Hint: give HOST, HOST:PORT, *.DOMAIN or [IPv6]:PORT, e.g. "
                                              "images.example.com"]
