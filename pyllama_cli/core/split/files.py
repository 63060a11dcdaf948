"""Writing split parts and merged files: each file is a hidden temporary one until every file of the
run is complete, then all are renamed into place (an error or Ctrl-C leaves none of them).

Tensor data moves with copy_file_range, inside the kernel, where the filesystem allows it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from ...errors import InputError, InvalidGGUF, UsageError
from ..gguf.layout import Layout, RawTensor, pad, read_layout
from ..paths import atomic_write, require_folder
from .plan import KEY_COUNT, KEY_NO, KEY_TENSORS, Part, part_path, part_prefix

_CHUNK = 16 << 20  # bytes per read when the kernel cannot copy between the files


def read_model(path: Path) -> Layout:
    """The input's header, or one error line (missing file, folder, not GGUF)."""
    if path.is_dir():
        raise InputError(f"{path} is a folder, not a GGUF file", hint="give the model file")
    if not path.is_file():
        raise InputError(f"{path} not found", hint="check the input path")
    return read_layout(path)


def write_parts(source: Layout, parts: list[Part], on_part: Callable[[Path], None] | None = None) -> None:
    """Write every part from `source`; all of them appear together, at the end."""
    for part in parts:
        require_folder(part.path, "split part")
    with open(source.path, "rb") as src, ExitStack() as stack:
        for part in parts:
            temp = stack.enter_context(atomic_write(part.path, "split part"))
            _write_file(temp, part.header(), [(src, source.data_offset, part.tensors)])
            if on_part is not None:
                on_part(part.path)


# ---------------------------------------------------------------- merge


@dataclass
class MergePlan:
    parts: list[Layout]
    output: Part


def plan_merge(first: Path, output: Path) -> MergePlan:
    """Read every part named after `first` and check that they belong together.

    Raises:
        InputError: `first` is not a split's first part; a part is missing, not GGUF, or from another split.
        UsageError: OUTPUT exists (llama-gguf-split refuses it too).
    """
    head = read_model(first)
    count = head.value(KEY_COUNT)
    if not isinstance(count, int) or count < 1:
        raise InputError(f"{first} is not part of a split model (it has no {KEY_COUNT})",
                         hint="give the first part, NAME-00001-of-0000N.gguf")
    prefix = part_prefix(first, 0, count)
    if prefix is None or head.value(KEY_NO) not in (0, None):
        raise InputError(f"{first} is not the first of {count} parts",
                         hint=f"give the first part, {part_path('NAME', 0, count)}")
    if output.exists():
        raise UsageError(f"output file {output} already exists", hint="remove it or choose another name")
    require_folder(output, "merged model")
    parts = [head] + [_read_part(part_path(prefix, i, count), i, count, head) for i in range(1, count)]
    _check_distinct(parts)
    tensors = [t for p in parts for t in p.tensors]
    expected = head.value(KEY_TENSORS)
    if isinstance(expected, int) and expected != len(tensors):
        raise InputError(f"the {count} parts of {prefix} hold {len(tensors)} tensors, not the {expected} "
                         f"their metadata announces", hint="one of the parts is from another split")
    # The split's own keys go, so the merge is the file that was split, byte for byte. (llama-gguf-split
    # keeps them, with split.count 0; its merge is that file plus three keys.)
    kvs = [kv for kv in head.kvs if kv.key not in (KEY_NO, KEY_COUNT, KEY_TENSORS)]
    return MergePlan(parts, Part(output, kvs, tensors))


def _read_part(path: Path, index: int, count: int, head: Layout) -> Layout:
    if not path.is_file():
        raise InputError(f"split part missing: {path}", hint=f"all {count} parts must sit beside the first")
    try:
        part = read_layout(path)
    except InvalidGGUF as exc:
        raise InputError(f"split part {path} is not a valid GGUF file", hint=exc.hint) from None
    same = (part.value(KEY_NO) == index and part.value(KEY_COUNT) == count
            and part.value(KEY_TENSORS) == head.value(KEY_TENSORS))
    if not same:
        raise InputError(f"split part {path} belongs to another split model "
                         f"(split.no {part.value(KEY_NO)}, split.count {part.value(KEY_COUNT)})",
                         hint=f"expected part {index + 1} of {count}")
    return part


def _check_distinct(parts: list[Layout]) -> None:
    """A part cut from another split of the same model repeats a tensor of an earlier part."""
    seen: set[str] = set()
    for part in parts:
        for t in part.tensors:
            if t.name in seen:
                raise InputError(f"split part {part.path} belongs to another split: tensor {t.name} is also in "
                                 f"an earlier part", hint="merge the parts of one split only")
            seen.add(t.name)


def write_merged(plan: MergePlan) -> None:
    out = plan.output
    with ExitStack() as stack:
        files = [stack.enter_context(open(p.path, "rb")) for p in plan.parts]
        temp = stack.enter_context(atomic_write(out.path, "merged model"))
        _write_file(temp, out.header(), [(f, p.data_offset, p.tensors) for f, p in zip(files, plan.parts)])


# ---------------------------------------------------------------- bytes


def _write_file(temp: Path, head: bytes, sources: list[tuple[object, int, list[RawTensor]]]) -> None:
    with open(temp, "r+b") as out:
        out.write(head)
        out.flush()
        fd = out.fileno()
        for src, data_offset, tensors in sources:
            for t in tensors:
                _copy(src.fileno(), fd, data_offset + t.offset, t.n_bytes)  # type: ignore[attr-defined]
                gap = pad(t.n_bytes) - t.n_bytes
                if gap:
                    os.write(fd, bytes(gap))


def _copy(src: int, dst: int, offset: int, n: int) -> None:
    for done in _kernel_copy(src, dst, offset, n):
        offset += done
        n -= done
    while n > 0:
        data = os.pread(src, min(n, _CHUNK), offset)
        if not data:
            raise InputError("a split input ended early", hint="the file may be truncated")
        os.write(dst, data)
        offset += len(data)
        n -= len(data)


def _kernel_copy(src: int, dst: int, offset: int, n: int) -> Iterator[int]:
    """Bytes copied by copy_file_range, until done or unsupported (the caller copies the rest)."""
    while n > 0:
        try:
            done = os.copy_file_range(src, dst, n, offset)
        except OSError:
            return
        if done <= 0:
            return
        offset += done
        n -= done
        yield done

