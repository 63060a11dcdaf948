"""Secrets never reach the server's log: keys in query strings and in authorization headers are masked.

`RedactFilter` is installed on every handler of the server's logging (run.log_config), so the access
log, uvicorn's error log and any traceback pass through `redact()` before they are written. A client
that puts its key in the URL (`?api_key=...`, as some do) is refused with 401 and still not logged.
"""

from __future__ import annotations

import logging
import re

MASK = "[REDACTED]"
SECRET_PARAMS = ("api_key", "api-key", "apikey", "key", "token", "access_token")
SECRET_HEADERS = ("authorization", "proxy-authorization", "x-api-key", "api-key")

# `?api_key=VALUE` / `&token=VALUE`: the value up to the next separator.
_PARAMS = "|".join(re.escape(p) for p in SECRET_PARAMS)
_HEADERS = "|".join(re.escape(h) for h in SECRET_HEADERS)
_QUERY = re.compile(rf"(?i)([?&;](?:{_PARAMS})=)[^&;#\s\"']*")
# `Authorization: Bearer VALUE`, `'x-api-key': 'VALUE'`, `(b'authorization', b'Bearer VALUE')`.
_HEADER = re.compile(rf"(?i)(\b(?:{_HEADERS})\b[\"']?\s*[:=,]\s*(?:b?[\"'])?)(?:(?:bearer|basic|token)\s+)?"
                     r"[^\s\"',)]+")
_BEARER = re.compile(r"(?i)(\bbearer\s+)[A-Za-z0-9._~+/=-]+")


def redact(text: str) -> str:
    """`text` with every secret query value and authorization header value replaced by MASK."""
    if not text:
        return text
    text = _QUERY.sub(rf"\g<1>{MASK}", text)
    text = _HEADER.sub(rf"\g<1>{MASK}", text)
    return _BEARER.sub(rf"\g<1>{MASK}", text)


class RedactFilter(logging.Filter):
    """Masks secrets in a record's message, its arguments and its traceback before any handler formats it.

    The arguments stay a tuple of the same length: uvicorn's access formatter unpacks them.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: redact(v) if isinstance(v, str) else v for k, v in record.args.items()}
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return True
