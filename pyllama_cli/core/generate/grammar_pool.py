"""Grammar samplers parsed ahead of time, off the thread that generates.

llama.cpp parses a grammar when its sampler is made, in time that grows with the grammar (0.4 s for
the 312 KB GBNF of a 10,000-string enum). Made on a server's engine thread, that parse would stall
every slot of the model; so a request's grammar is parsed while the request is prepared (on a worker
thread, `prebuild`) and the engine takes the ready sampler (`take`). A grammar not found here (a
second choice of the same request, a pool that was full) is parsed where it is needed, as before.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any

from ...errors import InputError

MAX_READY = 16  # samplers kept waiting at most; the oldest is freed to make room

_lock = threading.Lock()
# key -> (the model, weakly: a model unloaded and another loaded at its address must not match; grammar; sampler)
_ready: OrderedDict[int, tuple[weakref.ref[Any], str, Any]] = OrderedDict()
_next_key = 0


def parse(model: Any, grammar: str) -> Any:
    """A new grammar sampler for `model` (checked first: tokens a grammar names must exist).

    Raises:
        InputError: llama.cpp could not parse it, or it names a token the vocabulary lacks.
    """
    from ..constrain.grammar import check_grammar_tokens
    from ..model.native import lib

    check_grammar_tokens(grammar, model.n_vocab, lambda text: one_token(model, text))
    sampler = lib.llama_sampler_init_grammar(model.vocab, grammar.encode(), b"root")
    if not sampler:
        raise InputError("llama.cpp could not parse the grammar", hint="check it with --verbose")
    return sampler


def one_token(model: Any, text: str) -> int | None:
    """The token `text` is, as llama.cpp reads a grammar's <name>: special text parsed, nothing added."""
    ids = model.tokenize(text.encode(), add_special=False, parse_special=True)
    return int(ids[0]) if len(ids) == 1 else None


def prebuild(model: Any, grammar: str) -> None:
    """Parse `grammar` now, for the next sampler that `model`'s engine makes with it."""
    global _next_key
    sampler = parse(model, grammar)
    with _lock:
        _ready[_next_key] = (weakref.ref(model), grammar, sampler)
        _next_key += 1
        evicted = _ready.popitem(last=False)[1] if len(_ready) > MAX_READY else None
    if evicted is not None:
        _free(evicted[2])


def take(model: Any, grammar: str) -> Any | None:
    """A sampler parsed by `prebuild` for this model and grammar (now the caller's), or None."""
    with _lock:
        for key, (owner, text, sampler) in _ready.items():
            if text == grammar and owner() is model:
                del _ready[key]
                return sampler
    return None


def _free(sampler: Any) -> None:
    from ..model.native import lib

    lib.llama_sampler_free(sampler)
