"""A sliding-window model's prompts are evaluated in llama-server's batches, with its context checkpoints,
and a repeated request reuses what llama-server reuses (tests/test_serve_fidelity.py compares with a live
llama-server; these hold the same facts without one)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from pyllama_cli.core.generate.sampling import SamplingSettings
from pyllama_cli.core.model.settings import LoadSettings
from pyllama_cli.core.serving.cache.settings import CacheSettings
from pyllama_cli.core.generate.context_checkpoints import user_start_marker
from pyllama_cli.core.serving.jobs import GenerationJob, JobStream
from pyllama_cli.core.serving.scheduler import ParallelEngine
from pyllama_cli.core.serving.slots import PREFILL
from tests.fixtures.make_gguf import IM_START_ID, TINY, WIDE_SWA, write_llama_gguf
from tests.test_serve import Server, _start

PROMPT = tuple(range(300, 344))  # 44 tokens: shorter than the 96-token window


@pytest.fixture(scope="module")
def swa_model(models_dir: Path) -> Path:
    return write_llama_gguf(models_dir / "wide-swa.gguf", WIDE_SWA)


def _engine(model: Path) -> ParallelEngine:
    engine = ParallelEngine(model, LoadSettings(n_ctx=512, n_threads=1), n_slots=1)
    engine._load()
    return engine


@pytest.fixture
def engine(swa_model: Path) -> Iterator[ParallelEngine]:
    """A loaded engine whose scheduler is not running, so a test can step it."""
    eng = _engine(swa_model)
    yield eng
    eng._unload()
    eng.model.close()


def _prefill(engine: ParallelEngine, job: GenerationJob) -> list[int]:
    """Queue `job`, run the steps of its prompt, and return each step's batch size."""
    loop = asyncio.new_event_loop()
    try:
        engine._queue.append(JobStream(job, loop))
        engine._start_all(engine._assign_waiting())
        sizes = []
        while engine.slots[0].state == PREFILL:
            assert engine._build_batch()
            sizes.append(engine._batch.n_tokens)
            engine._decode_and_sample()
        engine._outbox.clear()
        return sizes
    finally:
        loop.close()


def _saved(engine: ParallelEngine) -> list[tuple[int, int, int]]:
    assert engine._checkpoints.active
    return [(c.n_tokens, c.pos_min, c.pos_max) for c in engine._checkpoints.slots[0].saved]


def test_a_prompt_ends_with_a_batch_of_its_last_four_tokens_after_a_checkpoint(engine: ParallelEngine) -> None:
    job = GenerationJob(prompt=PROMPT, sampling=SamplingSettings(temperature=0), max_tokens=2)
    assert _prefill(engine, job) == [40, 4]
    assert _saved(engine) == [(40, 0, 39)]


def test_a_chat_prompt_breaks_at_its_user_messages_as_llama_server_does(engine: ParallelEngine) -> None:
    # The first user message ends the first batch (no checkpoint yet: nothing evaluated); the last one
    # gets a checkpoint, and so does the batch of the last four tokens.
    job = GenerationJob(prompt=PROMPT, sampling=SamplingSettings(temperature=0), max_tokens=2, user_starts=(10, 30))
    assert _prefill(engine, job) == [10, 20, 10, 4]
    assert _saved(engine) == [(10, 0, 9), (30, 0, 29), (40, 0, 39)]


def test_a_model_without_a_window_evaluates_a_prompt_in_one_batch(models_dir: Path) -> None:
    engine = _engine(write_llama_gguf(models_dir / "tiny-ckpt.gguf", TINY))
    try:
        job = GenerationJob(prompt=PROMPT, sampling=SamplingSettings(temperature=0), max_tokens=2, user_starts=(10,))
        assert _prefill(engine, job) == [44]
        assert not engine._checkpoints.active
    finally:
        engine._unload()
        engine.model.close()


@pytest.fixture(scope="module")
def swa_server(swa_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = _start(swa_model, tmp_path_factory.mktemp("serve-swa") / "stderr.log", "-c", "1024")
    yield srv
    srv.stop()


@pytest.mark.parametrize(("first", "n_prompt", "reused"), [(300, 44, 39), (2000, 120, 119)])
def test_a_repeated_request_reuses_the_checkpoint_or_the_whole_prefix(swa_server: Server, first: int, n_prompt: int,
                                                                       reused: int) -> None:
    # Within the window the cells kept may not cover the prefix: llama-server restores the checkpoint
    # saved before the last four tokens (less one position). Past it, the whole prefix less one token.
    body = {"prompt": list(range(first, first + n_prompt)), "n_predict": 2, "temperature": 0}
    cached = [httpx.post(f"{swa_server.url}/completion", json=body, timeout=60).json()["timings"]["cache_n"]
              for _ in range(2)]
    assert cached == [0, reused]


def _chatml(messages: list[dict[str, str]]) -> str:
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


def _llama3(messages: list[dict[str, str]]) -> str:
    if not messages:
        raise ValueError("a chat needs a message")  # as templates that index messages[0] fail
    return "<|begin_of_text|>" + "".join(f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n{m['content']}<|eot_id|>"
                                         for m in messages)


@pytest.mark.parametrize(("render", "marker"), [(_chatml, "<|im_start|>user"),
                                                (_llama3, "<|start_header_id|>user<|end_header_id|>")])
def test_the_user_marker_is_what_a_template_writes_before_a_user_message(render, marker: str) -> None:
    assert user_start_marker(render) == marker


def test_a_rendered_chat_s_user_messages_start_at_their_marker(engine: ParallelEngine) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello world"},
                {"role": "assistant", "content": "yes"}, {"role": "user", "content": "tell me a story"}]
    ids = engine.tokenize(engine.render_chat(messages))
    starts = engine.user_starts(ids)
    assert len(starts) == 2
    assert [ids[i] for i in starts] == [IM_START_ID, IM_START_ID]
    marker = engine.tokenize("<|im_start|>user", add_special=False)
    assert [ids[i:i + len(marker)] for i in starts] == [marker, marker]
    assert ids[0] == 1 and ids[1] == IM_START_ID and 1 not in starts  # BOS, then the system message's start


def test_without_checkpoints_a_prompt_is_one_batch_and_a_repeat_evaluates_it_again(swa_model: Path) -> None:
    # llama-server -ctxcp 0: no batch of its own for the last tokens, nothing to restore.
    engine = ParallelEngine(swa_model, LoadSettings(n_ctx=512, n_threads=1), n_slots=1,
                            prompt_cache=CacheSettings(ctx_checkpoints=0))
    engine._load()
    try:
        job = GenerationJob(prompt=PROMPT, sampling=SamplingSettings(temperature=0), max_tokens=2, user_starts=(10,))
        assert _prefill(engine, job) == [44]
        engine._finish(engine.slots[0], "stop")
        engine._outbox.clear()
        assert _prefill(engine, job) == [44]
    finally:
        engine._unload()
        engine.model.close()


def test_a_conversation_that_comes_back_after_another_gets_its_state_back(swa_server: Server) -> None:
    # llama-server's prompt cache: B's request saves A's state (with its checkpoints) and A's takes it
    # back, then restores A's last checkpoint, as a repeat does.
    a, b = list(range(4000, 4044)), list(range(5000, 5044))
    cached = [httpx.post(f"{swa_server.url}/completion", json={"prompt": p, "n_predict": 2, "temperature": 0},
                         timeout=60).json()["timings"]["cache_n"] for p in (a, b, a)]
    assert cached == [0, 0, 39]
