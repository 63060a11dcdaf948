"""A small, defensive GGUF reader: header, metadata and tensor table, no weights.

pyllama reads every file itself before llama.cpp sees it, so that a truncated or corrupt file ends
in a clear error instead of a crash inside the C++ loader, and so that `info` is instant.
Format facts: magic "GGUF", version 2 or 3, little-endian, then KV pairs and tensor infos, then
aligned tensor data (alignment from `general.alignment`, default 32).
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from ...errors import InvalidGGUF

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# Hostile headers can claim billions of entries; real files stay far below these.
MAX_KV_COUNT = 1_000_000
MAX_TENSOR_COUNT = 1_000_000
MAX_STRING_BYTES = 256 * 1024 * 1024
MAX_ARRAY_LEN = 64 * 1024 * 1024
MAX_DIMS = 4

# GGUF metadata value types.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9

# ggml type id -> (name, block size in elements, bytes per block).
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292), 16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17),
    40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18), 42: ("Q2_0", 64, 18),
}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int

    @property
    def type_name(self) -> str:
        return GGML_TYPES.get(self.ggml_type, (f"type{self.ggml_type}", 1, 0))[0]

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def n_bytes(self) -> int:
        _, block, size = GGML_TYPES[self.ggml_type]
        return self.n_elements // block * size


@dataclass
class GGUFFile:
    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: list[TensorInfo]
    data_offset: int
    file_size: int
    # Metadata keys whose value is an array, with its element type name, for summaries.
    array_types: dict[str, str] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "unknown"))

    def arch_key(self, suffix: str, default: Any = None) -> Any:
        return self.metadata.get(f"{self.architecture}.{suffix}", default)


@dataclass(frozen=True)
class UnreadStrings:
    """A string array that `read_gguf(strings=False)` stepped over (a vocabulary, typically)."""

    count: int


_U64 = struct.Struct("<Q")


class _Reader:
    """Bounds-checked little-endian reads from a memory-mapped file of known size.

    Reading from a mapping (not per-field file reads) keeps a 256k-token vocabulary to a fraction
    of a second, which every command pays before loading a model.
    """

    def __init__(self, buf: Any, size: int, path: Path, strings: bool = True):
        self.buf, self.size, self.path, self.pos = buf, size, path, 0
        self.strings = strings  # False: step over string arrays without decoding them
        # With strings=False: a string array that does not fit the file is reported as a decoding
        # read reports it (the length that runs past the end), not in _skip_strings' shorter words.
        self.exact_errors = False

    def tell(self) -> int:
        return self.pos

    def fail(self, what: str) -> InvalidGGUF:
        return InvalidGGUF(
            f"{self.path} is not a valid GGUF file: {what}",
            hint="the file may be truncated or corrupt; download or convert it again",
        )

    def read(self, n: int) -> bytes:
        if self.pos + n > self.size:
            raise self.fail(f"header ends early at byte {self.size}")
        data = self.buf[self.pos:self.pos + n]
        self.pos += n
        return data

    def unpack(self, fmt: str) -> Any:
        n = struct.calcsize(fmt)
        if self.pos + n > self.size:
            raise self.fail(f"header ends early at byte {self.size}")
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += n
        return value

    def string(self) -> str:
        n = self.unpack("<Q")
        if n > MAX_STRING_BYTES or self.pos + n > self.size:
            raise self.fail(f"string length {n} runs past the end of the file")
        return self.read(n).decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            return self.array()
        raise self.fail(f"unknown metadata value type {vtype}")

    def array(self) -> list[Any] | UnreadStrings:
        item_type = self.unpack("<I")
        n = self.unpack("<Q")
        if n > MAX_ARRAY_LEN or n > self.size - self.pos:
            raise self.fail(f"array length {n} runs past the end of the file")
        if item_type in _SCALARS:
            fmt = _SCALARS[item_type]
            raw = self.read(struct.calcsize(fmt) * n)
            return list(struct.unpack(f"<{n}{fmt[1]}", raw))
        if item_type == _STRING:
            return self.string_array(n)
        return [self.value(item_type) for _ in range(n)]

    def string_array(self, n: int) -> list[str] | UnreadStrings:
        if self.strings:
            return self._decode_strings(n)
        if not self.exact_errors:
            return self._skip_strings(n)
        start = self.pos
        try:
            return self._skip_strings(n)
        except InvalidGGUF:
            self.pos = start
            self._decode_strings(n)  # raises, naming the string that runs past the end
            raise

    def _decode_strings(self, n: int) -> list[str]:
        # The hot loop of a header read (vocabularies): locals only, one unpack and one slice per string.
        buf, pos, size, unpack = self.buf, self.pos, self.size, _U64.unpack_from
        out: list[str] = [""] * n
        for i in range(n):
            if pos + 8 > size:
                self.pos = pos
                raise self.fail(f"header ends early at byte {size}")
            (length,) = unpack(buf, pos)
            end = pos + 8 + length
            if length > MAX_STRING_BYTES or end > size:
                self.pos = pos
                raise self.fail(f"string length {length} runs past the end of the file")
            out[i] = buf[pos + 8:end].decode("utf-8", errors="replace")
            pos = end
        self.pos = pos
        return out

    def _skip_strings(self, n: int) -> UnreadStrings:
        # Only the lengths matter here, so the loop does nothing else: a length that runs past the
        # end makes a later unpack fail, or leaves `pos` beyond the end, and both are caught below.
        buf, pos, unpack = self.buf, self.pos, _U64.unpack_from
        try:
            for _ in range(n):
                pos += 8 + unpack(buf, pos)[0]
        except struct.error:  # fewer than 8 bytes at `pos`
            pass
        else:
            if pos <= self.size:
                self.pos = pos
                return UnreadStrings(n)
        raise self.fail("a string length runs past the end of the file" if pos > self.size
                        else f"header ends early at byte {self.size}")


def _type_name(vtype: int) -> str:
    names = {0: "u8", 1: "i8", 2: "u16", 3: "i16", 4: "u32", 5: "i32", 6: "f32", 7: "bool",
             8: "str", 9: "arr", 10: "u64", 11: "i64", 12: "f64"}
    return names.get(vtype, "?")


def read_gguf(path: str | os.PathLike[str], *, check_data: bool = True,
              strings: bool | Collection[str] = True) -> GGUFFile:
    """Read a GGUF file's header and tensor table.

    Args:
        path: the file.
        check_data: also check that every tensor's data lies inside the file (catches truncation).
        strings: decode string arrays; False checks their bounds only and leaves an UnreadStrings
            (a 256k-token vocabulary costs a tenth of a second to decode, which quantize never needs).
            A collection of keys decodes those arrays only (the token texts, not a BPE vocabulary's
            merges, which are often twice as many); the others are stepped over, and a damaged one
            is reported in the same words as when every array is decoded.

    Raises:
        InvalidGGUF: not a GGUF file, an unsupported version, or a truncated/corrupt header or data.
    """
    p = Path(path)
    size = p.stat().st_size
    with open(p, "rb") as fh, _mapped(fh, size) as buf:
        r = _Reader(buf, size, p, strings is True)
        r.exact_errors = strings is not False
        magic = r.buf[:4]
        if magic != GGUF_MAGIC:
            raise InvalidGGUF(
                f"{p} is not a GGUF file (it does not start with the GGUF magic bytes)",
                hint="pyllama runs GGUF models; convert other formats with llama.cpp's convert_hf_to_gguf.py",
            )
        r.pos = 4
        version = r.unpack("<I")
        if version not in (2, 3):
            raise r.fail(f"unsupported GGUF version {version}")
        n_tensors, n_kv = r.unpack("<Q"), r.unpack("<Q")
        if n_tensors > MAX_TENSOR_COUNT or n_kv > MAX_KV_COUNT:
            raise r.fail(f"implausible counts ({n_tensors} tensors, {n_kv} metadata keys)")
        metadata, array_types = _read_metadata(r, n_kv, None if isinstance(strings, bool) else frozenset(strings))
        tensors = [_read_tensor_info(r) for _ in range(n_tensors)]
        alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise r.fail(f"general.alignment {_show(alignment)} is not a power of two")
        data_offset = -(-r.tell() // alignment) * alignment
    gguf = GGUFFile(p, version, metadata, tensors, data_offset, size, array_types)
    if check_data:
        _check_tensor_data(gguf, r)
    return gguf


def read_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The metadata of a GGUF file's header alone: no tensor table, string arrays left unread.

    For listings (`pyllama list`): a few kilobytes of the file, whatever the model's size.
    Raises InvalidGGUF as read_gguf does.
    """
    p = Path(path)
    size = p.stat().st_size
    with open(p, "rb") as fh, _mapped(fh, size) as buf:
        r = _Reader(buf, size, p, strings=False)
        if r.buf[:4] != GGUF_MAGIC:
            raise r.fail("it does not start with the GGUF magic bytes")
        r.pos = 4
        if r.unpack("<I") not in (2, 3):
            raise r.fail("unsupported GGUF version")
        r.unpack("<Q")  # the tensor count
        n_kv = r.unpack("<Q")
        if n_kv > MAX_KV_COUNT:
            raise r.fail(f"implausible count of {n_kv} metadata keys")
        return _read_metadata(r, n_kv)[0]


def _read_metadata(r: _Reader, n_kv: int, decoded: frozenset[str] | None = None
                   ) -> tuple[dict[str, Any], dict[str, str]]:
    """The key-value pairs; with `decoded`, only the string arrays of those keys are decoded."""
    metadata: dict[str, Any] = {}
    array_types: dict[str, str] = {}
    for _ in range(n_kv):
        key = r.string()
        vtype = r.unpack("<I")
        if vtype == _ARRAY:
            pos = r.tell()
            array_types[key] = _type_name(r.unpack("<I"))
            r.pos = pos
            if decoded is not None:
                r.strings = key in decoded
        metadata[key] = r.value(vtype)
    return metadata, array_types


def _read_tensor_info(r: _Reader) -> TensorInfo:
    name = r.string()
    n_dims = r.unpack("<I")
    if n_dims == 0 or n_dims > MAX_DIMS:
        raise r.fail(f"tensor {_show(name)} has {n_dims} dimensions")
    shape = tuple(r.unpack("<Q") for _ in range(n_dims))
    ggml_type = r.unpack("<I")
    offset = r.unpack("<Q")
    if ggml_type not in GGML_TYPES:
        raise r.fail(f"tensor {_show(name)} has unknown type {ggml_type}")
    if any(d == 0 or d > 1 << 40 for d in shape):
        raise r.fail(f"tensor {_show(name)} has an impossible shape {list(shape)}")
    block = GGML_TYPES[ggml_type][1]
    if shape[0] % block:
        raise r.fail(f"tensor {_show(name)} row of {shape[0]} is not a multiple of its block size {block}")
    return TensorInfo(name, shape, ggml_type, offset)


def _check_tensor_data(gguf: GGUFFile, r: _Reader) -> None:
    for t in gguf.tensors:
        end = gguf.data_offset + t.offset + t.n_bytes
        if end > gguf.file_size:
            missing = end - gguf.file_size
            raise InvalidGGUF(
                f"{gguf.path} is truncated: tensor {_show(t.name)} needs {missing} bytes past the end of the file",
                hint="the download or conversion did not finish; fetch the file again",
            )


@contextmanager
def _mapped(fh: BinaryIO, size: int) -> Iterator[Any]:
    """The file's bytes as a read-only mapping (an empty file cannot be mapped: plain bytes then)."""
    if size == 0:
        yield b""
        return
    with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        yield mapped


def _show(value: Any, limit: int = 80) -> str:
    """repr() cut short for messages: a corrupt header can make a name megabytes long."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def is_split_first_part(path: Path) -> bool:
    """Whether `path` names the first part of a split model (NAME-00001-of-0000N.gguf)."""
    stem = path.name.lower()
    return "-00001-of-" in stem and stem.endswith(".gguf")
