"""Quantize a GGUF model with llama.cpp's `llama_model_quantize`, as `llama-quantize` does.

Holds the reading of llama-quantize's positional arguments (its type table is in ftypes), the
parameters it passes (imatrix data and metadata overrides included, in the same order, so the output is
byte-identical), and the file safety around the call: llama.cpp writes to a hidden temporary file
next to the output that is renamed into place only on success; an error or Ctrl-C removes it.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import InputError, Interrupted, PyllamaError, UsageError
from ..gguf.ftypes import BY_NAME, QuantType, find_type, parse_type
from ..gguf.reader import read_gguf
from ..paths import hidden_temp_name, keep_mode, output_target, require_folder
from ..model.settings import MAX_THREADS

if TYPE_CHECKING:  # the imatrix reader is imported only by the runs that pass --imatrix
    from .imatrix import ImatrixData

_SPLIT_SUFFIX = re.compile(r"-\d{5}-of-\d{5}$", re.IGNORECASE)
_KV_TYPES = ("int", "float", "bool", "str")
_KV_INT_MAX = 2**32 - 1


# ---------------------------------------------------------------- arguments


@dataclass(frozen=True)
class Positionals:
    """llama-quantize's positional arguments: INPUT [OUTPUT] TYPE [NTHREADS]."""

    input: str | None
    output: str | None
    quant: QuantType
    nthreads: int | None


def parse_positionals(args: Sequence[str], *, input_named: bool) -> Positionals:
    """Read the positionals as llama-quantize does: the word after INPUT is TYPE if it names a type,
    else OUTPUT (then TYPE follows); a trailing integer is the thread count.

    With `input_named` (-m/-hf given) there is no INPUT positional.
    """
    rest = list(args)
    order = "[OUTPUT] TYPE [NTHREADS]" if input_named else "INPUT [OUTPUT] TYPE [NTHREADS]"
    source = None if input_named else (rest.pop(0) if rest else None)
    if not rest:
        raise UsageError("missing quantization TYPE" if input_named or source else "missing INPUT and TYPE",
                         hint=f"usage: pyllama quantize {order}; pyllama quantize --list shows the types")
    output = None
    quant = find_type(rest[0])
    if quant is None:
        if len(rest) == 1:
            parse_type(rest[0])  # a lone unknown word: say which types come close
        output = rest.pop(0)
        quant = parse_type(rest[0])
    rest.pop(0)
    nthreads = _parse_threads(rest, order)
    return Positionals(source, output, quant, nthreads)


def _parse_threads(rest: list[str], order: str) -> int | None:
    if not rest:
        return None
    if not re.fullmatch(r"-?[0-9]+", rest[0]):  # ASCII digits: int() would choke on "²"
        raise UsageError(f"unexpected argument {rest[0]!r} after TYPE",
                         hint=f"the order is {order}; NTHREADS is a number")
    if len(rest) > 1:
        raise UsageError(f"unexpected argument {rest[1]!r} after NTHREADS", hint=f"the order is {order}")
    return int(rest[0])


def default_output(source: Path, quant: QuantType, *, from_hub: bool) -> Path:
    """INPUT's stem with the type (`model-Q4_K_M.gguf`) next to INPUT (in the current folder for -hf).

    A trailing type or split suffix of the stem is dropped: model-F16.gguf gives model-Q4_K_M.gguf.
    """
    stem = source.name[:-5] if source.name.lower().endswith(".gguf") else source.name
    stem = _SPLIT_SUFFIX.sub("", stem)
    base, sep, last = stem.rpartition("-")
    if sep and base and last.upper() in BY_NAME:
        stem = base
    folder = Path.cwd() if from_hub else source.parent
    return folder / f"{stem}-{quant.name}.gguf"


@dataclass(frozen=True)
class KvOverride:
    key: str
    kind: str  # int, float, bool or str
    value: int | float | bool | str


def parse_override_kv(text: str) -> KvOverride:
    """KEY=TYPE:VALUE with TYPE int, float, bool or str (llama.cpp's --override-kv)."""
    key, sep, typed = text.partition("=")
    kind, colon, raw = typed.partition(":")
    hint = "write KEY=TYPE:VALUE with TYPE int, float, bool or str, e.g. general.name=str:my-model"
    if not sep or not key or not colon or kind not in _KV_TYPES:
        raise UsageError(f"malformed --override-kv {text!r}", hint=hint)
    if len(key.encode()) > 127 or (kind == "str" and len(raw.encode()) > 127):
        raise UsageError(f"--override-kv {text!r} is too long (keys and strings: 127 bytes at most)")
    try:
        value = _kv_value(kind, raw)
    except ValueError:
        raise UsageError(f"--override-kv {text!r}: {raw!r} is not a valid {kind}", hint=hint) from None
    if kind == "int" and not 0 <= value <= _KV_INT_MAX:
        # llama.cpp writes an int override as a uint32 of its absolute value: anything else would change.
        raise UsageError(f"--override-kv {text!r}: an int is stored as an unsigned 32-bit value",
                         hint=f"give 0 to {_KV_INT_MAX}")
    return KvOverride(key, kind, value)


def _kv_value(kind: str, raw: str) -> int | float | bool | str:
    if kind == "bool":
        if raw not in ("true", "false"):
            raise ValueError(raw)
        return raw == "true"
    return {"int": int, "float": float, "str": str}[kind](raw)


# ---------------------------------------------------------------- the request


@dataclass
class QuantizeRequest:
    """Everything one quantization needs; field names follow llama-quantize's flags."""

    inputs: tuple[Path, ...]  # the input file, or every part of a split input (first part first)
    output: Path  # with keep_split: the name prefix of the output parts
    quant: QuantType
    nthread: int = 0  # 0: llama.cpp uses every hardware thread
    allow_requantize: bool = False
    leave_output_tensor: bool = False
    pure: bool = False
    keep_split: bool = False
    output_tensor_type: int | None = None
    token_embedding_type: int | None = None
    imatrix: str | None = None  # as the user wrote it: llama-quantize stores this text in the file
    include_weights: tuple[str, ...] = ()
    exclude_weights: tuple[str, ...] = ()
    overrides: tuple[KvOverride, ...] = ()
    force: bool = False
    verbose: bool = False
    log_file: Path | None = None

    @property
    def source(self) -> Path:
        return self.inputs[0]

    def output_paths(self) -> list[Path]:
        """The files the run writes: one, or one per input part with keep_split (llama.cpp's names)."""
        if not self.keep_split:
            return [self.output]
        prefix = _split_prefix(self.output)
        n = len(self.inputs)
        return [prefix.with_name(f"{prefix.name}-{i:05d}-of-{n:05d}.gguf") for i in range(1, n + 1)]


def _split_prefix(path: Path) -> Path:
    return path.with_name(path.name[:-5]) if path.name.lower().endswith(".gguf") else path


@dataclass(frozen=True)
class TensorProgress:
    """Where a run is: tensors done (count and input bytes) out of the total, and the current one."""

    done: int
    total: int
    done_bytes: int
    total_bytes: int
    current: str


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
    staging = _Staging(req)
    parser = _LogParser(sizes, follow_current=on_progress is not None)
    start = time.perf_counter()
    try:
        status = _run_worker(req, imatrix, staging, parser, on_progress)
        if status != 0:
            raise _failure(req, parser, staging)
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


def _run_worker(req: QuantizeRequest, imatrix: ImatrixData | None, staging: _Staging, parser: _LogParser,
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


def _wait(worker: threading.Thread, parser: _LogParser, on_progress: Callable[[TensorProgress], None] | None
          ) -> None:
    seen = -1
    while worker.is_alive():
        worker.join(0.05)
        if on_progress is not None:
            snap = parser.snapshot()
            if snap.done != seen:
                seen = snap.done
                on_progress(snap)


def _stop(worker: threading.Thread, staging: _Staging, parser: _LogParser) -> None:
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
    from ..model.native import lib

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


# ---------------------------------------------------------------- the temporary files


class _Staging:
    """Hidden temporary file(s) next to the output that llama.cpp writes; renamed into place on success.

    Each name is random, and tried with O_EXCL (which also proves the folder writable), then
    released again: llama.cpp creates the file itself, as llama-quantize does, with mode 0666 less
    the umask. Leaving the empty file for llama.cpp to open with O_TRUNC would cost a second or
    more on big models: ext4 treats truncating an existing file as "replace its contents" and,
    when it is closed, pushes all of it to disk (auto_da_alloc) before close returns.
    """

    def __init__(self, req: QuantizeRequest):
        self.finals = [output_target(p) for p in req.output_paths()]  # a symlinked OUTPUT stays a link
        first = self.finals[0]
        # llama.cpp appends "-00001-of-00003.gguf" to the name of each part of a split output.
        base = hidden_temp_name(_split_prefix(req.output).name, room=len("-00001-of-00001.gguf"))
        self.llama_target = first.with_name(base)
        if req.keep_split:
            n = len(self.finals)
            self.temps = [first.with_name(f"{base}-{i:05d}-of-{n:05d}.gguf") for i in range(1, n + 1)]
        else:
            self.temps = [self.llama_target]
        for path in self.temps:
            self._reserve(path)

    @staticmethod
    def _reserve(path: Path) -> None:
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            os.unlink(path)
        except OSError as exc:
            raise PyllamaError(f"cannot write in {path.parent}: {exc.strerror}",
                               hint="choose an OUTPUT in a folder you can write to") from None

    def commit(self) -> None:
        try:
            for temp, final in zip(self.temps, self.finals):
                keep_mode(final, temp)  # a private model stays private
                os.replace(temp, final)
        except OSError as exc:
            raise PyllamaError(f"cannot rename the finished output to {exc.filename2 or exc.filename}: "
                               f"{exc.strerror}", hint="check the OUTPUT path") from None
        self.temps = []

    def discard(self) -> None:
        for path in self.temps:
            try:
                path.unlink()
            except FileNotFoundError:
                pass

    def sabotage(self) -> None:
        """Point llama.cpp's open descriptors of the temporary files at /dev/full (Linux only)."""
        names = {os.path.realpath(p) for p in self.temps}  # as /proc shows them: absolute, links resolved
        try:
            fds = os.listdir("/proc/self/fd")
            full = os.open("/dev/full", os.O_WRONLY)
        except OSError:
            return
        try:
            for fd in fds:
                try:
                    if os.readlink(f"/proc/self/fd/{fd}") in names:
                        os.dup2(full, int(fd))
                except OSError:
                    continue
        finally:
            os.close(full)

    def free_bytes(self) -> int | None:
        try:
            return shutil.disk_usage(self.finals[0].parent).free
        except OSError:
            return None


# ---------------------------------------------------------------- llama.cpp's log


_TENSOR_LINE = re.compile(r"^\[\s*(\d+)/\s*(\d+)\]\s+(\S+)")
_FAILED = "failed to quantize: "


class _LogParser:
    """Follows llama.cpp's per-tensor log lines (`[  3/201] name - [...], type = f16, ...`).

    Fed from the worker thread, read from the main thread: all state is behind one lock.
    llama.cpp logs a tensor's line in pieces; a tensor is done when its line ends.
    """

    def __init__(self, sizes: dict[str, int], *, follow_current: bool = True):
        self.sizes = sizes
        self.follow_current = follow_current  # only a progress bar shows the tensor in the works
        self.lock = threading.Lock()
        self.pending = ""
        self.done = 0
        self.total = 0
        self.done_bytes = 0
        self.current = ""
        self.reason: str | None = None
        self.warnings: list[str] = []
        self.on_line: Callable[[], None] | None = None

    def feed(self, level: int, text: str) -> None:
        with self.lock:
            self.pending += text
            while "\n" in self.pending:
                line, self.pending = self.pending.split("\n", 1)
                self._line(level, line)
            if self.follow_current:
                self._peek()
        if self.on_line is not None:
            self.on_line()

    def _peek(self) -> None:
        match = _TENSOR_LINE.match(self.pending)
        if match:
            self.total = int(match.group(2))
            self.current = match.group(3)

    def _line(self, level: int, line: str) -> None:
        # An error can end a tensor's unfinished line, so look for it first.
        if _FAILED in line:
            self.reason = line.split(_FAILED, 1)[1].strip()
            return
        match = _TENSOR_LINE.match(line)
        if match:
            self.done = int(match.group(1))
            self.total = int(match.group(2))
            self.done_bytes += self.sizes.get(match.group(3), 0)
        elif line.startswith("warning: ") and "falling back" in line:
            # `warning: NAME - ncols N not divisible by 256 (required for type q4_K) -> falling back to q5_0`
            self.warnings.append(" ".join(line[len("warning: "):].split()))

    def snapshot(self) -> TensorProgress:
        with self.lock:
            return TensorProgress(self.done, self.total, self.done_bytes, sum(self.sizes.values()), self.current)


def _failure(req: QuantizeRequest, parser: _LogParser, staging: _Staging) -> PyllamaError:
    """Turn llama.cpp's `failed to quantize: ...` reason into an error that says what to do."""
    reason = parser.reason or "no reason given"
    if "requantizing from type" in reason:
        return UsageError(f"{req.source.name} is already quantized ({reason})",
                          hint="quantize from the F16/BF16/F32 original, or pass --allow-requantize "
                               "(quality drops more than quantizing once)")
    if "requires an imatrix" in reason or "Missing importance matrix" in reason:
        hint = ("the imatrix lacks that tensor: check --include-weights/--exclude-weights, or use one made for "
                "this model" if req.imatrix else "pass --imatrix FILE made for this model")
        return UsageError(f"{req.quant.name} needs importance-matrix data for every tensor it quantizes "
                          f"(llama.cpp: {reason})", hint=hint)
    if "imatrix" in reason:
        return InputError(f"the imatrix does not fit this model: {reason}",
                          hint="use an imatrix computed for this model with llama-imatrix")
    if "iostream" in reason or "basic_ios" in reason or "write" in reason:
        return _write_failure(req, staging, reason)
    return PyllamaError(f"llama.cpp could not quantize {req.source}: {reason}",
                        hint="run again with --verbose to see llama.cpp's log")


def _write_failure(req: QuantizeRequest, staging: _Staging, reason: str) -> PyllamaError:
    free = staging.free_bytes()  # measured before the partial file is removed
    folder = req.output_paths()[0].parent
    if free is not None and free < 64 * 1024 * 1024:
        return PyllamaError(f"the disk is full: writing {req.output_paths()[0].name} stopped with "
                            f"{free // (1024 * 1024)} MiB free in {folder}",
                            hint="free some space or choose an OUTPUT on another disk; nothing was written")
    return PyllamaError(f"could not write the output in {folder} (llama.cpp: {reason})",
                        hint="check that the folder is writable and its disk has space; nothing was written")
