"""Projectors with M-RoPE positions (Qwen2-VL and later): complete --image and serve run them.

The fixture is Qwen2-VL's pair with random weights (tests/fixtures: TINY_QWEN2VL and make_mmproj's
QWEN2VL): each 16x16 pixel square of an image is one embedding, and an image of nx x ny embeddings
advances the position by max(nx, ny). The 96x48 PNG is 6 x 3 = 18 embeddings over 6 positions, the
48x80 JPEG 3 x 5 = 15 over 5. Prompt token counts count every embedding, as llama-mtmd-cli's do.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fixtures.make_gguf import TINY_QWEN2VL, write_llama_gguf
from tests.fixtures.make_mmproj import QWEN2VL, image_bytes, write_mmproj_gguf
from tests.helpers import run_cli
from tests.test_multimodal_reference import needs_mtmd_cli, theirs
from tests.test_serve import Server, _start

QUESTION = "What is in the image?"
MIDDLE = "Look at this: <__media__> and say what is in the image."  # text before and after the image


@pytest.fixture(scope="module")
def qwen(models_dir: Path) -> tuple[Path, Path]:
    return (write_llama_gguf(models_dir / "tiny-qwen2vl.gguf", TINY_QWEN2VL),
            write_mmproj_gguf(models_dir / "mmproj-tiny-qwen2vl.gguf", QWEN2VL))


@pytest.fixture(scope="module")
def pictures(models_dir: Path) -> dict[str, Path]:
    out = {}
    for key, (name, width, height, fmt, seed) in {"png": ("wide.png", 96, 48, "PNG", 4),
                                                  "jpeg": ("tall.jpg", 48, 80, "JPEG", 5)}.items():
        out[key] = models_dir / name
        out[key].write_bytes(image_bytes(width, height, fmt, seed))
    return out


def ours(qwen: tuple[Path, Path], image: Path, prompt: str = QUESTION, *flags: str) -> tuple[str, int]:
    model, projector = qwen
    result = run_cli("complete", "-m", str(model), "--mmproj", str(projector), "--image", str(image), "--chat",
                     "-p", prompt, "-n", "8", "--temp", "0", "-c", "512", "--json", *flags)
    assert result.exit_code == 0, result.stderr
    return result.stdout, int(re.search(r'"prompt_tokens": (\d+)', result.stderr).group(1))


def test_cells_count_each_embedding_and_never_part_of_an_image() -> None:
    """5 text tokens, a 6 x 3 image (6 positions, 18 cells), 4 text tokens: the cells before a position."""
    from pyllama_cli.core.media.prompt import MediaPrompt, _Chunk

    prompt = MediaPrompt.__new__(MediaPrompt)  # the chunks as libmtmd would give them, without a projector
    prompt._chunks, prompt.tokens = None, [0] * 15
    prompt.chunks = [_Chunk(None, 0, 5, 5, False), _Chunk(None, 5, 6, 18, True), _Chunk(None, 11, 4, 4, False)]
    assert (prompt.n_cells, prompt.extra_cells) == (27, 12)
    assert [prompt.cells(p) for p in (0, 3, 5, 8, 11, 13, 15, 17)] == [0, 3, 5, 5, 23, 25, 27, 29]


def test_prompt_tokens_count_every_embedding(qwen: tuple[Path, Path], pictures: dict[str, Path]) -> None:
    text, n_png = ours(qwen, pictures["png"])
    assert text.strip()
    assert n_png == 48 + 18  # the chat turn's 48 text tokens and the 6 x 3 image's 18, not its 6 positions
    assert ours(qwen, pictures["jpeg"])[1] == 48 + 15


def test_context_limit_counts_cells_not_positions(qwen: tuple[Path, Path], models_dir: Path) -> None:
    """A 352x160 image is 22 x 10 = 220 embeddings over 22 positions: with the chat turn, 268 cells over
    70 positions, which a context of 256 cells cannot hold."""
    model, projector = qwen
    image = models_dir / "big.png"
    image.write_bytes(image_bytes(352, 160, "PNG", 6))
    result = run_cli("complete", "-m", str(model), "--mmproj", str(projector), "--image", str(image),
                     "--chat", "-p", QUESTION, "-n", "4", "--temp", "0", "-c", "256")
    assert result.exit_code != 0
    assert result.stderr.splitlines()[0] == "Error: the prompt has 268 tokens but the context holds 256"


# ---- llama-mtmd-cli, the reference (LLAMA_CPP_BIN)


@pytest.mark.reference
@needs_mtmd_cli
@pytest.mark.parametrize("kind", ["png", "jpeg"])
@pytest.mark.parametrize("prompt", [QUESTION, MIDDLE], ids=["image-first", "text-around"])
def test_complete_matches_mtmd_cli(qwen: tuple[Path, Path], pictures: dict[str, Path], kind: str,
                                   prompt: str) -> None:
    assert_complete_matches_mtmd_cli(qwen, pictures[kind], prompt)


def assert_complete_matches_mtmd_cli(model: tuple[Path, Path], image: Path, prompt: str) -> None:
    """complete's greedy answer and prompt size for (text model, projector) are llama-mtmd-cli's."""
    expected = theirs(model[0], model[1], image, question=prompt)
    assert expected[0].strip()
    assert ours(model, image, prompt) == expected


# ---- serve: the scheduler's path, and a second request that reuses the slot's cells


@pytest.fixture(scope="module")
def qwen_server(qwen: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = vision_server(qwen, tmp_path_factory.mktemp("serve-qwen2vl"))
    yield srv
    srv.stop()


def vision_server(model: tuple[Path, Path], folder: Path) -> Server:
    """`serve` of (text model, projector) with one slot of 512 cells, its log in `folder`."""
    return _start(model[0], folder / "stderr.log", "--mmproj", str(model[1]), "-c", "512", "--parallel", "1")


def _ask(server: Server, image: Path, question: str) -> tuple[str, int, int]:
    url = f"data:image/png;base64,{base64.b64encode(image.read_bytes()).decode()}"
    answer = server.client().chat.completions.create(
        model="any", max_tokens=8, temperature=0,
        messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                               {"type": "text", "text": question}]}])
    usage = answer.usage
    cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
    return answer.choices[0].message.content, usage.prompt_tokens, cached or 0


def test_serve_gives_completes_text_and_reuses_the_image(qwen_server: Server, qwen: tuple[Path, Path],
                                                         pictures: dict[str, Path]) -> None:
    expected = ours(qwen, pictures["png"])
    text, n_prompt, _ = _ask(qwen_server, pictures["png"], QUESTION)
    assert (text, n_prompt) == expected
    again, n_again, cached = _ask(qwen_server, pictures["png"], QUESTION)
    assert (again, n_again) == expected
    assert cached > 18  # the image and the text before it came from the slot's cells
    # the same image, another question: the cells up to the image's end are kept, the text after it is new
    other = "Tell me what the picture shows."
    text, n_prompt, cached = _ask(qwen_server, pictures["png"], other)
    assert (text, n_prompt) == ours(qwen, pictures["png"], other)
    assert cached >= 18


def test_chat_second_turn_reuses_the_image_as_serve_answers(qwen_server: Server, qwen: tuple[Path, Path],
                                                            pictures: dict[str, Path]) -> None:
    """chat's second question keeps the cells through the image and the first answer: its answer is the
    server's to the whole two-turn conversation."""
    model, projector = qwen
    result = run_cli("chat", "-m", str(model), "--mmproj", str(projector), "--temp", "0", "-n", "8", "-c", "512",
                     stdin=f"/image {pictures['jpeg']}\n{QUESTION}\nTell me more.\n")
    assert result.exit_code == 0, result.stderr
    first, second = (line.strip("\n") for line in result.stdout.split("\n\n")[:2])
    assert first == ours(qwen, pictures["jpeg"])[0]
    url = f"data:image/jpeg;base64,{base64.b64encode(pictures['jpeg'].read_bytes()).decode()}"
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                             {"type": "text", "text": QUESTION}]},
                {"role": "assistant", "content": first}, {"role": "user", "content": "Tell me more."}]
    answer = qwen_server.client().chat.completions.create(model="any", max_tokens=8, temperature=0, messages=messages)
    assert second == answer.choices[0].message.content


def test_serve_refuses_a_prompt_whose_cells_overflow(qwen_server: Server, models_dir: Path) -> None:
    """A 480x272 image is 30 x 17 = 510 embeddings over 30 positions: 558 cells with the chat turn, more
    than the slot's 512, though its 78 positions would fit."""
    image = image_bytes(480, 272, "PNG", 7)
    url = f"data:image/png;base64,{base64.b64encode(image).decode()}"
    body = {"max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": QUESTION}]}]}
    response = httpx.post(f"{qwen_server.url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["n_prompt_tokens"], error["n_ctx"]) == ("exceed_context_size_error", 558, 512)
