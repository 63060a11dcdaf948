"""`serve` answers greedy requests with llama-server's tokens, and reuses its cache as llama-server does.

Each model runs under llama-server (from LLAMA_CPP_BIN) and `pyllama serve` with the same flags; the
same requests go to both in the same order. At temperature 0 two answers agree only while both
evaluate the prompt in the same batches; and the tokens each reused from its cache (timings.cache_n)
show the same reuse: a whole prefix, a context checkpoint's (a sliding-window model), or nothing.

The chats run in sequence on one slot: each is asked after the previous chat used the slot, then
again (the same request twice), then without its cache (`cache_prompt: false`, as on a fresh server);
the first chat comes back at the end, after all the others (llama-server then restores it from its
prompt cache, --cache-ram).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.fixtures.make_gguf import TINY, WIDE, WIDE_SWA, write_llama_gguf
from tests.helpers import free_port, post_json

pytestmark = pytest.mark.reference

BIN = os.environ.get("LLAMA_CPP_BIN")
LLAMA_SERVER = Path(BIN) / "llama-server" if BIN else None
pytestmark = [pytest.mark.reference,
              pytest.mark.skipif(LLAMA_SERVER is None or not LLAMA_SERVER.is_file(),
                                 reason="set LLAMA_CPP_BIN to a folder with llama-server")]

SPECS = {"wide-swa": WIDE_SWA, "wide": WIDE, "tiny": TINY}
WORDS = ("the quick brown fox jumps over a lazy dog hello world what is your name please tell me "
         "a story once upon a time there was small large number first second last new old").split()
N_PREDICT = 8


def _chats(n: int, seed: int = 41) -> list[list[dict[str, str]]]:
    """`n` chats of 2 to 4 user turns, a system message first; some share their system message
    (so a later chat reuses part of an earlier one's cache)."""
    rng = random.Random(seed)

    def text(lo: int, hi: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))

    systems = [text(3, 6) for _ in range(3)]
    chats = []
    for i in range(n):
        messages = [{"role": "system", "content": systems[i % 3]}]
        turns = 2 + i % 3
        for turn in range(turns):
            messages.append({"role": "user", "content": text(3, 10)})
            if turn < turns - 1:
                messages.append({"role": "assistant", "content": text(2, 8)})
        chats.append(messages)
    return chats


CHATS = _chats(20)


def _llama_server(model: Path, log: Path, np: int, *flags: str) -> tuple[subprocess.Popen, str]:
    """llama-server with -c 2048 -t 1 -np `np` and `flags` (a later -c wins), once it answers /health."""
    port = free_port()
    with open(log, "wb") as sink:
        proc = subprocess.Popen([str(LLAMA_SERVER), "-m", str(model), "-c", "2048", "-t", "1", "-np", str(np), *flags,
                                 "--host", "127.0.0.1", "--port", str(port)], stdout=sink, stderr=sink)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                if answer.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.1)
    proc.terminate()
    proc.wait(timeout=15)
    pytest.fail("llama-server did not start:\n" + log.read_text(errors="replace")[-2000:])


def _servers(model: Path, folder: Path, np: int) -> Iterator[tuple[str, str]]:
    """(llama-server's URL, pyllama serve's URL), both with -np `np` -c 2048 -t 1."""
    from tests.test_serve import spawn_serve

    proc, theirs = _llama_server(model, folder / "llama-server.log", np)
    try:
        ours = spawn_serve(folder / "serve.log", ["-m", str(model), "-c", "2048", "-np", str(np)])
    except BaseException:
        proc.terminate()
        proc.wait(timeout=15)
        raise
    try:
        yield theirs, ours.url
    finally:
        ours.stop()
        proc.terminate()
        proc.wait(timeout=15)


@pytest.fixture(scope="module", params=list(SPECS))
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str]]:
    """(llama-server's URL, serve's URL, the model's preset name), one slot each."""
    folder = tmp_path_factory.mktemp(f"fidelity-{request.param}")
    model = write_llama_gguf(folder / f"{request.param}.gguf", SPECS[request.param])
    for theirs, ours in _servers(model, folder, 1):
        yield theirs, ours, request.param


def _chat(url: str, messages: list[dict[str, str]], cache: bool = True) -> tuple[str, int]:
    """The greedy answer's text and how many prompt tokens came from the cache."""
    body = {"messages": messages, "max_tokens": N_PREDICT, "temperature": 0, "cache_prompt": cache}
    answer = post_json(f"{url}/v1/chat/completions", body, timeout=120)
    return answer["choices"][0]["message"]["content"], answer["timings"]["cache_n"]


def _complete(url: str, prompt: str, cache: bool = True) -> tuple[list[int], int]:
    body = {"prompt": prompt, "n_predict": N_PREDICT, "temperature": 0, "cache_prompt": cache, "return_tokens": True}
    answer = post_json(f"{url}/completion", body, timeout=120)
    return answer["tokens"], answer["timings"]["cache_n"]


def test_chats_answer_as_llama_server_fresh_repeated_and_after_another_chat(served: tuple[str, str, str]) -> None:
    theirs, ours, name = served
    # After the previous chat the answers agree, and so does the reuse on the sliding-window model (its
    # states are swapped by llama-server's rules: cache/sequence_states.py); --cache-ram's routes for the
    # other models pick the longest cached prefix, which is not always the entry llama-server picks.
    for i, messages in enumerate([*CHATS, CHATS[0]]):
        expected, got = _chat(theirs, messages), _chat(ours, messages)
        assert got[0] == expected[0], i
        if name == "wide-swa":
            assert got[1] == expected[1], i
        for cache in (True, False):  # the same again; as on a fresh server
            expected_reuse = _chat(theirs, messages, cache)
            assert _chat(ours, messages, cache) == expected_reuse, (i, cache)


def test_completion_answers_as_llama_server_fresh_and_repeated(served: tuple[str, str, str]) -> None:
    theirs, ours, _ = served
    for i, messages in enumerate(CHATS[:6]):
        prompt = post_json(f"{theirs}/apply-template", {"messages": messages}, timeout=120)["prompt"]
        for cache in (False, True, True):
            expected = _complete(theirs, prompt, cache)
            assert _complete(ours, prompt, cache) == expected, (i, cache)


@pytest.fixture(scope="module")
def served_parallel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    folder = tmp_path_factory.mktemp("fidelity-np4")
    yield from _servers(write_llama_gguf(folder / "wide-swa.gguf", WIDE_SWA), folder, 4)


def test_four_concurrent_chats_answer_as_llama_server_with_four_slots(served_parallel: tuple[str, str]) -> None:
    # Answers only: which slot (and cached prefix) a request gets depends on when each server reads it
    # (llama-server may finish one chat before it reads the next; serve starts requests that arrive
    # together in the same step).
    theirs, ours = served_parallel
    for round_ in range(3):  # fresh slots, then each chat again (its own slot's cache), then the next four
        chats = CHATS[4 * (round_ // 2):4 * (round_ // 2) + 4]
        with ThreadPoolExecutor(4) as pool:
            expected = [answer[0] for answer in pool.map(lambda m: _chat(theirs, m), chats)]
            got = [answer[0] for answer in pool.map(lambda m: _chat(ours, m), chats)]
        assert got == expected, round_


def _stream_chunks(url: str, prompt: str) -> list[tuple[list[int], int, str]]:
    body = {"prompt": prompt, "n_predict": N_PREDICT, "temperature": 0, "stream": True, "cache_prompt": False}
    request = urllib.request.Request(f"{url}/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as answer:
        lines = answer.read().decode().splitlines()
    chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: ") and line[6:] != "[DONE]"]
    return [(c["tokens"], c["tokens_predicted"], c["content"]) for c in chunks]


def test_streamed_completions_send_llama_server_s_chunks(served: tuple[str, str, str]) -> None:
    # An answer that ends with the end-of-generation token sends it in a chunk of its own, and counts it.
    theirs, ours, _ = served
    for i, messages in enumerate(CHATS[:3]):
        prompt = post_json(f"{theirs}/apply-template", {"messages": messages}, timeout=120)["prompt"]
        assert _stream_chunks(ours, prompt) == _stream_chunks(theirs, prompt), i
