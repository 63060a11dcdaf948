"""`pyllama chat` with no model named, on a terminal: the picker of cached models and the offer of a
first model, driven through prompt-toolkit's pipe input and through a real pseudo-terminal."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from prompt_toolkit.application import create_app_session
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output.plain_text import PlainTextOutput

from pyllama_cli.chat.first_run import DEFAULT_MODEL, first_run_request
from pyllama_cli.core.model.resolve import ModelRequest
from pyllama_cli.errors import NoModelGiven
from tests.fixtures.fake_hf import FakeHub
from tests.fixtures.make_gguf import write_quantized
from tests.fixtures.terminal import Terminal
from tests.helpers import run_cli

DOWN, ENTER = "\x1b[B", "\r"
DEFAULT_REPO = "ggml-org/gemma-3-1b-it-GGUF"


@pytest.fixture(scope="module")
def hub(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeHub]:
    q8 = write_quantized(tiny_model, tmp_path_factory.mktemp("first-run") / "q8.gguf", "Q8_0")
    with FakeHub() as fake:
        fake.add_repo(DEFAULT_REPO, {"gemma-3-1b-it-Q4_K_M.gguf": q8, "gemma-3-1b-it-Q8_0.gguf": tiny_model})
        fake.add_repo("org/tiny-GGUF", {"tiny-Q8_0.gguf": q8, "tiny-F32.gguf": tiny_model})
        yield fake


@pytest.fixture
def endpoint(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> FakeHub:
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    hub.clear_requests()
    return hub


def answer(keys: str, request: ModelRequest = ModelRequest()) -> tuple[ModelRequest | Exception, str]:
    """first_run_request with `keys` typed, and the text it showed."""
    shown = io.StringIO()
    with create_pipe_input() as keyboard, create_app_session(input=keyboard, output=PlainTextOutput(shown)):
        keyboard.send_text(keys)
        try:
            return first_run_request(request), shown.getvalue()
        except NoModelGiven as exc:
            return exc, shown.getvalue()


def test_the_picker_lists_cached_models_and_arrows_choose(endpoint: FakeHub) -> None:
    for spec in ("org/tiny-GGUF:Q8_0", "org/tiny-GGUF:F32"):
        assert run_cli("pull", "-hf", spec).exit_code == 0
    chosen, shown = answer(DOWN + ENTER)
    assert chosen == ModelRequest(hf_repo="org/tiny-GGUF", hf_file="tiny-Q8_0.gguf", offline=True)
    assert "Which model? (Up/Down to move, Enter to chat)" in shown
    assert "org/tiny-GGUF:F32  (6.53 MiB)" in shown and "org/tiny-GGUF:Q8_0  (1.75 MiB)" in shown
    assert answer(ENTER)[0].hf_file == "tiny-F32.gguf"


def test_with_nothing_cached_it_offers_the_default_model_with_its_size(endpoint: FakeHub) -> None:
    chosen, shown = answer(ENTER)
    assert chosen == ModelRequest(hf_repo=DEFAULT_MODEL)
    assert f" No models downloaded yet.\r\n Download {DEFAULT_MODEL} (1.75 MiB) and chat with it?\r\n" in shown
    assert ("GET", f"/api/models/{DEFAULT_REPO}/tree/main") in endpoint.requests
    declined, _ = answer(DOWN + ENTER)
    assert isinstance(declined, NoModelGiven)


def test_an_unreachable_hub_gives_the_usual_error_with_the_reason() -> None:
    error, _ = answer(ENTER)
    assert isinstance(error, NoModelGiven)
    assert error.hint.startswith(f"cannot reach http://127.0.0.1:9 to resolve {DEFAULT_REPO}\n")


def test_off_a_terminal_the_one_line_error_stays(endpoint: FakeHub) -> None:
    result = run_cli("chat")
    assert result.first_stderr_line == "Error: no model given: use -m FILE.gguf or -hf user/repo[:quant]"
    assert endpoint.requests == []


def test_first_chat_on_a_terminal_downloads_the_default_model_and_chats(endpoint: FakeHub) -> None:
    term = Terminal("chat", "-c", "128", "-t", "1", "--no-history")
    try:
        term.wait_for("and chat with it?")
        term.wait_for("No")
        term.type(ENTER)
        term.wait_for("pyllama chat · gemma-3-1b-it-Q4_K_M.gguf")
        term.wait_for("> ", after=term.wait_for("/exit quits"))  # the chat's own prompt
        term.type("\x04")  # Ctrl-D: leave the chat
        assert term.close() == 0
    finally:
        term.proc.kill()
    assert f"Download {DEFAULT_MODEL} (1.75 MiB)" in term.seen
    assert ("GET", f"/{DEFAULT_REPO}/resolve/main/gemma-3-1b-it-Q4_K_M.gguf") in endpoint.requests
