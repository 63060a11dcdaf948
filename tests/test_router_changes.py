"""A router's POST /models, DELETE /models and /models/sse (llama-server's): models downloaded from a
fake Hugging Face Hub on 127.0.0.1 while the server runs, and removed again as `pyllama rm` removes them."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from tests.fixtures.fake_hf import FakeHub
from tests.fixtures.make_gguf import TINY, write_llama_gguf
from tests.test_serve import Server, spawn_serve

HELLO = [{"role": "user", "content": "hello"}]
F32, Q8 = "org/tiny-GGUF:F32", "org/tiny-GGUF:Q8_0"


class Events:
    """/models/sse's events, read by a thread of their own until the server ends the stream."""

    def __init__(self, url: str):
        self.seen: list[dict] = []
        connected = threading.Event()

        def read() -> None:
            with httpx.stream("GET", f"{url}/models/sse", timeout=httpx.Timeout(5, read=120)) as response:
                connected.set()
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        self.seen.append(json.loads(line[6:]))

        threading.Thread(target=read, daemon=True).start()
        assert connected.wait(10)

    def of(self, model: str) -> list[dict]:
        return [e for e in self.seen if e["model"] == model]

    def wait(self, model: str, event: str, timeout: float = 30) -> list[dict]:
        deadline = time.monotonic() + timeout
        while not any(e["event"] == event for e in self.of(model)):
            assert time.monotonic() < deadline, f"no {event} for {model}: {self.of(model)}"
            time.sleep(0.02)
        return self.of(model)


@pytest.fixture(scope="module")
def hub(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeHub]:
    q8 = write_llama_gguf(tmp_path_factory.mktemp("hub-files") / "q8.gguf", replace(TINY, seed=3))
    with FakeHub() as fake:
        fake.add_repo("org/tiny-GGUF", {"tiny-F32.gguf": tiny_model, "tiny-Q8_0.gguf": q8})
        yield fake


@pytest.fixture(scope="module")
def router(hub: FakeHub, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("router-changes")
    alpha = write_llama_gguf(folder / "alpha.gguf", replace(TINY, seed=1))
    server = spawn_serve(folder / "stderr.log", ["-m", str(alpha), "-m", str(tiny_model), "-c", "512"],
                         env={"HF_ENDPOINT": hub.url}, timeout=60)
    yield server
    server.stop()


def cards(server: Server, path: str = "/v1/models") -> dict[str, dict]:
    return {card["id"]: card for card in httpx.get(f"{server.url}{path}", timeout=30).json()["data"]}


def error(response: httpx.Response) -> tuple[int, dict]:
    return response.status_code, response.json()["error"]


def post_model(server: Server, name: str) -> httpx.Response:
    return httpx.post(f"{server.url}/models", json={"model": name}, timeout=30)


def delete_model(server: Server, name: str | None) -> httpx.Response:
    return httpx.delete(f"{server.url}/models", params={"model": name} if name is not None else None, timeout=60)


def test_post_models_downloads_and_serves_it_by_its_name(router: Server, hub: FakeHub, tiny_model: Path) -> None:
    events = Events(router.url)
    assert post_model(router, F32).json() == {"success": True}
    seen = events.wait(F32, "download_finished")
    size = tiny_model.stat().st_size
    assert seen[0] == {"model": F32, "event": "model_status", "data": {"status": "downloading"}}
    assert seen[-1] == {"model": F32, "event": "download_finished"}
    progress = [e["data"]["progress"][f"{hub.url}/org/tiny-GGUF/resolve/main/tiny-F32.gguf"] for e in seen[1:-1]]
    assert [e["event"] for e in seen[1:-1]] == ["download_progress"] * len(progress)
    assert progress[0] == {"done": 0, "total": size} and progress[-1] == {"done": size, "total": size}
    card = cards(router)[F32]
    assert (card["status"], card["source"], card["can_remove"], card["size"]) == (
        {"value": "unloaded"}, "cache", True, size)
    assert Path(card["path"]).read_bytes() == tiny_model.read_bytes()
    assert "/hub/models--org--tiny-GGUF/snapshots/" in card["path"]
    assert {(c["source"], c["can_remove"]) for i, c in cards(router, "/models").items() if i != F32} == {("file", False)}
    answer = httpx.post(f"{router.url}/v1/chat/completions", timeout=60,
                        json={"model": F32, "messages": HELLO, "max_tokens": 2})
    assert (answer.status_code, answer.json()["model"]) == (200, F32)
    assert f"POST /models 200 model={F32} " in router.stderr  # the access log names the model


def test_post_models_errors(router: Server) -> None:
    assert error(post_model(router, "")) == (400, {"message": "model must be a non-empty string",
                                                   "type": "invalid_request_error", "param": "model",
                                                   "code": "invalid_value"})
    assert error(post_model(router, "alpha")) == (400, {"message": "model 'alpha' already exists",
                                                        "type": "invalid_request_error", "param": "model",
                                                        "code": "model_exists"})
    status, body = error(post_model(router, "org/missing-GGUF"))
    assert (status, body["code"], body["type"]) == (404, "model_not_found", "not_found_error")
    assert body["message"].startswith("Hugging Face repo not found: org/missing-GGUF")
    status, body = error(post_model(router, "org/tiny-GGUF:Q2_K"))
    assert (status, body["code"]) == (404, "model_not_found")
    assert body["message"] == ("org/tiny-GGUF has no GGUF file for quant 'Q2_K'; quants in org/tiny-GGUF: F32, Q8_0 "
                               "(use -hf org/tiny-GGUF:QUANT)")
    status, body = error(post_model(router, "not a repo"))
    assert (status, body["code"]) == (400, "invalid_value")
    assert body["message"].startswith("invalid Hugging Face repo 'not a repo'")
    assert "org/missing-GGUF" not in cards(router)


def test_a_model_downloading_is_listed_and_waited_for(router: Server, hub: FakeHub) -> None:
    events = Events(router.url)
    hub.stall_after = 1  # the download holds after its first byte
    try:
        assert post_model(router, Q8).json() == {"success": True}
        events.wait(Q8, "download_progress")
        card = cards(router)[Q8]
        assert (card["status"], card["source"], card["can_remove"]) == ({"value": "downloading"}, "cache", False)
        assert error(post_model(router, Q8))[1]["code"] == "model_exists"
        tags = httpx.get(f"{router.url}/api/tags", timeout=30)  # ollama's list: served models only
        assert tags.status_code == 200 and Q8 not in {m["name"] for m in tags.json()["models"]}
        chat = httpx.post(f"{router.url}/v1/chat/completions", json={"model": Q8, "messages": HELLO}, timeout=30)
        assert error(chat) == (503, {"message": f"the model {Q8!r} is still downloading",
                                     "type": "unavailable_error", "param": "model", "code": "model_downloading"})
        assert error(delete_model(router, Q8))[0:2] == (409, {
            "message": f"the model {Q8!r} is still downloading: remove it once it is listed as unloaded",
            "type": "invalid_request_error", "param": "model", "code": "model_downloading"})
    finally:
        hub.stall_after = None
    events.wait(Q8, "download_finished")
    assert cards(router)[Q8]["status"] == {"value": "unloaded"}


def test_delete_models_unloads_and_removes_what_was_downloaded(router: Server) -> None:
    for name in (F32, Q8):  # both quants of one repo in the cache, F32 loaded
        if name not in cards(router):
            Events(router.url)
            post_model(router, name)
    deadline = time.monotonic() + 30
    while any(cards(router)[n]["status"]["value"] == "downloading" for n in (F32, Q8)):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert httpx.post(f"{router.url}/models/load", json={"model": F32}, timeout=60).json() == {"success": True}
    f32_path, q8_path = Path(cards(router)[F32]["path"]), Path(cards(router)[Q8]["path"])
    events = Events(router.url)
    assert delete_model(router, F32).json() == {"success": True}
    assert events.wait(F32, "model_remove") == [{"model": F32, "event": "model_remove"}]
    assert F32 not in cards(router) and Q8 in cards(router)
    assert not f32_path.exists() and q8_path.exists()  # one quant of the repo goes, as `pyllama rm repo:F32`
    chat = httpx.post(f"{router.url}/v1/chat/completions", json={"model": F32, "messages": HELLO}, timeout=30)
    assert (chat.status_code, chat.json()["error"]["code"]) == (404, "model_not_found")
    with ThreadPoolExecutor(2) as pool:  # two at once: one removes it, the other finds it gone
        statuses = sorted(r.status_code for r in pool.map(lambda _: delete_model(router, Q8), range(2)))
    assert statuses == [200, 404]
    assert not q8_path.exists() and not q8_path.parents[2].exists()  # the last quant: the whole repo


def test_delete_models_never_deletes_the_users_own_files(router: Server, tiny_model: Path) -> None:
    assert error(delete_model(router, "alpha")) == (400, {
        "message": "the model 'alpha' is not removable: it is a file named with -m, and this server deletes only "
                   "models of the Hugging Face cache", "type": "invalid_request_error", "param": "model",
        "code": "model_not_removable"})
    assert Path(cards(router)["alpha"]["path"]).exists() and tiny_model.exists()
    assert error(delete_model(router, "nope")) == (404, {"message": "the model 'nope' is not served here",
                                                         "type": "not_found_error", "param": "model",
                                                         "code": "model_not_found"})
    assert error(delete_model(router, None))[1]["message"] == "model must be a non-empty string"


def test_a_server_of_one_model_adds_and_removes_none(server: Server) -> None:
    for response in (post_model(server, F32), delete_model(server, "x"), httpx.get(f"{server.url}/models/sse")):
        status, body = error(response)
        assert (status, body["code"]) == (400, "not_router")
        assert body["message"].startswith("this server serves one model and cannot ")


def test_sigterm_ends_models_sse_at_once_not_after_the_grace(tiny_model: Path, tmp_path: Path) -> None:
    """/models/sse is no request to wait for: a stopping router ends it at once, where it used to hold
    the stop for the whole --shutdown-grace (3 s) like an unfinished answer."""
    other = write_llama_gguf(tmp_path / "other.gguf", replace(TINY, seed=2))
    server = spawn_serve(tmp_path / "stderr.log", ["-m", str(other), "-m", str(tiny_model), "-c", "512"])
    try:
        Events(server.url)
        started = time.monotonic()
        server.proc.terminate()
        assert server.proc.wait(timeout=15) == 0
        assert time.monotonic() - started < 1.5
    finally:
        server.stop()
