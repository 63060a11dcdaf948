"""Tokenizer metadata that would crash llama.cpp, caught from the GGUF header before it loads.

llama.cpp trusts the vocabulary it reads: duplicate token texts trip an assertion while loading,
a BOS/EOS/SEP token that must be added but does not exist trips one at the first tokenize, a
SentencePiece vocabulary without byte tokens throws out of C++ on text it cannot spell, and byte
tokens in a vocabulary kind that has no byte decoding abort when printed. Each of these ends the
process (SIGABRT), so `check_vocab` refuses such files with an InvalidGGUF naming the problem.
Anything llama.cpp refuses cleanly by itself is left to it.
"""

from __future__ import annotations

from typing import Any

from ...errors import InvalidGGUF
from .reader import GGUFFile

_TOKEN_TYPE_BYTE = 6
# Vocabulary kinds (tokenizer.ggml.model) whose byte tokens llama.cpp can decode.
_BYTE_DECODING = {"llama", "t5", "gpt2", "hybriddna", "whitespace", "gemma4"}
# llama.cpp's defaults per vocabulary kind: special ids, then whether BOS/EOS/SEP are added.
_DEFAULT_IDS: dict[str, dict[str, int]] = {
    "llama": {"bos": 1, "eos": 2}, "bert": {"bos": 101, "sep": 102}, "gpt2": {"bos": 11, "eos": 11},
    "t5": {"eos": 1}, "plamo2": {"bos": 1, "eos": 2},
}
_DEFAULT_ADDS: dict[str, set[str]] = {"llama": {"bos"}, "bert": {"bos", "sep"}, "t5": {"eos"}, "gemma4": {"bos"}}
# The string arrays check_vocab reads: a header read for it decodes these alone (read_gguf's `strings`).
VOCAB_KEYS = frozenset({"tokenizer.ggml.tokens"})


def check_vocab(gguf: GGUFFile) -> None:
    """Raise InvalidGGUF for tokenizer metadata that would crash llama.cpp (see the module docstring)."""
    kind = gguf.get("tokenizer.ggml.model")
    tokens = gguf.get("tokenizer.ggml.tokens")
    if not isinstance(kind, str) or not isinstance(tokens, list):
        return  # llama.cpp refuses these itself, with its own message
    try:
        joined = "".join(tokens)  # also the check that every token is a string, at C speed
    except TypeError:
        return
    texts, present = tokens, set(tokens)
    if "\0" in joined or "" in present:
        # llama.cpp reads each text as a C string (it ends at a NUL byte), then renames empty ones "[EMPTY_i]".
        texts = [t.split("\0", 1)[0] or f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        present = set(texts)
    _check_unique(gguf, texts, present)
    _check_byte_tokens(gguf, kind, texts, present)
    for name, key in (("bos", "add_bos_token"), ("eos", "add_eos_token"), ("sep", "add_sep_token")):
        added = gguf.get(f"tokenizer.ggml.{key}")
        if (added if isinstance(added, bool) else name in _DEFAULT_ADDS.get(kind, ())) and \
                _special_id(gguf, kind, name, len(tokens)) is None:
            given = gguf.get(f"tokenizer.ggml.{name}_token_id")
            why = (f"{name}_token_id {given} is outside the {len(tokens)}-token vocabulary" if given is not None
                   else f"there is no {name}_token_id")
            raise _invalid(gguf, f"the tokenizer adds a {name.upper()} token to every text, but {why}")


def _check_unique(gguf: GGUFFile, texts: list[str], present: set[str]) -> None:
    if len(present) == len(texts):
        return
    seen: dict[str, int] = {}
    for i, text in enumerate(texts):
        # Texts that were not valid UTF-8 read back with U+FFFD and may differ as bytes: not proof of a duplicate.
        if text in seen and "\ufffd" not in text:
            shown = repr(text) if len(text) <= 40 else f"{text[:40]!r}..."
            raise _invalid(gguf, f"tokens {seen[text]} and {i} are both {shown} (token texts must be unique)")
        seen[text] = i


def _check_byte_tokens(gguf: GGUFFile, kind: str, tokens: list[str], present: set[str]) -> None:
    types = gguf.get("tokenizer.ggml.token_type")
    if kind not in _BYTE_DECODING and isinstance(types, list) and _TOKEN_TYPE_BYTE in types[:len(tokens)]:
        i = types.index(_TOKEN_TYPE_BYTE)
        raise _invalid(gguf, f"token {i} is a byte token, which a {kind!r} vocabulary cannot decode")
    if kind == "llama":  # SentencePiece falls back to <0xXX> tokens for text its pieces cannot spell
        for byte in range(256):
            if f"<0x{byte:02X}>" not in present and (byte >= 0x80 or chr(byte) not in present or byte == 0):
                raise _invalid(gguf, f"the SentencePiece vocabulary has no byte token <0x{byte:02X}>, which "
                                     "llama.cpp needs for text outside its pieces")


def _special_id(gguf: GGUFFile, kind: str, name: str, n_tokens: int) -> int | None:
    """The id llama.cpp ends up using: the file's when in range, else its default when in range, else none."""
    given: Any = gguf.get(f"tokenizer.ggml.{name}_token_id")
    if isinstance(given, int) and not isinstance(given, bool) and 0 <= given < n_tokens:
        return given
    default = _DEFAULT_IDS.get(kind, {}).get(name)
    return default if default is not None and default < n_tokens else None


def _invalid(gguf: GGUFFile, problem: str) -> InvalidGGUF:
    return InvalidGGUF(f"{gguf.path} has a broken tokenizer: {problem}",
                       hint="llama.cpp would crash on it; convert the model again or use another file")
