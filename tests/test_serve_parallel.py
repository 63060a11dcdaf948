"""`pyllama serve --parallel N`: continuous batching across slots, a FIFO queue, per-slot prompt cache."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from pyllama_cli.core.serving.engine import READY
from pyllama_cli.core.serving.jobs import GenerationJob, JobStream
from pyllama_cli.core.serving import arrivals
from pyllama_cli.core.serving.arrivals import ARRIVAL_WAIT_S
from pyllama_cli.core.serving.scheduler import ParallelEngine
from pyllama_cli.core.serving.slots import GENERATING, PREFILL, PaddingTrial
from pyllama_cli.core.generate.sampling import SamplingSettings
from pyllama_cli.core.model.settings import LoadSettings
from tests.test_serve import Server

N_SLOTS = 4
N_CTX = 2048  # shared: 512 tokens per slot
PROMPT = "hello world the"


@pytest.fixture(scope="module")
def pserver(four_slot_server: Server) -> Server:
    """conftest.py's server with N_SLOTS slots and -c N_CTX (test_openai_responses's too)."""
    return four_slot_server


async def _stream_completion(client: httpx.AsyncClient, url: str, prompt: str, max_tokens: int,
                             **extra: object) -> tuple[str, dict]:
    body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}, **extra}
    text, usage = "", {}
    async with client.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as resp:
        assert resp.status_code == 200, await resp.aread()
        async for line in resp.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                data = json.loads(line[6:])
                assert "error" not in data
                if data["choices"]:
                    text += data["choices"][0]["text"]
                usage = data.get("usage") or usage
    return text, usage


def _run_concurrently(url: str, jobs: list[dict]) -> list[tuple[str, dict]]:
    async def main() -> list[tuple[str, dict]]:
        async with httpx.AsyncClient() as client:
            return await asyncio.gather(*[_stream_completion(client, url, **job) for job in jobs])

    return asyncio.run(main())


def _slots(server: Server) -> list[dict]:
    return httpx.get(f"{server.url}/slots", timeout=10).json()


def test_startup_names_the_slots_and_the_per_slot_context(pserver: Server) -> None:
    assert "context 512 tokens per request, chat and completions, 4 slots" in pserver.stderr
    slots = _slots(pserver)
    assert [(s["id"], s["n_ctx"], s["is_processing"]) for s in slots] == [(i, 512, False) for i in range(4)]


def test_eight_concurrent_streams_on_four_slots_all_complete(pserver: Server) -> None:
    results = _run_concurrently(pserver.url, [{"prompt": f"{PROMPT} {i}", "max_tokens": 24, "seed": i}
                                              for i in range(8)])
    assert [usage["completion_tokens"] for _, usage in results] == [24] * 8
    assert all(text for text, _ in results)
    assert all(s["state"] == "idle" for s in _slots(pserver))


def test_greedy_answer_is_the_same_alone_and_beside_three_others(pserver: Server) -> None:
    job = {"prompt": "the quick brown fox", "max_tokens": 20, "seed": 7, "temperature": 0}
    alone = _run_concurrently(pserver.url, [job])[0][0]
    crowd = _run_concurrently(pserver.url, [job] + [{"prompt": f"{PROMPT} {i}", "max_tokens": 30, "seed": i}
                                                    for i in range(3)])
    assert crowd[0][0] == alone


def test_prompt_cache_reuse_is_reported(pserver: Server) -> None:
    long_prompt = " ".join(["hello world the quick brown fox"] * 12)
    first = _run_concurrently(pserver.url, [{"prompt": long_prompt, "max_tokens": 4, "temperature": 0}])[0][1]
    second = _run_concurrently(pserver.url, [{"prompt": long_prompt + " again", "max_tokens": 4,
                                              "temperature": 0}])[0][1]
    n_first = first["prompt_tokens"]
    assert n_first > 60
    assert second["prompt_tokens_details"]["cached_tokens"] >= n_first - 1
    assert second["prompt_tokens"] - second["prompt_tokens_details"]["cached_tokens"] <= 3


def test_cancelled_stream_frees_its_slot(pserver: Server) -> None:
    body = {"prompt": PROMPT, "max_tokens": 480, "stream": True, "ignore_eos": True}
    with httpx.Client() as client, client.stream("POST", f"{pserver.url}/v1/completions", json=body,
                                                 timeout=60) as resp:
        chunks = 0
        for line in resp.iter_lines():
            chunks += line.startswith("data: ")
            if chunks == 3:
                busy = [s for s in _slots(pserver) if s["state"] != "idle"]
                assert len(busy) == 1
                break
    deadline = time.monotonic() + 10
    while any(s["state"] != "idle" for s in _slots(pserver)):
        assert time.monotonic() < deadline, _slots(pserver)
        time.sleep(0.05)
    served = [s for s in _slots(pserver) if s["n_cached"] > 0]
    assert served and max(s["n_cached"] for s in served) < 480


def test_a_prompt_longer_than_a_slot_fails_alone(pserver: Server) -> None:
    too_long = " ".join(["hello"] * 600)
    response = httpx.post(f"{pserver.url}/v1/completions", json={"prompt": too_long, "max_tokens": 4}, timeout=30)
    assert response.status_code == 400
    assert "exceeds the available context size (512 tokens)" in response.json()["error"]["message"]
    ok = _run_concurrently(pserver.url, [{"prompt": PROMPT, "max_tokens": 5}])[0][1]
    assert ok["completion_tokens"] == 5


def test_metrics_count_slots_by_state(pserver: Server) -> None:
    text = httpx.get(f"{pserver.url}/metrics").text
    assert 'pyllama_slots{state="idle"} 4' in text
    assert 'pyllama_slots{state="generating"} 0' in text


@pytest.fixture
def engine(tiny_model: Path) -> Iterator[ParallelEngine]:
    """A loaded engine whose scheduler is not running, so a test can set its slots' states."""
    eng = ParallelEngine(tiny_model, LoadSettings(n_ctx=N_CTX, n_threads=1), n_slots=N_SLOTS)
    eng._load()
    yield eng
    eng._unload()
    eng.model.close()


def _batch_seq_ids(eng: ParallelEngine) -> list[int]:
    raw = eng._batch.raw
    return [raw.seq_id[i][0] for i in range(raw.n_tokens)]


def test_a_short_prompt_rest_is_evaluated_whole_beside_a_long_one(engine: ParallelEngine) -> None:
    # An agent's later turn (a few new tokens after a cached prefix) must not wait behind another
    # conversation's long first prompt: the shortest rest gets its room first, the batch keeps slot order.
    long, short = engine.slots[0], engine.slots[2]
    long.state, long.cached, long.pending = PREFILL, [], [1] + [300] * 2099
    short.state, short.cached, short.pending = PREFILL, [], [1, 400, 401, 402, 403]
    assert engine._build_batch()
    # The step ends the short prompt, so it carries none of the long one: llama_decode returns the short
    # one's first token only when its whole batch is done.
    assert _batch_seq_ids(engine) == [2] * 5
    assert (len(short.pending), len(long.pending)) == (0, 2100)
    assert short.batch_index == 4 and long.batch_index == -1


def test_a_long_prompt_alone_fills_the_batch_and_beside_a_generating_slot_one_ubatch(engine: ParallelEngine) -> None:
    long = engine.slots[0]
    long.state, long.cached, long.pending = PREFILL, [], [1] + [300] * 2099
    assert engine._build_batch()
    assert _batch_seq_ids(engine) == [0] * engine._ctx.n_batch  # no one waits for a token: the whole room
    long.cached, long.pending = [], [1] + [300] * 2099
    talker = engine.slots[1]
    talker.state, talker.last_token, talker.cached = GENERATING, 301, [1, 300]
    assert engine._build_batch()
    assert _batch_seq_ids(engine) == [0] * (engine._ctx.n_ubatch - 1) + [1]  # its next token after one pass


def test_a_step_batch_lists_the_slots_in_sequence_order(engine: ParallelEngine) -> None:
    # Slots 0, 1 and 3 generate while a new request fills slot 2: llama.cpp passes one run of
    # consecutive increasing sequence ids at a time, so slot 2's tokens must sit between 1 and 3.
    for slot in engine.slots:
        slot.state, slot.last_token, slot.cached = GENERATING, 300 + slot.id, [1, 300]
    prefill = engine.slots[2]
    prefill.state, prefill.cached, prefill.pending = PREFILL, [], [1, 400, 401]
    assert engine._build_batch()
    assert _batch_seq_ids(engine) == [0, 1, 2, 2, 2, 3]
    assert [s.batch_index for s in engine.slots] == [0, 1, 4, 5]  # each slot's logits: its last token
    engine._ctx.decode(engine._batch)  # the batch is one llama.cpp accepts


def _job(prompt: list[int]) -> GenerationJob:
    return GenerationJob(prompt=tuple(prompt), sampling=SamplingSettings(seed=1), max_tokens=4)


def _admit(eng: ParallelEngine, prompt: list[int], loop: asyncio.AbstractEventLoop) -> int:
    """Queue a request and let the scheduler assign it; the id of the slot it got."""
    stream = JobStream(_job(prompt), loop)
    eng._queue.append(stream)
    eng._start_all(eng._assign_waiting())
    return next(slot.id for slot in eng.slots if slot.stream is stream)


def test_a_new_request_takes_the_idle_slot_that_leaves_no_gap(engine: ParallelEngine) -> None:
    loop = asyncio.new_event_loop()
    try:
        for slot in engine.slots:
            slot.cached = [1, 400, 401]
        engine.slots[1].state = engine.slots[3].state = GENERATING
        # Slots 0 and 2 cache the prompt equally well; slot 2 makes the busy slots one run (1-3).
        assert _admit(engine, [1, 400, 401, 402], loop) == 2
        engine._release(engine.slots[2])
        # The prompt cache still comes first: slot 0 holds more of this prompt.
        engine.slots[0].cached = [1, 400, 401, 402]
        assert _admit(engine, [1, 400, 401, 402, 403], loop) == 0
    finally:
        loop.close()


def test_padding_is_tried_both_ways_then_the_faster_is_kept() -> None:
    trial = PaddingTrial()
    choices = []
    for _ in range(2 * PaddingTrial.TRIALS):
        padded = trial.choose()
        choices.append(padded)
        trial.record(padded, 0.008 if padded else 0.010)
    assert choices == [False, True] * PaddingTrial.TRIALS
    assert trial.decision is True and trial.choose() is True
    slower = PaddingTrial()
    for _ in range(2 * PaddingTrial.TRIALS):
        padded = slower.choose()
        slower.record(padded, 0.012 if padded else 0.010)
    assert slower.decision is False and slower.choose() is False


def test_a_three_token_step_is_padded_through_an_idle_slot_that_keeps_its_cache(engine: ParallelEngine) -> None:
    from pyllama_cli.core.model.native import lib

    # Every slot holds two tokens; slots 0, 1 and 3 generate, slot 2 is idle between requests.
    batch = engine._batch
    batch.clear()
    for slot in engine.slots:
        for pos, token in enumerate([1, 300 + slot.id]):
            batch.add(token, pos, (slot.id,), False)
        slot.cached = [1, 300 + slot.id]
    engine._ctx.decode(batch)
    for slot in engine.slots:
        if slot.id != 2:
            slot.state, slot.last_token = GENERATING, 400
    engine._padding.decision = True
    assert engine._build_batch()
    raw = engine._batch.raw
    assert _batch_seq_ids(engine) == [0, 1, 2, 3]  # one run of sequences: one pass
    assert [bool(raw.logits[i]) for i in range(4)] == [True, True, False, True]  # no output for the filler
    engine._decode_and_sample()
    memory = engine._ctx.memory
    assert [lib.llama_memory_seq_pos_max(memory, s) for s in range(N_SLOTS)] == [2, 2, 1, 2]
    assert engine.slots[2].cached == [1, 302]


def _schedule_in_thread(eng: ParallelEngine) -> tuple[threading.Thread, list[float]]:
    """What the scheduler does at the top of a step (admit, then wait for arrivals), in a thread;
    the list gets the perf_counter time at which the step ended."""
    ended: list[float] = []

    def step() -> None:
        with eng._cond:
            starting = eng._assign_waiting() + eng._wait_for_arrivals()
        eng._start_all(starting)
        ended.append(time.perf_counter())

    thread = threading.Thread(target=step, daemon=True)
    thread.start()
    return thread, ended


def _until_the_step_waits(eng: ParallelEngine, thread: threading.Thread) -> None:
    """Return once the step has admitted the queued request and released the condition to wait for arrivals.
    The step holds the condition from its start until it waits, so holding it here with a slot in PREFILL
    means the step is inside its wait, or over already: then it did not wait, and that is the failure."""
    deadline = time.monotonic() + 30
    while True:
        with eng._cond:
            if any(s.state == PREFILL for s in eng.slots):
                assert thread.is_alive(), "the step did not wait for the request still arriving"
                return
        assert time.monotonic() < deadline, "the step never admitted the queued request"
        time.sleep(0.001)


def test_requests_that_arrive_together_start_in_the_same_step(engine: ParallelEngine,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # Timed with the real 3 ms window this failed on a loaded machine, where B's parsing (or the step's
    # thread start) alone can take longer. With a 10 s window B surely submits inside it, while the step
    # is seen waiting; the step must then end at B's submit, long before the window's end.
    monkeypatch.setattr(arrivals, "ARRIVAL_WAIT_S", 10.0)
    engine.state = READY

    async def scenario() -> None:
        engine.submit(_job([1, 400]))  # A
        thread, took = _schedule_in_thread(engine)
        with engine.arriving():  # B reached the server and is still being parsed when a step begins
            started = time.perf_counter()
            thread, ended = _schedule_in_thread(engine)
            await asyncio.to_thread(_until_the_step_waits, engine, thread)
            engine.submit(_job([1, 500]))
            await asyncio.to_thread(thread.join, 30)
        assert not thread.is_alive() and ended[0] - started < 5  # B's submit ended the wait

    asyncio.run(scenario())
    assert sorted(s.pending[-1] for s in engine.slots if s.state == PREFILL) == [400, 500]
    assert len(engine._arrivals) == 0


def test_a_step_waits_the_arrival_window_for_a_request_that_never_comes(engine: ParallelEngine,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    assert 0 < ARRIVAL_WAIT_S <= 0.01  # the real window costs a lone request a few milliseconds at most
    # A wider window, measured from before the arrival: the step may not end before it (exact, whatever
    # the load) and must end soon after it (the slack covers a thread's wake-up on a loaded machine).
    window = 0.2
    monkeypatch.setattr(arrivals, "ARRIVAL_WAIT_S", window)
    engine.state = READY

    async def scenario() -> tuple[float, float]:
        engine.submit(_job([1, 400]))
        started = time.perf_counter()
        with engine.arriving():  # a request that will fail before its submit
            thread, ended = _schedule_in_thread(engine)
            await asyncio.to_thread(thread.join, 30)
            assert not thread.is_alive(), "the step waits past the window"
        return started, ended[0]

    started, ended = asyncio.run(scenario())
    assert window <= ended - started < window + 5
    assert [s.state for s in engine.slots].count(PREFILL) == 1


def test_a_request_that_fails_before_its_submit_is_no_longer_awaited(engine: ParallelEngine) -> None:
    with pytest.raises(ValueError), engine.arriving():
        assert len(engine._arrivals) == 1
        raise ValueError("a bad request")
    assert len(engine._arrivals) == 0


def test_a_memory_that_cannot_drop_the_filler_alone_forgets_that_slot_and_stops_padding(
        engine: ParallelEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    # A recurrent model's memory refuses to remove part of a sequence (llama_memory_seq_rm -> false).
    calls: list[tuple[int, int, int]] = []
    monkeypatch.setattr(engine._ctx, "remove_tokens",
                        lambda seq, start, end=-1: calls.append((seq, start, end)) or start == 0)
    slot = engine.slots[2]
    slot.cached = [1, 302]
    engine._padding.unpad(engine._ctx, slot, 2)
    assert calls == [(2, 2, -1), (2, 0, -1)]
    assert slot.cached == [] and engine._padding.decision is False
