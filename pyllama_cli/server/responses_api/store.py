"""Responses kept for `previous_response_id` and GET /v1/responses/{id}: in memory, bounded.

The store forgets its oldest responses once it holds more than `max_count` of them or more than
`max_bytes` of memory; a forgotten or unknown id is a 404, as OpenAI answers one. Each response is
held as one compact UTF-8 JSON document, not as Python objects: a body of many small values (150k
metadata keys took 6x their JSON in dicts and strs) then holds what its size says.
"""

from __future__ import annotations

import json
import sys
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from ..errors import APIError

DEFAULT_MAX_COUNT = 1000
DEFAULT_MAX_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Stored:
    """A response, and the conversation it ends (its input and its output, as chat messages)."""

    document: bytes  # [body, messages] as JSON

    @property
    def size(self) -> int:
        return sys.getsizeof(self.document)

    @property
    def body(self) -> dict[str, Any]:
        return json.loads(self.document)[0]

    @property
    def messages(self) -> list[dict[str, Any]]:
        return json.loads(self.document)[1]


class ResponseStore:
    def __init__(self, max_count: int = DEFAULT_MAX_COUNT, max_bytes: int = DEFAULT_MAX_BYTES):
        self.max_count = max_count
        self.max_bytes = max_bytes
        self.items: OrderedDict[str, Stored] = OrderedDict()
        self.size = 0

    def put(self, body: dict[str, Any], messages: list[dict[str, Any]]) -> None:
        stored = Stored(json.dumps([body, messages], ensure_ascii=False, separators=(",", ":")).encode())
        if stored.size > self.max_bytes:
            return  # larger than the whole store: keeping it would forget everything else
        self.remove(body["id"])
        self.items[body["id"]] = stored
        self.size += stored.size
        while len(self.items) > self.max_count or self.size > self.max_bytes:
            _, oldest = self.items.popitem(last=False)
            self.size -= oldest.size

    def get(self, response_id: str, param: str | None = None) -> Stored:
        stored = self.items.get(response_id)
        if stored is None:
            raise APIError(404, f"no response with id {response_id!r} is stored here (unknown, not stored, or "
                           "forgotten: the server keeps the most recent ones)", param=param, code="not_found")
        return stored

    def remove(self, response_id: str) -> bool:
        stored = self.items.pop(response_id, None)
        if stored is not None:
            self.size -= stored.size
        return stored is not None
