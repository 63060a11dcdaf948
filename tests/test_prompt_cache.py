"""The prompt cache across slots (--cache-ram, --cache-disk): what a slot computed comes back for the
next request that starts with it, and never for one that differs before the restored length."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.cache_replay import APIS, replay_sync
from tests.fixtures.make_gguf import TINY, write_llama_gguf
from tests.helpers import run_cli
from tests.test_serve import Server, spawn_serve

N_CTX = "2048"  # 1024 tokens per slot


def _serve(model: Path, log: Path, *args: str) -> Server:
    return spawn_serve(log, ["-m", str(model), *([] if "-c" in args else ["-c", N_CTX]), "-np", "2", *args])


@pytest.fixture(scope="module")
def off(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = _serve(tiny_model, tmp_path_factory.mktemp("cache-off") / "stderr.log", "--cache-ram", "0")
    yield srv
    srv.stop()


def _tokens(srv: Server, text: str) -> list[int]:
    return httpx.post(f"{srv.url}/tokenize", json={"content": text}, timeout=30).json()["tokens"]


def _complete(srv: Server, prompt: list[int], n: int = 6) -> dict:
    body = {"prompt": prompt, "n_predict": n, "temperature": 0, "return_tokens": True, "cache_prompt": True}
    response = httpx.post(f"{srv.url}/completion", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def _routes(srv: Server) -> dict[str, int]:
    text = httpx.get(f"{srv.url}/metrics", timeout=10).text
    return {m[0]: int(m[1]) for m in re.findall(r'^pyllama_prompt_cache_requests_total\{route="(\w+)"\} (\d+)$',
                                                  text, re.M)}


def _text(i: int, n: int = 40) -> str:
    return " ".join(f"line{i} {k} of the tool list" for k in range(n))


def _fill_both_slots(srv: Server, *prompts: list[int]) -> None:
    for prompt in prompts:
        _complete(srv, prompt, 2)


def test_a_prefix_pushed_out_of_its_slot_comes_back_from_ram(on: Server, off: Server) -> None:
    a, b, c = _tokens(on, _text(1)), _tokens(on, _text(2)), _tokens(on, _text(3))
    first = _complete(on, a)
    _fill_both_slots(on, b, c)  # both slots now hold b and c: a lives in RAM only
    before = _routes(on)
    extra = _tokens(on, "and one more line")[1:]
    prompt = a + first["tokens"][:3] + extra
    again = _complete(on, prompt)
    assert again["timings"]["cache_n"] == len(a) + 3  # the prompt, and the answer tokens that were evaluated
    assert again["timings"]["prompt_n"] == len(extra)
    assert _routes(on)["ram"] == before["ram"] + 1
    assert again["tokens"] == _complete(off, prompt)["tokens"]


def test_the_same_prefix_then_a_different_token_restores_only_the_prefix(on: Server, off: Server) -> None:
    a, b, c = _tokens(on, _text(4)), _tokens(on, _text(5)), _tokens(on, _text(6))
    _complete(on, a)
    _fill_both_slots(on, b, c)
    cut = 57
    other = next(t for t in range(300, 400) if t != a[cut])
    prompt = a[:cut] + [other] + a[cut + 1:]
    answer = _complete(on, prompt)
    assert answer["timings"]["cache_n"] == cut
    assert answer["tokens"] == _complete(off, prompt)["tokens"]


def test_a_prompt_that_is_all_cached_still_evaluates_its_last_token(on: Server) -> None:
    a, b, c = _tokens(on, _text(7)), _tokens(on, _text(8)), _tokens(on, _text(9))
    _complete(on, a)
    _fill_both_slots(on, b, c)
    answer = _complete(on, a)
    assert (answer["timings"]["cache_n"], answer["timings"]["prompt_n"]) == (len(a) - 1, 1)


@pytest.mark.parametrize("api", APIS)
def test_answers_with_the_cache_equal_answers_without_it_over_random_interleavings(api: str, on: Server,
                                                                                    off: Server) -> None:
    # 6 conversations over 2 slots; scripts/prompt_cache_equality.py runs 50 interleavings.
    for seed in (1,):
        cached, fresh = replay_sync(on.url, api, seed), replay_sync(off.url, api, seed)
        assert cached["answers"] == fresh["answers"]
        assert cached["prompt"] == fresh["prompt"]
        assert cached["cached"] > fresh["cached"] + cached["prompt"] // 3


def test_usage_reports_cached_tokens_on_every_api(on: Server) -> None:
    result = replay_sync(on.url, "messages", 3)
    assert result["cached"] > result["prompt"] // 2
    system = "You are brief. " * 30
    body = {"model": "m", "system": system, "max_tokens": 2, "temperature": 0,
            "messages": [{"role": "user", "content": "hi"}]}
    httpx.post(f"{on.url}/v1/messages", json=body, timeout=60)
    usage = httpx.post(f"{on.url}/v1/messages", json=body, timeout=60).json()["usage"]
    total = httpx.post(f"{on.url}/v1/messages/count_tokens", json=body, timeout=60).json()["input_tokens"]
    assert usage["input_tokens"] == 1 and usage["cache_read_input_tokens"] == total - 1
    assert usage["cache_creation_input_tokens"] == 0


def test_ollama_counts_the_whole_prompt_and_times_only_what_it_evaluated(on: Server) -> None:
    # ollama's prompt_eval_count is the prompt's length, as OpenAI's prompt_tokens, whatever the cache held.
    messages = [{"role": "system", "content": _text(50, 20)}, {"role": "user", "content": "hi"}]
    body = {"model": "m", "messages": messages, "stream": False, "options": {"num_predict": 2, "temperature": 0}}
    first, again = (httpx.post(f"{on.url}/api/chat", json=body, timeout=60).json() for _ in range(2))
    openai = httpx.post(f"{on.url}/v1/chat/completions", json={"messages": messages, "max_tokens": 2},
                        timeout=60).json()["usage"]
    assert first["prompt_eval_count"] == again["prompt_eval_count"] == openai["prompt_tokens"]
    assert openai["prompt_tokens_details"]["cached_tokens"] == openai["prompt_tokens"] - 1
    assert again["prompt_eval_duration"] < first["prompt_eval_duration"]


# ---- the disk tier

DISK_TEXT = _text(20, 25)  # fits the 512 tokens of a slot of -c 1024

@pytest.fixture(scope="module")
def disk(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache folder holding tiny.gguf's states of DISK_TEXT, written when its server stopped."""
    folder = tmp_path_factory.mktemp("cache-disk") / "cache"
    srv = _serve(tiny_model, folder.parent / "first.log", "--cache-disk", str(folder), "--cache-disk-min-tokens", "16")
    try:
        _complete(srv, _tokens(srv, DISK_TEXT))
    finally:
        srv.stop()
    assert len(list(folder.glob("*.pcache"))) == 1
    return folder


def _disk_server(model: Path, folder: Path, name: str, *args: str) -> Server:
    return _serve(model, folder.parent / f"{name}.log", "--cache-disk", str(folder), "--cache-disk-min-tokens", "16",
                  *args)


def test_the_disk_tier_survives_a_restart(tiny_model: Path, disk: Path, off: Server, tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    shutil.copytree(disk, folder)
    srv = _disk_server(tiny_model, folder, "restart")
    try:
        prompt = _tokens(srv, DISK_TEXT) + _tokens(srv, "then a question")[1:]
        answer = _complete(srv, prompt)
        assert answer["timings"]["cache_n"] == len(_tokens(srv, DISK_TEXT))
        assert _routes(srv)["disk"] == 1
        assert answer["tokens"] == _complete(off, prompt)["tokens"]
    finally:
        srv.stop()


@pytest.mark.parametrize("change", [["-c", "1024"], ["--chat-template", "llama3"], ["other model"], ["-ctk", "f32"],
                                    ["--rope-freq-base", "5000"]],
                         ids=["context size", "chat template", "model", "KV cache type", "RoPE base"])
def test_an_entry_never_serves_another_model_or_other_settings(change: list[str], tiny_model: Path, disk: Path,
                                                               tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    shutil.copytree(disk, folder)
    model = tiny_model
    if change == ["other model"]:
        model = write_llama_gguf(tmp_path / "tiny.gguf", TINY.__class__(**{**TINY.__dict__, "seed": 7}))
        change = []
    srv = _disk_server(model, folder, "changed", *change)
    try:
        answer = _complete(srv, _tokens(srv, DISK_TEXT))
        assert answer["timings"]["cache_n"] == 0
        assert _routes(srv)["disk"] == 0
    finally:
        srv.stop()
    assert "prompt cache: 1 entries in" in srv.stderr and "belong to other models or settings" in srv.stderr


def test_a_damaged_or_renamed_entry_is_skipped_with_one_line(tiny_model: Path, disk: Path, tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    shutil.copytree(disk, folder)
    [entry] = folder.glob("*.pcache")
    data = bytearray(entry.read_bytes())
    data[-100] ^= 0xFF  # a flipped bit in the state
    entry.write_bytes(bytes(data))
    srv = _disk_server(tiny_model, folder, "damaged")
    try:
        answer = _complete(srv, _tokens(srv, DISK_TEXT))
        assert answer["timings"]["cache_n"] == 0
    finally:
        srv.stop()
    assert srv.stderr.count(f"prompt cache: skipped {entry.name}: its checksum does not match") == 1


def test_a_router_keeps_disk_entries_over_an_unload_and_never_shares_them_between_models(
        tiny_model: Path, tmp_path: Path) -> None:
    other = write_llama_gguf(tmp_path / "other.gguf", TINY.__class__(**{**TINY.__dict__, "seed": 7}))
    srv = spawn_serve(tmp_path / "router.log", ["-m", str(tiny_model), "-m", str(other), "-c", N_CTX, "-np", "2",
                                                "--cache-disk", str(tmp_path / "cache"), "--cache-disk-min-tokens", "16"])
    system = {"role": "system", "content": _text(30, 25)}

    def chat(model: str, *turns: str) -> dict:
        body = {"model": model, "max_tokens": 2, "temperature": 0,
                "messages": [system, *({"role": "user", "content": t} for t in turns)]}
        response = httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=60)
        assert response.status_code == 200, response.text
        return response.json()["usage"]

    try:
        first = chat("tiny", "hello")
        assert httpx.post(f"{srv.url}/models/unload", json={"model": "tiny"}, timeout=30).json() == {"success": True}
        assert chat("other", "hello")["prompt_tokens_details"]["cached_tokens"] == 0
        again = chat("tiny", "hello", "and more")
        assert first["prompt_tokens"] - 10 < again["prompt_tokens_details"]["cached_tokens"] < first["prompt_tokens"]
        metrics = httpx.get(f"{srv.url}/metrics", timeout=10).text
        assert 'pyllama_prompt_cache_requests_total{model="tiny",route="disk"} 1' in metrics
    finally:
        srv.stop()


def test_after_a_restart_the_second_half_of_a_replay_evaluates_under_a_tenth_of_a_cold_start(
        tiny_model: Path, tmp_path: Path, off: Server) -> None:
    folder = tmp_path / "cache"
    history = {c: [{"role": "system", "content": _text(40 + c, 25)}] for c in range(4)}  # about 370 tokens

    def half(srv: Server, turns: range, keep: bool = True) -> int:
        """Each conversation's turns in `turns`, round robin; the prompt tokens evaluated in all."""
        evaluated = 0
        for t in turns:
            for c, messages in history.items():
                asked = [*messages, {"role": "user", "content": f"turn {t}: what does line{40 + c} hold?"}]
                body = {"messages": asked, "max_tokens": 4, "temperature": 0}
                usage = (answer := httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=60).json())["usage"]
                evaluated += usage["prompt_tokens"] - usage["prompt_tokens_details"]["cached_tokens"]
                if keep:
                    messages[:] = [*asked, answer["choices"][0]["message"]]
        return evaluated

    for turns in (range(2), range(2, 4)):  # the first half, then the second after a restart
        srv = _disk_server(tiny_model, folder, f"replay{turns[0]}")
        try:
            restarted = half(srv, turns, keep=turns[0] == 0)
        finally:
            srv.stop()
    evaluated_cold = half(off, range(2, 4), keep=False)  # a cold start's flags: no RAM tier, no disk
    assert restarted <= evaluated_cold // 10


def test_a_cache_folder_that_cannot_be_made_is_one_error_line(tiny_model: Path, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    result = run_cli("serve", "-m", str(tiny_model), "--cache-disk", str(tmp_path / "file" / "cache"))
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"Error: --cache-disk {tmp_path / 'file' / 'cache'}: cannot use it as the prompt cache folder (Not a directory)",
        "Hint: name a folder you can write, or drop --cache-disk"]


# ---- LoRA adapter sets (#36)

def test_a_prefix_cached_under_one_adapter_set_never_serves_another(tiny_model: Path, tmp_path: Path) -> None:
    from tests.fixtures.make_adapters import write_lora_gguf

    adapter = write_lora_gguf(tmp_path / "a.gguf", seed=1)
    lora_flags = ("--lora", str(adapter), "--lora-init-without-apply")
    srv = _serve(tiny_model, tmp_path / "lora.log", "--cache-ram", "64", *lora_flags)
    cold = _serve(tiny_model, tmp_path / "cold.log", "--cache-ram", "0", *lora_flags)
    on_set, off_set = [{"id": 0, "scale": 1.0}], [{"id": 0, "scale": 0.0}]

    def complete(server: Server, prompt: list[int], lora: list[dict], slot: int = -1) -> dict:
        body = {"prompt": prompt, "n_predict": 6, "temperature": 0, "return_tokens": True, "cache_prompt": True,
                "lora": lora, "id_slot": slot}
        response = httpx.post(f"{server.url}/completion", json=body, timeout=60)
        assert response.status_code == 200, response.text
        return response.json()

    try:
        prompt = _tokens(srv, _text(60, 20))
        first = complete(srv, prompt, on_set, 0)  # slot 0: the prompt's cells under the adapter
        other = complete(srv, prompt, off_set, 1)  # slot 0 holds the same tokens, under another set: not used
        assert (first["timings"]["cache_n"], other["timings"]["cache_n"]) == (0, 0)
        assert other["tokens"] == complete(cold, prompt, off_set)["tokens"] != first["tokens"]
        # Each set finds its own cells: the adapter's in slot 0 (slot 1's go to RAM first), the others' in RAM.
        again = complete(srv, prompt, on_set, 1)
        other_again = complete(srv, prompt, off_set, 0)
        assert [again["timings"]["cache_n"], other_again["timings"]["cache_n"]] == [len(prompt) - 1] * 2
        assert (again["tokens"], other_again["tokens"]) == (first["tokens"], other["tokens"])
        assert {r: n for r, n in _routes(srv).items() if n} == {"none": 2, "other_slot": 1, "ram": 1}
    finally:
        srv.stop()
        cold.stop()


def test_conversations_over_one_system_prompt_hold_it_once_in_ram(tiny_model: Path, tmp_path: Path,
                                                                    off: Server) -> None:
    srv = spawn_serve(tmp_path / "stderr.log", ["-m", str(tiny_model), "-c", "1024", "-np", "1", "--cache-ram", "64"])
    try:
        system = _tokens(srv, _text(7, 50))  # some 700 tokens
        assert len(system) > 600
        prompts = [system + _tokens(srv, f"user {i} asks about {_text(i, 2)}")[1:] for i in range(5)]
        sizes = []
        for prompt in prompts:  # each conversation pushes the one before out of the only slot, into RAM
            _complete(srv, prompt, 2)
            metrics = httpx.get(f"{srv.url}/metrics", timeout=10).text
            sizes.append(int(re.search(r'^pyllama_prompt_cache_bytes\{[^}]*tier="ram"\} (\d+)', metrics,
                                       re.M)[1]))
        assert re.search(r'^pyllama_prompt_cache_entries\{[^}]*tier="ram"\} 4$', metrics, re.M)
        one = sizes[1]  # one whole entry
        assert sizes[4] < 1.5 * one  # four entries: the system prompt's cells once, and four short rests
        for prompt in prompts[:4]:  # each comes back from a shared prefix and its own cells, bit for bit
            answer = _complete(srv, prompt + [prompt[-1]])
            assert answer["timings"]["cache_n"] == len(prompt)
            assert answer["tokens"] == _complete(off, prompt + [prompt[-1]])["tokens"]
    finally:
        srv.stop()
