"""The token ids of each `/v1/embeddings` input, in every shape llama-server takes.

`input` is one entry, or a list of entries when the list holds no bare token id. An entry is:
a string; a list of token ids; a list mixing strings and ids (one prompt: only a leading string gets
BOS, as llama-server's mixed prompts do); `{"prompt_string": ...}` (either of the former);
or OpenAI content parts, `{"content": [{"type": "text", "text": ...}, ...]}`, whose texts are joined.
"""

from __future__ import annotations

from typing import Any

from ...core.serving.engine import Engine
from ...errors import InputError
from ..errors import APIError

MEDIA_PARTS = ("image_url", "input_audio", "input_video")


def embedding_inputs(engine: Engine, value: Any) -> list[list[int]]:
    """Each input's token ids; a 400 naming `input` for a shape no entry can have, or an empty one."""
    if isinstance(value, list) and not any(_is_id(e) for e in value):
        if not value:
            raise _bad("input is empty: give a string, token ids, or a list of them")
        entries = value
    else:
        entries = [value]
    out = [_entry_tokens(engine, entry) for entry in entries]
    if any(not ids for ids in out):
        raise _bad("an input is empty (no tokens): this model adds no BOS to empty text")
    return out


def _entry_tokens(engine: Engine, entry: Any) -> list[int]:
    if isinstance(entry, dict) and "content" in entry:
        return engine.tokenize(_content_text(entry["content"]), add_special=True, parse_special=True)
    if isinstance(entry, dict) and "prompt_string" in entry:
        if "multimodal_data" in entry:
            raise _bad("multimodal_data needs a multimodal model, and this one reads text only")
        entry = entry["prompt_string"]
    if isinstance(entry, str):
        return engine.tokenize(entry, add_special=True, parse_special=True)
    # Token ids, with strings mixed in or not; a list of strings alone is a list of inputs, not one.
    if isinstance(entry, list) and entry and all(_is_id(e) or isinstance(e, str) for e in entry) \
            and any(_is_id(e) for e in entry):
        return _mixed_tokens(engine, entry)
    raise _bad("each input must be a string, a list of token ids (strings may be mixed in), "
               '{"prompt_string": ...} or {"content": [{"type": "text", "text": ...}]}')


def _mixed_tokens(engine: Engine, parts: list[Any]) -> list[int]:
    """One prompt from strings and ids in order; BOS only when it starts with a string."""
    ids: list[int] = []
    for position, part in enumerate(parts):
        if isinstance(part, str):
            ids += engine.tokenize(part, add_special=position == 0, parse_special=True)
        else:
            try:
                engine.check_token_ids([part])
            except InputError as exc:
                raise _bad(exc.message) from None
            ids.append(part)
    return ids


def _content_text(content: Any) -> str:
    """The joined text of OpenAI content parts; media is refused (this server embeds text only)."""
    if not isinstance(content, list):
        raise _bad('content must be a list of parts, e.g. [{"type": "text", "text": "..."}]')
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in MEDIA_PARTS:
            raise _bad(f"a {kind} part needs a multimodal model, and this one reads text only")
        if kind != "text" or not isinstance(part.get("text"), str):
            raise _bad(f'content parts must be {{"type": "text", "text": "..."}}; got type {kind!r}')
        texts.append(part["text"])
    return "".join(texts)


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bad(message: str) -> APIError:
    return APIError(400, message, param="input", code="invalid_value")
