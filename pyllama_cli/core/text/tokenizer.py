"""Tokenizing and detokenizing the way llama-tokenize does, with output built in bulk.

The ids come from llama.cpp itself (`llama_tokenize`), with the same flags llama-tokenize passes,
so they are identical by construction. What lives here is everything around that call: escape
processing of the input, rendering of `%6d -> '%s'` lines and `[1, 2, 3]` lists for millions of
tokens without a Python call per token, chat prompts, and detokenizing that undoes tokenizing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ...errors import InputError
from . import json_text
from ..model.native import Model, lib

# Tokens that llama.cpp's tokenizer splits the text at (its "special tokens cache").
_SPECIAL_ATTRS = lib.LLAMA_TOKEN_ATTR_CONTROL | lib.LLAMA_TOKEN_ATTR_USER_DEFINED | lib.LLAMA_TOKEN_ATTR_UNKNOWN


def tokenize_text(model: Model, text: bytes, *, add_bos: bool = True, parse_special: bool = True) -> np.ndarray:
    """Token ids for `text` as llama-tokenize computes them.

    Args:
        model: a (vocab-only) model.
        text: the input bytes, already unescaped.
        add_bos: add the BOS token when the vocab wants one (llama-tokenize's `!--no-bos`). Like
            llama-tokenize, this is llama.cpp's add_special: it also governs an automatic EOS.
        parse_special: turn special-token text such as `<|im_start|>` into its token.
    """
    return model.tokenize(text, add_special=model.add_bos and add_bos, parse_special=parse_special)


# ---------------------------------------------------------------- output


# Bytes gathered per output chunk: large enough that numpy does the work, small enough to stream.
_CHUNK_BYTES = 16 << 20


def _gather(ids: np.ndarray, render: Callable[[int], bytes]) -> Iterator[bytes]:
    """Concatenate render(id) for every id in chunks, calling render once per distinct id.

    The entries (which never hold a NUL) go into a fixed-width byte table padded with NULs: one
    numpy gather per chunk and dropping the NULs give the exact concatenation, with no Python
    object per token. If a few long entries would make that table mostly padding, a plain
    join of the entries does the work instead.
    """
    if not len(ids):
        return
    counts = np.bincount(ids)
    entries = {t: render(t) for t in np.flatnonzero(counts).tolist()}
    width = max(map(len, entries.values()))
    total = sum(len(entry) * int(counts[t]) for t, entry in entries.items())
    step = max(1, _CHUNK_BYTES // max(width, 1))
    if width * len(ids) > 3 * total:
        listed = [b""] * len(counts)
        for t, entry in entries.items():
            listed[t] = entry
        for start in range(0, len(ids), step):
            yield b"".join(map(listed.__getitem__, ids[start:start + step].tolist()))
        return
    table = np.zeros(len(counts), dtype=f"S{width}")
    table[list(entries)] = list(entries.values())
    rows = table.view(np.uint8).reshape(len(counts), width)
    for start in range(0, len(ids), step):
        gathered = np.take(rows, ids[start:start + step], axis=0)
        yield gathered[gathered != 0].tobytes()


def render_token_lines(model: Model, ids: np.ndarray) -> Iterator[bytes]:
    """llama-tokenize's default output, `%6d -> '%s'` per token, in chunks of bytes.

    The piece is printed as C's `%s` prints it: cut at a NUL byte, and invalid UTF-8 as raw bytes
    (llama-tokenize flags it only on Windows consoles).
    """
    def line(token: int) -> bytes:
        return b"%6d -> '%s'\n" % (token, model.token_to_piece(token, special=True).split(b"\0", 1)[0])

    return _gather(ids, line)


def render_id_list(ids: np.ndarray) -> Iterator[bytes]:
    """llama-tokenize's `--ids` output, `[1, 2, 3]` and a newline, in chunks of bytes."""
    yield b"["
    # Every id is followed by ", " except the last, which is written on its own.
    yield from _gather(ids[:-1], lambda t: b"%d, " % t)
    yield b"%d]\n" % ids[-1] if len(ids) else b"]\n"


def render_count(ids: np.ndarray) -> bytes:
    return b"Total number of tokens: %d\n" % len(ids)


def token_pieces(model: Model, ids: np.ndarray) -> list[str]:
    """Each token's full piece as text; bytes that are not UTF-8 on their own show as `\\xNN`."""
    table = {t: model.token_to_piece(t, special=True).decode("utf-8", "backslashreplace") for t in set(ids.tolist())}
    return [table[t] for t in ids.tolist()]


def render_json(model: Model, ids: np.ndarray, prompt: str | None = None) -> bytes:
    """`{"ids": [...], "pieces": [...], "count": N}` (plus "prompt" for a chat)."""
    doc: dict[str, Any] = {"ids": ids.tolist(), "pieces": token_pieces(model, ids), "count": len(ids)}
    if prompt is not None:
        doc["prompt"] = prompt
    return json.dumps(doc, ensure_ascii=False).encode() + b"\n"


# ---------------------------------------------------------------- chat


def parse_messages(data: bytes, source: str) -> list[dict[str, Any]]:
    """Parse a JSON list of chat messages read from `source` (named in errors)."""
    from .chat_template import validate_messages

    try:
        value = json_text.loads(data.decode("utf-8"), source)
    except UnicodeDecodeError as exc:
        raise InputError(f"{source} is not UTF-8 text (byte {exc.start})") from exc
    except json.JSONDecodeError as exc:
        near = exc.doc[exc.pos:exc.pos + 20]
        raise InputError(f"{source} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno} "
                         f"(near {near!r})",
                         hint='give a list like [{"role": "user", "content": "Hi"}]') from exc
    return validate_messages(value)


def chat_prompt(model: Model, messages: list[dict[str, Any]], template: str | None = None,
                *, add_bos: bool = True) -> str:
    """The text a chat renders to, ready to tokenize.

    As llama.cpp does after rendering, a leading BOS text (and a trailing EOS text) is dropped when
    tokenizing will add that token anyway, so the model never sees it twice.
    """
    from .chat_template import render_chat

    prompt = render_chat(model, messages, template, add_generation_prompt=True)
    return drop_added_specials(model, prompt) if add_bos else prompt


def drop_added_specials(model: Model, prompt: str, *, builtin_template: bool = False) -> str:
    """A rendered chat prompt less a leading BOS text when the vocab adds BOS, and less a trailing EOS
    text when it adds EOS, as llama.cpp's chat-template application drops them: tokenizing with the
    special tokens added would otherwise give them twice.

    With `builtin_template`, as llama.cpp's built-in templates (llama-server's non-Jinja path) give
    the prompt: they never write BOS, which the tokenizer adds or nothing does, and they keep an EOS.
    """
    if (model.add_bos or builtin_template) and model.bos >= 0:
        bos = _special_text(model, model.bos)
        if bos and prompt.startswith(bos):
            prompt = prompt[len(bos):]
    if _add_eos(model) and model.eos >= 0 and not builtin_template:
        eos = _special_text(model, model.eos)
        if eos and prompt.endswith(eos):
            prompt = prompt[:-len(eos)]
    return prompt


def _special_text(model: Model, token: int) -> str:
    return model.token_to_piece(token, special=True).decode("utf-8", "replace")


def _add_eos(model: Model) -> bool:
    return bool(lib.llama_vocab_get_add_eos(model.vocab))


# ---------------------------------------------------------------- detokenize

_ID_SEPARATORS = re.compile(r"[\s,]+")
_TOKEN_ID = re.compile(r"-?[0-9]+")
_COUNT_LINE = re.compile(r"^Total number of tokens: \d+\s*$", re.MULTILINE)


def parse_ids(text: str) -> list[int]:
    """Token ids from `1 2 3`, `1,2,3`, tokenize's `[1, 2, 3]` (with or without its count line),
    or its `--json` object.

    Raises:
        InputError: a value that is not an integer, naming it.
    """
    stripped = _COUNT_LINE.sub("", text).strip()
    if stripped.startswith("{"):
        return _ids_from_json(stripped)
    if stripped.startswith("[") and stripped.endswith("]"):
        stripped = stripped[1:-1]
    ids = []
    for word in _ID_SEPARATORS.split(stripped):
        if not word:
            continue
        # int() also reads "1_000" and digits of other scripts: a token id is ASCII digits only.
        if not _TOKEN_ID.fullmatch(word):
            raise InputError(f"{word[:40]!r} is not a token id",
                             hint="give integers, e.g. 1 15043 3186 or [1, 15043, 3186]")
        ids.append(int(word))
    return ids


def _ids_from_json(text: str) -> list[int]:
    try:
        value = json_text.loads(text, "the ids")
    except json.JSONDecodeError as exc:
        raise InputError(f"the ids are not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from exc
    ids = value.get("ids") if isinstance(value, dict) else None
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise InputError('a JSON input must be an object with an "ids" list of integers (tokenize --json output)')
    return ids


def check_ids(model: Model, ids: list[int]) -> None:
    """Raise InputError naming the first id outside the vocab."""
    for token in ids:
        if not 0 <= token < model.n_vocab:
            raise InputError(f"token id {token} is out of range: the vocab has {model.n_vocab} tokens "
                             f"(0..{model.n_vocab - 1})", hint="were the ids made with another model's tokenizer?")


def detokenize_ids(model: Model, ids: list[int]) -> bytes:
    """The text that tokenizes to `ids`: the inverse of tokenize_text on its own output.

    llama.cpp's tokenizer adds the BOS (and EOS) the vocab asks for, and before each run of text
    that starts the input or follows a special token it may insert one space (SentencePiece's
    prefix). So the automatic BOS/EOS are dropped, that one space is removed again, and the
    pieces are joined as they are: unlike llama_detokenize, no Hugging Face-style clean-up of
    spaces before punctuation, which would change text such as `a , b`.

    Raises:
        InputError: an id outside the vocab.
    """
    check_ids(model, ids)
    if ids and model.add_bos and ids[0] == model.bos:
        ids = ids[1:]
    if ids and _add_eos(model) and ids[-1] == model.eos:
        ids = ids[:-1]
    pieces = {t: model.token_to_piece(t, special=True) for t in set(ids)}
    special = {t for t in pieces if lib.llama_vocab_get_attr(model.vocab, t) & _SPECIAL_ATTRS}
    strip_prefix = _adds_space_prefix(model)
    parts: list[bytes] = []
    run_start = True
    for token in ids:
        piece = pieces[token]
        if token in special:
            run_start = True
        elif run_start:
            run_start = False
            if strip_prefix and piece.startswith(b" "):
                piece = piece[1:]
        parts.append(piece)
    return b"".join(parts)


def _adds_space_prefix(model: Model) -> bool:
    """Whether the tokenizer puts a space before text (SentencePiece-style), seen by tokenizing "a"."""
    probe = model.tokenize(b"a", add_special=False, parse_special=False).tolist()
    return b"".join(model.token_to_piece(t, special=True) for t in probe) == b" a"


FIM_KINDS = ("pre", "suf", "mid", "rep", "sep")


def fim_tokens(model: Model) -> dict[str, int]:
    """The model's fill-in-the-middle tokens that it has, by kind (pre, suf, mid, rep, sep)."""
    from ..model.native import lib

    found = {kind: int(getattr(lib, f"llama_vocab_fim_{kind}")(model.vocab)) for kind in FIM_KINDS}
    return {kind: token for kind, token in found.items() if token >= 0}
