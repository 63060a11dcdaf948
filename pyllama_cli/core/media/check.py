"""Media bytes looked at before libmtmd decodes them.

libmtmd decodes images with stb_image and audio with miniaudio; both take whatever they are given.
The checks here refuse, with one clear line each, what they would choke on or what would cost far
more memory than it is worth: a format they do not read (SVG, WebP, text), a file cut short, and an
image whose header claims more pixels than any projector looks at (a few bytes that promise
20000 x 20000 pixels would make stb_image allocate over a gigabyte before it finds the data missing).
"""

from __future__ import annotations

import struct
from pathlib import Path
from dataclasses import dataclass

from ...errors import InputError

# The largest image accepted: 64 megapixels (8192 x 8192). Projectors resize to a few megapixels at
# most, and llama-server's own clients send photos well below it.
MAX_IMAGE_PIXELS = 8192 * 8192
IMAGE_FORMATS = ("PNG", "JPEG", "GIF", "BMP")
AUDIO_FORMATS = ("WAV", "MP3", "FLAC")


@dataclass(frozen=True)
class Media:
    """Bytes that passed the checks: what they are, and their size when they are an image."""

    data: bytes
    kind: str  # "image" or "audio"
    format: str
    width: int = 0
    height: int = 0
    name: str = "the file"  # how errors name it: its path, or its place in a request


def sniff(data: bytes, what: str = "the file") -> Media:
    """Tell an image or audio clip from its first bytes and check its header.

    Raises:
        InputError: empty, not a format libmtmd reads, cut short, or too large an image.
    """
    if not data:
        raise InputError(f"{what} is empty", hint="send a PNG, JPEG, GIF or BMP image, or a WAV, MP3 or FLAC clip")
    image = _image_format(data)
    if image is not None:
        width, height = _dimensions(image, data, what)
        return Media(data, "image", image, width, height, what)
    audio = _audio_format(data)
    if audio is not None:
        return Media(data, "audio", audio, name=what)
    raise InputError(f"{what} is not an image or audio format that can be read ({_describe(data)})",
                     hint="send a PNG, JPEG, GIF or BMP image, or a WAV, MP3 or FLAC clip")


def _image_format(data: bytes) -> str | None:
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if data.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "GIF"
    if data.startswith(b"BM"):
        return "BMP"
    return None


def _audio_format(data: bytes) -> str | None:
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return "WAV"
    if data.startswith(b"fLaC"):
        return "FLAC"
    if data.startswith(b"ID3") or (len(data) > 1 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0):
        return "MP3"
    return None


def _describe(data: bytes) -> str:
    head = data[:64].lstrip()
    if head.startswith((b"<svg", b"<?xml")):
        return "SVG/XML"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WebP"
    return f"it starts with {data[:8]!r}"


def _dimensions(image: str, data: bytes, what: str) -> tuple[int, int]:
    size = {"PNG": _png_size, "JPEG": _jpeg_size, "GIF": _gif_size, "BMP": _bmp_size}[image](data)
    if size is None:
        raise InputError(f"{what} is a {image} image cut short or damaged: its header cannot be read",
                         hint="send the whole file")
    width, height = size
    if width <= 0 or height <= 0:
        raise InputError(f"{what} is a {image} image of {width}x{height} pixels", hint="send a real picture")
    if width * height > MAX_IMAGE_PIXELS:
        raise InputError(f"{what} is a {image} image of {width}x{height} pixels, more than the "
                         f"{MAX_IMAGE_PIXELS // 1_000_000} megapixels accepted", hint="scale it down first")
    return width, height


def _png_size(data: bytes) -> tuple[int, int] | None:
    if len(data) < 33 or data[12:16] != b"IHDR":
        return None
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def _gif_size(data: bytes) -> tuple[int, int] | None:
    return struct.unpack("<HH", data[6:10]) if len(data) >= 13 else None


def _bmp_size(data: bytes) -> tuple[int, int] | None:
    if len(data) < 26:
        return None
    width, height = struct.unpack("<ii", data[18:26])
    return width, abs(height)  # a negative height is a top-down bitmap


# JPEG's start-of-frame markers (baseline, progressive and the rarer codings), which hold the size.
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    at = 2
    while at + 9 <= len(data):
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        length = struct.unpack(">H", data[at + 2:at + 4])[0]
        if marker in _SOF_MARKERS:
            height, width = struct.unpack(">HH", data[at + 5:at + 9])
            return width, height
        at += 2 + length
    return None


def read_media(path: Path) -> Media:
    """A media file from disk, checked.

    Raises:
        InputError: missing, unreadable, or not media libmtmd reads.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"media file not found: {path}", hint="check the --image/--audio path") from None
    except OSError as exc:
        raise InputError(f"cannot read the media file {path}: {exc.strerror or exc}") from None
    return sniff(data, str(path))


def read_media_files(paths: list[Path]) -> tuple[Media, ...]:
    """--image/--audio files, read and checked; a comma-separated value names several, as in llama.cpp."""
    names = [item for path in paths for item in str(path).split(",") if item]
    return tuple(read_media(Path(name)) for name in names)
