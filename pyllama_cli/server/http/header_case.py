"""Response header names as llama-server writes them, for clients that look them up case-sensitively.

HTTP header names are case-insensitive, but some clients read them from a plain dict: llama-server's
own test suite looks up "Access-Control-Allow-Origin" exactly as llama-server writes it. uvicorn's
httptools protocol lowercases every name it writes, so the protocol class gets a transport that
puts the CORS names (and /metrics' Process-Start-Time-Unix) back in their usual case in each response head.
"""

from __future__ import annotations

from typing import Any

_HEAD_START = b"HTTP/1.1 "
_HEAD_END = b"\r\n\r\n"
_NAMES = [b"Access-Control-Allow-Origin", b"Access-Control-Allow-Credentials", b"Access-Control-Allow-Methods",
          b"Access-Control-Allow-Headers", b"Access-Control-Max-Age", b"Vary", b"Process-Start-Time-Unix"]
_CANONICAL = [(b"\r\n" + name.lower() + b":", b"\r\n" + name + b":") for name in _NAMES]


def canonical_head(data: bytes) -> bytes:
    """`data` with the CORS header names of its response head (if it starts with one) in their usual case."""
    if not data.startswith(_HEAD_START) or (b"\r\naccess-control-" not in data
                                            and b"\r\nprocess-start-time-unix:" not in data):
        return data
    end = data.find(_HEAD_END)
    head, rest = (data, b"") if end < 0 else (data[:end + 2], data[end + 2:])
    for lower, canonical in _CANONICAL:
        head = head.replace(lower, canonical)
    return head + rest


class _CasedTransport:
    """A transport that writes response heads through canonical_head and is otherwise the one it wraps."""

    def __init__(self, transport: Any):
        self._transport = transport

    def write(self, data: bytes) -> None:
        self._transport.write(canonical_head(data))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def with_header_case(protocol: type) -> type:
    """`protocol` (an asyncio HTTP protocol class of uvicorn's) writing CORS header names in their usual case."""

    def connection_made(self: Any, transport: Any) -> None:
        protocol.connection_made(self, _CasedTransport(transport))

    return type(f"Cased{protocol.__name__}", (protocol,), {"connection_made": connection_made})
