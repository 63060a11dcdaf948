"""complete --image and --audio give llama-mtmd-cli's text and prompt token count, medium by medium.

llama-mtmd-cli applies the model's chat template to -p with the media's markers first, which is what
`complete --chat` does with --image or --audio; both run greedy (--temp 0).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.helpers import run_cli
from tests.test_audio import audio_proj, clips, flac_clip  # noqa: F401 - the fixtures
from tests.test_multimodal import images, mmproj  # noqa: F401 - the fixtures

pytestmark = pytest.mark.reference
QUESTION = "What is in the image?"


def _mtmd_cli() -> Path | None:
    folder = os.environ.get("LLAMA_CPP_BIN")
    tool = Path(folder) / "llama-mtmd-cli" if folder else None
    return tool if tool is not None and tool.is_file() else None


needs_mtmd_cli = pytest.mark.skipif(_mtmd_cli() is None, reason="set LLAMA_CPP_BIN to a folder with llama-mtmd-cli")


def theirs(model: Path, projector: Path, image: Path, flag: str = "--image", question: str = QUESTION,
           n_ctx: str = "512") -> tuple[str, int]:
    """llama-mtmd-cli's text and the prompt tokens its perf line counts. Its log thread sometimes loses the
    end of the log at exit (more often on a loaded machine), so it runs again, at most 10 times, until the
    perf line is there."""
    for _ in range(10):
        proc = subprocess.run([str(_mtmd_cli()), "-m", str(model), "--mmproj", str(projector), flag,
                               str(image), "-p", question, "-n", "8", "--temp", "0", "-c", n_ctx, "-lv", "4"],
                              capture_output=True, timeout=120, check=False)
        log = proc.stderr.decode(errors="replace")
        assert proc.returncode == 0, log[-2000:]
        perf = re.search(r"prompt eval time = .* / +(\d+) tokens", log)
        if perf:
            return proc.stdout.decode("utf-8", errors="replace").strip("\n"), int(perf.group(1))
    raise AssertionError(f"llama-mtmd-cli printed no perf line: {log[-2000:]}")


def ours(model: Path, projector: Path, image: Path, flag: str = "--image", question: str = QUESTION,
         n_ctx: str = "512") -> tuple[str, int]:
    result = run_cli("complete", "-m", str(model), "--mmproj", str(projector), flag, str(image), "--chat",
                     "-p", question, "-n", "8", "--temp", "0", "-c", n_ctx, "--json")
    assert result.exit_code == 0, result.stderr
    return result.stdout, int(re.search(r'"prompt_tokens": (\d+)', result.stderr).group(1))


@needs_mtmd_cli
@pytest.mark.parametrize("kind", ["png", "jpeg", "large"])
def test_complete_image_matches_mtmd_cli(tiny_model: Path, mmproj: Path, images: dict[str, Path],  # noqa: F811
                                         kind: str) -> None:
    expected = theirs(tiny_model, mmproj, images[kind])
    assert expected[0].strip()  # the reference wrote something
    assert ours(tiny_model, mmproj, images[kind]) == expected


@needs_mtmd_cli
@pytest.mark.parametrize("kind", ["short", "resampled", "long", "flac"])
def test_complete_audio_matches_mtmd_cli(tiny_model: Path, audio_proj: Path, clips: dict[str, Path],  # noqa: F811
                                         flac_clip: Path, kind: str) -> None:  # noqa: F811
    """The audio fixture (tests/fixtures/make_audio_proj.py): WAVs of 1 s at 16 kHz, 2 s at 44.1 kHz and 31 s
    (two chunks), and the 1 s clip as FLAC."""
    clip = flac_clip if kind == "flac" else clips[kind]
    asked = (audio_proj, clip, "--audio", "What do you hear?", "1024")
    expected = theirs(tiny_model, *asked)
    assert expected[0].strip()
    assert ours(tiny_model, *asked) == expected
