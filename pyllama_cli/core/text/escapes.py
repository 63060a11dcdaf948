"""llama.cpp's escape sequences in text typed on the command line (its string_process_escapes).

llama-tokenize, llama-completion and llama-cli turn `\\n`, `\\t`, `\\xHH`... in -p, -f and -r text into
the characters they name (--no-escape keeps them as typed); pyllama's tokenize and complete do the same.
"""

from __future__ import annotations

# string_process_escapes (llama.cpp common): `\n \r \t \' \" \\` and `\xHH`; any other `\c` stays.
_SIMPLE_ESCAPES = {ord("n"): b"\n", ord("r"): b"\r", ord("t"): b"\t",
                   ord("'"): b"'", ord('"'): b'"', ord("\\"): b"\\"}
_HEX = frozenset(b"0123456789abcdefABCDEF")
_C_SPACE = frozenset(b" \t\n\v\f\r")


def process_escapes(data: bytes) -> bytes:
    """Unescape `data` exactly as llama.cpp's string_process_escapes does (bytes in, bytes out).

    Jumps from backslash to backslash, so text with few of them costs one bulk copy.
    """
    out = bytearray()
    i, n = 0, len(data)
    while True:
        j = data.find(b"\\", i)
        if j < 0 or j + 1 >= n:  # a lone trailing backslash stays as it is
            out += data[i:]
            return bytes(out)
        out += data[i:j]
        c = data[j + 1]
        i = j + 2
        if c in _SIMPLE_ESCAPES:
            out += _SIMPLE_ESCAPES[c]
            continue
        if c == ord("x") and j + 3 < n:
            value = _strtol_hex2(data[j + 2:j + 4])
            if value is not None:
                out.append(value & 0xFF)
                i = j + 4
                continue
        out += b"\\" + bytes([c])


def _strtol_hex2(two: bytes) -> int | None:
    """The value of C's strtol(two, &end, 16) when it consumes both bytes, else None.

    strtol accepts leading whitespace and a sign, so `\\x 7` and `\\x-1` are escapes too.
    """
    first, second = two[0], two[1]
    if second not in _HEX:
        return None
    if first in _HEX:
        return int(two, 16)
    if first in _C_SPACE or first == ord("+"):
        return int(bytes([second]), 16)
    if first == ord("-"):
        return -int(bytes([second]), 16)
    return None


def process_text_escapes(text: str) -> str:
    """process_escapes for text as Python holds command-line input (undecodable bytes as surrogates)."""
    if "\\" not in text:
        return text
    return process_escapes(text.encode("utf-8", "surrogateescape")).decode("utf-8", "surrogateescape")
