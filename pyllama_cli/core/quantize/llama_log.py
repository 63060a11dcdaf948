"""llama.cpp's log during a quantization: progress per tensor, fallback warnings, and the reason it failed."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...errors import InputError, PyllamaError, UsageError

if TYPE_CHECKING:
    from .arguments import QuantizeRequest
    from .staging import Staging

_TENSOR_LINE = re.compile(r"^\[\s*(\d+)/\s*(\d+)\]\s+(\S+)")
_FAILED = "failed to quantize: "


@dataclass(frozen=True)
class TensorProgress:
    """Where a run is: tensors done (count and input bytes) out of the total, and the current one."""

    done: int
    total: int
    done_bytes: int
    total_bytes: int
    current: str


class LogParser:
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


def failure_error(req: QuantizeRequest, parser: LogParser, staging: Staging) -> PyllamaError:
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


def _write_failure(req: QuantizeRequest, staging: Staging, reason: str) -> PyllamaError:
    free = staging.free_bytes()  # measured before the partial file is removed
    folder = req.output_paths()[0].parent
    if free is not None and free < 64 * 1024 * 1024:
        return PyllamaError(f"the disk is full: writing {req.output_paths()[0].name} stopped with "
                            f"{free // (1024 * 1024)} MiB free in {folder}",
                            hint="free some space or choose an OUTPUT on another disk; nothing was written")
    return PyllamaError(f"could not write the output in {folder} (llama.cpp: {reason})",
                        hint="check that the folder is writable and its disk has space; nothing was written")
