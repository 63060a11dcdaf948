"""llama-imatrix's run: the same chunks, the same batches, the same context, so the same activations.

The text is tokenized whole (with BOS) and cut into chunks of `n_ctx` tokens; each chunk starts from
an empty KV cache with its first token replaced by BOS. `n_batch / n_ctx` chunks share one
llama_decode as separate sequences, in a context of that many times `n_ctx` cells, and every token
asks for its logits (the last layer then runs on every row, as in llama-imatrix). PPL is scored on
each chunk's second half, in llama-perplexity's arithmetic.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...errors import InputError, Interrupted, PyllamaError, UsageError
from ..evaluate.perplexity import NllSums, token_nll
from ..interrupt import StopFlag, catch_sigint
from ..model.native import Batch, Context, Model, lib
from ..model.settings import LoadSettings
from . import storage
from .collector import Collector


@dataclass
class ImatrixRequest:
    output: Path
    prompt_file: str | None  # the -f text as the user wrote it: llama-imatrix stores this name
    n_ctx: int = 512
    n_chunks: int = -1
    skip_chunks: int = 0  # --chunk
    out_freq: int = 10
    save_freq: int = 0
    process_output: bool = False
    compute_ppl: bool = True
    legacy: bool = False  # --output-format dat
    in_files: list[Path] = field(default_factory=list)


@dataclass(frozen=True)
class Plan:
    n_ctx: int  # tokens per chunk
    n_seq: int  # chunks per llama_decode
    n_batch: int
    n_chunk: int

    @property
    def n_kv(self) -> int:
        return self.n_seq * self.n_ctx


@dataclass
class ChunkDone:
    chunk: int  # 1-based
    ppl: float | None
    seconds: float  # since the first decode


class ImatrixRun:
    """One collection: load --in-file matrices, evaluate the text, save (also every --output-frequency)."""

    def __init__(self, req: ImatrixRequest, n_batch: int):
        if req.n_ctx <= 0:
            raise UsageError("imatrix needs -c/--ctx-size > 0", hint="the default is 512")
        if req.out_freq < 1:
            raise UsageError(f"--output-frequency {req.out_freq} must be at least 1")
        self.req = req
        n_seq = max(1, n_batch // req.n_ctx)
        self.n_batch = min(n_batch, n_seq * req.n_ctx)
        self.n_seq = n_seq
        if not (self.n_batch < req.n_ctx or self.n_batch % req.n_ctx == 0):
            raise UsageError(f"-b {n_batch} must be smaller than -c {req.n_ctx} or a multiple of it")
        self.matrix = storage.Matrix()
        self.collector = Collector(req.n_ctx, process_output=req.process_output, out_freq=req.out_freq,
                                   save_freq=req.save_freq, on_save=self.save)
        self.sums = NllSums()
        self.tokens: np.ndarray = np.zeros(0, np.int32)

    # ------------------------------------------------------------ files

    def load_inputs(self) -> None:
        for path in self.req.in_files:
            storage.load_into(self.matrix, path, self.req.n_ctx)
        self.collector.stats, self.collector.last_chunk = self.matrix.stats, self.matrix.last_chunk

    def save(self, n_chunk: int | None = None) -> Path:
        """Write the matrix (to OUTPUT, or OUTPUT.at_N for --save-frequency's numbered copies)."""
        path = self.req.output if n_chunk is None else Path(f"{self.req.output}.at_{n_chunk}")
        self.matrix.stats, self.matrix.last_chunk = self.collector.stats, self.collector.last_chunk
        storage.save(path, self.matrix, self.req.n_ctx, self.req.prompt_file, self.req.legacy)
        return path

    # ------------------------------------------------------------ evaluation

    def plan(self, model: Model, text: bytes) -> Plan:
        """Tokenize and check the text is long enough (two chunks at least, after --chunk's skip).

        Raises:
            InputError: too few tokens.
        """
        n_ctx, skip = self.req.n_ctx, self.req.skip_chunks
        tokens = model.tokenize(text, add_special=True, parse_special=False)
        if skip > 0:
            if (skip + 2) * n_ctx >= len(tokens):
                raise InputError(f"the text is {len(tokens)} tokens long: not enough is left after skipping "
                                 f"{skip} chunks of {n_ctx}", hint="use a longer text or a smaller --chunk")
            tokens = tokens[skip * n_ctx:]
        if len(tokens) < 2 * n_ctx:
            raise InputError(f"the text is {len(tokens)} tokens long; imatrix with a context of {n_ctx} needs at "
                             f"least {2 * n_ctx} tokens", hint="use a longer text or a smaller -c")
        self.tokens = tokens
        n_chunk_max = len(tokens) // n_ctx
        n_chunk = n_chunk_max if self.req.n_chunks < 0 else min(self.req.n_chunks, n_chunk_max)
        return Plan(n_ctx, self.n_seq, self.n_batch, n_chunk)

    def open_context(self, model: Model, settings: LoadSettings, plan: Plan) -> Context:
        return Context(model, settings, n_ctx=plan.n_kv, n_seq_max=plan.n_seq, cb_eval=self.collector.callback,
                       cb_eval_user_data=None)

    def chunks(self, ctx: Context, plan: Plan) -> Iterator[ChunkDone]:
        """Evaluate every chunk; yield each as it is done (several per decode when n_seq > 1).

        Raises:
            Interrupted: Ctrl-C; the matrix of the chunks done so far is saved first.
            PyllamaError: the collection failed (non-finite activations, inconsistent sizes).
        """
        stop = StopFlag()
        ctx.abort_check = lambda: bool(stop) or self.collector.failed()
        bos = ctx.model.bos if ctx.model.add_bos else None
        n_steps = -(-plan.n_ctx // plan.n_batch)
        start = time.perf_counter()
        done = 0
        try:
            with catch_sigint(stop), ctx.abortable(), Batch(plan.n_batch, 1) as batch:
                for i in range(0, plan.n_chunk, plan.n_seq):
                    snapshot = self.collector.snapshot()
                    group = min(plan.n_seq, plan.n_chunk - i)
                    try:
                        logits = self._decode_group(ctx, batch, plan, i, group, n_steps, bos)
                    except Interrupted:
                        self._fail_or_save(snapshot)
                        raise
                    self._raise_collector_error()
                    for seq in range(group):
                        ppl = self._score(logits, plan, i, seq) if logits is not None else None
                        done = i + seq + 1
                        yield ChunkDone(done, ppl, time.perf_counter() - start)
                    if stop:
                        self._fail_or_save(self.collector.snapshot())
                        raise Interrupted("imatrix interrupted")
        finally:
            ctx.abort_check = None

    def _fail_or_save(self, snapshot: object) -> None:
        self._raise_collector_error()
        self.collector.restore(snapshot)  # type: ignore[arg-type]
        path = self.save()
        raise Interrupted(f"imatrix interrupted; the {self.collector.last_chunk} chunks collected so far are in {path}")

    def _raise_collector_error(self) -> None:
        error = self.collector.error
        if error is not None:
            raise error if isinstance(error, PyllamaError) else PyllamaError(f"imatrix collection failed: {error!r}")

    def _decode_group(self, ctx: Context, batch: Batch, plan: Plan, i: int, group: int, n_steps: int,
                      bos: int | None) -> np.ndarray | None:
        ctx.clear_memory()
        start = i * plan.n_ctx
        gathered = []
        for j in range(n_steps):
            size = min(plan.n_ctx - j * plan.n_batch, plan.n_batch)
            rows = []
            for seq in range(group):
                first = start + j * plan.n_batch + seq * plan.n_ctx
                chunk = self.tokens[first:first + size].copy()
                if bos is not None and j == 0:
                    chunk[0] = bos
                rows.append(chunk)
            _fill(batch, np.concatenate(rows), j * plan.n_batch, size, group)
            ctx.decode(batch)
            if self.req.compute_ppl:
                n = group * size
                out = np.ctypeslib.as_array(lib.llama_get_logits(ctx.handle), shape=(n, ctx.model.n_vocab))
                gathered.append(out if n_steps == 1 else out.copy())
        if not self.req.compute_ppl:
            return None
        return gathered[0] if n_steps == 1 else np.concatenate(gathered)

    def _score(self, logits: np.ndarray, plan: Plan, i: int, seq: int) -> float:
        first = plan.n_ctx // 2
        base = (i + seq) * plan.n_ctx
        rows = logits[seq * plan.n_ctx + first:seq * plan.n_ctx + plan.n_ctx - 1]
        targets = self.tokens[base + first + 1:base + plan.n_ctx]
        self.sums.add(token_nll(rows, targets))
        return self.sums.ppl

    @property
    def uncertainty(self) -> float:
        return self.sums.uncertainty if self.sums.count > 1 else math.nan


def _fill(batch: Batch, tokens: np.ndarray, pos0: int, size: int, group: int) -> None:
    """Tokens of `group` sequences of `size` each, at positions pos0.., every one asking for logits."""
    raw, n = batch.raw, len(tokens)
    np.ctypeslib.as_array(raw.token, shape=(n,))[:] = tokens
    np.ctypeslib.as_array(raw.pos, shape=(n,))[:] = np.tile(np.arange(pos0, pos0 + size, dtype=np.int32), group)
    np.ctypeslib.as_array(raw.n_seq_id, shape=(n,))[:] = 1
    np.ctypeslib.as_array(raw.logits, shape=(n,))[:] = 1
    for k in range(n):
        raw.seq_id[k][0] = k // size
    batch.n_tokens = raw.n_tokens = n
