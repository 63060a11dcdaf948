"""Quantize a GGUF model with llama.cpp's `llama_model_quantize`, as `llama-quantize` does.

Holds the request's checks, the parameters llama-quantize passes (imatrix data and metadata overrides
included, in the same order, so the output is byte-identical), and the run: llama.cpp works in a
thread, writing to a hidden temporary file (`staging`) that is renamed into place only on success; an
error or Ctrl-C removes it. Reading the command line, and the request it makes, is in `arguments`,
following llama.cpp's log in `llama_log`.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import Interrupted, UsageError
from ..gguf.ftypes import QuantType
from ..gguf.reader import read_gguf
from ..model.limits import MAX_THREADS
from ..paths import output_target, require_folder
from .arguments import KvOverride, QuantizeRequest
# commands/quantize.py calls these as quantizer.NAME, so they stay reachable here.
from .arguments import default_output, parse_override_kv, parse_positionals  # noqa: F401
from .llama_log import LogParser, TensorProgress, failure_error
from .staging import Staging

if TYPE_CHECKING:  # the imatrix reader is imported only by the runs that pass --imatrix
    from .imatrix import ImatrixData


# ---------------------------------------------------------------- the request


@dataclass
class QuantizeResult:
    outputs: list[Path]
    quant: QuantType
    input_bytes: int
    output_bytes: int
    seconds: float
    imatrix_entries: int = 0
    warnings: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return self.input_bytes / self.output_bytes if self.output_bytes else 0.0


def check_request(req: QuantizeRequest) -> None:
    """Refuse what would fail, lose data or overwrite, before any work starts.

    Raises:
        UsageError: conflicting options, a missing imatrix, OUTPUT equal to INPUT, an existing OUTPUT.
        InputError: the output folder is missing or a file; OUTPUT is a FIFO, a device...
    """
    if req.include_weights and req.exclude_weights:
        raise UsageError("--include-weights and --exclude-weights cannot be used together")
    if (req.include_weights or req.exclude_weights) and not req.imatrix:
        raise UsageError("--include-weights/--exclude-weights select imatrix entries; they need --imatrix FILE")
    if not 0 <= req.nthread <= MAX_THREADS:
        raise UsageError(f"thread count {req.nthread} is out of range",
                         hint=f"give 1 to {MAX_THREADS} (ggml's limit), or 0 for every hardware thread")
    if req.quant.needs_imatrix and not req.imatrix:
        raise UsageError(f"{req.quant.name} needs an importance matrix",
                         hint="make one with llama-imatrix and pass --imatrix FILE, or pick a type such as IQ3_S or Q2_K")
    for out in req.output_paths():
        if any(_same_file(out, inp) for inp in req.inputs):
            raise UsageError(f"OUTPUT {out} is the input file", hint="give a different OUTPUT name")
        if out.is_dir():
            raise UsageError(f"OUTPUT {out} is a folder", hint=f"give a file name, e.g. {out / 'model.gguf'}")
        require_folder(out, "OUTPUT")
        if out.exists() and not req.force:
            raise UsageError(f"{out} already exists", hint="pass --force to replace it, or choose another OUTPUT")
    _check_one_folder(req)


def _check_one_folder(req: QuantizeRequest) -> None:
    """llama.cpp writes every part of a split output into one folder; symlinked parts must lead there too."""
    folders = {os.path.realpath(output_target(out).parent) for out in req.output_paths()}
    if len(folders) > 1:
        raise UsageError(f"the output parts lead to more than one folder ({', '.join(sorted(folders))})",
                         hint="with --keep-split, keep all the OUTPUT parts (or their link targets) in one folder")


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and os.path.samefile(a, b)
    except OSError:
        return False


# ---------------------------------------------------------------- running


def quantize_model(req: QuantizeRequest, *, on_progress: Callable[[TensorProgress], None] | None = None
                   ) -> QuantizeResult:
    """Quantize `req.inputs` into `req.output_paths()` with llama_model_quantize.

    llama.cpp runs in a worker thread while this (main) thread waits interruptibly, so Ctrl-C is
    seen at once. `on_progress` is called from this thread after each tensor.

    Raises:
        UsageError, InputError: see check_request; also an unusable imatrix.
        Interrupted: Ctrl-C or SIGTERM (no output file is left behind).
        PyllamaError: llama.cpp refused the model or could not write the output (a full disk says so).
    """
    check_request(req)
    imatrix = _load_imatrix(req) if req.imatrix else None
    # Tensor sizes weight the progress bar; without one, skip re-reading the header.
    sizes = {t.name: t.n_bytes for p in req.inputs for t in read_gguf(p, strings=False).tensors} if on_progress else {}
    staging = Staging(req)
    parser = LogParser(sizes, follow_current=on_progress is not None)
    start = time.perf_counter()
    try:
        status = _run_worker(req, imatrix, staging, parser, on_progress)
        if status != 0:
            raise failure_error(req, parser, staging)
        staging.commit()
    finally:
        staging.discard()
    outputs = req.output_paths()
    return QuantizeResult(
        outputs=outputs, quant=req.quant, input_bytes=sum(p.stat().st_size for p in req.inputs),
        output_bytes=sum(p.stat().st_size for p in outputs), seconds=time.perf_counter() - start,
        imatrix_entries=len(imatrix.entries) if imatrix else 0, warnings=parser.warnings,
    )


def _load_imatrix(req: QuantizeRequest) -> ImatrixData:
    from .imatrix import load_imatrix

    return load_imatrix(req.imatrix, req.include_weights, req.exclude_weights)


def _run_worker(req: QuantizeRequest, imatrix: ImatrixData | None, staging: Staging, parser: LogParser,
                on_progress: Callable[[TensorProgress], None] | None) -> int:
    from ..model.library import configure_logging, lib, log_listener

    configure_logging(req.verbose, req.log_file)
    params, keepalive = build_params(req, imatrix)
    status: list[int] = []

    # `keep` holds what params points into for as long as the thread runs, even past an interrupt.
    def work(keep: list[Any] = keepalive) -> None:
        status.append(int(lib.llama_model_quantize(
            str(req.source).encode(), str(staging.llama_target).encode(), ctypes.byref(params))))

    worker = threading.Thread(target=work, name="llama_model_quantize", daemon=True)
    with log_listener(parser.feed), _sigterm_as_interrupt():
        try:
            worker.start()
            _wait(worker, parser, on_progress)
        except KeyboardInterrupt:
            _stop(worker, staging, parser)
            raise Interrupted("quantization interrupted; no output file was written") from None
    return status[0] if status else 1


def _wait(worker: threading.Thread, parser: LogParser, on_progress: Callable[[TensorProgress], None] | None
          ) -> None:
    seen = -1
    while worker.is_alive():
        worker.join(0.05)
        if on_progress is not None:
            snap = parser.snapshot()
            if snap.done != seen:
                seen = snap.done
                on_progress(snap)


def _stop(worker: threading.Thread, staging: Staging, parser: LogParser) -> None:
    """Make llama.cpp give up: its next write to the temporary file fails, so it unwinds and returns."""
    parser.on_line = staging.sabotage  # a file it opens later is caught at its next tensor line
    staging.sabotage()
    staging.discard()
    try:
        worker.join(30)
    except KeyboardInterrupt:
        pass  # a second Ctrl-C: leave now; the temporary file is already gone
    staging.discard()


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Handle SIGTERM like Ctrl-C while llama.cpp writes, so the temporary file is removed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def build_params(req: QuantizeRequest, imatrix: ImatrixData | None) -> tuple[Any, list[Any]]:
    """llama_model_quantize_params as llama-quantize fills them; also the objects they point into,
    which must stay alive until the call returns."""
    from ..model.library import lib

    params = lib.llama_model_quantize_default_params()
    params.ftype = req.quant.ftype
    params.nthread = max(req.nthread, 0)
    params.allow_requantize = req.allow_requantize
    params.quantize_output_tensor = not req.leave_output_tensor
    params.pure = req.pure
    params.keep_split = req.keep_split
    params.only_copy = req.quant.name == "COPY"
    if req.output_tensor_type is not None:
        params.output_tensor_type = req.output_tensor_type
    if req.token_embedding_type is not None:
        params.token_embedding_type = req.token_embedding_type
    keepalive: list[Any] = []
    overrides = list(req.overrides)
    if imatrix is not None and imatrix.entries:
        params.imatrix = _imatrix_array(lib, imatrix, keepalive)
        overrides += imatrix_overrides(req.imatrix or "", imatrix)
    if overrides:
        params.kv_overrides = _kv_array(lib, overrides, keepalive)
    return params, keepalive


def imatrix_overrides(path_text: str, imatrix: ImatrixData) -> list[KvOverride]:
    """The quantize.imatrix.* keys llama-quantize records, in its order (strings cut to 127 bytes)."""
    keys = [KvOverride("quantize.imatrix.file", "str", _cut(path_text))]
    if imatrix.datasets:
        keys.append(KvOverride("quantize.imatrix.dataset", "str", _cut(imatrix.datasets[0])))
    keys.append(KvOverride("quantize.imatrix.entries_count", "int", len(imatrix.entries)))
    if imatrix.chunk_count > 0:
        keys.append(KvOverride("quantize.imatrix.chunks_count", "int", imatrix.chunk_count))
    return keys


def _cut(text: str) -> str:
    return text.encode()[:127].decode("utf-8", errors="ignore")


def _imatrix_array(lib: Any, imatrix: ImatrixData, keepalive: list[Any]) -> Any:
    entries = list(imatrix.entries.items())
    array = (lib.llama_model_imatrix_data * (len(entries) + 1))()
    for slot, (name, values) in zip(array, entries):
        slot.name = name.encode()
        slot.data = values.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        slot.size = values.size
    keepalive += [array, imatrix]
    return array


def _kv_array(lib: Any, overrides: list[KvOverride], keepalive: list[Any]) -> Any:
    tags = {"int": lib.LLAMA_KV_OVERRIDE_TYPE_INT, "float": lib.LLAMA_KV_OVERRIDE_TYPE_FLOAT,
            "bool": lib.LLAMA_KV_OVERRIDE_TYPE_BOOL, "str": lib.LLAMA_KV_OVERRIDE_TYPE_STR}
    array = (lib.llama_model_kv_override * (len(overrides) + 1))()  # zeroed: the last one ends the list
    for slot, kv in zip(array, overrides):
        slot.key = kv.key.encode()
        slot.tag = tags[kv.kind]
        if kv.kind == "int":
            slot.value.val_i64 = int(kv.value)
        elif kv.kind == "float":
            slot.value.val_f64 = float(kv.value)
        elif kv.kind == "bool":
            slot.value.val_bool = bool(kv.value)
        else:
            slot.value.val_str = str(kv.value).encode()
    keepalive.append(array)
    return array
