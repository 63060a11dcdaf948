"""Shared fixtures: isolated user directories, the tiny test models, and a fake Hugging Face Hub."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.make_gguf import TINY, write_llama_gguf

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
