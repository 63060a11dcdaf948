"""Router mode of `pyllama serve`: real server processes over a folder of fixture models."""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from tests.fixtures.fake_hf import FakeHub
from tests.fixtures.make_gguf import TINY, write_llama_gguf, write_split_gguf
from tests.helpers import run_cli, run_process
from tests.test_serve import Server, spawn_serve

HELLO = [{"role": "user", "content": "hello"}]
PRESETS = """\
version = 1
; every model
[*]
c = 1024
np = 2
top-k = 3

[alpha]
alias = first, primary
temp = 0.25
n-predict = 3

[beta]
chat-template = llama3
c = 512
"""


class Router(Server):
    """A `pyllama serve` of several models, with the requests these tests send it."""

    def chat(self, model: str, **fields: object) -> httpx.Response:
        body = {"model": model, "messages": HELLO, "max_tokens": 2, **fields}
        return httpx.post(f"{self.url}/v1/chat/completions", json=body, timeout=60)

    def models(self) -> dict[str, dict]:
        return {card["id"]: card for card in httpx.get(f"{self.url}/v1/models").json()["data"]}

    def status(self, model: str) -> str:
        return self.models()[model]["status"]["value"]

    def wait_status(self, model: str, wanted: str, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while self.status(model) != wanted:
            assert time.monotonic() < deadline, f"{model} is {self.status(model)}, not {wanted}"
            time.sleep(0.05)

    def rss_kib(self) -> int:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE).group(1))


def _start(log: Path, *args: str, hf_home: Path | None = None) -> Router:
    """Start `pyllama serve` in router mode on a free port and wait for its ready line."""
    env = {"HF_HOME": str(hf_home)} if hf_home is not None else None
    return spawn_serve(log, list(args), env=env, kind=Router, timeout=60)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """alpha and beta (tiny), gamma (about 60 MB, for a clear drop in memory), and a corrupt broken.gguf."""
    models = tmp_path_factory.mktemp("router-models")
    write_llama_gguf(models / "alpha.gguf", TINY)
    write_llama_gguf(models / "beta.gguf", replace(TINY, seed=1))
    write_llama_gguf(models / "gamma.gguf", replace(TINY, seed=2, n_layer=24))
    (models / "broken.gguf").write_bytes(b"GGUF\x03\x00\x00\x00 not a model")
    return models


@pytest.fixture(scope="module")
def router(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    preset = folder.parent / "presets.ini"
    preset.write_text(PRESETS)
    server = _start(tmp_path_factory.mktemp("router") / "stderr.log", "--models-dir", str(folder),
                    "--models-preset", str(preset), "--top-k", "7")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def small_router(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    server = _start(tmp_path_factory.mktemp("router-small") / "stderr.log", "-m", str(folder / "alpha.gguf"),
                    "-m", str(folder / "beta.gguf"), "-c", "512", "--models-max", "1", "--sleep-idle-seconds", "2")
    yield server
    server.stop()


def test_lists_every_model_unloaded_with_size_path_and_aliases(router: Router, folder: Path) -> None:
    cards = router.models()
    assert sorted(cards) == ["alpha", "beta", "broken", "gamma"]
    alpha = cards["alpha"]
    assert alpha["path"] == str(folder / "alpha.gguf")
    assert alpha["size"] == (folder / "alpha.gguf").stat().st_size
    assert alpha["aliases"] == ["first", "primary"]
    assert cards["broken"]["status"] == {"value": "unloaded"}
    assert "runtime" not in cards["broken"]
    assert re.search(r"listening on http://\S+ - router mode, 4 models: alpha, beta, broken, gamma", router.stderr)


def test_unknown_model_is_404_listing_the_ids(router: Router) -> None:
    response = router.chat("nope")
    assert response.status_code == 404
    assert response.json()["error"]["message"] == (
        "the model 'nope' is not served here; this server serves 'alpha', 'beta', 'broken', 'gamma'")


def test_two_concurrent_first_requests_load_the_model_once(router: Router) -> None:
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda _: router.chat("alpha"), range(2)))
    assert [a.status_code for a in answers] == [200, 200]
    assert [a.json()["model"] for a in answers] == ["alpha", "alpha"]
    assert router.stderr.count("loading model 'alpha'") == 1
    metrics = httpx.get(f"{router.url}/metrics").text
    assert 'pyllama_model_loads_total{model="alpha"} 1' in metrics
    assert 'pyllama_model_loaded{model="alpha"} 1' in metrics
    assert re.search(r'^pyllama_jobs_total\{model="alpha",outcome="done"\} 2$', metrics, re.MULTILINE)
    card = router.models()["alpha"]
    assert card["status"] == {"value": "loaded"}
    assert card["runtime"]["n_ctx"] == 512 and card["runtime"]["slots_total"] == 2
    assert card["runtime"]["slots_busy"] == 0 and card["runtime"]["memory_bytes"] > card["size"]


def test_presets_apply_per_model(router: Router) -> None:
    router.chat("alpha")
    props = httpx.get(f"{router.url}/props", params={"model": "alpha"}).json()
    assert props["default_generation_settings"]["n_ctx"] == 512  # c = 1024 over np = 2 slots
    assert props["default_generation_settings"]["params"]["temperature"] == 0.25
    assert props["default_generation_settings"]["params"]["top_k"] == 7  # the command line wins over [*]
    assert props["total_slots"] == 2
    by_alias = httpx.post(f"{router.url}/v1/chat/completions", json={"model": "primary", "messages": HELLO})
    assert by_alias.json()["model"] == "alpha"
    assert by_alias.json()["usage"]["completion_tokens"] <= 3  # n-predict = 3
    beta = httpx.get(f"{router.url}/props", params={"model": "beta"}).json()
    assert beta["default_generation_settings"]["n_ctx"] == 256
    prompt = httpx.post(f"{router.url}/apply-template", params={"model": "beta"}, json={"messages": HELLO}).json()
    assert prompt["prompt"].startswith("<|start_header_id|>user<|end_header_id|>")


def test_a_request_runs_on_a_while_b_loads_and_answers(router: Router) -> None:
    router.chat("gamma")  # the slowest model, so that its stream lasts while beta loads and answers
    body = {"model": "gamma", "messages": HELLO, "max_tokens": 150, "stream": True, "ignore_eos": True}
    arrivals: list[tuple[float, str]] = []
    first = threading.Event()

    def stream() -> None:
        with httpx.stream("POST", f"{router.url}/v1/chat/completions", json=body, timeout=60) as response:
            for line in response.iter_lines():
                if line:
                    arrivals.append((time.monotonic(), line))
                    first.set()

    reader = threading.Thread(target=stream)
    reader.start()
    assert first.wait(30)
    beta = router.chat("beta")
    answered = time.monotonic()
    reader.join(60)
    assert beta.status_code == 200 and beta.json()["model"] == "beta"
    assert arrivals[-1][1] == "data: [DONE]"
    assert sum(line.startswith("data: {") for _, line in arrivals) > 50
    assert any(at > answered for at, _ in arrivals[:-1]), "gamma's stream ended before beta answered"


def test_a_corrupt_model_fails_only_its_own_requests(router: Router) -> None:
    response = router.chat("broken")
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["code"] == "model_load_failed"
    assert error["message"].startswith("the model 'broken' could not be loaded: ")
    assert router.chat("alpha").status_code == 200
    assert router.models()["broken"]["status"] == {"value": "failed", "failed": True,
                                                  "error": error["message"].split(": ", 1)[1]}
    load = httpx.post(f"{router.url}/models/load", json={"model": "broken"}, timeout=30)
    assert load.status_code == 500 and load.json()["error"]["code"] == "model_load_failed"


def test_keep_alive_zero_unloads_after_the_request(router: Router) -> None:
    assert router.chat("beta", keep_alive=0).status_code == 200
    router.wait_status("beta", "unloaded")
    assert "unloading model 'beta' (keep_alive 0)" in router.stderr
    bad = router.chat("beta", keep_alive="soon")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "keep_alive"


def test_load_and_unload_routes(router: Router) -> None:
    assert httpx.post(f"{router.url}/models/load", json={"model": "beta"}, timeout=30).json() == {"success": True}
    assert router.status("beta") == "loaded"
    assert httpx.post(f"{router.url}/models/unload", json={"model": "beta"}, timeout=30).json() == {"success": True}
    assert router.status("beta") == "unloaded"
    again = httpx.post(f"{router.url}/models/unload", json={"model": "beta"})
    assert again.status_code == 400 and again.json()["error"]["code"] == "model_not_loaded"
    unknown = httpx.post(f"{router.url}/models/unload", json={"model": "nope"})
    assert unknown.status_code == 404
    assert httpx.get(f"{router.url}/health").json() == {"status": "ok"}


def test_unloading_the_largest_model_frees_its_memory(router: Router, folder: Path) -> None:
    size_kib = (folder / "gamma.gguf").stat().st_size // 1024
    assert router.chat("gamma").status_code == 200  # every weight is read once: resident
    loaded = router.rss_kib()
    assert httpx.post(f"{router.url}/models/unload", json={"model": "gamma"}, timeout=30).status_code == 200
    freed = loaded - router.rss_kib()
    assert freed > size_kib * 0.8, f"RSS fell by {freed} KiB after unloading a {size_kib} KiB model"


def test_models_max_one_evicts_the_least_recently_used(small_router: Router) -> None:
    assert small_router.chat("alpha").status_code == 200
    assert small_router.chat("beta").status_code == 200
    assert small_router.status("alpha") == "unloaded" and small_router.status("beta") == "loaded"
    assert "unloading model 'alpha' (to make room for 'beta' (--models-max 1))" in small_router.stderr


def test_idle_models_unload_after_sleep_idle_seconds(small_router: Router) -> None:
    assert small_router.chat("alpha").status_code == 200
    answered = time.monotonic()
    assert small_router.status("alpha") == "loaded"
    small_router.wait_status("alpha", "unloaded", timeout=10)
    assert time.monotonic() - answered > 1.5  # not before its 2 s of idleness
    assert "unloading model 'alpha' (idle for 2 s)" in small_router.stderr


def test_a_request_without_a_model_is_refused_listing_the_ids(small_router: Router) -> None:
    response = httpx.post(f"{small_router.url}/v1/chat/completions", json={"messages": HELLO})
    assert response.status_code == 400
    assert response.json()["error"]["message"] == (
        "this server serves several models: name one in `model` ('alpha', 'beta')")


def test_no_model_serves_every_gguf_in_the_hf_cache(tiny_model: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    parts = write_split_gguf(tmp_path / "split", replace(TINY, ftype="F16"), 2)
    files = {"tiny-F16-00001-of-00002.gguf": parts[0], "tiny-F16-00002-of-00002.gguf": parts[1],
             "tiny-F32.gguf": tiny_model}
    with FakeHub() as hub:
        hub.add_repo("org/tiny-GGUF", files)
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        for quant in ("F16", "F32"):
            assert run_cli("pull", "-hf", f"org/tiny-GGUF:{quant}").exit_code == 0
    server = _start(tmp_path / "stderr.log", "-c", "512", hf_home=Path(os.environ["HF_HOME"]))
    try:
        cards = server.models()
        assert sorted(cards) == ["tiny-F16", "tiny-F32"]  # the split model is one model
        assert cards["tiny-F16"]["size"] == sum(p.stat().st_size for p in parts)
        assert server.chat("tiny-F16").json()["model"] == "tiny-F16"
    finally:
        server.stop()


@pytest.mark.parametrize(("value", "seconds"), [
    (0, 0.0), (-1, -1.0), ("300", 300.0), ("5m", 300.0), ("1h30m", 5400.0), ("-1m", -60.0), ("250ms", 0.25)])
def test_keep_alive_takes_ollamas_durations(value: object, seconds: float) -> None:
    from pyllama_cli.core.serving.pool import parse_keep_alive

    assert parse_keep_alive(value) == seconds


def test_a_bad_preset_file_is_one_error_naming_the_line(folder: Path, tmp_path: Path) -> None:
    preset = tmp_path / "bad.ini"
    preset.write_text("[*]\nc = 512\n[alpha]\nwarp-speed = 9\n")
    result = run_process("serve", "--models-dir", str(folder), "--models-preset", str(preset), "--port", "0")
    assert result.exit_code != 0
    assert result.stderr.splitlines()[0] == f"Error: {preset}:4: unknown key 'warp-speed'"
    assert "Traceback" not in result.stderr


def test_rpc_in_router_mode_needs_models_max_1(folder: Path) -> None:
    # Two models decoding on one RPC server at once hang inside ggml's RPC client: refused before any connection.
    args = ("serve", "-m", str(folder / "alpha.gguf"), "-m", str(folder / "beta.gguf"), "--rpc", "127.0.0.1:1",
            "--port", "0")
    result = run_cli(*args)
    assert (result.exit_code, result.stderr.strip().splitlines()) == (
        1, ["Error: --rpc in router mode runs one model at a time", "Hint: add --models-max 1"])


def test_metrics_show_the_moment_of_sleep_only_while_every_model_sleeps(folder: Path, tmp_path: Path) -> None:
    server = _start(tmp_path / "stderr.log", "-m", str(folder / "alpha.gguf"), "-m", str(folder / "beta.gguf"),
                    "-c", "512")
    try:
        def metrics() -> str:
            return httpx.get(f"{server.url}/metrics", timeout=30).text

        def loaded(text: str) -> dict[str, str]:
            return dict(re.findall(r'^pyllama_model_loaded\{model="(\w+)"\} (\d)$', text, re.MULTILINE))

        assert server.chat("alpha", keep_alive="10m").status_code == 200
        assert server.chat("beta", keep_alive=0).status_code == 200
        server.wait_status("beta", "unloaded")
        assert loaded(metrics()) == {"alpha": "1", "beta": "0"}  # beta sleeps, alpha does not: live
        assert httpx.post(f"{server.url}/models/unload", json={"model": "alpha"}, timeout=30).status_code == 200
        assert loaded(metrics()) == {"alpha": "0", "beta": "0"}  # unloaded by hand, not asleep: live
        assert server.chat("alpha", keep_alive=0).status_code == 200
        server.wait_status("alpha", "unloaded")
        assert loaded(metrics()) == {"alpha": "1", "beta": "0"}  # every model asleep: as alpha fell asleep
        asleep = metrics()
        assert server.status("beta") == "unloaded" and metrics() == asleep
        assert server.chat("beta", keep_alive="10m").status_code == 200
        assert loaded(metrics()) == {"alpha": "0", "beta": "1"}
    finally:
        server.stop()
