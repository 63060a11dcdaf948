"""--cache-reuse N (llama-server's n_cache_reuse): a run of at least N of a slot's cached tokens that
the prompt repeats further on is shifted into place instead of being evaluated again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_prompt_cache import _complete, _routes, _serve, _text, _tokens
from tests.test_serve import Server


@pytest.fixture(scope="module")
def reuse(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = _serve(tiny_model, tmp_path_factory.mktemp("cache-reuse") / "stderr.log", "--cache-reuse", "16")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def reuse_without_ram(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = _serve(tiny_model, tmp_path_factory.mktemp("cache-reuse-noram") / "stderr.log", "--cache-reuse", "16",
                 "--cache-ram", "0")
    yield srv
    srv.stop()


def _parts(srv: Server, tag: int) -> tuple[list[int], list[int], list[int]]:
    """A prompt's head (with BOS), a middle part and a tail (without), each a few hundred tokens."""
    head, middle, tail = _tokens(srv, _text(tag, 12)), _tokens(srv, _text(tag + 1, 12)), _tokens(srv, _text(tag + 2, 12))
    return head, middle[1:], tail[1:]


@pytest.mark.parametrize("which", ["reuse", "reuse_without_ram"])
def test_a_prompt_that_drops_its_middle_shifts_the_tail_into_place(which: str, request: pytest.FixtureRequest) -> None:
    srv: Server = request.getfixturevalue(which)
    head, middle, tail = _parts(srv, 10 if which == "reuse" else 20)
    _complete(srv, head + middle + tail, 2)
    before = _routes(srv)
    answer = _complete(srv, head + tail)
    assert answer["timings"]["cache_n"] == len(head) + len(tail) - 1  # the last token is evaluated, for its logits
    assert answer["timings"]["prompt_n"] == 1
    assert len(answer["tokens"]) == 6
    if which == "reuse":
        assert _routes(srv)["shift"] == before["shift"] + 1


def test_runs_shorter_than_n_are_evaluated_again(reuse: Server) -> None:
    head, middle, tail = _parts(reuse, 30)
    _complete(reuse, head + middle + tail[:10], 2)
    answer = _complete(reuse, head + tail[:10])  # the shared run is 10 tokens, under --cache-reuse 16
    same = next(i for i, (a, b) in enumerate(zip(middle, tail)) if a != b)  # both start "line3..."
    assert answer["timings"]["cache_n"] == len(head) + same
    assert answer["timings"]["prompt_n"] == 10 - same


def test_without_cache_reuse_only_the_common_prefix_is_kept(request: pytest.FixtureRequest) -> None:
    srv: Server = request.getfixturevalue("on")
    head, middle, tail = _parts(srv, 40)
    _complete(srv, head + middle + tail, 2)
    answer = _complete(srv, head + tail)
    same = next(i for i, (a, b) in enumerate(zip(middle, tail)) if a != b)
    assert answer["timings"]["cache_n"] == len(head) + same
    assert answer["timings"]["prompt_n"] == len(tail) - same
