"""The memory-mapped model file, watched so that a truncated file is an error instead of a SIGBUS."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from pathlib import Path

from ...errors import ModelLoadError


def _size_reader() -> Callable[[int], int]:
    """The size of an open file, read before every decode.

    lseek(fd, 0, SEEK_END) through libc keeps the GIL (see _keeping_gil); os.fstat would release it
    just before llama_decode. Where libc cannot be reached that way, os.fstat it is.
    """
    try:
        libc = ctypes.PyDLL(None)
        seek = getattr(libc, "lseek64", None) or libc.lseek
    except (OSError, AttributeError, TypeError):
        return lambda fd: os.fstat(fd).st_size
    seek.argtypes, seek.restype = (ctypes.c_int, ctypes.c_int64, ctypes.c_int), ctypes.c_int64

    def size(fd: int) -> int:
        end = seek(fd, 0, os.SEEK_END)
        return end if end >= 0 else os.fstat(fd).st_size

    return size


_current_size = _size_reader()


class MappedFile:
    """The model file whose weights llama.cpp reads through mmap.

    Deleting or replacing the file is harmless (the mapping keeps the old data), but truncating it
    makes any access to the lost pages kill the process with SIGBUS. Decoding checks the size of
    the file (through a descriptor of its own, so a replaced file does not count) beforehand.
    """

    def __init__(self, path: Path):
        self.path = path
        self.fd = os.open(path, os.O_RDONLY)
        self.size = os.fstat(self.fd).st_size

    def check(self) -> None:
        size = _current_size(self.fd)
        if size < self.size:
            raise ModelLoadError(f"{self.path} was truncated while in use ({size} of {self.size} bytes left)",
                                 hint="restore the file and restart; --no-mmap keeps a private copy of the weights")

    def close(self) -> None:
        os.close(self.fd)
