"""Images through a projector (--mmproj): the checks of media, complete --image, and its errors.

The fixture projector (tests/fixtures/make_mmproj.py) is LLaVA's "mlp" type with random weights: every
image becomes 16 embeddings, and different images make the tiny model write different text.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pyllama_cli.core.media.check import sniff
from pyllama_cli.errors import InputError
from tests.fixtures.make_gguf import WIDE, write_llama_gguf
from tests.fixtures.make_mmproj import ProjectorSpec, image_bytes, write_mmproj_gguf
from tests.helpers import run_cli

ASK = ("--chat", "-p", "What is in the image?", "-n", "8", "--temp", "0", "-c", "512")


@pytest.fixture(scope="session")
def mmproj(models_dir: Path) -> Path:
    return write_mmproj_gguf(models_dir / "mmproj-tiny.gguf")


@pytest.fixture(scope="session")
def images(models_dir: Path) -> dict[str, Path]:
    """A PNG, a JPEG, and a PNG large enough that the projector scales it down."""
    files = {"png": ("a.png", 48, 40, "PNG", 1), "jpeg": ("b.jpg", 64, 64, "JPEG", 2),
             "large": ("c.png", 1200, 900, "PNG", 3)}
    out = {}
    for key, (name, width, height, fmt, seed) in files.items():
        out[key] = models_dir / name
        out[key].write_bytes(image_bytes(width, height, fmt, seed))
    return out


def complete(model: Path, mmproj: Path, *flags: str):
    return run_cli("complete", "-m", str(model), "--mmproj", str(mmproj), *flags)


def test_each_image_gives_its_own_answer(tiny_model: Path, mmproj: Path, images: dict[str, Path]) -> None:
    texts = {}
    for key, path in images.items():
        result = complete(tiny_model, mmproj, "--image", str(path), *ASK, "--json")
        assert result.exit_code == 0, result.stderr
        texts[key] = result.stdout
        assert '"prompt_tokens": 41' in result.stderr  # 25 text tokens of the chat turn and 16 of the image
    assert len(set(texts.values())) == 3, texts


def test_marker_places_the_image_and_two_images_take_32_tokens(tiny_model: Path, mmproj: Path,
                                                               images: dict[str, Path]) -> None:
    first = complete(tiny_model, mmproj, "--image", str(images["png"]), *ASK)
    marked = complete(tiny_model, mmproj, "--image", str(images["png"]), "--chat", "-p",
                      "<__media__>What is in the image?", "-n", "8", "--temp", "0", "-c", "512")
    assert marked.stdout == first.stdout
    two = complete(tiny_model, mmproj, "--image", f"{images['png']},{images['jpeg']}", *ASK, "--json")
    assert two.exit_code == 0, two.stderr
    assert '"prompt_tokens": 57' in two.stderr


def test_media_errors_are_one_line(tiny_model: Path, mmproj: Path, images: dict[str, Path], tmp_path: Path) -> None:
    svg = tmp_path / "x.png"
    svg.write_text('<svg xmlns="http://www.w3.org/2000/svg"/>')
    cut = tmp_path / "cut.png"
    cut.write_bytes(images["png"].read_bytes()[:60])
    cases = {
        str(svg): f"Error: {svg} is not an image or audio format that can be read (SVG/XML)",
        str(tmp_path / "none.png"): f"Error: media file not found: {tmp_path / 'none.png'}",
        str(cut): f"Error: {cut} could not be decoded as a PNG image",
    }
    for path, line in cases.items():
        result = complete(tiny_model, mmproj, "--image", path, *ASK)
        assert result.exit_code != 0
        assert result.stderr.splitlines()[0] == line
        assert "Traceback" not in result.stderr


def test_markers_must_match_the_images(tiny_model: Path, mmproj: Path, images: dict[str, Path]) -> None:
    result = complete(tiny_model, mmproj, "--image", str(images["png"]), "-p", "<__media__> and <__media__>", "-n", "1")
    assert result.stderr.splitlines()[0] == "Error: the prompt has 2 media markers (<__media__>) for 1 media"


def test_image_without_projector(tiny_model: Path, images: dict[str, Path]) -> None:
    result = run_cli("complete", "-m", str(tiny_model), "--image", str(images["png"]), *ASK)
    assert result.exit_code != 0
    assert result.stderr.splitlines()[:2] == ["Error: --image and --audio need a multimodal projector",
                                              "Hint: pass --mmproj FILE"]


def test_no_mmproj_turns_the_projector_off(tiny_model: Path, mmproj: Path, images: dict[str, Path]) -> None:
    result = complete(tiny_model, mmproj, "--no-mmproj", "--image", str(images["png"]), *ASK)
    assert result.stderr.splitlines()[0] == "Error: --image and --audio need a multimodal projector"


def test_projector_of_another_width_names_both_sizes(models_dir: Path, mmproj: Path,
                                                     images: dict[str, Path]) -> None:
    wide = write_llama_gguf(models_dir / "wide-mm.gguf", WIDE)  # n_embd 128; the projector makes 256
    result = complete(wide, mmproj, "--image", str(images["png"]), *ASK)
    assert result.exit_code != 0
    assert result.stderr.splitlines()[0] == (
        "Error: the projector mmproj-tiny.gguf makes embeddings of size 256, but the text model takes "
        "embeddings of size 128")


def test_projector_that_is_not_one(tiny_model: Path, images: dict[str, Path]) -> None:
    result = complete(tiny_model, tiny_model, "--image", str(images["png"]), *ASK)
    assert result.exit_code != 0
    assert result.stderr.splitlines()[0].startswith(f"Error: cannot load the projector {tiny_model}: ")


def test_projector_spec_counts_patches() -> None:
    assert ProjectorSpec().n_patches == 16


@pytest.mark.parametrize(("data", "message"), [
    (b"", "the file is empty"),
    (b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR" + (20000).to_bytes(4, "big") * 2 + b"\x08\x02\0\0\0" + b"\0" * 4,
     "the file is a PNG image of 20000x20000 pixels, more than the 67 megapixels accepted"),
    (b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR" + (0).to_bytes(4, "big") * 2 + b"\x08\x02\0\0\0" + b"\0" * 4,
     "the file is a PNG image of 0x0 pixels"),
    (b"\x89PNG\r\n\x1a\n", "the file is a PNG image cut short or damaged: its header cannot be read"),
    (b"RIFF\0\0\0\0WEBPVP8 ", "the file is not an image or audio format that can be read (WebP)"),
    (b"hello world", "the file is not an image or audio format that can be read (it starts with b'hello wo')"),
])
def test_sniff_refuses(data: bytes, message: str) -> None:
    with pytest.raises(InputError) as caught:
        sniff(data)
    assert caught.value.message == message


def test_sniff_reads_sizes() -> None:
    assert (sniff(image_bytes(48, 40, "PNG")).width, sniff(image_bytes(48, 40, "PNG")).height) == (48, 40)
    jpeg = sniff(image_bytes(33, 17, "JPEG"))
    assert (jpeg.format, jpeg.width, jpeg.height) == ("JPEG", 33, 17)
    assert sniff(image_bytes(5, 7, "GIF")).format == "GIF"
    assert (sniff(image_bytes(5, 7, "BMP")).width, sniff(image_bytes(5, 7, "BMP")).height) == (5, 7)


def test_info_shows_the_projector(mmproj: Path) -> None:
    result = run_cli("info", "-m", str(mmproj))
    assert result.exit_code == 0, result.stderr
    lines = [line.strip() for line in result.stdout.splitlines()]
    start = lines.index("Projector")
    assert lines[start + 1:start + 7] == ["type                  mlp", "accepts               vision",
                                          "image size            32", "patch size            8",
                                          "encoder width         64", "projection dim        256"]
    data = json.loads(run_cli("info", "-m", str(mmproj), "--json").stdout)
    assert data["projector"] == {"type": "mlp", "accepts": ["vision"], "image_size": 32, "patch_size": 8,
                                 "embedding_length": 64, "projection_dim": 256}


def test_info_of_a_text_model_has_no_projector(tiny_model: Path) -> None:
    data = json.loads(run_cli("info", "-m", str(tiny_model), "--json").stdout)
    assert data["projector"] is None


def test_chat_image_then_a_question_answers_as_complete_image(tiny_model: Path, mmproj: Path,
                                                               images: dict[str, Path]) -> None:
    """chat's /image puts the image before the next message, as complete --chat --image does: the same
    rendered prompt, so the same greedy answer; a second turn keeps the image in the cached prompt."""
    expected = complete(tiny_model, mmproj, "--image", str(images["jpeg"]), *ASK)
    stdin = f"/image {images['jpeg']}\nWhat is in the image?\nAnd now?\n"
    result = run_cli("chat", "-m", str(tiny_model), "--mmproj", str(mmproj), "-n", "8", "--temp", "0", "-c", "512",
                     stdin=stdin)
    assert result.exit_code == 0, result.stderr
    answers = result.stdout.split("\n\n")
    assert answers[0] == expected.stdout
    assert answers[1].strip()  # the second turn is answered, the image still in its prompt
    assert f"Attached '{images['jpeg']}' (JPEG 64x64); it goes with your next message." in result.stderr


def test_chat_image_without_projector(tiny_model: Path, images: dict[str, Path]) -> None:
    result = run_cli("chat", "-m", str(tiny_model), "-n", "4", stdin=f"/image {images['png']}\n")
    assert "this model cannot see images: there is no projector" in result.stderr


@pytest.mark.parametrize(("files", "model", "tag", "chosen"), [
    (["m-Q4_K_M.gguf", "mmproj-m-f16.gguf", "mmproj-m-Q8_0.gguf"], "m-Q4_K_M.gguf", "Q4_K_M", "mmproj-m-Q8_0.gguf"),
    (["m-Q4_K_M.gguf", "mmproj-m-f16.gguf", "mmproj-m-Q8_0.gguf"], "m-Q4_K_M.gguf", "F16", "mmproj-m-f16.gguf"),
    (["m-F32.gguf", "mmproj-m-f16.gguf", "mmproj-m-Q8_0.gguf"], "m-F32.gguf", None, "mmproj-m-f16.gguf"),
    (["a/m-Q8_0.gguf", "mmproj-top-f16.gguf", "a/mmproj-a-f16.gguf", "b/mmproj-b-Q8_0.gguf"], "a/m-Q8_0.gguf",
     "Q8_0", "a/mmproj-a-f16.gguf"),
    (["m-Q8_0.gguf", "README.md"], "m-Q8_0.gguf", None, None),
])
def test_pick_projector_as_llama_cpp(files: list[str], model: str, tag: str | None, chosen: str | None) -> None:
    from pyllama_cli.core.model.resolve import pick_projector

    assert pick_projector(files, model, tag) == chosen


def test_hf_model_brings_its_projector(tiny_model: Path, mmproj: Path, images: dict[str, Path],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.fixtures.fake_hf import FakeHub

    expected = complete(tiny_model, mmproj, "--image", str(images["png"]), *ASK)
    with FakeHub() as hub:
        hub.add_repo("org/vl-GGUF", {"vl-F32.gguf": tiny_model, "mmproj-vl-f16.gguf": mmproj,
                                     "mmproj-vl-Q8_0.gguf": tiny_model})  # the Q8_0 one would fail to load
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        result = run_cli("complete", "-hf", "org/vl-GGUF:F32", "--image", str(images["png"]), *ASK)
        assert result.exit_code == 0, result.stderr
        assert result.stdout == expected.stdout
        assert ("GET", "/org/vl-GGUF/resolve/main/mmproj-vl-f16.gguf") in hub.requests
        off = run_cli("complete", "-hf", "org/vl-GGUF:F32", "--no-mmproj", "--image", str(images["png"]), *ASK)
        assert off.stderr.splitlines()[0] == "Error: --image and --audio need a multimodal projector"


def test_chat_image_on_a_terminal(tiny_model: Path, mmproj: Path, images: dict[str, Path]) -> None:
    """In a pty (prompt-toolkit's front end): /image, then the question, answers as complete --image."""
    from tests.fixtures.terminal import Terminal

    expected = complete(tiny_model, mmproj, "--image", str(images["png"]), *ASK).stdout
    term = Terminal("chat", "-m", str(tiny_model), "--mmproj", str(mmproj), "-n", "8", "--temp", "0", "-c", "512",
                    "-t", "1", "--no-history", "--plain")
    try:
        start = term.wait_for("> ", after=term.wait_for("/exit quits"))
        term.type(f"/image {images['png']}\r")
        start = term.wait_for("it goes with your next message.", after=start)
        term.type("What is in the image?\r")
        start = term.wait_for(expected, after=start)
        term.wait_for("> ", after=start)  # the next prompt
        term.type("\x04")  # Ctrl-D: leave the chat
        assert term.close() == 0, term.seen[-500:]
    finally:
        term.proc.kill()


def test_chat_takes_a_dropped_image_path_as_an_attachment(tiny_model: Path, mmproj: Path,
                                                           images: dict[str, Path]) -> None:
    """A line that is only an image's path (as a terminal pastes a dropped file, quoted) attaches it."""
    expected = complete(tiny_model, mmproj, "--image", str(images["png"]), *ASK)
    result = run_cli("chat", "-m", str(tiny_model), "--mmproj", str(mmproj), "-n", "8", "--temp", "0", "-c", "512",
                     stdin=f"'{images['png']}'\nWhat is in the image?\n")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.split("\n\n")[0] == expected.stdout
    assert f"Attached '{images['png']}' (PNG 48x40)" in result.stderr
