"""The hidden temporary file(s) llama.cpp writes a quantized model into, renamed into place only on success."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from ...errors import PyllamaError
from ..paths import hidden_temp_name, keep_mode, output_target
from .arguments import split_prefix

if TYPE_CHECKING:
    from .arguments import QuantizeRequest


class Staging:
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
        base = hidden_temp_name(split_prefix(req.output).name, room=len("-00001-of-00001.gguf"))
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
