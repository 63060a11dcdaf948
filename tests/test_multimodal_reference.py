"""complete --image gives llama-mtmd-cli's text and prompt token count, image by image.

llama-mtmd-cli applies the model's chat template to -p with the images' markers first, which is what
`complete --chat` does with --image; both run greedy (--temp 0).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.helpers import run_cli
from tests.test_multimodal import images, mmproj  # noqa: F401 - the fixtures

pytestmark = pytest.mark.reference
QUESTION = "What is in the image?"


def _mtmd_cli() -> Path | None:
    folder = os.environ.get("LLAMA_CPP_BIN")
    tool = Path(folder) / "llama-mtmd-cli" if folder else None
    return tool if tool is not None and tool.is_file() else None


needs_mtmd_cli = pytest.mark.skipif(_mtmd_cli() is None, reason="set LLAMA_CPP_BIN to a folder with llama-mtmd-cli")


def theirs(model: Path, projector: Path, image: Path, prompt: str = QUESTION) -> tuple[str, int]:
    """llama-mtmd-cli's text and the prompt tokens its perf line counts. Its log thread sometimes loses the
    end of the log at exit, so it runs again (at most 4 times) until the perf line is there."""
    for _ in range(4):
        proc = subprocess.run([str(_mtmd_cli()), "-m", str(model), "--mmproj", str(projector), "--image",
                               str(image), "-p", prompt, "-n", "8", "--temp", "0", "-c", "512", "-lv", "4"],
                              capture_output=True, timeout=120, check=False)
        log = proc.stderr.decode(errors="replace")
        assert proc.returncode == 0, log[-2000:]
        perf = re.search(r"prompt eval time = .* / +(\d+) tokens", log)
        if perf:
            return proc.stdout.decode("utf-8", errors="replace").strip("\n"), int(perf.group(1))
    raise AssertionError(f"llama-mtmd-cli printed no perf line: {log[-2000:]}")


def ours(model: Path, projector: Path, image: Path) -> tuple[str, int]:
    result = run_cli("complete", "-m", str(model), "--mmproj", str(projector), "--image", str(image), "--chat",
                     "-p", QUESTION, "-n", "8", "--temp", "0", "-c", "512", "--json")
    assert result.exit_code == 0, result.stderr
    return result.stdout, int(re.search(r'"prompt_tokens": (\d+)', result.stderr).group(1))


@needs_mtmd_cli
@pytest.mark.parametrize("kind", ["png", "jpeg", "large"])
def test_complete_image_matches_mtmd_cli(tiny_model: Path, mmproj: Path, images: dict[str, Path],  # noqa: F811
                                         kind: str) -> None:
    expected = theirs(tiny_model, mmproj, images[kind])
    assert expected[0].strip()  # the reference wrote something
    assert ours(tiny_model, mmproj, images[kind]) == expected
