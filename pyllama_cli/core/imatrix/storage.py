"""imatrix files as llama-imatrix writes and reads them, byte for byte.

GGUF (the default): `general.type` = imatrix, `imatrix.datasets`, `imatrix.chunk_count`,
`imatrix.chunk_size`, then per weight, in name order, `<name>.in_sum2` (the raw sums, one row per
matrix) and `<name>.counts` (rows seen per matrix), both F32.
Legacy `.dat`: the entry count; per entry its name, the chunk count and the values as sum/count
scaled by the chunk count; then the chunk count and the dataset's name.
Reading adds a file into running statistics, as `--in-file` combines matrices.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...errors import InputError, InvalidGGUF
from ..gguf.layout import (TYPE_U32, header, kv_scalar, kv_string, kv_strings, packed_offsets, pad, read_layout)
from ..gguf.reader import GGUF_MAGIC
from ..paths import atomic_write
from .collector import Stats

_F32 = 0
KEY_DATASETS, KEY_CHUNK_COUNT, KEY_CHUNK_SIZE = "imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size"


@dataclass
class Matrix:
    """What an imatrix file holds: statistics per weight, the datasets, and the chunk bookkeeping."""

    stats: dict[str, Stats] = field(default_factory=dict)
    datasets: list[str] = field(default_factory=list)  # from --in-file files, in order
    last_chunk: int = 0


# ---------------------------------------------------------------- writing


def gguf_bytes(m: Matrix, chunk_size: int, prompt_file: str | None) -> bytes:
    datasets = m.datasets + ([prompt_file] if prompt_file else [])
    kvs = [kv_string("general.type", "imatrix"), kv_strings(KEY_DATASETS, datasets),
           kv_scalar(KEY_CHUNK_COUNT, TYPE_U32, m.last_chunk), kv_scalar(KEY_CHUNK_SIZE, TYPE_U32, chunk_size)]
    arrays: list[tuple[str, np.ndarray, tuple[int, int]]] = []
    for name in sorted(m.stats, key=lambda n: n.encode()):
        s = m.stats[name]
        if s.values.size and s.counts.size:
            n_mat = s.counts.size
            arrays.append((f"{name}.in_sum2", s.values.astype(np.float32), (s.values.size // n_mat, n_mat)))
            arrays.append((f"{name}.counts", s.counts.astype(np.float32), (1, n_mat)))
    offsets = packed_offsets(a.nbytes for _, a, _ in arrays)
    parts = [header(kvs, [(name, shape, _F32, o) for (name, _, shape), o in zip(arrays, offsets)])]
    for _, a, _ in arrays:
        parts += [a.tobytes(), bytes(pad(a.nbytes) - a.nbytes)]
    return b"".join(parts)


def dat_bytes(m: Matrix, chunk_size: int, prompt_file: str | None) -> bytes:
    """The legacy format; weights without any data are left out, as llama-imatrix does."""
    kept = sorted((n for n, s in m.stats.items() if s.counts.size and s.counts.any()), key=lambda n: n.encode())
    out = [struct.pack("<i", len(kept))]
    for name in kept:
        s = m.stats[name]
        ncall = int((s.counts.max() + chunk_size - 1) // chunk_size)
        per_value = np.repeat(s.counts.astype(np.float32), s.values.size // s.counts.size)
        values = s.values.astype(np.float32)
        empty = per_value == 0
        values = np.where(empty, np.float32(1), values)
        per_value = np.where(empty, np.float32(1), per_value)
        scaled = (values / per_value) * np.float32(ncall)
        raw = name.encode()
        out += [struct.pack("<i", len(raw)), raw, struct.pack("<ii", ncall, s.values.size), scaled.tobytes()]
    dataset = prompt_file or (m.datasets[-1] if m.datasets else "")
    out.append(struct.pack("<i", m.last_chunk))
    out.append(struct.pack("<i", len(dataset.encode())) + dataset.encode())
    return b"".join(out)


def save(path: Path, m: Matrix, chunk_size: int, prompt_file: str | None, legacy: bool) -> None:
    """Write the matrix to `path`, whole or not at all."""
    data = (dat_bytes if legacy else gguf_bytes)(m, chunk_size, prompt_file)
    with atomic_write(path, "imatrix") as temp:
        temp.write_bytes(data)


# ---------------------------------------------------------------- reading


def load_into(m: Matrix, path: Path, chunk_size: int) -> None:
    """Add the file's statistics to `m` as llama-imatrix's --in-file does.

    Raises:
        InputError: a missing, unreadable or malformed file, or one whose sizes differ from `m`'s.
    """
    if not path.is_file():
        raise InputError(f"imatrix file {path} not found", hint="check the --in-file path")
    with open(path, "rb") as fh:
        is_gguf = fh.read(4) == GGUF_MAGIC
    if is_gguf:
        _add_gguf(m, path)
    else:
        _add_legacy(m, path, chunk_size)
    top = max((int(s.counts.max()) for s in m.stats.values() if s.counts.size), default=0)
    m.last_chunk = top // chunk_size


def _add_gguf(m: Matrix, path: Path) -> None:
    try:
        layout = read_layout(path)
    except InvalidGGUF as exc:
        raise InputError(f"{path} is not a valid imatrix file: {exc.message}") from None
    if not layout.tensors:
        raise InputError(f"{path} is not a valid imatrix file: it holds no data")
    data = np.memmap(path, np.uint8, mode="r")
    tensors = {t.name: t for t in layout.tensors}
    sums: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name in sorted({n.rsplit(".", 1)[0] for n in tensors if n.endswith((".in_sum2", ".counts"))}):
        s, c = tensors.get(f"{name}.in_sum2"), tensors.get(f"{name}.counts")
        if s is None or c is None:
            raise InputError(f"{path} is not a valid imatrix file: mismatched sums and counts for {name}")
        if s.ggml_type != _F32 or c.ggml_type != _F32:
            raise InputError(f"{path} is not a valid imatrix file: sums and counts for {name} must be F32")
        at = layout.data_offset
        sums[name] = (data[at + s.offset:at + s.offset + s.n_bytes].view(np.float32),
                      data[at + c.offset:at + c.offset + c.n_bytes].view(np.float32))
    for name, (values, counts) in sums.items():
        _add_entry(m, path, name, values, np.rint(counts).astype(np.int64))
    datasets = _string_array(layout, KEY_DATASETS)
    m.datasets.extend(datasets)


def _add_entry(m: Matrix, path: Path, name: str, values: np.ndarray, counts: np.ndarray) -> None:
    e = m.stats.setdefault(name, Stats())
    if e.values.size == 0:
        e.values = np.zeros(values.size, np.float32)
    elif e.values.size != values.size:
        raise InputError(f"{path}: mismatched sums size for {name}: {values.size} != {e.values.size}",
                         hint="combine matrices made for the same model")
    if e.counts.size == 0:
        e.counts = np.zeros(counts.size, np.int64)
    elif e.counts.size == 1 and counts.size > 1:
        e.counts = np.full(counts.size, e.counts[0], np.int64)
    elif e.counts.size != counts.size:
        raise InputError(f"{path}: mismatched counts size for {name}: {counts.size} != {e.counts.size}",
                         hint="combine matrices made for the same model")
    e.values += values
    e.counts += counts


def _string_array(layout: object, key: str) -> list[str]:
    from ..gguf.reader import read_gguf

    value = read_gguf(layout.path, check_data=False).get(key)  # type: ignore[attr-defined]
    return [str(v) for v in value] if isinstance(value, list) else []


def _add_legacy(m: Matrix, path: Path, chunk_size: int) -> None:
    data = path.read_bytes()
    bad = InputError(f"{path} is not a valid imatrix file", hint="give a file written by llama-imatrix or pyllama imatrix")
    pos = 4
    try:
        (n_entries,) = struct.unpack_from("<i", data, 0)
        if n_entries < 1:
            raise bad
        for _ in range(n_entries):
            (length,) = struct.unpack_from("<i", data, pos)
            name = data[pos + 4:pos + 4 + length].decode("utf-8", errors="replace")
            pos += 4 + length
            ncall, nval = struct.unpack_from("<ii", data, pos)
            pos += 8
            if nval < 1 or pos + 4 * nval > len(data):
                raise bad
            sums = np.frombuffer(data, np.float32, nval, pos)
            pos += 4 * nval
            e = m.stats.setdefault(name, Stats())
            if e.values.size == 0:
                e.values, e.counts = np.zeros(nval, np.float32), np.zeros(1, np.int64)
            elif e.values.size != nval:
                raise InputError(f"{path}: mismatched sums size for {name}: {nval} != {e.values.size}")
            e.values += sums * np.float32(chunk_size)
            e.counts += ncall * chunk_size
        if pos + 8 <= len(data):
            (length,) = struct.unpack_from("<i", data, pos + 4)
            if length > 0 and pos + 8 + length <= len(data):
                m.datasets.append(data[pos + 8:pos + 8 + length].split(b"\0")[0].decode("utf-8", "replace"))
    except struct.error:
        raise bad from None
