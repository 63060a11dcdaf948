"""Model output to safe HTML: Markdown by markdown-it-py, code by Pygments, then nh3's sanitizer.

Model output is untrusted input. markdown-it-py runs with raw HTML off (a `<script>` in an answer
is shown as text) and with its own link check (no `javascript:` or `data:` links), and nh3 then keeps
only the tags and attributes the page styles, whatever the two before it let through.
"""

from __future__ import annotations

import asyncio
from functools import lru_cache

import nh3
from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.util import ClassNotFound

from ..errors import APIError

# The largest text one request renders (characters); a longer one is refused with 413. An answer
# this long is far beyond any context the page's conversations reach.
MAX_RENDER_CHARS = 512 * 1024
# Renders running at once, and waiting beyond those: a page re-renders a streaming answer a few
# times a second at most, so more than this in the queue is a client misbehaving (429).
RENDER_SLOTS = 2
RENDER_QUEUE = 16

TAGS = {"p", "br", "hr", "h1", "h2", "h3", "h4", "h5", "h6", "strong", "em", "s", "del", "code", "pre",
        "blockquote", "ul", "ol", "li", "a", "table", "thead", "tbody", "tr", "th", "td", "span"}
ATTRIBUTES = {"a": {"href", "title"}, "code": {"class"}, "span": {"class"}, "ol": {"start"}}
URL_SCHEMES = {"http", "https", "mailto"}
_FORMATTER = HtmlFormatter(nowrap=True, classprefix="tok-")


def _highlight(code: str, lang: str, _attrs: object) -> str:
    """Pygments' token spans for a fenced block with a known language; "" lets markdown-it escape it."""
    if not lang:
        return ""
    try:
        lexer = get_lexer_by_name(lang.strip().split()[0])
    except ClassNotFound:
        return ""
    return highlight(code, lexer, _FORMATTER)


@lru_cache(maxsize=1)
def _markdown() -> MarkdownIt:
    # CommonMark with tables and strikethrough, raw HTML off: tags in an answer are text, not markup.
    return MarkdownIt("commonmark", {"html": False, "linkify": False, "highlight": _highlight}) \
        .enable(["table", "strikethrough"])


def render_markdown(text: str) -> str:
    """Sanitized HTML for `text` (Markdown); code blocks carry Pygments' `tok-*` classes."""
    html = _markdown().render(text)
    return nh3.clean(html, tags=TAGS, attributes=ATTRIBUTES, url_schemes=URL_SCHEMES,
                     link_rel="noopener noreferrer nofollow", strip_comments=True)


class RenderLimiter:
    """Bounds the renders one server runs: RENDER_SLOTS at once, RENDER_QUEUE waiting, 429 past that."""

    def __init__(self, slots: int = RENDER_SLOTS, queue: int = RENDER_QUEUE):
        self._slots = asyncio.Semaphore(slots)
        self._waiting = 0
        self._queue = queue

    async def __aenter__(self) -> None:
        if self._waiting >= self._queue:
            raise APIError(429, "too many render requests at once; try again shortly", code="rate_limited",
                           error_type="rate_limit_error")
        self._waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self._waiting -= 1

    async def __aexit__(self, *_: object) -> None:
        self._slots.release()


def check_size(text: str) -> None:
    if len(text) > MAX_RENDER_CHARS:
        raise APIError(413, f"the text has {len(text)} characters; /render takes at most {MAX_RENDER_CHARS}",
                       param="text", code="request_too_large")
