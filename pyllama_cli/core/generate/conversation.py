"""A chat conversation and the engine that answers it with a model.

`Conversation` is plain data: the system prompt, the user/assistant messages, files waiting to go
with the next message, and the edits a chat REPL makes (regen, undo, clear, save, load).
`ChatEngine` renders the whole conversation with the chat template on every turn and hands it to
the shared `Generator`, whose common-prefix reuse means only the tokens new since the previous
turn are evaluated. `fit_context` decides what happens when the conversation outgrows the context.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import ContextOverflow, InputError, UsageError
from ..media.settings import MEDIA_MARKER
from ..text import json_text
from ..text.chat_template import TURN_END_MARKERS, render_template, validate_messages
from ..text.reasoning import Thinking, opens_reasoning, template_markers
from .decide import STOP_EOS, STOP_LENGTH
from .generator import Generator
from .stats import GenerationStats
from ..paths import atomic_write
from .sampling import SamplingSettings

Message = dict[str, Any]


@dataclass
class Conversation:
    """The messages of one chat; the system prompt is kept apart so that /clear and shifts keep it."""

    system: str = ""
    messages: list[Message] = field(default_factory=list)
    attachments: list[tuple[str, str]] = field(default_factory=list)  # (name, text) for the next message
    media: list[Any] = field(default_factory=list)  # images and clips (core/media's Media) for the next message

    def __post_init__(self) -> None:
        self.system = valid_text(self.system)

    def to_messages(self) -> list[Message]:
        """The messages as a template sees them: the system prompt first, when there is one."""
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.messages

    @property
    def n_turns(self) -> int:
        return sum(1 for m in self.messages if m["role"] == "user")

    def attach(self, name: str, text: str) -> None:
        """Queue a file's text for the next user message."""
        self.attachments.append((name, valid_text(text)))

    def attach_media(self, medium: Any) -> None:
        """Queue an image or clip for the next user message."""
        self.media.append(medium)

    def add_user(self, text: str) -> None:
        """Add a user message, preceded by the queued files, each under a header naming it, and by a media
        marker for each queued image (the message keeps the images under "media")."""
        parts = [f"--- File: {name} ---\n{body.rstrip()}" for name, body in self.attachments]
        self.attachments = []
        text = valid_text(text)
        message: Message = {"role": "user", "content": "\n\n".join(parts + [text]) if text else "\n\n".join(parts)}
        if self.media:  # where llama-mtmd-cli puts them: before the text
            message = {**message, "content": MEDIA_MARKER * len(self.media) + message["content"],
                       "media": tuple(self.media)}
            self.media = []
        self.messages.append(message)

    def add_assistant(self, text: str) -> None:
        self.messages.append({"role": "assistant", "content": text})

    def last_answer(self) -> str | None:
        for m in reversed(self.messages):
            if m["role"] == "assistant":
                return m["content"]
        return None

    def drop_last_answer(self) -> bool:
        """Remove the last answer so that it can be generated again; False when there is none."""
        if not self.messages or self.messages[-1]["role"] != "assistant":
            return False
        self.messages.pop()
        return True

    def undo(self) -> bool:
        """Remove the last exchange (the last user message and the answer after it)."""
        if not self.messages:
            return False
        if self.messages[-1]["role"] == "assistant":
            self.messages.pop()
        if self.messages and self.messages[-1]["role"] == "user":
            self.messages.pop()
        return True

    def clear(self) -> None:
        """Forget the messages and queued files; the system prompt stays."""
        self.messages = []
        self.attachments = []
        self.media = []

    def drop_oldest_turn(self) -> None:
        """Remove the first user message and everything up to the next one (its answer)."""
        del self.messages[0]
        while self.messages and self.messages[0]["role"] != "user":
            del self.messages[0]

    # ---- files

    def save(self, path: Path, title: str = "") -> None:
        """Write the conversation: `.json` = the message list, `.md` = a readable transcript.

        Raises:
            InputError: another extension, or a file that cannot be written.
        """
        suffix = path.suffix.lower()
        if suffix == ".json":
            plain = [{k: v for k, v in m.items() if k != "media"} for m in self.to_messages()]  # images stay out
            text = json.dumps(plain, indent=2, ensure_ascii=False) + "\n"
        elif suffix == ".md":
            text = self.to_markdown(title)
        else:
            raise InputError(f"cannot save as {path.name!r}: the file name must end in .json or .md",
                             hint="/save chat.json (messages, loadable with /load) or /save chat.md (transcript)")
        _write_atomic(path, text)

    def to_markdown(self, title: str = "") -> str:
        lines = [f"# Chat{' with ' + title if title else ''}", ""]
        for m in self.to_messages():
            lines += [f"## {m['role'].capitalize()}", "", m["content"].rstrip(), ""]
        return "\n".join(lines)

    def load(self, path: Path) -> None:
        """Replace the messages with a `.json` message list; its system message, if any, replaces ours.

        Raises:
            InputError: an unreadable file or one that is not a message list.
        """
        try:
            data = json_text.loads(path.read_text(encoding="utf-8"), str(path))
        except OSError as exc:
            raise InputError(f"cannot read {path}: {exc.strerror}") from exc
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InputError(f"{path} is not JSON: {exc}", hint="/load reads files written by /save NAME.json") from exc
        checked = validate_messages(data)
        _check_chat_roles(data, path)
        # JSON's \udXXX escapes can carry half a UTF-16 pair: no text a file or the model can take.
        messages = [{"role": m["role"], "content": valid_text(m["content"])} for m in checked]
        if messages[0]["role"] == "system":
            self.system = messages.pop(0)["content"]
        self.messages = messages
        self.attachments = []


def _check_chat_roles(data: list[Message], path: Path) -> None:
    """A chat holds an optional system message first, then user and assistant messages: what /save
    writes. Other roles ("tool", a typo) would reach the template and the /undo and /regen
    bookkeeping, which know only these."""
    for i, m in enumerate(data):
        role = m["role"]
        if role not in ("user", "assistant") and not (role == "system" and i == 0):
            where = "comes only first" if role == "system" else "is not one /load takes"
            raise InputError(f"message {i} of {path} has the role {role!r}, which {where}",
                             hint="/load takes a system message (first, optional), then user and assistant messages")


# Lone UTF-16 surrogates: how Python carries bytes that are not UTF-8 (stdin, argv: U+DC80-U+DCFF,
# surrogateescape) and what a JSON \udXXX escape can hold. None can be encoded, tokenized or saved.
_SURROGATES = re.compile("[\ud800-\udfff]")
_NOT_ESCAPED_BYTES = re.compile("[\ud800-\udc7f\udd00-\udfff]")


def valid_text(text: str) -> str:
    """`text` with its lone surrogates as U+FFFD: escaped bytes come out as decoding the original
    bytes with errors="replace" would, as the model's own output is decoded."""
    if not _SURROGATES.search(text):
        return text
    text = _NOT_ESCAPED_BYTES.sub("\ufffd", text)
    return text.encode("utf-8", errors="surrogateescape").decode("utf-8", errors="replace")


def _write_atomic(path: Path, text: str) -> None:
    """Write through a temporary file in the same folder, so a failure never leaves half a file."""
    with atomic_write(path.expanduser()) as temp:
        temp.write_text(text, encoding="utf-8")


def fit_context(conv: Conversation, count_tokens: Callable[[list[Message]], int], n_ctx: int, *,
                reserve: int, shift: bool) -> int:
    """Make the conversation's prompt leave `reserve` tokens of the context for the answer.

    With `shift`, the oldest turns are dropped (never the system prompt, never the last message)
    until it fits. Returns how many turns were dropped.

    Raises:
        ContextOverflow: it does not fit (without `shift`, or even with the last message alone).
    """
    n = count_tokens(conv.to_messages())
    dropped = 0
    while n + reserve > n_ctx:
        if not shift or conv.n_turns <= 1:
            raise _overflow(n, reserve, n_ctx, shift)
        conv.drop_oldest_turn()
        dropped += 1
        n = count_tokens(conv.to_messages())
    return dropped


def _overflow(n: int, reserve: int, n_ctx: int, shift: bool) -> ContextOverflow:
    need = f"{n} tokens" + (f" (+{reserve} for the answer)" if reserve > 1 else "")
    if shift:
        return ContextOverflow(f"the last message alone needs {need} but the context holds {n_ctx}",
                               hint="send a shorter message, or restart with a larger -c/--ctx-size")
    return ContextOverflow(f"the conversation no longer fits the context: it needs {need}, the context holds {n_ctx}",
                           hint="/clear to start over (the system prompt stays), /undo to drop the last exchange, "
                                "or restart with a larger -c or with --context-shift")


_MAX_SNAPSHOTS = 8
CHAT_CHECKPOINTS = 3  # the last prompt's: its last user message's start, 4 + n_ubatch and 4 before its end


class ChatEngine:
    """Answers a conversation with a model: renders it, tokenizes it, streams the reply.

    Args:
        model: a loaded native.Model.
        ctx: a native.Context for it; the engine's Generator owns its sequence 0.
        template: the Jinja chat template text.
        template_name: a short name for banners (`chatml`, `model (GGUF)`, a file name).
    """

    def __init__(self, model: Any, ctx: Any, template: str, template_name: str, speculation: Any = None):
        self.model = model
        self.ctx = ctx
        self.template = template
        self.template_name = template_name
        # A memory that cannot be cut anywhere (Qwen3.5, sliding windows) keeps the last prompt's checkpoints
        # between turns: before its last user message (undo, then a new message) and near its end (the next
        # turn, /regen). Each holds a recurrent state or a window of cells: tens to hundreds of MiB.
        self.generator = Generator(model, ctx, speculation, checkpoints=CHAT_CHECKPOINTS)
        self.speculation = speculation  # closed with the engine (a draft model's context)
        self._user_marker: list[int] | None = None  # the tokens a user message starts with (checkpoints)
        self.bos_text = _token_text(model, model.bos)
        self.eos_text = _token_text(model, model.eos)
        self.turn_end = TURN_END_MARKERS.get(template_name, ())
        self.projector: Any = None  # core/media's Projector when chat runs with --mmproj (/image)
        self._media: Any = None  # the MediaPrompt of the last prompt with images
        self.markers = template_markers(template)
        self.thinking = Thinking(self.markers)  # the last prompt's: did the template open the think block?
        # Recent prompts and prompt+answer pairs as text and as the exact tokens the model saw and produced,
        # so a later turn extends those tokens instead of re-tokenizing an answer that may split differently
        # (which would re-evaluate it), and /regen sees the very tokens the first answer came from.
        self._snapshots: list[tuple[str, list[int]]] = []

    def close(self) -> None:
        self.generator.close()
        self._use_media(None)
        if self.speculation is not None:
            self.speculation.close()
            self.speculation = None

    @property
    def n_ctx(self) -> int:
        return self.ctx.n_ctx

    @property
    def n_used(self) -> int:
        """Tokens of the context holding the conversation so far."""
        return len(self.generator.cached)

    @property
    def stats(self) -> GenerationStats:
        return self.generator.stats

    def render(self, messages: list[Message], add_generation_prompt: bool = True) -> str:
        return render_template(self.template, messages, bos_token=self.bos_text, eos_token=self.eos_text,
                               add_generation_prompt=add_generation_prompt)

    def prompt_tokens(self, messages: list[Message]) -> list[int]:
        """The token ids the model sees for `messages`, the assistant's turn opened, with one BOS."""
        return self._tokenize(self.render(messages))

    def _tokenize(self, text: str) -> list[int]:
        # Templates that write bos_token themselves would get a second one from the tokenizer.
        if self.model.add_bos and self.bos_text and text.startswith(self.bos_text):
            text = text[len(self.bos_text):]
        return self.model.tokenize(text.encode("utf-8"), add_special=True, parse_special=True).tolist()

    def count_tokens(self, messages: list[Message]) -> int:
        return len(self.prompt_tokens(messages))

    def answer(self, messages: list[Message], sampling: SamplingSettings, *, max_tokens: int = -1,
               stop: Sequence[str] = (), stop_flag: Callable[[], bool] = lambda: False) -> Iterator[str]:
        """Stream the assistant's reply to `messages`; statistics are in `self.stats` afterwards.

        Raises:
            ContextOverflow: the rendered conversation does not fit the context.
            Interrupted: `stop_flag` was raised while the prompt was being evaluated.
        """
        # Not a generator itself: the prompt is rendered (and template errors raised) right away.
        text = self.render(messages)
        self.thinking = Thinking(self.markers, opens_reasoning(text, self.markers))
        media = [medium for m in messages for medium in m.get("media", ())]
        prompt = self._media_tokens(text, media) if media else self._continuation(text)
        if not media:
            self._use_media(None)
        if prompt is None:
            prompt = self._tokenize(text)
        stream = self.generator.stream(prompt, sampling, max_tokens=max_tokens,
                                       stop=tuple(stop) + self.turn_end, stop_flag=stop_flag,
                                       user_starts=self._user_starts(prompt))
        return self._remember_turn(text, prompt, stream)

    def _user_starts(self, prompt: list[int]) -> tuple[int, ...]:
        """Where the prompt's user messages start, for a generator that saves checkpoints before them."""
        if self.generator.checkpoints is None:
            return ()
        from .context_checkpoints import find_user_starts, user_marker_tokens

        if self._user_marker is None:
            self._user_marker = user_marker_tokens(
                lambda m: self.render(m, add_generation_prompt=False),
                lambda text: self.model.tokenize(text.encode("utf-8"), add_special=False, parse_special=True).tolist())
        return find_user_starts(prompt, self._user_marker)

    def _media_tokens(self, text: str, media: list[Any]) -> list[int]:
        """The prompt's tokens with its images (placeholders), which the generator evaluates through libmtmd."""
        from ..media.prompt import MediaPrompt

        if self.projector is None:
            raise UsageError("the conversation has images but there is no projector", hint="start with --mmproj")
        self._use_media(MediaPrompt(self.projector, text, media))
        return list(self._media.tokens)

    def _use_media(self, media: Any) -> None:
        if self._media is not None:
            self._media.close()
        self._media = self.generator.media = media

    def _continuation(self, text: str) -> list[int] | None:
        """The tokens of the longest remembered text that `text` extends, plus the tokens of the rest."""
        matches = [snap for snap in self._snapshots if text.startswith(snap[0])]
        if not matches:
            return None
        known_text, known_tokens = max(matches, key=lambda snap: len(snap[0]))
        tail = text[len(known_text):].encode("utf-8")
        return known_tokens + self.model.tokenize(tail, add_special=False, parse_special=True).tolist()

    def _remember(self, text: str, tokens: list[int]) -> None:
        if self._media is not None:  # image placeholders are no text's tokens
            return
        self._snapshots = [*self._snapshots[-(_MAX_SNAPSHOTS - 1):], (text, tokens)]

    def _remember_turn(self, text: str, prompt: list[int], stream: Iterator[str]) -> Iterator[str]:
        self._remember(text, list(prompt))
        pieces = []
        for piece in stream:
            pieces.append(piece)
            yield piece
        stats = self.generator.stats
        # Only an answer that ended by itself or by length is exactly its tokens (a stop string is cut out).
        if stats.stop_reason in (STOP_EOS, STOP_LENGTH):
            self._remember(text + "".join(pieces), list(prompt) + list(stats.tokens))

    def describe(self) -> dict[str, Any]:
        """Facts about the model and context for /show."""
        m = self.model
        return {
            "model": m.path.name, "description": m.description, "parameters": m.n_params,
            "size_bytes": m.size_bytes, "n_ctx_train": m.n_ctx_train, "n_ctx": self.n_ctx,
            "template": self.template_name,
        }


def open_chat_engine(session: Any, settings: Any, template_override: str | None = None,
                     speculative: Any = None) -> ChatEngine:
    """A ChatEngine over a model session (template: the override, else the GGUF's), in a context made
    for it that the session owns and frees.

    The template is checked first, so a model without a usable one fails before its context is made.

    Args:
        session: a core.model.session.Session opened without a context.

    Raises:
        TemplateError: no usable template, or one that does not parse.
        ModelLoadError: llama.cpp could not create the context.
    """
    from ..text.chat_template import check_template, resolve_template

    text, name = resolve_template(session.model.chat_template(), template_override)
    check_template(text)
    ctx = session.open_context(settings)
    speculation = None
    if speculative is not None:
        from .speculative import open_speculation

        speculation = open_speculation(speculative, settings, session.model, n_ctx_seq=ctx.n_ctx)
    return ChatEngine(session.model, ctx, text, name, speculation)


def _token_text(model: Any, token: int) -> str:
    if token < 0:
        return ""
    return model.token_to_piece(token, special=True).decode("utf-8", errors="replace")
