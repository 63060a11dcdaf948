"""Images in chat requests: OpenAI's `image_url` and `input_audio` parts turned into checked media.

A part's place in the message becomes libmtmd's media marker in the text, and its bytes a
core/media `Media`. `data:` URLs are read; `file:` URLs only inside --media-path; an `http(s)` URL
only from a host --media-domains lists (fetched by media_fetch.py, within the request's remaining
media bytes); any other scheme is refused. `input_audio` takes base64 in `data`, or a URL in `data`
or `url`, as llama-server does.
Every problem is a 400 in the API's shape, naming the part.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from ...core.media.check import Media, sniff
from ...core.media.settings import MEDIA_MARKER
from ...errors import InputError
from ..errors import APIError
from ..settings import ServerSettings
from .media_fetch import fetch_media

MEDIA_PART_TYPES = ("image_url", "input_audio")
URL_PREFIXES = ("data:", "http://", "https://", "file:")  # how input_audio tells a URL from bare base64
NO_PROJECTOR = ("this model cannot see images or hear audio: the server has no multimodal projector "
                "(start it with --mmproj)")


def part_media(part: Any, where: str, settings: ServerSettings, taken: Sequence[Media] = ()) -> Media:
    """The checked bytes of one media part (`where` names it in errors: messages[0].content[1]); `taken`:
    the request's media so far, whose bytes a fetched URL's limit leaves out."""
    if part.type == "image_url":
        url = (part.image_url or {}).get("url") if isinstance(part.image_url, dict) else part.image_url
        data = _url_bytes(url, f"{where}.image_url.url", settings, _budget(settings, "image", taken))
    else:
        audio = part.input_audio if isinstance(part.input_audio, dict) else {}
        key = "url" if audio.get("data") is None and audio.get("url") is not None else "data"
        value, param = audio.get(key), f"{where}.input_audio.{key}"
        if isinstance(value, str) and value.startswith(URL_PREFIXES):
            data = _url_bytes(value, param, settings, _budget(settings, "audio", taken))
        else:
            data = _base64(value, param)
    return _sniffed(data, where)


def _budget(settings: ServerSettings, kind: str, taken: Sequence[Media]) -> tuple[int, str]:
    """The bytes a fetched URL of a `kind` part may still have in this request, and the flag that sets them."""
    limit, flag = ((settings.media.max_image_bytes, "--media-max-image-size") if kind == "image"
                   else (settings.media.max_audio_bytes, "--media-max-audio-size"))
    return max(0, limit - sum(len(m.data) for m in taken if m.kind == kind)), flag


def _url_bytes(url: Any, param: str, settings: ServerSettings, budget: tuple[int, str]) -> bytes:
    if not isinstance(url, str) or not url:
        raise APIError(400, f"{param} is missing: an image part needs a data: URL", param=param, code="invalid_value")
    if url.startswith("data:"):
        header, comma, payload = url.partition(",")
        if not comma or not header.endswith(";base64"):
            raise APIError(400, f"{param}: a data: URL must be base64 (data:image/png;base64,...)", param=param,
                           code="invalid_value")
        return _base64(payload, param)
    parts = urlsplit(url)
    if parts.scheme.lower() in ("http", "https"):
        return fetch_media(url, param, settings.media.domains, *budget)
    if parts.scheme == "file":
        return _file_bytes(parts.path, param, settings)
    what = f"{parts.scheme}: URLs are refused" if parts.scheme else "is not a URL"
    raise APIError(400, f"{param}: {what}; send the image inline as a data: URL", param=param, code="invalid_value")


def media_from_base64(payload: Any, where: str) -> Media:
    """llama-server's multimodal_data entry: base64 bytes of an image or audio clip, checked."""
    return _sniffed(_base64(payload, where), where)


def _sniffed(data: bytes, where: str) -> Media:
    """core/media's checks of a part's bytes; what they refuse is a 400 with their hint."""
    try:
        return sniff(data, where)
    except InputError as exc:
        message = f"{exc.message}; {exc.hint}" if exc.hint else exc.message
        raise APIError(400, message, param=where, code="invalid_value") from None


def _file_bytes(url_path: str, param: str, settings: ServerSettings) -> bytes:
    """A file: URL's bytes, only from inside --media-path (links and .. resolved first, so none leads out)."""
    folder = settings.media.path
    if folder is None:
        raise APIError(400, f"{param}: file: URLs are refused (the server has no --media-path); send the image "
                       "inline as a data: URL", param=param, code="invalid_value")
    path = Path(unquote(url_path)).resolve()
    if not path.is_relative_to(folder) or not path.is_file():
        raise APIError(400, f"{param}: no such file in --media-path", param=param, code="invalid_value")
    limit = max(settings.media.max_image_bytes, settings.media.max_audio_bytes)
    with open(path, "rb") as file:
        data = file.read(limit + 1)
    if len(data) > limit:
        raise APIError(400, f"{param}: the file is larger than {limit} bytes", param=param, code="invalid_value")
    return data


def _base64(payload: Any, param: str) -> bytes:
    if not isinstance(payload, str) or not payload:
        raise APIError(400, f"{param} is empty", param=param, code="invalid_value")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise APIError(400, f"{param} is not valid base64", param=param, code="invalid_value") from None


def content_text(parts: list[Any], i: int, settings: ServerSettings | None, media: list[Media] | None) -> str:
    """A message's parts as one text: media parts become markers (their bytes appended to `media`);
    without `media` (routes that render text only) they are refused."""
    texts = []
    for j, part in enumerate(parts):
        where = f"messages[{i}].content[{j}]"
        if part.type in MEDIA_PART_TYPES and media is not None and settings is not None:
            media.append(part_media(part, where, settings, media))
            texts.append(MEDIA_MARKER)
        elif part.type != "text":
            why = NO_PROJECTOR if part.type in MEDIA_PART_TYPES else "this server takes text and images"
            raise APIError(400, f"messages[{i}]: content parts of type {part.type!r} are not supported: {why}",
                           param=f"messages[{i}].content", code="invalid_value")
        elif part.text is None:
            raise APIError(400, f"{where}: a text part needs its \"text\"", param=where, code="invalid_value")
        else:
            texts.append(part.text)
    return "".join(texts)


def check_media_bytes(media: list[Media], settings: ServerSettings, param: str = "messages") -> None:
    """A request's images and audio within --media-max-image-size and --media-max-audio-size."""
    limits = (settings.media.max_image_bytes, settings.media.max_audio_bytes)
    for kind, limit, flag in zip(("image", "audio"), limits, ("--media-max-image-size", "--media-max-audio-size")):
        total = sum(len(m.data) for m in media if m.kind == kind)
        if total > limit:
            raise APIError(400, f"the request's {kind} data is {total} bytes, more than the {limit} this server "
                           f"takes ({flag})", param=param, code="invalid_value")


def media_prompt_of(engine: Any, prompt: str, media: list[Media], settings: ServerSettings,
                    param: str = "messages") -> Any:
    """The rendered prompt and its media as libmtmd's chunks (core/media's MediaPrompt).

    Raises:
        APIError: 400 when the model has no projector, or the projector refuses the media.
    """
    from ...core.media.prompt import MediaPrompt

    if engine.projector is None:
        raise APIError(400, NO_PROJECTOR, param=param, code="invalid_value")
    check_media_bytes(media, settings, param)
    try:
        prepared = MediaPrompt(engine.projector, prompt, media)
    except InputError as exc:
        raise APIError(400, exc.message, param=param, code="invalid_value") from None
    if not prepared.ends_with_text:
        prepared.close()
        raise APIError(400, "the prompt must not end with an image", param=param, code="invalid_value")
    return prepared


def prompt_token_count(engine: Any, prompt: str, media: list[Media], settings: ServerSettings,
                       param: str = "messages") -> int:
    """The tokens of a rendered prompt with its media (each image as many as its projector makes), as
    the generating routes would count them; the media are tokenized, not encoded."""
    if not media:
        return len(engine.tokenize(prompt, add_special=True, parse_special=True))
    prepared = media_prompt_of(engine, prompt, media, settings, param)
    try:
        return prepared.n_cells  # an M-RoPE image's embeddings all count, though they take fewer positions
    finally:
        prepared.close()


def media_list(engine: Any) -> list[Media] | None:
    """Where a route collects a request's media: a list when the model has a projector, None (media parts
    refused with NO_PROJECTOR) when it has none."""
    return [] if engine.projector is not None else None
