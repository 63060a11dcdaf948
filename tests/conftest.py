"""Shared fixtures: isolated user directories, the tiny test models, a fake Hugging Face Hub, and the
servers that several modules share (each start costs a second or two; tests that need a fresh server or
other flags start their own)."""

from __future__ import annotations

import os
import sys

# The suite starts a few hundred `python -m pyllama_cli` children. With PYTHONDONTWRITEBYTECODE set (as
# on this project's machines) a fresh clone has no bytecode, so each child compiled pyllama_cli's
# modules from source again (~0.1 s of CPU a start); let the first import write it for the rest.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

from collections.abc import Iterator  # noqa: E402
from dataclasses import replace  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402

from tests.fixtures.make_gguf import TINY, write_llama_gguf  # noqa: E402
from tests.fixtures.think_templates import OPENS_THINK  # noqa: E402
from tests.helpers import SHARED_API_KEY  # noqa: E402
from tests.test_prompt_cache import _serve  # noqa: E402
from tests.test_serve import Server, _start  # noqa: E402

_USER_DIR_VARS = ("HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "PYLLAMA_HOME", "XDG_CACHE_HOME",
                  "XDG_DATA_HOME", "XDG_CONFIG_HOME", "LLAMA_CACHE")


@pytest.fixture(autouse=True)
def isolated_user_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own HF cache and pyllama home; no test sees the user's or the network."""
    home = tmp_path / "home"
    for var in _USER_DIR_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(home / "hf"))
    monkeypatch.setenv("PYLLAMA_HOME", str(home / "pyllama"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / "cache"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("PYLLAMA_DEBUG", raising=False)
    # Nothing may reach the real Hub: tests that want a hub serve one and set HF_ENDPOINT themselves.
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    return home


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def tiny_model(models_dir: Path) -> Path:
    """A small llama-architecture GGUF (F32, fixed-seed random weights, SPM vocab, ChatML template)."""
    return write_llama_gguf(models_dir / "tiny.gguf", TINY)


@pytest.fixture(scope="session")
def server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """tiny.gguf with the defaults and -c N_CTX of test_serve; tests that use it compare metrics as deltas."""
    srv = _start(tiny_model, tmp_path_factory.mktemp("serve") / "stderr.log")
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def embedding_server(models_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    model = write_llama_gguf(models_dir / "tiny-embed.gguf", replace(TINY, embedding_only=True))
    srv = _start(model, tmp_path_factory.mktemp("serve-embed") / "stderr.log", "--embeddings")
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def on(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """test_prompt_cache's server with a RAM tier (--cache-ram 64, 2 slots), also test_cache_reuse's
    server without --cache-reuse; each test there uses prompts of its own and counts routes as deltas."""
    srv = _serve(tiny_model, tmp_path_factory.mktemp("cache-on") / "stderr.log", "--cache-ram", "64")
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def keyed_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """4 slots, -c 2048 and PYLLAMA_API_KEY=SHARED_API_KEY: test_anthropic's and test_ollama's server."""
    srv = _start(tiny_model, tmp_path_factory.mktemp("serve-keyed") / "stderr.log", "-np", "4", "-c", "2048",
                 env={"PYLLAMA_API_KEY": SHARED_API_KEY})
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def four_slot_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """4 slots and -c 2048 (512 tokens each): test_openai_responses's and test_serve_parallel's server."""
    srv = _start(tiny_model, tmp_path_factory.mktemp("serve-np") / "stderr.log", "-np", "4", "-c", "2048")
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def think_model(models_dir: Path) -> Path:
    return write_llama_gguf(models_dir / "opens-think.gguf", replace(TINY, chat_template=OPENS_THINK))


@pytest.fixture(scope="session")
def thinking_server(think_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A template that opens <think>, -c 1024 and --reasoning-budget 3: test_reasoning's and test_ollama's."""
    srv = _start(think_model, tmp_path_factory.mktemp("serve-think") / "stderr.log", "-c", "1024",
                 "--reasoning-budget", "3")
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A headless Chromium (test_webui.py's CHROMIUM and CHROMEDRIVER), shared by the web UI's test modules."""
    from tests.test_webui import CHROMEDRIVER, CHROMIUM

    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
    if not CHROMIUM or not CHROMEDRIVER:
        pytest.skip("Chromium and chromedriver are not installed (Debian: apt-get install chromium chromium-driver)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    options.set_capability("goog:loggingPrefs", {"browser": "SEVERE"})  # script errors, CSP violations
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1100,820", "--disable-extensions", "--no-first-run"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    downloads = tmp_path_factory.mktemp("downloads")
    driver.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
    driver.downloads = downloads
    yield driver
    driver.quit()
