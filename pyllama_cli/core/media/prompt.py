"""A prompt with media: its text and images as libmtmd's chunks, and their evaluation into a context.

The text marks where each medium goes with libmtmd's marker (`<__media__>`); `with_markers` puts the
markers first when the text has none, as llama-mtmd-cli does. `MediaPrompt.tokens` is the prompt as
the generator sees it: the text chunks' token ids, and for each media position a negative id made
from the medium's content, so the prefix of a later prompt with the same image still matches and one
with another image does not. `evaluate` decodes the chunks from a chunk boundary on.

`tokens` has one entry per position, so a token's index is its position, for models with M-RoPE
positions too (Qwen2-VL and later: an image of nx x ny embeddings advances the position by
max(nx, ny), and text after it goes on from there). Their KV cache then holds more cells than the
prompt has positions: `n_cells` and `cells()` count those, and are what prompt token counts and
context limits use, as llama-mtmd-cli and llama-server count them.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import InputError, PyllamaError
from .check import Media
from .projector import Projector
from .settings import MEDIA_MARKER


def with_markers(text: str, n_media: int) -> str:
    """`text` with one media marker per medium: as written, or all put first when it has none."""
    found = text.count(MEDIA_MARKER)
    if found == 0:
        return MEDIA_MARKER * n_media + text
    if found != n_media:
        raise InputError(f"the prompt has {found} media markers ({MEDIA_MARKER}) for {n_media} media",
                         hint=f"write {MEDIA_MARKER} once where each image goes, or not at all to put them first")
    return text


def placeholder(content_id: str) -> int:
    """The negative token id that stands for one position of a medium in `MediaPrompt.tokens`, from the
    content id (core/media/projector.py's media_id) that libmtmd's chunks of it carry."""
    return -2 - int(content_id[:7], 16)


@dataclass
class _Chunk:
    handle: Any
    start: int  # its first position
    n_pos: int  # the positions it advances (an M-RoPE image: fewer than its tokens)
    n_tokens: int  # the KV cells it fills
    media: bool


class MediaPrompt:
    """A text with media markers and the media, tokenized by libmtmd; close() frees the chunks."""

    def __init__(self, projector: Projector, text: str, media: Sequence[Media], *, add_special: bool = True):
        self.projector = projector
        self.lib = lib = projector.lib
        self.n_media_tokens = 0
        self.tokens: list[int] = []
        self.chunks: list[_Chunk] = []
        self._chunks = lib.mtmd_input_chunks_init()
        bitmaps: list[Any] = []
        try:
            for medium in media:
                bitmaps.append(projector.bitmap(medium))
            self._tokenize(text, bitmaps, add_special)
        except BaseException:
            self.close()
            raise
        finally:  # the chunks hold what they need of the images
            for bitmap in bitmaps:
                lib.mtmd_bitmap_free(bitmap)
        for chunk in self.chunks:
            if chunk.media:  # a medium may span several chunks (audio: one per 30 s): each carries its id
                content_id = (lib.mtmd_input_chunk_get_id(chunk.handle) or b"").decode()
                self.tokens.extend([placeholder(content_id)] * chunk.n_pos)
                self.n_media_tokens += chunk.n_tokens
            else:
                self.tokens.extend(self._text_tokens(chunk.handle))

    def _tokenize(self, text: str, bitmaps: list[Any], add_special: bool) -> None:
        lib = self.lib
        raw = text.encode("utf-8", errors="surrogateescape")
        source = lib.mtmd_input_text(text=raw, text_len=len(raw), add_special=add_special, parse_special=True)
        array = (lib.mtmd_bitmap_p_ctypes * max(len(bitmaps), 1))(*bitmaps)
        status = lib.mtmd_tokenize(self.projector.handle, self._chunks, ctypes.byref(source), array, len(bitmaps))
        if status == 1:
            raise InputError("the prompt's media markers do not match the media given",
                             hint=f"write {MEDIA_MARKER} once where each image goes")
        if status != 0:
            raise InputError("the projector could not prepare the image", hint="try another image")
        position = 0
        for i in range(lib.mtmd_input_chunks_size(self._chunks)):
            handle = lib.mtmd_input_chunks_get(self._chunks, i)
            n_pos = int(lib.mtmd_input_chunk_get_n_pos(handle))
            n_tokens = int(lib.mtmd_input_chunk_get_n_tokens(handle))
            media = lib.mtmd_input_chunk_get_type(handle) != lib.MTMD_INPUT_CHUNK_TYPE_TEXT
            self.chunks.append(_Chunk(handle, position, n_pos, n_tokens, media))
            position += n_pos

    def _text_tokens(self, handle: Any) -> list[int]:
        n = ctypes.c_size_t(0)
        pointer = self.lib.mtmd_input_chunk_get_tokens_text(handle, ctypes.byref(n))
        return [int(pointer[i]) for i in range(n.value)]

    @property
    def n_cells(self) -> int:
        """The KV cells the whole prompt fills: its tokens, each image's embeddings counted one by one."""
        return sum(chunk.n_tokens for chunk in self.chunks)

    @property
    def media_end(self) -> int:
        """The position after the prompt's last image or clip (0 when it has none)."""
        return max((chunk.start + chunk.n_pos for chunk in self.chunks if chunk.media), default=0)

    @property
    def extra_cells(self) -> int:
        """How many more cells than positions the prompt takes (M-RoPE images; 0 for other projectors)."""
        return self.n_cells - len(self.tokens)

    def cells(self, position: int) -> int:
        """The cells held by the first `position` positions (a chunk's start, a text position, or one past
        the prompt: generated tokens take one cell each)."""
        held = 0
        for chunk in self.chunks:
            if position >= chunk.start + chunk.n_pos:
                held += chunk.n_tokens
            elif position > chunk.start and not chunk.media:
                held += position - chunk.start  # inside a text chunk: a cell a position (an image is never cut)
        return held + max(position - len(self.tokens), 0)

    def cut_before(self, position: int) -> int:
        """Where evaluation may restart to reuse the first `position` positions: `position` itself, or the
        start of the image (or clip) it falls inside, which is evaluated whole."""
        for chunk in self.chunks:
            if chunk.media and chunk.start <= position < chunk.start + chunk.n_pos:
                return chunk.start
        return position

    def evaluate(self, lctx: Any, start: int, n_batch: int, seq_id: int = 0, end: int | None = None) -> None:
        """Decode positions `start` to `end` (the prompt's end by default) into sequence `seq_id`, with the
        logits of the prompt's last position when `end` is the prompt's end. `start` is a chunk's start or
        inside text, and so is `end`: an image is decoded whole, and text may stop anywhere, so that a
        memory that cannot cut a sequence (recurrent) never holds a position it must give back.

        Raises:
            PyllamaError: libmtmd could not encode an image or decode a chunk.
        """
        end = len(self.tokens) if end is None else end
        todo = [c for c in self.chunks if c.start + c.n_pos > start and c.start < end]
        for k, chunk in enumerate(todo):
            whole = chunk.start >= start and chunk.start + chunk.n_pos <= end
            if chunk.media or whole:
                self._evaluate_chunk(lctx, chunk, n_batch, seq_id, k == len(todo) - 1 and end == len(self.tokens))
            else:  # part of a text chunk: its tokens at their positions
                self._decode_text(lctx, max(start, chunk.start), min(end, chunk.start + chunk.n_pos), n_batch, seq_id)

    def _evaluate_chunk(self, lctx: Any, chunk: _Chunk, n_batch: int, seq_id: int, logits_last: bool) -> None:
        lib = self.lib
        new_n_past = lib.llama_cpp.llama_pos(0)
        status = lib.mtmd_helper_eval_chunk_single(self.projector.handle, lctx, chunk.handle, chunk.start, seq_id,
                                                   n_batch, logits_last, ctypes.byref(new_n_past))
        if status != 0:
            raise PyllamaError(f"libmtmd could not evaluate the prompt's {'media' if chunk.media else 'text'} "
                               f"at position {chunk.start} (status {status})", hint="see the log with -v")

    def _decode_text(self, lctx: Any, start: int, end: int, n_batch: int, seq_id: int) -> None:
        from ..model.native import Batch

        with Batch(n_batch) as batch:
            for first in range(start, end, n_batch):
                batch.fill(self.tokens[first:min(first + n_batch, end)], first, seq_id,
                           logits_last=min(first + n_batch, end) == len(self.tokens))
                status = self.lib.llama_cpp.llama_decode(lctx, batch.raw)
                if status != 0:
                    raise PyllamaError(f"the prompt's text at position {first} could not be decoded (status {status})",
                                       hint="see the log with -v")

    @property
    def ends_with_text(self) -> bool:
        return bool(self.chunks) and not self.chunks[-1].media

    def close(self) -> None:
        if self._chunks:
            self.lib.mtmd_input_chunks_free(self._chunks)
            self._chunks = None

    def __del__(self) -> None:  # a server job cancelled before it ran still frees its chunks
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit the bindings may be gone already
            pass


def prefill_slot(media: MediaPrompt, ctx: Any, seq_id: int, reuse: int, *, text_after: bool = False) -> int:
    """Evaluate a server slot's prompt with media into sequence `seq_id` (its first `reuse` positions are
    cached already), all but the last token, which the scheduler's batch evaluates with the other slots'
    tokens to get its logits. Returns how many positions the sequence now holds.

    The last token is never decoded here: a recurrent or hybrid memory (Qwen3.5) cannot give it back.
    With `text_after` (a memory that takes context checkpoints), the text after the last image is left
    to the scheduler as well, as llama-server leaves it to its prompt batches: they save checkpoints
    where they save them for any prompt, the one before a short question included, so another question
    after the same image restores that instead of evaluating the image again."""
    last = len(media.tokens) - 1
    start = media.cut_before(min(reuse, last))
    end = max(start, min(last, media.media_end)) if text_after else last
    ctx.remove_tokens(seq_id, start, -1)
    media.evaluate(ctx.handle, start, ctx.n_batch, seq_id, end=end)
    media.close()  # its chunks are in the KV cache now
    return end


def prompt_cells(media: MediaPrompt | None, n_positions: int) -> int:
    """The KV cells that the first `n_positions` positions of a prompt fill (the positions themselves
    without media, or without M-RoPE)."""
    return n_positions if media is None else media.cells(n_positions)


def context_room(media: MediaPrompt | None, n_ctx: int) -> int:
    """The positions a context of `n_ctx` cells has for this prompt and its answer: fewer than `n_ctx`
    when M-RoPE images fill more cells than they take positions."""
    return n_ctx if media is None else n_ctx - media.extra_cells
