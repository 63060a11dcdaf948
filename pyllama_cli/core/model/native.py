"""The handles libllama hands out: `Model`, `Context` and `Batch`, each freed deterministically.

Everything else in pyllama uses these classes, or `lib` (re-exported here from `library`) for the
few hot loops that call llama.cpp directly.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import InputError, Interrupted, ModelLoadError
from ..gguf.ftypes import size_label
from .adapters import ModelAdapters
from .sizing.fit import choose_context
from .library import configure_logging, keeping_gil, lib
from .mapped_file import MappedFile
from .placement import apply_placement
from .sizing.memory import apply_kv_cache, apply_rope, check_kv_cache_fits, context_failure_hint
from .settings import LoadSettings
from .threads import ThreadPools

if TYPE_CHECKING:
    import numpy as np


_token_to_piece = keeping_gil(lib.llama_token_to_piece)
_vocab_is_eog = keeping_gil(lib.llama_vocab_is_eog)
# Top-k, top-p, temperature and a draw over one row of logits: tens of microseconds (no grammar).
sampler_sample = keeping_gil(lib.llama_sampler_sample)


# ---------------------------------------------------------------- model


def _placement(settings: LoadSettings) -> Any:
    """-dev, -ts and --rpc as model parameters (None when none is given: llama.cpp's own choice)."""
    if not (settings.rpc or settings.devices or settings.tensor_split):
        return None
    from .rpc import model_devices

    return model_devices(settings.rpc, settings.devices, settings.tensor_split)


class Model:
    """A loaded llama.cpp model (or just its vocabulary) and its tokenizer."""

    def __init__(self, handle: Any, path: Path):
        self.handle = handle
        self.path = path
        self.vocab = lib.llama_model_get_vocab(handle)
        self.n_vocab = lib.llama_vocab_n_tokens(self.vocab)
        # A model without a tokenizer ("none"/"no_vocab") aborts inside llama.cpp on any text call.
        self.has_vocab = lib.llama_vocab_type(self.vocab) != lib.LLAMA_VOCAB_TYPE_NONE
        self.mapped: MappedFile | None = None  # set by load() when the weights are memory-mapped
        # A token's piece and end-of-generation flag never change: generation loops ask for the same
        # few thousand tokens over and over, so each is fetched from llama.cpp once.
        self._pieces: dict[tuple[int, bool], bytes] = {}
        self._eog: dict[int, bool] = {}
        self.adapters = ModelAdapters()  # --lora and --control-vector, set by load()

    @classmethod
    def load(
        cls,
        path: Path,
        settings: LoadSettings,
        *,
        vocab_only: bool = False,
        on_progress: Callable[[float], None] | None = None,
    ) -> Model:
        """Load a GGUF file (the first part of a split model loads every part).

        Raises:
            ModelLoadError: llama.cpp refused the file.
            Interrupted: Ctrl-C during the load.
        """
        configure_logging(settings.verbose, settings.log_file)
        params = lib.llama_model_default_params()
        params.vocab_only = vocab_only
        params.n_gpu_layers = settings.n_gpu_layers if settings.n_gpu_layers >= 0 else 999
        params.load_mode = _load_mode(settings)
        placement = _placement(settings)
        if placement is not None:
            placement.apply(params)
        overrides = apply_placement(params, settings)  # noqa: F841 - owns the C strings until the load returns
        interrupted = False

        def progress(fraction: float, _user: Any) -> bool:
            nonlocal interrupted
            try:
                if on_progress is not None:
                    on_progress(fraction)
                return True
            except BaseException:  # noqa: BLE001 - Ctrl-C lands here; tell llama.cpp to stop
                interrupted = True
                return False

        callback = lib.llama_progress_callback(progress)
        params.progress_callback = callback
        handle = lib.llama_model_load_from_file(str(path).encode(), params)
        if interrupted:
            if handle:
                lib.llama_model_free(handle)
            raise Interrupted("model loading interrupted")
        if not handle:
            raise ModelLoadError(
                f"llama.cpp could not load {path}",
                hint="run again with --verbose to see llama.cpp's reason (unsupported architecture or a damaged file)",
            )
        model = cls(handle, path)
        if settings.mmap and not vocab_only:
            model.mapped = MappedFile(path)
        if not vocab_only:
            try:
                model.adapters = ModelAdapters.load(model, settings.adapters)
            except BaseException:
                model.close()
                raise
        return model

    def check_file(self) -> None:
        """Raise before llama.cpp touches weights that a shrunken model file no longer has (see MappedFile)."""
        if self.mapped is not None:
            self.mapped.check()

    def close(self) -> None:
        if self.handle:
            lib.llama_model_free(self.handle)
            self.handle = None
        if self.mapped is not None:
            self.mapped.close()
            self.mapped = None

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- description

    @property
    def description(self) -> str:
        """llama.cpp's "llama 1B Q4_K - Medium"; a size llama.cpp does not name ("?B") is the count of
        parameters, as a converter labels it (general.size_label: "1.7M", "7.2B")."""
        buf = ctypes.create_string_buffer(256)
        lib.llama_model_desc(self.handle, buf, ctypes.sizeof(buf))
        return buf.value.decode("utf-8", errors="replace").replace(" ?B ", f" {size_label(self.n_params)} ", 1)

    @property
    def size_bytes(self) -> int:
        return int(lib.llama_model_size(self.handle))

    @property
    def n_params(self) -> int:
        return int(lib.llama_model_n_params(self.handle))

    @property
    def n_ctx_train(self) -> int:
        return int(lib.llama_model_n_ctx_train(self.handle))

    @property
    def n_embd(self) -> int:
        return int(lib.llama_model_n_embd(self.handle))

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(4096)
        n = lib.llama_model_meta_val_str(self.handle, key.encode(), buf, ctypes.sizeof(buf))
        if n < 0:
            return None
        if n >= ctypes.sizeof(buf):
            buf = ctypes.create_string_buffer(n + 1)
            lib.llama_model_meta_val_str(self.handle, key.encode(), buf, ctypes.sizeof(buf))
        return buf.value.decode("utf-8", errors="replace")

    def chat_template(self, name: str | None = None) -> str | None:
        raw = lib.llama_model_chat_template(self.handle, name.encode() if name else None)
        return raw.decode("utf-8", errors="replace") if raw else None

    # ---- vocabulary

    @property
    def bos(self) -> int:
        return int(lib.llama_vocab_bos(self.vocab))

    @property
    def eos(self) -> int:
        return int(lib.llama_vocab_eos(self.vocab))

    @property
    def eot(self) -> int:
        return int(lib.llama_vocab_eot(self.vocab))

    @property
    def add_bos(self) -> bool:
        return bool(lib.llama_vocab_get_add_bos(self.vocab))

    def is_eog(self, token: int) -> bool:
        eog = self._eog.get(token)
        if eog is None:
            eog = self._eog[token] = bool(_vocab_is_eog(self.vocab, token))
        return eog

    @functools.cached_property
    def eog_tokens(self) -> tuple[int, ...]:
        """Every end-of-generation token (EOS, EOT, <|im_end|>, ...), found by one pass over the vocabulary."""
        return tuple(t for t in range(self.n_vocab) if _vocab_is_eog(self.vocab, t))

    def tokenize(self, text: bytes, *, add_special: bool = True, parse_special: bool = False) -> np.ndarray:
        """Token ids of `text` as an int32 array (BOS added when the vocab wants it and add_special)."""
        self._need_vocab()
        n_max = len(text) + 8
        buf = (lib.llama_token * n_max)()
        n = lib.llama_tokenize(self.vocab, text, len(text), buf, n_max, add_special, parse_special)
        if n < 0:
            n_max = -n
            buf = (lib.llama_token * n_max)()
            n = lib.llama_tokenize(self.vocab, text, len(text), buf, n_max, add_special, parse_special)
        import numpy as np

        return np.frombuffer(buf, dtype=np.int32, count=n).copy()

    def _need_vocab(self) -> None:
        if not self.has_vocab:
            raise InputError(f"{self.path.name} has no tokenizer (its tokenizer.ggml.model is 'none'), so it "
                             "cannot turn text into tokens or back", hint="use a model file that has a vocabulary")

    def token_to_piece(self, token: int, *, special: bool = True) -> bytes:
        piece = self._pieces.get((token, special))
        if piece is None:
            piece = self._pieces[token, special] = self._fetch_piece(token, special)
        return piece

    def _fetch_piece(self, token: int, special: bool) -> bytes:
        self._need_vocab()
        buf = ctypes.create_string_buffer(64)
        n = _token_to_piece(self.vocab, token, buf, 64, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = _token_to_piece(self.vocab, token, buf, -n, 0, special)
        return buf.raw[:n]

    def detokenize(self, tokens: list[int] | np.ndarray, *, remove_special: bool = False,
                   unparse_special: bool = True) -> bytes:
        self._need_vocab()
        ids = (lib.llama_token * len(tokens))(*[int(t) for t in tokens])
        size = max(64, len(tokens) * 8)
        buf = ctypes.create_string_buffer(size)
        n = lib.llama_detokenize(self.vocab, ids, len(tokens), buf, size, remove_special, unparse_special)
        if n < 0:
            size = -n
            buf = ctypes.create_string_buffer(size)
            n = lib.llama_detokenize(self.vocab, ids, len(tokens), buf, size, remove_special, unparse_special)
        return buf.raw[:n]



def _load_mode(settings: LoadSettings) -> int:
    if settings.mmap and settings.mlock:
        return lib.LLAMA_LOAD_MODE_MMAP_MLOCK
    if settings.mlock:
        return lib.LLAMA_LOAD_MODE_MLOCK
    return lib.LLAMA_LOAD_MODE_MMAP if settings.mmap else lib.LLAMA_LOAD_MODE_NONE


# ---------------------------------------------------------------- context


_FLASH_ATTN = {"auto": "LLAMA_FLASH_ATTN_TYPE_AUTO", "on": "LLAMA_FLASH_ATTN_TYPE_ENABLED",
               "off": "LLAMA_FLASH_ATTN_TYPE_DISABLED"}


def _computes_elsewhere(settings: LoadSettings) -> bool:
    """Whether llama_decode may return before its graph has run: on an RPC server (ggml's RPC client
    sends it from a thread of its own, whose abort report needs the GIL) or on a GPU."""
    if settings.rpc:
        return True
    if settings.n_gpu_layers == 0:
        return False
    from .library import gpu_device_present

    return gpu_device_present()


class Context:
    """A llama.cpp context (KV cache + compute buffers) over a loaded model.

    `abort_requested` is polled by llama.cpp between graph nodes while `abortable()` is active, so a
    Ctrl-C stops even a long prompt evaluation.
    """

    def __init__(self, model: Model, settings: LoadSettings, *, n_ctx: int | None = None,
                 n_seq_max: int = 1, embeddings: bool = False, kv_unified: bool = False, **extra: Any):
        params = lib.llama_context_default_params()
        params.n_ctx = n_ctx if n_ctx is not None else (settings.n_ctx or choose_context(
            model, settings, 1 if kv_unified else max(1, n_seq_max)))
        params.n_batch = min(settings.n_batch, params.n_ctx) if settings.n_batch > 0 else params.n_ctx
        params.n_ubatch = min(settings.n_ubatch, params.n_batch)
        params.n_seq_max = n_seq_max
        params.n_threads = settings.resolved_threads()
        params.n_threads_batch = settings.resolved_threads_batch()
        params.flash_attn_type = getattr(lib, _FLASH_ATTN[settings.flash_attn])
        params.embeddings = embeddings
        params.kv_unified = kv_unified
        params.no_perf = False
        apply_kv_cache(params, settings)
        apply_rope(params, settings)
        for key, value in extra.items():
            setattr(params, key, value)
        check_kv_cache_fits(model, params, settings)
        self.abort_requested = False
        self.abort_check: Callable[[], bool] | None = None
        self._abort_cb = lib.ggml_abort_callback(self._should_abort)
        handle = lib.llama_init_from_model(model.handle, params)
        if not handle:
            raise ModelLoadError(
                f"llama.cpp could not create a context of {params.n_ctx} tokens for {model.path.name}",
                hint=context_failure_hint(settings),
            )
        self.handle = handle
        self.threads = ThreadPools(handle, int(params.n_threads), int(params.n_threads_batch), settings.cpu,
                                   settings.resolved_cpu_batch())
        self.model = model
        self.n_ctx = int(lib.llama_n_ctx(handle))
        self.n_batch = int(params.n_batch)
        self.n_ubatch = int(params.n_ubatch)
        self.swa_full = bool(params.swa_full)  # whether a sliding-window memory keeps every cell (no checkpoints)
        self.memory = lib.llama_get_memory(handle)
        self._settle_after_decode = _computes_elsewhere(settings)
        try:
            model.adapters.apply(handle)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.handle:
            self.threads.detach(self.handle)
            lib.llama_free(self.handle)
            self.handle = None
            self.threads.free()

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _should_abort(self, _data: Any) -> bool:
        try:
            return bool(self.abort_requested or (self.abort_check is not None and self.abort_check()))
        except BaseException:  # noqa: BLE001 - a Ctrl-C raised here must not cross into C
            self.abort_requested = True
            return True

    @contextmanager
    def abortable(self) -> Iterator[None]:
        """Let `abort_requested` stop llama_decode mid-graph (costs a Python call per graph node)."""
        lib.llama_set_abort_callback(self.handle, self._abort_cb, None)
        try:
            yield
        finally:
            lib.llama_set_abort_callback(self.handle, lib.ggml_abort_callback(0), None)

    def decode(self, batch: Any) -> None:
        """Run llama_decode; raise on failure or abort."""
        self.model.check_file()
        rc = lib.llama_decode(self.handle, batch.raw if isinstance(batch, Batch) else batch)
        if rc == 0:
            if self._settle_after_decode:
                # The graph may still run on the device: wait for it here, where ctypes releases the
                # GIL, not in the sampler's first logits read, which keeps it (see keeping_gil).
                lib.llama_synchronize(self.handle)
            return
        if rc == 2 or self.abort_requested or (self.abort_check is not None and self.abort_check()):
            raise Interrupted("evaluation interrupted")
        if rc == 1:
            raise ModelLoadError("no room left in the KV cache for this batch", hint="raise -c/--ctx-size")
        raise ModelLoadError(f"llama_decode failed with code {rc}")

    def logits(self, i: int = -1) -> np.ndarray:
        """A view of the logits of output `i` of the last batch (n_vocab float32)."""
        import numpy as np

        ptr = lib.llama_get_logits_ith(self.handle, i)
        return np.ctypeslib.as_array(ptr, shape=(self.model.n_vocab,))

    def pooling_type(self) -> int:
        return int(lib.llama_pooling_type(self.handle))

    def clear_memory(self, data: bool = True) -> None:
        """Empty the KV cache; `data` also zeroes its buffers (a memset of the whole cache)."""
        lib.llama_memory_clear(self.memory, data)

    def remove_tokens(self, seq_id: int, start: int, end: int = -1) -> bool:
        return bool(lib.llama_memory_seq_rm(self.memory, seq_id, start, end))

    def shift_tokens(self, seq_id: int, keep: int, n_discard: int, n_past: int) -> None:
        """Drop positions [keep, keep + n_discard) of a sequence and move the later ones back by n_discard."""
        lib.llama_memory_seq_rm(self.memory, seq_id, keep, keep + n_discard)
        lib.llama_memory_seq_add(self.memory, seq_id, keep + n_discard, n_past, -n_discard)

    def synchronize(self) -> None:
        lib.llama_synchronize(self.handle)


class Batch:
    """A reusable llama_batch for up to `capacity` tokens."""

    def __init__(self, capacity: int, n_seq_max: int = 1):
        self.capacity = capacity
        self.raw = lib.llama_batch_init(capacity, 0, n_seq_max)
        self.n_tokens = 0

    def close(self) -> None:
        if self.raw is not None:
            lib.llama_batch_free(self.raw)
            self.raw = None

    def __enter__(self) -> Batch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def clear(self) -> None:
        self.n_tokens = 0
        self.raw.n_tokens = 0

    def add(self, token: int, pos: int, seq_ids: tuple[int, ...] = (0,), logits: bool = False) -> None:
        i = self.n_tokens
        raw = self.raw
        raw.token[i] = token
        raw.pos[i] = pos
        raw.n_seq_id[i] = len(seq_ids)
        for j, s in enumerate(seq_ids):
            raw.seq_id[i][j] = s
        raw.logits[i] = logits
        self.n_tokens = i + 1
        raw.n_tokens = self.n_tokens

    def fill(self, tokens: list[int] | np.ndarray, start_pos: int, seq_id: int = 0, logits_last: bool = True) -> None:
        """Replace the batch with `tokens` at consecutive positions of one sequence."""
        self.clear()
        n = len(tokens)
        for k, tok in enumerate(tokens):
            self.add(int(tok), start_pos + k, (seq_id,), logits_last and k == n - 1)

