"""A GGUF file's header as bytes: its metadata entries kept whole, its tensor table, and the writer
of new headers in ggml's own layout (for gguf-split and imatrix files that match llama.cpp's bytes).

ggml writes a header as: magic, version 3, tensor count (u64), entry count (u64), each entry (key,
type, value), each tensor's info (name, dimension count, dimensions, type, offset), then zeros up to
the alignment (32 for every file it creates). A tensor's dimension count is ggml_n_dims: trailing
dimensions of 1 are not written. Entries copied from another file keep their exact bytes.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ...errors import InvalidGGUF
from .reader import _ARRAY, GGML_TYPES, GGUF_MAGIC, MAX_KV_COUNT, MAX_TENSOR_COUNT, _Reader, _read_tensor_info

ALIGNMENT = 32  # what ggml gives every GGUF it creates (gguf_init_empty)
VERSION = 3
# GGUF metadata value types ggml writes for the keys pyllama sets.
TYPE_U16, TYPE_U32, TYPE_I32, TYPE_F32, TYPE_STRING, TYPE_ARRAY = 2, 4, 5, 6, 8, 9


@dataclass(frozen=True)
class RawKV:
    key: str
    raw: bytes  # the whole entry as stored: key, type and value


@dataclass(frozen=True)
class RawTensor:
    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int  # from the start of the data section
    n_bytes: int


@dataclass(frozen=True)
class Layout:
    path: Path
    kvs: list[RawKV]
    tensors: list[RawTensor]
    data_offset: int
    file_size: int

    def value(self, key: str) -> object:
        """A scalar entry's value (None when absent or not a scalar)."""
        for kv in self.kvs:
            if kv.key == key:
                r = _Reader(kv.raw, len(kv.raw), self.path)
                r.string()
                vtype = r.unpack("<I")
                return None if vtype == _ARRAY else r.value(vtype)
        return None


def read_layout(path: Path) -> Layout:
    """The header of `path`, entry by entry, and its tensor table.

    Raises:
        InvalidGGUF: not a GGUF file, or a truncated or corrupt one.
    """
    size = path.stat().st_size
    with open(path, "rb") as fh:
        if fh.read(4) != GGUF_MAGIC:
            raise InvalidGGUF(f"{path} is not a GGUF file (it does not start with the GGUF magic bytes)",
                              hint="give a .gguf model file")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            r = _Reader(buf, size, path, strings=False)
            r.pos = 4
            version = r.unpack("<I")
            if version not in (2, 3):
                raise r.fail(f"unsupported GGUF version {version}")
            n_tensors, n_kv = r.unpack("<Q"), r.unpack("<Q")
            if n_tensors > MAX_TENSOR_COUNT or n_kv > MAX_KV_COUNT:
                raise r.fail(f"implausible counts ({n_tensors} tensors, {n_kv} metadata keys)")
            kvs, alignment = [], ALIGNMENT
            for _ in range(n_kv):
                start = r.tell()
                key = r.string()
                value = r.value(r.unpack("<I"))
                if key == "general.alignment" and isinstance(value, int) and value > 0:
                    alignment = value
                kvs.append(RawKV(key, bytes(buf[start:r.tell()])))
            infos = [_read_tensor_info(r) for _ in range(n_tensors)]
            data_offset = -(-r.tell() // alignment) * alignment
    tensors = [RawTensor(t.name, t.shape, t.ggml_type, t.offset, t.n_bytes) for t in infos]
    for t in tensors:
        if data_offset + t.offset + t.n_bytes > size:
            raise InvalidGGUF(f"{path} is truncated: tensor {t.name!r} runs past the end of the file",
                              hint="the download or conversion did not finish; fetch the file again")
    return Layout(path, kvs, tensors, data_offset, size)


# ---------------------------------------------------------------- writing


def pad(n: int, alignment: int = ALIGNMENT) -> int:
    return -(-n // alignment) * alignment


def encode_string(text: str | bytes) -> bytes:
    data = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(data)) + data


def kv_scalar(key: str, vtype: int, value: int | float) -> RawKV:
    fmt = {TYPE_U16: "<H", TYPE_U32: "<I", TYPE_I32: "<i", TYPE_F32: "<f"}[vtype]
    return RawKV(key, encode_string(key) + struct.pack("<I", vtype) + struct.pack(fmt, value))


def kv_string(key: str, value: str) -> RawKV:
    return RawKV(key, encode_string(key) + struct.pack("<I", TYPE_STRING) + encode_string(value))


def kv_strings(key: str, values: Iterable[str]) -> RawKV:
    items = [encode_string(v) for v in values]
    head = encode_string(key) + struct.pack("<IIQ", TYPE_ARRAY, TYPE_STRING, len(items))
    return RawKV(key, head + b"".join(items))


def set_kv(kvs: list[RawKV], entry: RawKV) -> None:
    """ggml's gguf_set_val_*: an existing key is removed, and the entry goes last."""
    kvs[:] = [kv for kv in kvs if kv.key != entry.key]
    kvs.append(entry)


def n_dims(shape: tuple[int, ...]) -> int:
    """ggml_n_dims: the dimensions up to the last one that is not 1 (at least one)."""
    n = len(shape)
    while n > 1 and shape[n - 1] == 1:
        n -= 1
    return n


def tensor_bytes(shape: tuple[int, ...], ggml_type: int) -> int:
    _, block, size = GGML_TYPES[ggml_type]
    count = 1
    for d in shape:
        count *= d
    return count // block * size


def header(kvs: list[RawKV], tensors: list[tuple[str, tuple[int, ...], int, int]]) -> bytes:
    """A whole header, padded to ALIGNMENT: `tensors` are (name, shape, ggml type, data offset)."""
    parts = [GGUF_MAGIC, struct.pack("<IQQ", VERSION, len(tensors), len(kvs))]
    parts += [kv.raw for kv in kvs]
    for name, shape, ggml_type, offset in tensors:
        dims = shape[:n_dims(shape)]
        parts.append(encode_string(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, ggml_type, offset))
    data = b"".join(parts)
    return data + bytes(pad(len(data)) - len(data))


def packed_offsets(sizes: Iterable[int]) -> list[int]:
    """Each tensor's data offset when every tensor's data is padded to ALIGNMENT (gguf_add_tensor)."""
    offsets, at = [], 0
    for n in sizes:
        offsets.append(at)
        at += pad(n)
    return offsets
