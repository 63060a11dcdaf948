"""Agent-shaped conversations replayed against a server, for the prompt cache's tests and scripts.

Six conversations, each with its own system prompt (two pairs share their first half, so a prompt
can be served by a prefix of another conversation), take turns in a given order with at most two
requests in flight, on one of three APIs. At temperature 0 the answers depend only on the prompts,
so a server with the prompt cache must answer exactly as one without it.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import httpx

APIS = ("chat", "messages", "responses")
N_CONVERSATIONS, N_TURNS, IN_FLIGHT = 6, 3, 2


def system_prompt(c: int, seed: int | str) -> str:
    """Conversation c's system prompt in replay `seed`: its first half is shared with one other
    conversation (and with every replay), the rest is its own."""
    shared = " ".join(f"tool{c // 2}_{i} reads the file and returns its lines." for i in range(12))
    own = " ".join(f"helper{c}_{i} writes the answer." for i in range(10))
    return f"{shared} Session {seed}. {own}"


def interleaving(seed: int) -> list[int]:
    """Which conversation takes each turn: every conversation N_TURNS times, in a seeded random order."""
    order = [c for c in range(N_CONVERSATIONS) for _ in range(N_TURNS)]
    random.Random(seed).shuffle(order)
    return order


def _request(api: str, system: str, turns: list[dict[str, str]], max_tokens: int) -> tuple[str, dict[str, Any]]:
    if api == "chat":
        return "/v1/chat/completions", {"messages": [{"role": "system", "content": system}, *turns],
                                        "max_tokens": max_tokens, "temperature": 0}
    if api == "messages":
        return "/v1/messages", {"model": "m", "system": system, "messages": turns, "max_tokens": max_tokens,
                                "temperature": 0}
    items = [{"type": "message", **turn} for turn in turns]  # llama-server wants each item's type
    return "/v1/responses", {"model": "m", "instructions": system, "input": items,
                             "max_output_tokens": max_tokens, "temperature": 0}


def _answer(api: str, body: dict[str, Any]) -> tuple[str, int, int]:
    """(text, prompt tokens, cached prompt tokens) of an answer."""
    if api == "chat":
        usage = body["usage"]
        return body["choices"][0]["message"]["content"], usage["prompt_tokens"], \
            usage["prompt_tokens_details"]["cached_tokens"]
    if api == "messages":
        usage = body["usage"]
        text = "".join(block.get("text", "") for block in body["content"])
        return text, usage["input_tokens"] + usage["cache_read_input_tokens"], usage["cache_read_input_tokens"]
    usage = body["usage"]
    text = "".join(part["text"] for item in body["output"] if item["type"] == "message" for part in item["content"])
    return text, usage["input_tokens"], usage["input_tokens_details"]["cached_tokens"]


async def replay(url: str, api: str, seed: int, max_tokens: int = 8) -> dict[str, Any]:
    """Run replay `seed`'s turns in its order (at most IN_FLIGHT at once, a conversation's turns one
    after another); returns each conversation's answers and the prompt and cached tokens in all."""
    order = interleaving(seed)
    turns: dict[int, list[dict[str, str]]] = {c: [] for c in set(order)}
    answers: dict[int, list[str]] = {c: [] for c in turns}
    pending, busy = list(order), set()
    totals = {"prompt": 0, "cached": 0}
    ready = asyncio.Condition()

    async def take() -> int | None:
        async with ready:
            while True:
                free = next((c for c in pending if c not in busy), None)
                if free is not None or not pending:
                    if free is not None:
                        pending.remove(free)
                        busy.add(free)
                    return free
                await ready.wait()

    async def worker(client: httpx.AsyncClient) -> None:
        while (c := await take()) is not None:
            turns[c].append({"role": "user", "content": f"Turn {len(answers[c])}: what does helper{c} do?"})
            path, body = _request(api, system_prompt(c, f"{api} {seed}"), turns[c], max_tokens)
            response = await client.post(url + path, json=body, timeout=120)
            assert response.status_code == 200, response.text
            text, prompt, cached = _answer(api, response.json())
            answers[c].append(text)
            turns[c].append({"role": "assistant", "content": text})
            totals["prompt"] += prompt
            totals["cached"] += cached
            async with ready:
                busy.discard(c)
                ready.notify_all()

    async with httpx.AsyncClient() as client:
        await asyncio.gather(*[worker(client) for _ in range(IN_FLIGHT)])
    return {"answers": answers, **totals}


def replay_sync(url: str, api: str, seed: int, max_tokens: int = 8) -> dict[str, Any]:
    return asyncio.run(replay(url, api, seed, max_tokens))
