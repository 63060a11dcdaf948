"""A session's SSE bytes: appended by its one producer, followed from any byte offset by its readers.

Everything runs on the event loop, so there are no locks: appending wakes the readers through an
`asyncio.Event` that is replaced after each wake-up.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator


class BufferFull(Exception):
    """A chunk would take the buffer past its byte bound."""


class ReplayBuffer:
    """The bytes of one stream, at most `max_bytes` of them, kept whole from offset 0."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._data = bytearray()
        self._changed = asyncio.Event()
        self.done = False

    def __len__(self) -> int:
        return len(self._data)

    def append(self, chunk: bytes) -> None:
        """Add `chunk`, or raise BufferFull (nothing added) if it does not fit in the bound."""
        if len(self._data) + len(chunk) > self.max_bytes:
            raise BufferFull(f"the stream passed its buffer of {self.max_bytes} bytes (--stream-buffer-size)")
        self.force(chunk)

    def force(self, chunk: bytes) -> None:
        """Add `chunk` past the bound: the error event that ends an overfull stream must reach its readers."""
        self._data += chunk
        self._wake()

    def finish(self) -> None:
        """No more bytes will come: readers end once they have read the rest."""
        self.done = True
        self._wake()

    async def follow(self, offset: int) -> AsyncIterator[bytes]:
        """The bytes from `offset` on, as they arrive, until the stream is finished."""
        while True:
            if offset < len(self._data):
                chunk = bytes(self._data[offset:])
                offset += len(chunk)
                yield chunk
                continue
            if self.done:
                return
            await self._changed.wait()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()
