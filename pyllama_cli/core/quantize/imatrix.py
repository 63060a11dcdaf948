"""Read an importance matrix (llama-imatrix's output) into the per-tensor weights llama.cpp's
quantizer takes, exactly as llama-quantize computes them (so the quantized bytes match).

Two formats: the GGUF one (`<tensor>.in_sum2` and `<tensor>.counts` F32 tensors plus `imatrix.*`
metadata) and the legacy binary `.dat` one.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from ...errors import InputError
from ..gguf.reader import GGUF_MAGIC, read_gguf

if TYPE_CHECKING:
    import numpy as np

_F32 = 0
_METADATA_KEYS = ("imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size")


@dataclass
class ImatrixData:
    """Per-tensor importance weights (float32), the datasets they came from, and the chunk count."""

    entries: dict[str, np.ndarray] = field(default_factory=dict)
    datasets: list[str] = field(default_factory=list)
    chunk_count: int = 0


def load_imatrix(path_text: str, include: Sequence[str] = (), exclude: Sequence[str] = ()) -> ImatrixData:
    """Load an imatrix file and keep the entries llama-quantize would keep.

    `exclude` drops entries whose name contains any of its strings; `include` then keeps only the
    entries whose name contains one of its strings.

    Raises:
        InputError: a missing, unreadable or malformed file.
    """
    path = Path(path_text)
    if path.is_dir():
        raise InputError(f"imatrix file {path_text} is a folder", hint="give the imatrix file in it")
    if not path.is_file():
        raise InputError(f"imatrix file {path_text} not found", hint="check the --imatrix path")
    with open(path, "rb") as fh:
        is_gguf = fh.read(4) == GGUF_MAGIC
    data = _load_gguf(path) if is_gguf else _load_legacy(path)
    data.entries = {name: values for name, values in data.entries.items()
                    if not any(s in name for s in exclude)}
    if include:
        data.entries = {name: values for name, values in data.entries.items() if any(s in name for s in include)}
    return data


def _bad(path: Path, what: str) -> InputError:
    return InputError(f"{path} is not a usable imatrix file: {what}",
                      hint="make one with llama.cpp's llama-imatrix for this model")


def _load_gguf(path: Path) -> ImatrixData:
    gguf = read_gguf(path)
    if not gguf.tensors:
        raise _bad(path, "it holds no data")
    if not all(key in gguf.metadata for key in _METADATA_KEYS):
        raise _bad(path, "the imatrix metadata (imatrix.datasets, chunk_count, chunk_size) is missing")
    datasets = gguf.metadata["imatrix.datasets"]
    data = ImatrixData(datasets=[str(d) for d in datasets] if isinstance(datasets, list) else [],
                       chunk_count=int(gguf.metadata["imatrix.chunk_count"]))
    pairs: dict[str, dict[str, object]] = {}
    for t in gguf.tensors:
        for suffix in (".in_sum2", ".counts"):
            if t.name.endswith(suffix):
                pairs.setdefault(t.name[: -len(suffix)], {})[suffix] = t
    with open(path, "rb") as fh:
        for name, pair in sorted(pairs.items()):
            if len(pair) != 2:
                raise _bad(path, f"mismatched sums and counts for {name}")
            sums, counts = (_read_f32(fh, gguf.data_offset, pair[s], path) for s in (".in_sum2", ".counts"))
            data.entries[name] = _normalise(sums, counts)
    return data


def _read_f32(fh: BinaryIO, data_offset: int, tensor: object, path: Path) -> np.ndarray:
    if tensor.ggml_type != _F32:  # type: ignore[attr-defined]
        raise _bad(path, f"{tensor.name} is not F32")  # type: ignore[attr-defined]
    import numpy as np  # here, not at the top: `pyllama quantize` without --imatrix never needs numpy

    fh.seek(data_offset + tensor.offset)  # type: ignore[attr-defined]
    return np.fromfile(fh, dtype="<f4", count=tensor.n_elements).astype(np.float32)  # type: ignore[attr-defined]


def _normalise(sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Mean squared activation per column: sums / count for each expert's slice; 1 where nothing was seen."""
    import numpy as np

    # llama.cpp rounds the stored counts to integers (half away from zero), then divides in float32.
    whole = np.where(counts >= 0, np.floor(counts + 0.5), np.ceil(counts - 0.5)).astype(np.float32)
    rows = sums.reshape(len(counts), -1)
    out = np.ones_like(rows)
    seen = whole > 0
    out[seen] = rows[seen] / whole[seen][:, None]
    return out.reshape(-1)


def _load_legacy(path: Path) -> ImatrixData:
    import numpy as np

    raw = path.read_bytes()
    pos = 0

    def take(fmt: str) -> tuple:
        nonlocal pos
        size = struct.calcsize(fmt)
        if pos + size > len(raw):
            raise _bad(path, "it ends early (neither GGUF nor the legacy format)")
        values = struct.unpack_from(fmt, raw, pos)
        pos += size
        return values

    (n_entries,) = take("<i")
    if n_entries < 1:
        raise _bad(path, "it holds no data")
    data = ImatrixData()
    for _ in range(n_entries):
        (length,) = take("<i")
        name = take(f"<{max(length, 0)}s")[0].split(b"\0", 1)[0].decode("utf-8", errors="replace")
        ncall, nval = take("<ii")
        if nval < 1:
            raise _bad(path, f"entry {name!r} has no values")
        sums = np.array(take(f"<{nval}f"), dtype=np.float32)
        data.entries[name] = sums / np.float32(ncall) if ncall > 0 else sums
    if pos + 4 <= len(raw):  # optional trailer: chunk count, then the dataset name
        (data.chunk_count,) = take("<i")
        if pos + 4 <= len(raw):
            (length,) = take("<i")
            if length > 0 and pos + length <= len(raw):
                data.datasets.append(take(f"<{length}s")[0].split(b"\0", 1)[0].decode("utf-8", errors="replace"))
    return data
