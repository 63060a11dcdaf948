"""Qwen3-VL: M-RoPE positions plus deepstack, whose image embeddings are wider than the text model.

The fixture (make_gguf's TINY_QWEN3VL, make_mmproj's QWEN3VL) has one deepstack layer: each image
embedding is 2 x 256 floats, the first 256 the text model's input and the next 256 added to its first
layer's output, so the model takes embeddings of 512 (llama.cpp's n_embd_inp) though its width is 256.
Images make as many embeddings and positions as Qwen2-VL's: the 96x48 PNG 6 x 3 = 18 over 6 positions.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.make_gguf import TINY_QWEN2VL, TINY_QWEN3VL, TINY_QWEN3VLMOE, write_llama_gguf
from tests.fixtures.make_mmproj import QWEN2VL, QWEN3VL, QWEN35, write_mmproj_gguf
from tests.fixtures.make_qwen35 import TINY_QWEN35MOE, write_qwen35_gguf
from tests.helpers import run_cli
from tests.test_multimodal_mrope import (  # noqa: F401 - pictures: a fixture
    MIDDLE,
    QUESTION,
    _ask,
    assert_complete_matches_mtmd_cli,
    ours,
    pictures,
    vision_server,
)
from tests.test_multimodal_reference import needs_mtmd_cli
from tests.test_serve import Server
from tests.test_serve_fidelity import LLAMA_SERVER, _llama_server


@pytest.fixture(scope="module")
def qwen3(models_dir: Path) -> tuple[Path, Path]:
    return (write_llama_gguf(models_dir / "tiny-qwen3vl.gguf", TINY_QWEN3VL),
            write_mmproj_gguf(models_dir / "mmproj-tiny-qwen3vl.gguf", QWEN3VL))


def test_prompt_tokens_count_every_embedding(qwen3: tuple[Path, Path], pictures: dict[str, Path]) -> None:  # noqa: F811
    text, n_prompt = ours(qwen3, pictures["png"])
    assert text.strip()
    assert n_prompt == 48 + 18  # the chat turn's 48 text tokens and the 6 x 3 image's 18 embeddings


@pytest.mark.parametrize("text_model, projector, sizes", [
    (TINY_QWEN3VL, QWEN2VL, (256, 512)),  # a Qwen2-VL projector's 256 wide embeddings, no deepstack slice
    (TINY_QWEN2VL, QWEN3VL, (512, 256)),  # a deepstack projector for a model that takes its width only
], ids=["qwen2vl-projector", "qwen3vl-projector"])
def test_a_projector_of_another_width_is_one_error_line(models_dir: Path, pictures: dict[str, Path],  # noqa: F811
                                                        text_model, projector, sizes) -> None:
    model = write_llama_gguf(models_dir / f"{text_model.name}.gguf", text_model)
    mmproj = write_mmproj_gguf(models_dir / f"mmproj-for-{text_model.name}.gguf", projector)
    result = run_cli("complete", "-m", str(model), "--mmproj", str(mmproj), "--image", str(pictures["png"]),
                     "-p", QUESTION, "-n", "2")
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        f"Error: the projector {mmproj.name} makes embeddings of size {sizes[0]}, but the text model takes "
        f"embeddings of size {sizes[1]}", "Hint: use the mmproj file made for this model"]


@pytest.mark.reference
@needs_mtmd_cli
@pytest.mark.parametrize("model", ["qwen3", "qwen3moe"])  # Qwen3-VL, and its MoE variant (below)
@pytest.mark.parametrize("kind, prompt", [("png", QUESTION), ("jpeg", MIDDLE)], ids=["png-first", "jpeg-around"])
def test_complete_matches_mtmd_cli(request: pytest.FixtureRequest, model: str, pictures: dict[str, Path],  # noqa: F811
                                   kind: str, prompt: str) -> None:
    assert_complete_matches_mtmd_cli(request.getfixturevalue(model), pictures[kind], prompt)


@pytest.fixture(scope="module")
def qwen3_server(qwen3: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = vision_server(qwen3, tmp_path_factory.mktemp("serve-qwen3vl"))
    yield srv
    srv.stop()


def test_serve_image_url_gives_completes_text(qwen3_server: Server, qwen3: tuple[Path, Path],
                                             pictures: dict[str, Path]) -> None:  # noqa: F811
    url = f"data:image/jpeg;base64,{base64.b64encode(pictures['jpeg'].read_bytes()).decode()}"
    answer = qwen3_server.client().chat.completions.create(
        model="any", max_tokens=8, temperature=0,
        messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                               {"type": "text", "text": QUESTION}]}])
    assert (answer.choices[0].message.content, answer.usage.prompt_tokens) == ours(qwen3, pictures["jpeg"])
    assert answer.usage.prompt_tokens == 48 + 15  # the 48x80 JPEG: 3 x 5 embeddings


# ---- Qwen3-VL-MoE: the same layers with a router over experts in place of each feed-forward block


@pytest.fixture(scope="module")
def qwen3moe(qwen3: tuple[Path, Path], models_dir: Path) -> tuple[Path, Path]:
    return write_llama_gguf(models_dir / "tiny-qwen3vlmoe.gguf", TINY_QWEN3VLMOE), qwen3[1]


def test_qwen3vlmoe_serve_gives_completes_text_and_reuses_the_image(
        qwen3moe: tuple[Path, Path], pictures: dict[str, Path], tmp_path: Path) -> None:  # noqa: F811
    serve = vision_server(qwen3moe, tmp_path)
    try:
        expected = ours(qwen3moe, pictures["png"])
        assert expected[1] == 48 + 18  # as Qwen3-VL's: the same projector
        assert _ask(serve, pictures["png"], QUESTION) == (*expected, 0)
        assert _ask(serve, pictures["png"], QUESTION) == (*expected, expected[1] - 1)  # all but the last token
    finally:
        serve.stop()


# ---- Qwen3.5: M-RoPE over a hybrid memory (a recurrent layer and an attention layer)
# Its recurrent state cannot be cut at a position: a slot's next request reuses the prompt's cells only
# from a context checkpoint (core/serving/checkpoints.py). llama-mtmd-cli prints special tokens as text
# and complete does not, so the prompts here are ones whose 8 greedy tokens have none.
TELL = "Tell me what the picture shows."


@pytest.fixture(scope="module")
def qwen35(models_dir: Path) -> tuple[Path, Path]:
    return (write_qwen35_gguf(models_dir / "tiny-qwen35.gguf"),
            write_mmproj_gguf(models_dir / "mmproj-tiny-qwen35.gguf", QWEN35))


@pytest.fixture(scope="module")
def qwen35moe(qwen35: tuple[Path, Path], models_dir: Path) -> tuple[Path, Path]:
    """The mixture-of-experts variant (qwen35moe: 4 experts, 2 a token, and a shared one), same projector."""
    return write_qwen35_gguf(models_dir / "tiny-qwen35moe.gguf", TINY_QWEN35MOE), qwen35[1]


@pytest.mark.reference
@needs_mtmd_cli
@pytest.mark.parametrize("model", ["qwen35", "qwen35moe"])
@pytest.mark.parametrize("kind, prompt", [("png", MIDDLE), ("jpeg", TELL)], ids=["png-around", "jpeg-first"])
def test_qwen35_complete_matches_mtmd_cli(request: pytest.FixtureRequest, model: str,
                                          pictures: dict[str, Path], kind: str, prompt: str) -> None:  # noqa: F811
    assert_complete_matches_mtmd_cli(request.getfixturevalue(model), pictures[kind], prompt)


def test_qwen35moe_serve_answers_as_complete_and_reuses_the_checkpoint_after_the_image(
        qwen35moe: tuple[Path, Path], pictures: dict[str, Path], tmp_path: Path) -> None:  # noqa: F811
    serve = vision_server(qwen35moe, tmp_path)
    try:
        expected = ours(qwen35moe, pictures["png"], TELL)
        assert _ask(serve, pictures["png"], TELL) == (*expected, 0)
        assert _ask(serve, pictures["png"], QUESTION) == (*ours(qwen35moe, pictures["png"], QUESTION), IMAGE_END_CELLS)
    finally:
        serve.stop()


@pytest.fixture(scope="module")
def qwen35_server(qwen35: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = vision_server(qwen35, tmp_path_factory.mktemp("serve-qwen35"))
    yield srv
    srv.stop()


# The 96x48 PNG's prompts: 18 positions before the image, then its 18 cells over 6 positions.
IMAGE_END_CELLS = 18 + 18


def test_qwen35_serve_reuses_a_checkpoint_after_the_image(qwen35_server: Server, qwen35: tuple[Path, Path],
                                                         pictures: dict[str, Path]) -> None:  # noqa: F811
    """The text after the image is evaluated in the scheduler's batches, which save checkpoints where
    they save them for any prompt. The same question again restores the one 4 tokens before the end;
    another question after the same image restores the one before its text, and the image is not
    evaluated again. Each answer is complete's."""
    expected = ours(qwen35, pictures["png"], TELL)
    assert _ask(qwen35_server, pictures["png"], TELL) == (*expected, 0)
    assert _ask(qwen35_server, pictures["png"], TELL) == (*expected, expected[1] - 4)
    for question in (QUESTION, "Describe it."):
        assert _ask(qwen35_server, pictures["png"], question) == (*ours(qwen35, pictures["png"], question),
                                                                   IMAGE_END_CELLS)


@pytest.mark.reference
@pytest.mark.skipif(LLAMA_SERVER is None or not LLAMA_SERVER.is_file(),
                    reason="set LLAMA_CPP_BIN to a folder with llama-server")
def test_qwen35_serve_answers_and_caches_as_llama_server_and_keeps_the_image_it_evaluates_again(
        qwen35: tuple[Path, Path], pictures: dict[str, Path], tmp_path: Path) -> None:  # noqa: F811
    proc, url = _llama_server(qwen35[0], tmp_path / "llama-server.log", 1, "--mmproj", str(qwen35[1]), "-c", "512")
    llama_server = Server(proc, url, tmp_path / "llama-server.log")
    serve = vision_server(qwen35, tmp_path)
    try:
        questions = (TELL, TELL, QUESTION)
        theirs = [_ask(llama_server, pictures["png"], q) for q in questions]
        mine = [_ask(serve, pictures["png"], q) for q in questions]
    finally:
        llama_server.stop()
        serve.stop()
    assert [answer[:2] for answer in mine] == [answer[:2] for answer in theirs]
    assert [answer[2] for answer in mine[:2]] == [answer[2] for answer in theirs[:2]]
    # llama-server restores a checkpoint only near a prompt's end: before another question it keeps one token.
    assert (theirs[2][2], mine[2][2]) == (1, IMAGE_END_CELLS)


def test_qwen35_chat_second_turn_as_serve_answers(qwen35_server: Server, qwen35: tuple[Path, Path],
                                                  pictures: dict[str, Path]) -> None:  # noqa: F811
    """chat's second turn cannot cut the recurrent state back to the shared prefix: it evaluates the
    conversation again, and answers as the server does."""
    model, projector = qwen35
    result = run_cli("chat", "-m", str(model), "--mmproj", str(projector), "--temp", "0", "-n", "8", "-c", "512",
                     stdin=f"/image {pictures['jpeg']}\n{TELL}\nTell me more.\n")
    assert result.exit_code == 0, result.stderr
    first, second = (line.strip("\n") for line in result.stdout.split("\n\n")[:2])
    assert first == ours(qwen35, pictures["jpeg"], TELL)[0]
    url = f"data:image/jpeg;base64,{base64.b64encode(pictures['jpeg'].read_bytes()).decode()}"
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                             {"type": "text", "text": TELL}]},
                {"role": "assistant", "content": first}, {"role": "user", "content": "Tell me more."}]
    answer = qwen35_server.client().chat.completions.create(model="any", max_tokens=8, temperature=0,
                                                            messages=messages)
    assert second == answer.choices[0].message.content


def test_qwen35_chat_turns_restore_a_checkpoint_instead_of_evaluating_the_conversation_again(
        qwen35: tuple[Path, Path], pictures: dict[str, Path]) -> None:  # noqa: F811
    """chat evaluates a prompt in the server's batches, with checkpoints before them. The re-rendered
    conversation differs from the cache inside the last answer, where the recurrent state cannot be cut,
    so the next turn restores the checkpoint saved 4 tokens before the previous prompt's end (the image
    is not evaluated again) and answers as a chat that started over does. Before, each turn started over."""
    from pyllama_cli.core.generate.conversation import Conversation, open_chat_engine
    from pyllama_cli.core.generate.sampling import SamplingSettings
    from pyllama_cli.core.media.check import read_media
    from pyllama_cli.core.media.projector import Projector
    from pyllama_cli.core.media.settings import ProjectorSettings
    from pyllama_cli.core.model.native import Model
    from pyllama_cli.core.model.resolve import ResolvedModel
    from pyllama_cli.core.model.session import Session
    from pyllama_cli.core.model.settings import LoadSettings

    settings, greedy = LoadSettings(n_ctx=512, n_threads=1), SamplingSettings(temperature=0)

    def chat(turns: list[str], fresh_last: bool) -> tuple[list[str], list[tuple[int, int]]]:
        model = Model.load(qwen35[0], settings)
        engine = open_chat_engine(Session(ResolvedModel(qwen35[0], (qwen35[0],)), model), settings)
        engine.projector = Projector.load(qwen35[1], model, ProjectorSettings(path=qwen35[1]), 1)
        conv, answers, counts = Conversation(), [], []
        conv.attach_media(read_media(pictures["jpeg"]))
        try:
            for i, text in enumerate(turns):
                conv.add_user(text)
                if fresh_last and i == len(turns) - 1:
                    engine.generator.reset()
                answers.append("".join(engine.answer(conv.to_messages(), greedy, max_tokens=8)))
                conv.add_assistant(answers[-1])
                counts.append((engine.stats.n_cached, engine.stats.n_prompt))
        finally:
            engine.close()
            engine.projector.close()
            engine.ctx.close()
            model.close()
        return answers, counts

    turns = [TELL, "Tell me more.", "And the colours?"]
    answers, counts = chat(turns, fresh_last=False)
    started_over, fresh = chat(turns, fresh_last=True)
    assert answers == started_over
    assert fresh[-1][0] == 0
    # Each later turn keeps everything before its previous user message: the image (18 cells) and more.
    assert [n_cached for n_cached, _ in counts] == [0] + [n_prompt - 4 for _, n_prompt in counts[:-1]]
