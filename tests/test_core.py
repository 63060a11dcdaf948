"""The shared core: llama.cpp's log routing, download progress, the Ctrl-C boundary."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pyllama_cli.core.model.native import Model
from pyllama_cli.core.model.settings import LoadSettings
from tests.helpers import REPO_ROOT

LOAD_SCRIPT = """
import sys
from pathlib import Path
from pyllama_cli.core.model.native import Model
from pyllama_cli.core.model.settings import LoadSettings
verbose = sys.argv[2] == "verbose"
log_file = Path(sys.argv[3]) if len(sys.argv) > 3 else None
with Model.load(Path(sys.argv[1]), LoadSettings(verbose=verbose, log_file=log_file)) as m:
    print(m.n_vocab)
"""


def _load_in_process(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", LOAD_SCRIPT, *args], capture_output=True, text=True,
                          cwd=REPO_ROOT, timeout=60)


def test_llama_log_is_silent_by_default(tiny_model: Path) -> None:
    proc = _load_in_process(str(tiny_model), "quiet")
    assert proc.returncode == 0
    assert proc.stdout == "1024\n"
    assert proc.stderr == ""


def test_verbose_sends_llama_log_to_stderr(tiny_model: Path) -> None:
    proc = _load_in_process(str(tiny_model), "verbose")
    assert proc.stdout == "1024\n"
    assert "llama_model_loader" in proc.stderr


def test_log_file_receives_the_log(tiny_model: Path, tmp_path: Path) -> None:
    log = tmp_path / "llama.log"
    proc = _load_in_process(str(tiny_model), "quiet", str(log))
    assert proc.stdout == "1024\n" and proc.stderr == ""
    assert "llama_model_loader" in log.read_text()


def test_model_tokenizes_with_the_vocab(tiny_model: Path) -> None:
    with Model.load(tiny_model, LoadSettings(), vocab_only=True) as model:
        assert model.tokenize(b"hello world").tolist() == [1, 263, 264]
        assert model.tokenize(b"hello world", add_special=False).tolist() == [263, 264]
        assert model.detokenize([263, 264]) == b"hello world"  # SPM drops the first piece's space
        assert (model.bos, model.eos, model.eot) == (1, 2, 260)


def test_end_of_generation_tokens_and_pieces(tiny_model: Path) -> None:
    # Both are cached per model; the cache must give what llama.cpp gives.
    with Model.load(tiny_model, LoadSettings(), vocab_only=True) as model:
        assert model.eog_tokens == (2, 260)  # </s> and <|im_end|>
        assert [t for t in range(model.n_vocab) if model.is_eog(t)] == [2, 260]
        assert [model.token_to_piece(t) for t in (1, 67, 260, 263)] == [b"<s>", b"@", b"<|im_end|>", b" hello"]
        assert model.token_to_piece(260, special=False) == b""  # a control token spells nothing in text
        assert model.token_to_piece(263) == b" hello"  # the second call comes from the cache


@pytest.mark.parametrize(("found", "gpu"), [([(0, "CPU")], False), ([(0, "CPU"), (1, "RPC[127.0.0.1:50052]")], True),
                                             ([(0, "CPU"), (2, "Intel iGPU")], True), ([(0, "CPU"), (3, "BLAS")], False)])
def test_only_a_gpu_type_device_counts_as_a_gpu(found: list[tuple[int, str]], gpu: bool,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # A build with the RPC backend says it supports GPU offload with no device at all; the device list decides.
    from pyllama_cli.core.model import library

    monkeypatch.setattr(library, "devices", lambda: found)
    assert library.gpu_device_present() is gpu


def test_the_device_registry_lists_the_cpu_and_decides_the_gpu_question() -> None:
    from pyllama_cli.core.model import library

    kinds = [kind for kind, _ in library.devices()]
    assert library.gpu_device_present() is any(kind in (1, 2) for kind in kinds)
    assert 0 in kinds  # the CPU device is always there


def test_ctrl_c_exits_130_without_traceback() -> None:
    script = textwrap.dedent("""
        import typer
        from pyllama_cli import cli
        app = typer.Typer()
        app.callback()(lambda: None)
        @app.command("sleepy")
        def sleepy():
            raise KeyboardInterrupt
        cli.build_app = lambda only=None: app
        cli.main()
    """)
    proc = subprocess.run([sys.executable, "-c", script, "sleepy"], capture_output=True, text=True,
                          cwd=REPO_ROOT, timeout=60)
    assert proc.returncode == 130
    assert "Traceback" not in proc.stderr


def test_download_progress_class_drives_a_real_download(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pyllama_cli import console
    from pyllama_cli.core.model.resolve import ModelRequest, resolve_model
    from tests.fixtures.fake_hf import FakeHub

    monkeypatch.setattr(console, "stderr_is_tty", lambda: True)
    with FakeHub() as hub:
        hub.add_repo("org/p-GGUF", {"p-F32.gguf": tiny_model})
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        resolved = resolve_model(ModelRequest(hf_repo="org/p-GGUF"), tqdm_class=console.download_tqdm())
    assert resolved.path.read_bytes() == tiny_model.read_bytes()
