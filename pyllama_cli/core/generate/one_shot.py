"""One-shot completion (`pyllama complete`): prompt text -> tokens -> streamed text, with a prompt cache.

Builds on the shared Generator: this module only decides what the prompt is (-p, -f or piped
stdin; raw text or one chat turn), makes it fit the context (or says why it does not), and
loads/saves `--prompt-cache`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import ContextOverflow, InputError, UsageError
from ..media.prompt import MediaPrompt, with_markers
from ..text.chat_template import render_chat, resolve_template
from ..text.reasoning import Thinking, opens_reasoning, template_markers
from .generator import Generator
from .stats import GenerationStats
from ..model.native import Context, Model, lib
from .prompt_cache import CacheLoad, load_prompt_cache, save_prompt_cache
from .sampling import SamplingSettings, check_logit_bias


@dataclass(frozen=True)
class OneShotRequest:
    prompt: str
    sampling: SamplingSettings
    n_predict: int = -1
    stop: tuple[str, ...] = ()
    chat: bool = False  # wrap the prompt as one user turn with the model's chat template
    system_prompt: str | None = None
    chat_template: str | None = None  # NAME|FILE|JINJA override for --chat
    truncate: bool = False  # keep the end of a prompt longer than the context instead of failing
    prompt_cache: Path | None = None
    context_shift: bool = False  # when the context is full, drop half of what follows the kept prompt tokens
    keep: int = 0  # --keep: prompt tokens a shift keeps after BOS (-1 = the whole prompt)
    media: tuple[Any, ...] = ()  # --image/--audio: checked media (core/media/check.py's Media), in order


@dataclass
class OneShotReport:
    """Everything `--stats` shows once the run is over."""

    stats: GenerationStats = field(default_factory=GenerationStats)
    truncated: int = 0  # prompt tokens dropped by --truncate
    cache: CacheLoad | None = None
    cache_load_ms: float = 0.0
    cache_saved: bool = False
    eval_tps: float = 0.0  # llama.cpp's own count: single-token decodes per second of decode time

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = self.stats.to_dict()
        data["eval_tps"] = round(self.eval_tps, 3)
        data["truncated_tokens"] = self.truncated
        if self.cache is not None:
            data["prompt_cache"] = {"file_tokens": len(self.cache.saved_tokens), "reused_tokens": self.stats.n_cached,
                                    "load_ms": round(self.cache_load_ms, 3), "saved": self.cache_saved}
        return data


# ---------------------------------------------------------------- where the prompt comes from


STDIN_FILE = "-"  # `-f -` reads the prompt from stdin, as Unix tools do


def as_typed(text: str) -> str:
    return text


def read_prompt(prompt: str | None, file: Path | None, unescape: Callable[[str], str] = as_typed) -> str:
    """The prompt from -p or -f (`unescape`d), followed by stdin when it is piped (as it is: data)."""
    if prompt is not None and file is not None:
        raise UsageError("-p/--prompt and -f/--file cannot be used together", hint="give the prompt one way")
    if file is not None and str(file) == STDIN_FILE:
        return unescape(_without_final_newline(_read_stdin(even_a_terminal=True) or ""))
    text = prompt if file is None else _without_final_newline(_read_file(file))
    text = None if text is None else unescape(text)
    piped = _read_stdin()
    if piped:
        piped = _without_final_newline(piped)
        text = f"{text}\n{piped}" if text else piped
    if text is None:
        raise UsageError("no prompt given", hint="pass -p TEXT, -f FILE, or pipe text on stdin")
    return text


def _without_final_newline(text: str) -> str:
    # The newline that ends a file's last line is not part of the prompt: llama.cpp's -f drops it too,
    # and `echo TEXT |` or `cat FILE |` must give the same prompt as -p TEXT or -f FILE.
    return text[:-1] if text.endswith("\n") else text


def _read_file(file: Path) -> str:
    try:
        return file.read_bytes().decode("utf-8", errors="surrogateescape")
    except FileNotFoundError:
        raise InputError(f"prompt file not found: {file}") from None
    except OSError as exc:
        raise InputError(f"cannot read prompt file {file}: {exc.strerror or exc}") from None


def _read_stdin(even_a_terminal: bool = False) -> str | None:
    stdin = sys.stdin
    if stdin is None or stdin.closed or (stdin.isatty() and not even_a_terminal):
        return None
    try:
        raw = stdin.buffer.read() if hasattr(stdin, "buffer") else stdin.read().encode("utf-8", "surrogateescape")
    except OSError as exc:
        raise InputError(f"cannot read the prompt from stdin: {exc.strerror or exc}") from None
    # Bytes that are not UTF-8 ride along as surrogates and reach the tokenizer unchanged, as in llama.cpp.
    return raw.decode("utf-8", errors="surrogateescape")


# ---------------------------------------------------------------- the run


def prompt_text(model: Model, request: OneShotRequest) -> str:
    """The text the model sees: the prompt itself, or with --chat, one rendered user turn."""
    prompt = with_markers(request.prompt, len(request.media)) if request.media else request.prompt
    if not request.chat:
        return prompt
    messages = [{"role": "user", "content": prompt}]
    if request.system_prompt:
        messages.insert(0, {"role": "system", "content": request.system_prompt})
    return render_chat(model, messages, template=request.chat_template)


def tokenize_prompt(model: Model, text: str) -> list[int]:
    """Token ids as llama.cpp's tools make them: BOS when the vocab wants it, special tokens parsed."""
    # surrogateescape: prompt bytes that are not UTF-8 (read that way from a file or stdin) pass through as bytes.
    raw = text.encode("utf-8", errors="surrogateescape")
    ids = [int(t) for t in model.tokenize(raw, add_special=True, parse_special=True)]
    # A chat template that writes BOS itself would otherwise give two.
    if len(ids) >= 2 and ids[0] == ids[1] == model.bos:
        ids.pop(0)
    return ids


def fit_prompt(ids: list[int], n_ctx: int, n_predict: int, truncate: bool, bos: int) -> tuple[list[int], int]:
    """Return the prompt (cut to its end with --truncate) and how many tokens were dropped.

    Raises:
        ContextOverflow: the prompt does not fit and truncation was not asked for.
    """
    if len(ids) < n_ctx:
        return ids, 0
    if not truncate:
        raise ContextOverflow(
            f"the prompt has {len(ids)} tokens but the context holds {n_ctx}",
            hint=f"raise the context with -c/--ctx-size (e.g. -c {_room_for(len(ids), n_predict)}), "
                 "or pass --truncate to keep the end of the prompt",
        )
    room = min(n_predict, n_ctx // 2) if n_predict > 0 else n_ctx // 4
    keep = max(n_ctx - max(room, 1), 1)
    head = [ids[0]] if ids and ids[0] == bos and keep > 1 else []
    kept = head + ids[len(ids) - (keep - len(head)):]
    return kept, len(ids) - len(kept)


def _eval_counters(ctx: Context) -> tuple[float, int]:
    """llama.cpp's running totals for single-token decodes: (milliseconds, count)."""
    data = lib.llama_perf_context(ctx.handle)
    return float(data.t_eval_ms), int(data.n_eval)


def _room_for(n_prompt: int, n_predict: int) -> int:
    need = n_prompt + (n_predict if n_predict > 0 else 256)
    size = 512
    while size < need:
        size *= 2
    return size


def kept_on_shift(keep: int, n_prompt: int, add_bos: bool) -> int:
    """The tokens at the start of the context a shift keeps, as llama-completion counts them: the whole
    prompt for -1 or more than it has, else --keep tokens after the BOS."""
    if keep < 0 or keep > n_prompt:
        return n_prompt
    return keep + int(add_bos)


class OneShot:
    """One completion run over a loaded model and a fresh context."""

    def __init__(self, model: Model, ctx: Context, request: OneShotRequest,
                 warn: Callable[[str], None] = lambda _: None, speculation: Any = None, projector: Any = None):
        self.model = model
        self.ctx = ctx
        self.request = request
        self.warn = warn
        self.report = OneShotReport()
        self.generator = Generator(model, ctx, speculation)
        self.text = prompt_text(model, request)
        if request.media and speculation is not None:
            raise UsageError("speculative decoding does not work with media yet", hint="leave out -md/--spec-type")
        self.media = _media_prompt(projector, request, self.text)
        self.generator.media = self.media
        ids = tokenize_prompt(model, self.text) if self.media is None else self.media.tokens
        self.tokens, self.report.truncated = fit_prompt(ids, ctx.n_ctx, request.n_predict, request.truncate,
                                                        model.bos)
        if self.report.truncated:
            self.text = model.detokenize(self.tokens, remove_special=True, unparse_special=True).decode(
                "utf-8", errors="replace")
            warn(f"the prompt has {len(ids)} tokens but the context holds {ctx.n_ctx}: kept its last "
                 f"{len(self.tokens)} tokens (--truncate)")
        check_logit_bias(self.request.sampling.logit_bias, self.model.n_vocab)
        if request.context_shift:
            self.generator.shift_keep = kept_on_shift(request.keep, len(self.tokens), model.add_bos)
        self.thinking = _thinking(model, request, self.text)
        self._eval_start: tuple[float, int] | None = None

    def stream(self, stop_flag: Callable[[], bool] = lambda: False) -> Iterator[str]:
        """Yield the generated text; `self.report` is complete once the iterator ends or raises."""
        cache_path = self.request.prompt_cache
        if cache_path is not None:
            self._load_cache(cache_path)
        try:
            yield from self.generator.stream(
                self.tokens, self.request.sampling, max_tokens=self.request.n_predict, stop=self.request.stop,
                stop_flag=stop_flag, after_prefill=self._after_prefill)
        finally:
            self.report.stats = self.generator.stats
            self.report.eval_tps = self._eval_tps()

    def _after_prefill(self) -> None:
        if self.request.prompt_cache is not None:
            self._save_cache(self.request.prompt_cache)
        self._eval_start = _eval_counters(self.ctx)

    def _eval_tps(self) -> float:
        """Decode-only generation speed as llama.cpp's tools report it (`eval time ... tokens per second`)."""
        if self._eval_start is None:
            return 0.0
        t_start, n_start = self._eval_start
        t_end, n_end = _eval_counters(self.ctx)
        return (n_end - n_start) / ((t_end - t_start) / 1000) if t_end > t_start else 0.0

    def close(self) -> None:
        self.generator.close()
        if self.media is not None:
            self.media.close()

    def _load_cache(self, path: Path) -> None:
        start = time.perf_counter()
        load = load_prompt_cache(path, self.model, self.ctx, self.tokens)
        self.report.cache_load_ms = (time.perf_counter() - start) * 1000
        self.report.cache = load
        if load.warning:
            self.warn(load.warning)
        if load.reused:
            # Tell the generator what sequence 0 now holds, so its prefill evaluates only the rest.
            self.generator.cached = list(self.tokens[:load.reused])

    def _save_cache(self, path: Path) -> None:
        cache = self.report.cache
        if cache is not None and cache.saved_tokens == self.tokens:
            return  # the file already holds exactly this prompt
        try:
            save_prompt_cache(path, self.model, self.ctx, self.tokens)
            self.report.cache_saved = True
        except InputError as exc:
            self.warn(exc.message)


def _media_prompt(projector: Any, request: OneShotRequest, text: str) -> MediaPrompt | None:
    """The prompt as libmtmd's chunks when media come with it."""
    if not request.media:
        return None
    if projector is None:
        raise UsageError("--image and --audio need a multimodal projector", hint="pass --mmproj FILE")
    if request.truncate or request.prompt_cache is not None or request.context_shift:
        raise UsageError("--truncate, --prompt-cache and --context-shift do not work with media yet",
                         hint="leave them out when you pass --image or --audio")
    return MediaPrompt(projector, text, request.media)


def cut_warning(stats: GenerationStats, n_ctx: int, *, constrained: bool) -> str | None:
    """What to say when the text may be cut short: otherwise it just ends, and nothing tells a reader of
    stdout (llama.cpp warns of a full context too). Output that follows a grammar or schema and stops at
    -n is likely unfinished (JSON without its closing brace)."""
    from .decide import STOP_CONTEXT, STOP_LENGTH

    if stats.stop_reason == STOP_CONTEXT:
        return (f"the context is full ({n_ctx} tokens): generation stopped after {stats.n_generated} tokens; "
                "raise -c/--ctx-size for a longer text")
    if stats.stop_reason == STOP_LENGTH and constrained:
        return (f"generation stopped at the -n limit of {stats.n_generated} tokens before the grammar said the "
                "output was done, so it may be unfinished; raise -n/--n-predict")
    return None


def _thinking(model: Model, request: OneShotRequest, prompt: str) -> Thinking:
    """Where the answer's reasoning is: the chat template's think markers, and whether the prompt opened
    the block (plain prompts use `<think>`, opened when the prompt ends with it)."""
    if not request.chat:
        return Thinking(inside=opens_reasoning(prompt))
    markers = template_markers(resolve_template(model.chat_template(), request.chat_template)[0])
    return Thinking(markers, opens_reasoning(prompt, markers))
