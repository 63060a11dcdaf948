"""How llama-gguf-split cuts a model: tensors in file order, a new part when the next tensor would pass
--split-max-size (its data padded to 32 bytes counts) or every --split-max-tensors tensors; all of the
metadata in the first part; `split.no`, `split.count` and `split.tensors.count` in every part.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import UsageError
from ..gguf.layout import (TYPE_I32, TYPE_U16, Layout, RawKV, RawTensor, header, kv_scalar, packed_offsets, pad,
                           set_kv)

KEY_NO, KEY_COUNT, KEY_TENSORS = "split.no", "split.count", "split.tensors.count"
DEFAULT_MAX_TENSORS = 128
_SIZE = re.compile(r"(-?\d+)([MG])")


def part_path(prefix: str, index: int, count: int) -> Path:
    """llama.cpp's name of part `index` (0-based) of `count`: PREFIX-00001-of-00003.gguf."""
    return Path(f"{prefix}-{index + 1:05d}-of-{count:05d}.gguf")


def part_prefix(path: Path, index: int, count: int) -> str | None:
    """The PREFIX of a part's name, or None when the name does not end as part `index` of `count` would."""
    suffix = f"-{index + 1:05d}-of-{count:05d}.gguf"
    text = str(path)
    return text[:-len(suffix)] if text.endswith(suffix) else None


def parse_size(text: str) -> int:
    """--split-max-size: a whole number of megabytes (M, 10^6 bytes) or gigabytes (G, 10^9 bytes)."""
    match = _SIZE.match(text)
    if not text or text[-1] not in "MG":
        raise UsageError(f"--split-max-size {text!r}: the units are M (megabytes) or G (gigabytes)",
                         hint="e.g. --split-max-size 500M or --split-max-size 2G")
    if match is None or int(match.group(1)) <= 0:
        raise UsageError(f"--split-max-size {text!r}: the size must be a positive whole number",
                         hint="e.g. --split-max-size 500M or --split-max-size 2G")
    return int(match.group(1)) * (10**6 if text[-1] == "M" else 10**9)


@dataclass
class Part:
    path: Path
    kvs: list[RawKV]
    tensors: list[RawTensor] = field(default_factory=list)

    def header(self) -> bytes:
        offsets = packed_offsets(t.n_bytes for t in self.tensors)
        return header(self.kvs, [(t.name, t.shape, t.ggml_type, o) for t, o in zip(self.tensors, offsets)])

    @property
    def size(self) -> int:
        """As llama-gguf-split counts it: the header and each tensor's data, unpadded."""
        return len(self.header()) + sum(t.n_bytes for t in self.tensors)


def plan_split(layout: Layout, prefix: str, *, max_tensors: int = DEFAULT_MAX_TENSORS, max_bytes: int | None = None,
               no_tensor_first_split: bool = False) -> list[Part]:
    """The parts llama-gguf-split writes for `layout` (by size when `max_bytes` is given).

    Raises:
        UsageError: a limit so small that a part would hold no tensor.
    """
    n_tensors = len(layout.tensors)
    if max_bytes is None and max_tensors <= 0:
        raise UsageError(f"--split-max-tensors {max_tensors} must be at least 1")
    parts: list[Part] = []

    def new_part(allow_empty: bool) -> None:
        if parts and not parts[-1].tensors and not allow_empty:
            raise UsageError("one of the parts would hold no tensor",
                             hint="raise --split-max-size or --split-max-tensors")
        kvs = list(layout.kvs) if not parts else []
        for entry in (kv_scalar(KEY_NO, TYPE_U16, len(parts)), kv_scalar(KEY_COUNT, TYPE_U16, 0),
                      kv_scalar(KEY_TENSORS, TYPE_I32, n_tensors)):
            set_kv(kvs, entry)
        parts.append(Part(Path(), kvs))

    new_part(False)
    if no_tensor_first_split:
        new_part(True)
    used = 0
    for i, tensor in enumerate(layout.tensors):
        n = pad(tensor.n_bytes)
        if max_bytes is not None:
            cut = used + n > max_bytes
        else:
            cut = 0 < i and i % max_tensors == 0
        if cut:
            new_part(False)
            used = n
        else:
            used += n
        parts[-1].tensors.append(tensor)
    for i, part in enumerate(parts):
        set_kv(part.kvs, kv_scalar(KEY_COUNT, TYPE_U16, len(parts)))
        part.path = part_path(prefix, i, len(parts))
    return parts


def plan_lines(parts: list[Part]) -> list[str]:
    """llama-gguf-split's plan: the part count, then each part's tensors and size in whole megabytes."""
    lines = [f"n_split: {len(parts)}"]
    for i, part in enumerate(parts):
        lines.append(f"split {i + 1:05d}: n_tensors = {len(part.tensors)}, total_size = {part.size // 1000 // 1000}M")
    return lines
