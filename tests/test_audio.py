"""Audio through a projector: complete --audio, chat's /audio, serve's input_audio, and pyllama info.

The fixture projector (tests/fixtures/make_audio_proj.py) is Ultravox's type with random weights. libmtmd
pads a clip to 30 s chunks of which each becomes 50 embeddings, so a clip of under 30 s takes 50 tokens
and one of 31 s takes 100. The text model is the tiny one; a sine with seeded noise is the sound.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.fixtures.make_audio_proj import AudioProjectorSpec, flac_bytes, wav_bytes, write_audio_proj_gguf
from tests.helpers import run_cli
from tests.test_multimodal import images, mmproj  # noqa: F401 - the fixtures
from tests.test_serve import Server, _start

QUESTION = "What do you hear?"
ASK = ("--chat", "-p", QUESTION, "-n", "8", "--temp", "0", "-c", "1024")
CHAT_TURN_TOKENS = 23  # the ChatML turn around QUESTION, without the clip


@pytest.fixture(scope="session")
def audio_proj(models_dir: Path) -> Path:
    return write_audio_proj_gguf(models_dir / "mmproj-audio-tiny.gguf")


@pytest.fixture(scope="session")
def clips(models_dir: Path) -> dict[str, Path]:
    """A 1 s clip at 16 kHz, a 2 s one at 44.1 kHz (libmtmd resamples it), and one of 31 s (two chunks)."""
    files = {"short": ("a.wav", 1.0, 440.0, 16000, 0), "resampled": ("b.wav", 2.0, 1000.0, 44100, 1),
             "long": ("c.wav", 31.0, 220.0, 16000, 2)}
    out = {}
    for key, (name, seconds, freq, rate, seed) in files.items():
        out[key] = models_dir / name
        out[key].write_bytes(wav_bytes(seconds, freq, rate, seed))
    return out


@pytest.fixture(scope="session")
def flac_clip(models_dir: Path) -> Path:
    """The short clip's samples as FLAC (stored uncompressed): lossless, so it answers as the WAV does."""
    path = models_dir / "a.flac"
    path.write_bytes(flac_bytes(1.0, 440.0, 16000, 0))
    return path


def complete(model: Path, projector: Path, *flags: str):
    return run_cli("complete", "-m", str(model), "--mmproj", str(projector), *flags)


def prompt_tokens(stderr: str) -> int:
    return int(re.search(r'"prompt_tokens": (\d+)', stderr).group(1))


@pytest.fixture(scope="session")
def expected(tiny_model: Path, audio_proj: Path, clips: dict[str, Path]) -> dict[str, tuple[str, int]]:
    """complete --chat --audio's text and prompt tokens for each clip."""
    out = {}
    for kind, clip in clips.items():
        result = complete(tiny_model, audio_proj, "--audio", str(clip), *ASK, "--json")
        assert result.exit_code == 0, result.stderr
        out[kind] = result.stdout, prompt_tokens(result.stderr)
    return out


def test_each_clip_gives_its_own_answer_and_50_tokens_a_chunk(expected: dict[str, tuple[str, int]]) -> None:
    per_chunk = AudioProjectorSpec().n_tokens_per_chunk
    assert per_chunk == 50
    assert {kind: tokens for kind, (_, tokens) in expected.items()} == {
        "short": CHAT_TURN_TOKENS + per_chunk, "resampled": CHAT_TURN_TOKENS + per_chunk,
        "long": CHAT_TURN_TOKENS + 2 * per_chunk}
    assert len({text for text, _ in expected.values()}) == 3, expected


def test_flac_answers_as_the_wav_of_its_samples(tiny_model: Path, audio_proj: Path, flac_clip: Path,
                                                expected: dict[str, tuple[str, int]]) -> None:
    result = complete(tiny_model, audio_proj, "--audio", str(flac_clip), *ASK, "--json")
    assert result.exit_code == 0, result.stderr
    assert (result.stdout, prompt_tokens(result.stderr)) == expected["short"]


def test_audio_to_an_image_projector_is_one_error(tiny_model: Path, mmproj: Path,  # noqa: F811
                                                  clips: dict[str, Path]) -> None:
    result = complete(tiny_model, mmproj, "--audio", str(clips["short"]), *ASK)
    assert result.exit_code != 0
    assert result.stderr.splitlines()[:2] == ["Error: the projector mmproj-tiny.gguf does not take audio",
                                              "Hint: send images only"]


def test_image_to_an_audio_projector_is_one_error(tiny_model: Path, audio_proj: Path,
                                                  images: dict[str, Path]) -> None:  # noqa: F811
    result = complete(tiny_model, audio_proj, "--image", str(images["png"]), *ASK)
    assert result.exit_code != 0
    assert result.stderr.splitlines()[:2] == ["Error: the projector mmproj-audio-tiny.gguf does not take images",
                                              "Hint: send audio only"]


def test_cut_wav_is_one_error(tiny_model: Path, audio_proj: Path, clips: dict[str, Path], tmp_path: Path) -> None:
    cut = tmp_path / "cut.wav"
    cut.write_bytes(clips["short"].read_bytes()[:40])  # the RIFF header, no samples
    result = complete(tiny_model, audio_proj, "--audio", str(cut), *ASK)
    assert result.exit_code != 0
    assert result.stderr.splitlines()[0] == f"Error: {cut} could not be decoded as a WAV audio"
    assert "Traceback" not in result.stderr


def test_info_says_the_projector_takes_audio(audio_proj: Path) -> None:
    result = run_cli("info", "-m", str(audio_proj))
    assert result.exit_code == 0, result.stderr
    lines = [line.strip() for line in result.stdout.splitlines()]
    start = lines.index("Projector")
    assert lines[start + 1:start + 5] == ["type                  ultravox", "accepts               audio",
                                          "encoder width         64", "projection dim        256"]
    data = json.loads(run_cli("info", "-m", str(audio_proj), "--json").stdout)
    assert data["projector"] == {"type": "ultravox", "accepts": ["audio"], "image_size": None, "patch_size": None,
                                 "embedding_length": 64, "projection_dim": 256}


def test_chat_audio_then_a_question_answers_as_complete_audio(tiny_model: Path, audio_proj: Path,
                                                               clips: dict[str, Path],
                                                               expected: dict[str, tuple[str, int]]) -> None:
    stdin = f"/audio {clips['short']}\n{QUESTION}\n"
    result = run_cli("chat", "-m", str(tiny_model), "--mmproj", str(audio_proj), "-n", "8", "--temp", "0",
                     "-c", "1024", stdin=stdin)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.split("\n\n")[0] == expected["short"][0]
    assert f"Attached '{clips['short']}' (WAV); it goes with your next message." in result.stderr


@pytest.mark.parametrize("projector", ["image-only", "none"])
def test_chat_refuses_a_clip_it_cannot_hear_when_attached(tiny_model: Path, mmproj: Path,  # noqa: F811
                                                          clips: dict[str, Path], projector: str) -> None:
    flags = ["--mmproj", str(mmproj)] if projector == "image-only" else []
    result = run_cli("chat", "-m", str(tiny_model), *flags, "-n", "4", "-c", "512",
                     stdin=f"/audio {clips['short']}\n")
    assert result.exit_code == 1  # a script feeding stdin learns that a command failed
    assert "Attached" not in result.stderr
    line = {"image-only": "Error: the projector mmproj-tiny.gguf does not take audio",
            "none": "Error: this model cannot hear audio: there is no projector"}[projector]
    assert line in result.stderr.splitlines()


def test_chat_audio_on_a_terminal(tiny_model: Path, audio_proj: Path, clips: dict[str, Path],
                                  expected: dict[str, tuple[str, int]]) -> None:
    """In a pty (prompt-toolkit's front end): /audio, then the question, answers as complete --audio."""
    from tests.fixtures.terminal import Terminal

    term = Terminal("chat", "-m", str(tiny_model), "--mmproj", str(audio_proj), "-n", "8", "--temp", "0",
                    "-c", "1024", "-t", "1", "--no-history", "--plain")
    try:
        start = term.wait_for("> ", after=term.wait_for("/exit quits"))
        term.type(f"/audio {clips['short']}\r")
        start = term.wait_for("it goes with your next message.", after=start)
        term.type(f"{QUESTION}\r")
        start = term.wait_for(expected["short"][0], after=start)
        term.wait_for("> ", after=start)
        term.type("\x04")
        assert term.close() == 0, term.seen[-500:]
    finally:
        term.proc.kill()


# --- serve -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hearing(tiny_model: Path, audio_proj: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = _start(tiny_model, tmp_path_factory.mktemp("serve-audio") / "stderr.log", "--mmproj", str(audio_proj),
                 "-c", "256")  # the 31 s clip's 123 tokens fit, 5 clips of 50 do not
    yield srv
    srv.stop()


def audio_part(clip: Path) -> dict:
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(clip.read_bytes()).decode(),
                                                   "format": clip.suffix[1:]}}


def ask(part: dict) -> list[dict]:
    return [{"role": "user", "content": [part, {"type": "text", "text": QUESTION}]}]


@pytest.mark.parametrize("kind", ["short", "resampled", "long", "flac"])
def test_openai_input_audio_gives_complete_audios_text(hearing: Server, clips: dict[str, Path], flac_clip: Path,
                                                       expected: dict[str, tuple[str, int]], kind: str) -> None:
    clip = flac_clip if kind == "flac" else clips[kind]
    answer = hearing.client().chat.completions.create(model="any", messages=ask(audio_part(clip)),
                                                      max_tokens=8, temperature=0)
    assert (answer.choices[0].message.content, answer.usage.prompt_tokens) == expected[
        "short" if kind == "flac" else kind]


def test_completion_multimodal_data_takes_audio(hearing: Server, tiny_model: Path, audio_proj: Path,
                                                clips: dict[str, Path]) -> None:
    """llama-server's /completion: a clip in multimodal_data goes where the prompt's marker is."""
    prompt = "<__media__>The sound is"
    body = {"prompt": {"prompt_string": prompt,
                       "multimodal_data": [base64.b64encode(clips["short"].read_bytes()).decode()]},
            "n_predict": 8, "temperature": 0}
    answer = httpx.post(f"{hearing.url}/completion", json=body, timeout=60).json()
    local = complete(tiny_model, audio_proj, "--audio", str(clips["short"]), "-p", prompt, "-n", "8", "--temp", "0",
                     "-c", "1024", "--json")
    assert local.exit_code == 0, local.stderr
    assert (answer["content"], answer["tokens_evaluated"]) == (local.stdout, prompt_tokens(local.stderr))


def test_props_and_models_report_audio(hearing: Server) -> None:
    assert httpx.get(f"{hearing.url}/props", timeout=30).json()["modalities"] == {"vision": False, "audio": True}
    card = httpx.get(f"{hearing.url}/v1/models", timeout=30).json()["data"][0]
    assert card["meta"]["modalities"] == {"vision": False, "audio": True}


def test_image_to_an_audio_projector_is_a_400(hearing: Server, images: dict[str, Path]) -> None:  # noqa: F811
    url = f"data:image/png;base64,{base64.b64encode(images['png'].read_bytes()).decode()}"
    with pytest.raises(openai.BadRequestError) as caught:
        hearing.client().chat.completions.create(
            model="any", messages=ask({"type": "image_url", "image_url": {"url": url}}), max_tokens=4)
    error = caught.value.body
    assert (error["message"], error["type"]) == ("the projector mmproj-audio-tiny.gguf does not take images",
                                                 "invalid_request_error")


@pytest.mark.parametrize(("kind", "message"), [
    ("text", "messages[0].content[0] is not an image or audio format that can be read (it starts with b'hello wo'); "
             "send a PNG, JPEG, GIF or BMP image, or a WAV, MP3 or FLAC clip"),
    ("cut", "messages[0].content[0] could not be decoded as a WAV audio"),
])
def test_input_audio_that_is_not_audio_is_a_400(hearing: Server, clips: dict[str, Path], kind: str,
                                                message: str) -> None:
    data = b"hello world" if kind == "text" else clips["short"].read_bytes()[:40]  # cut: the header, no samples
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": "wav"}}
    response = httpx.post(f"{hearing.url}/v1/chat/completions", json={"messages": ask(part), "max_tokens": 4},
                          timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["message"] == message
    assert hearing.proc.poll() is None


def test_audio_tokens_count_against_the_context(hearing: Server, clips: dict[str, Path]) -> None:
    """5 clips of 50 tokens each do not fit a 256-token context: the usual context error, a 400."""
    messages = [{"role": "user", "content": [audio_part(clips["short"])] * 5 + [{"type": "text", "text": QUESTION}]}]
    response = httpx.post(f"{hearing.url}/v1/chat/completions", json={"messages": messages, "max_tokens": 4},
                          timeout=60)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["message"].startswith("the request (273 tokens) exceeds the available context size")


def test_input_tokens_counts_a_long_clips_two_chunks(hearing: Server, clips: dict[str, Path],
                                                     expected: dict[str, tuple[str, int]]) -> None:
    """/v1/chat/completions/input_tokens counts a clip as the generating route does (31 s: two chunks)."""
    counted = httpx.post(f"{hearing.url}/v1/chat/completions/input_tokens",
                         json={"messages": ask(audio_part(clips["long"]))}, timeout=30)
    assert counted.json() == {"input_tokens": expected["long"][1], "object": "response.input_tokens"}
    assert expected["long"][1] == CHAT_TURN_TOKENS + 100


def test_a_long_clip_reused_from_the_cache_answers_as_complete(hearing: Server, tiny_model: Path,
                                                                audio_proj: Path, clips: dict[str, Path]) -> None:
    """The second request shares the first one's clip (two chunks of one content id): the slot keeps the
    clip's embeddings and evaluates only the new text, and the answer is complete's for that question."""
    client = hearing.client()
    client.chat.completions.create(model="any", messages=ask(audio_part(clips["long"])), max_tokens=2, temperature=0)
    other = "Is it loud?"
    messages = [{"role": "user", "content": [audio_part(clips["long"]), {"type": "text", "text": other}]}]
    answer = client.chat.completions.create(model="any", messages=messages, max_tokens=8, temperature=0)
    local = complete(tiny_model, audio_proj, "--audio", str(clips["long"]), "--chat", "-p", other, "-n", "8",
                     "--temp", "0", "-c", "1024")
    assert local.exit_code == 0, local.stderr
    assert answer.choices[0].message.content == local.stdout
    assert answer.usage.prompt_tokens_details.cached_tokens >= 100  # at least the clip's two chunks
