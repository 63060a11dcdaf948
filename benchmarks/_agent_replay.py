"""An agent's workload replayed on one server: bench_agents.py --replay distinct|shared.

4 conversations of 4 turns. Each starts with a system prompt of tool definitions (about 800 tokens;
`distinct`: one per conversation, `shared`: one for all), and each turn adds a user message of about
40 tokens and keeps the answer (32 tokens, ignore_eos). Turns go round robin (c0 t0, c1 t0, ...) with
at most 2 requests in flight, a conversation's turns one after another. Streamed chat completions;
reported: prompt tokens evaluated (llama-server's timings.prompt_n, summed), wall time, and the
median time to the first streamed token of turns >= 2.

It also reports the floor: the prompt tokens a server must evaluate if it kept every earlier prompt and
answer (each turn's prompt less its longest common token prefix with any earlier turn's prompt + answer,
at least 1 token), counted after the timed part through the server's /apply-template and /tokenize. A
cache can go no lower, so a server at the floor re-evaluates nothing.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from typing import Any

N_CONVERSATIONS, N_TURNS, IN_FLIGHT, ANSWER_TOKENS = 4, 4, 2, 32
WORDS = ("path", "line", "file", "query", "limit", "offset", "pattern", "command", "timeout", "branch", "diff",
         "search", "replace", "glob", "regex", "encoding", "cwd", "env", "url", "method", "header", "body")


def tools_prompt(seed: int) -> str:
    """About 800 tokens of tool definitions, as an agent's system prompt opens (seeded: distinct per seed)."""
    rng = random.Random(seed)
    tools = []
    for i in range(9):
        params = {w: {"type": rng.choice(("string", "integer", "boolean")), "description": " ".join(
            rng.choice(WORDS) for _ in range(6))} for w in rng.sample(WORDS, 5)}
        tools.append({"name": f"{rng.choice(WORDS)}_{rng.choice(WORDS)}_{i}",
                      "description": " ".join(rng.choice(WORDS) for _ in range(14)),
                      "parameters": {"type": "object", "properties": params}})
    return "You are a coding agent. Tools:\n" + "\n".join(json.dumps(t) for t in tools)


def user_turn(c: int, t: int) -> str:
    rng = random.Random(1000 * c + t)
    return f"Turn {t}: " + " ".join(rng.choice(WORDS) for _ in range(30)) + "?"


async def _turn(client: Any, url: str, messages: list[dict[str, str]]) -> tuple[str, int, float]:
    """(answer, prompt tokens evaluated, seconds to the first streamed token) of one streamed chat turn."""
    body = {"messages": messages, "max_tokens": ANSWER_TOKENS, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    start, first, text, evaluated = time.perf_counter(), 0.0, "", None
    async with client.stream("POST", url + "/v1/chat/completions", json=body, timeout=1200) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{url}: {response.status_code} {(await response.aread())[:300]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            for choice in data.get("choices") or []:
                delta = choice.get("delta") or {}
                piece = delta.get("content") or delta.get("reasoning_content") or ""
                if piece and not first:
                    first = time.perf_counter() - start
                text += delta.get("content") or ""
            if "timings" in data:
                evaluated = data["timings"]["prompt_n"]
            elif data.get("usage") and evaluated is None:
                usage = data["usage"]
                evaluated = usage["prompt_tokens"] - (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return text, int(evaluated or 0), first


async def replay(url: str, mode: str) -> dict[str, float]:
    import httpx

    systems = [tools_prompt(0 if mode == "shared" else c) for c in range(N_CONVERSATIONS)]
    history = {c: [{"role": "system", "content": systems[c]}] for c in range(N_CONVERSATIONS)}
    order = [(c, t) for t in range(N_TURNS) for c in range(N_CONVERSATIONS)]
    busy: set[int] = set()
    ready = asyncio.Condition()
    evaluated, ttft_later = 0, []
    turns: list[tuple[list[dict[str, str]], str]] = []  # (the turn's messages, its answer), in start order

    async def take() -> tuple[int, int] | None:
        async with ready:
            while order:
                found = next((item for item in order if item[0] not in busy), None)
                if found is not None:
                    order.remove(found)
                    busy.add(found[0])
                    return found
                await ready.wait()
            return None

    async def worker(client: Any) -> None:
        nonlocal evaluated
        while (item := await take()) is not None:
            c, t = item
            history[c].append({"role": "user", "content": user_turn(c, t)})
            sent = list(history[c])
            turns.append((sent, ""))
            index = len(turns) - 1
            text, n, first = await _turn(client, url, sent)
            turns[index] = (sent, text)
            history[c].append({"role": "assistant", "content": text})
            evaluated += n
            if t >= 1:
                ttft_later.append(first)
            async with ready:
                busy.discard(c)
                ready.notify_all()

    start = time.perf_counter()
    async with httpx.AsyncClient() as client:
        await asyncio.gather(*[worker(client) for _ in range(IN_FLIGHT)])
        wall = time.perf_counter() - start
        floor = await _floor(client, url, turns)
    return {"evaluated": evaluated, "wall": wall, "ttft": statistics.median(ttft_later), "floor": floor}


async def _tokens(client: Any, url: str, text: str, add_special: bool) -> list[int]:
    response = await client.post(url + "/tokenize", json={"content": text, "add_special": add_special}, timeout=60)
    response.raise_for_status()
    return response.json()["tokens"]


async def _floor(client: Any, url: str, turns: list[tuple[list[dict[str, str]], str]]) -> int:
    """Prompt tokens that no earlier turn's prompt + answer covers, summed (see the module's docstring)."""
    seen: list[list[int]] = []
    floor = 0
    for messages, answer in turns:
        response = await client.post(url + "/apply-template", json={"messages": messages}, timeout=60)
        response.raise_for_status()
        prompt = await _tokens(client, url, response.json()["prompt"], True)
        reused = max((_common_prefix(prompt, earlier) for earlier in seen), default=0)
        floor += max(1, len(prompt) - reused)
        seen.append(prompt + await _tokens(client, url, answer, False))
    return floor


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def run(url: str, mode: str) -> dict[str, float]:
    return asyncio.run(replay(url, mode))
