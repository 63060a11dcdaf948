"""llama-quantize's command line as it reads it: the positional arguments, type names, --override-kv, and
the `QuantizeRequest` they make (quantizer.py runs it; staging.py and llama_log.py read it too).

The type table itself is in `core.gguf.ftypes`; here are the rules for reading INPUT [OUTPUT] TYPE
[NTHREADS], the output name made from INPUT and the type, and KEY=TYPE:VALUE metadata overrides.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ...errors import UsageError
from ..gguf.ftypes import BY_NAME, QuantType, find_type, parse_type

_SPLIT_SUFFIX = re.compile(r"-\d{5}-of-\d{5}$", re.IGNORECASE)
_KV_TYPES = ("int", "float", "bool", "str")
_KV_INT_MAX = 2**32 - 1


# ---------------------------------------------------------------- positionals


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


# ---------------------------------------------------------------- output names


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


def split_prefix(path: Path) -> Path:
    return path.with_name(path.name[:-5]) if path.name.lower().endswith(".gguf") else path


# ---------------------------------------------------------------- metadata overrides


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
        prefix = split_prefix(self.output)
        n = len(self.inputs)
        return [prefix.with_name(f"{prefix.name}-{i:05d}-of-{n:05d}.gguf") for i in range(1, n + 1)]
