"""Reasoning kept apart: the splitter, the thinking budget, and `reasoning_content`, `thinking` blocks and
reasoning items in the three APIs of `pyllama serve`, streamed and not."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import anthropic
import pytest

from pyllama_cli.core.text.chat_template import render_template
from pyllama_cli.core.text.reasoning import (
    THINK,
    BudgetSpec,
    ReasoningSplitter,
    ThinkBudget,
    ThinkMarkers,
    split_reasoning,
    template_markers,
)
from tests.fixtures.make_gguf import TINY, write_llama_gguf
from tests.fixtures.think_templates import QWEN3_STYLE
from tests.helpers import run_cli
from tests.test_serve import Server, _start

BUDGET = 3  # the thinking server's --reasoning-budget (conftest.py's thinking_server)
HI = [{"role": "user", "content": "hi"}]
# For a template that does not open the think block: the model writes one, then a short answer.
WRITES_THINK = 'root ::= "<think>\\n" [a-z]{2,6} "\\n</think>\\n\\n" [a-z]{2,6}'


@pytest.fixture(scope="module")
def qwen_style_model(models_dir: Path) -> Path:
    return write_llama_gguf(models_dir / "qwen3-style.gguf", replace(TINY, chat_template=QWEN3_STYLE))


@pytest.fixture(scope="module")
def thinker(thinking_server: Server) -> Server:
    """A model whose template opens <think>: the budget closes the block, an answer follows (conftest.py's)."""
    return thinking_server


@pytest.fixture(scope="module")
def whole(qwen_style_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = _start(qwen_style_model, tmp_path_factory.mktemp("serve-none") / "stderr.log", "-c", "1024",
                 "--reasoning-format", "none")
    yield srv
    srv.stop()


# ---------------------------------------------------------------- the splitter and the budget


def test_the_splitter_finds_markers_cut_across_chunks_for_any_family() -> None:
    split = ReasoningSplitter(markers=ThinkMarkers("[THINK]", "[/THINK]"))
    parts = [p for chunk in ["[TH", "INK]plan[/", "THINK]\n\nAnswer [", "x"] for p in split.feed(chunk)]
    assert parts + split.flush() == [(True, "plan"), (False, "\n\nAnswer "), (False, "[x")]
    assert split_reasoning(" plan \n</think>\n\nAnswer", inside=True) == ("plan", "Answer")
    assert split_reasoning("\n\nno thinking") == ("", "\n\nno thinking")


def test_markers_come_from_the_template() -> None:
    assert template_markers(QWEN3_STYLE) == THINK
    assert template_markers("{{ '[THINK]' }}{{ '[/THINK]' }}") == ThinkMarkers("[THINK]", "[/THINK]")
    assert template_markers("{{ messages }}") == THINK


def test_the_budget_forces_the_end_marker_after_n_thinking_tokens() -> None:
    pieces = {1: "a", 2: "b", 3: "</think>", 4: "x"}
    budget = ThinkBudget(BudgetSpec(2, (3,), inside=True), pieces.__getitem__)
    made = []
    for sampled in [1, 2, 1, 4, 4]:
        token = budget.forced() or sampled
        budget.accepted(token)
        made.append(token)
    assert made == [1, 2, 3, 4, 4]  # two thinking tokens, the forced end, then the answer is sampled


def test_the_budget_waits_for_the_model_to_open_the_block() -> None:
    pieces = {1: "a", 5: "<think>", 3: "</think>"}
    budget = ThinkBudget(BudgetSpec(0, (3,), inside=False), pieces.__getitem__)
    made = []
    for sampled in [1, 5, 1, 1]:
        token = budget.forced() or sampled
        budget.accepted(token)
        made.append(token)
    assert made == [1, 5, 3, 1]


def test_a_real_style_template_drops_past_thinking_from_the_history() -> None:
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": "<think>\nold plan\n</think>\n\nHello!"},
                {"role": "user", "content": "again"}]
    prompt = render_template(QWEN3_STYLE, messages)
    assert prompt == ("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
                      "<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n")


# ---------------------------------------------------------------- the three APIs


def _chat(server: Server, **extra: object) -> tuple[str, str]:
    message = server.client().chat.completions.create(model="m", messages=HI, temperature=0, **extra).choices[0].message
    return getattr(message, "reasoning_content", None) or "", message.content or ""


def _chat_streamed(server: Server, **extra: object) -> tuple[str, str]:
    reasoning, content = "", ""
    for chunk in server.client().chat.completions.create(model="m", messages=HI, temperature=0, stream=True,
                                                         **extra):
        delta = chunk.choices[0].delta if chunk.choices else None
        reasoning += (getattr(delta, "reasoning_content", None) or "") if delta else ""
        content += (delta.content or "") if delta else ""
    return reasoning, content


def test_chat_completions_carry_reasoning_content_apart_streamed_and_not(thinker: Server) -> None:
    reasoning, content = _chat(thinker, max_tokens=20)
    assert reasoning and content
    assert "</think>" not in reasoning + content and not content.startswith("\n")
    assert _chat_streamed(thinker, max_tokens=20) == (reasoning, content)


def test_a_grammar_written_think_block_is_split_too(thinker: Server) -> None:
    grammar = 'root ::= [a-z]{2,6} "\\n</think>\\n\\n" [a-z]{2,6}'  # the template opened the block
    reasoning, content = _chat(thinker, max_tokens=30, extra_body={"grammar": grammar})
    assert re.fullmatch("[a-z]{2,6}", reasoning) and re.fullmatch("[a-z]{2,6}", content)
    assert _chat_streamed(thinker, max_tokens=30, extra_body={"grammar": grammar}) == (reasoning, content)


def _anthropic(server: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=60)


def test_messages_answer_with_a_thinking_block_then_text_streamed_and_not(thinker: Server) -> None:
    reasoning, content = _chat(thinker, max_tokens=20)
    request = {"model": "m", "max_tokens": 20, "messages": HI, "extra_body": {"temperature": 0}}
    message = _anthropic(thinker).messages.create(**request)
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in message.content] == \
        [("thinking", reasoning), ("text", content)]
    with _anthropic(thinker).messages.stream(**request) as stream:
        deltas = [e.delta.type for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert [b.model_dump(exclude={"citations", "parsed_output"}) for b in final.content] == \
        [b.model_dump(exclude={"citations"}) for b in message.content]
    assert deltas[0] == "thinking_delta" and deltas[-1] == "text_delta"


def test_responses_answer_with_a_reasoning_item_then_a_message_streamed_and_not(thinker: Server) -> None:
    reasoning, content = _chat(thinker, max_tokens=20)
    request = {"model": "m", "input": "hi", "max_output_tokens": 20, "temperature": 0}
    response = thinker.client().responses.create(**request)
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert (response.output[0].content[0].text, response.output_text) == (reasoning, content)
    with thinker.client().responses.stream(**request) as stream:
        deltas = [e.delta for e in stream if e.type == "response.reasoning_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == reasoning
    assert (final.output[0].content[0].text, final.output_text) == (reasoning, content)


def test_the_budget_cuts_the_thinking_at_n_tokens(thinker: Server) -> None:
    for n in (2, 4):  # the greedy thought ends (end of turn) after 5 tokens
        # Unlimited thinking, stopped by max_tokens after n tokens: the first n tokens of thought.
        first_n, _ = _chat(thinker, max_tokens=n, reasoning_effort="high")
        message = _anthropic(thinker).messages.create(
            model="m", max_tokens=n + 16, messages=HI, extra_body={"temperature": 0},
            thinking={"type": "enabled", "budget_tokens": n})
        assert message.content[0].type == "thinking" and message.content[0].thinking == first_n
        assert message.usage.output_tokens > n and message.stop_reason in ("end_turn", "max_tokens")
    assert _chat(thinker, max_tokens=20, reasoning_effort="none")[0] == ""  # budget 0: no thinking


def test_reasoning_format_none_leaves_the_text_whole(whole: Server) -> None:
    reasoning, content = _chat(whole, max_tokens=30, extra_body={"grammar": WRITES_THINK})
    assert reasoning == "" and re.fullmatch("<think>\n[a-z]{2,6}\n</think>\n\n[a-z]{2,6}", content)
    assert _chat_streamed(whole, max_tokens=30, extra_body={"grammar": WRITES_THINK}) == ("", content)


def test_complete_chat_hides_the_thinking_of_a_real_style_template(qwen_style_model: Path) -> None:
    hidden = run_cli("complete", "-m", str(qwen_style_model), "--chat", "-p", "hi", "-n", "30",
                     "--grammar", WRITES_THINK, "--reasoning", "hide")
    assert hidden.exit_code == 0 and re.fullmatch("[a-z]{2,6}", hidden.stdout), hidden
