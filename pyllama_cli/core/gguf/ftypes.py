"""llama.cpp's model file types (`general.file_type`, LLAMA_FTYPE_*) by number and name, and
llama-quantize's type list (with the ggml tensor types its flags accept)."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Any

from ...errors import UsageError

# LLAMA_FTYPE number -> name as llama-quantize spells it.
FTYPE_NAMES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1",
    10: "Q2_K", 11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M",
    16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S",
    22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M",
    28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0",
    37: "TQ2_0", 38: "MXFP4_MOE", 39: "NVFP4", 40: "Q1_0", 41: "Q2_0",
}


def ftype_name(ftype: int | None) -> str | None:
    """The name of a `general.file_type` value, or None when absent or unknown."""
    if ftype is None:
        return None
    # Bit 10 (1024) marks a file type guessed by the converter; the rest is the type.
    return FTYPE_NAMES.get(int(ftype) & ~1024)


@dataclass(frozen=True)
class QuantType:
    """One entry of llama-quantize's type list."""

    name: str
    ftype: int
    bpw: float | None  # bits per weight of the main tensors (mixes keep some tensors wider)
    description: str
    needs_imatrix: bool = False
    alias_of: str | None = None


def _t(name: str, ftype: int, bpw: float | None, desc: str, **kw: Any) -> QuantType:
    return QuantType(name, ftype, bpw, desc, **kw)


_LLAMA3 = "ppl @ Llama-3-8B"
# llama-quantize's list, in its order (which also decides what a bare number means).
QUANT_TYPES: tuple[QuantType, ...] = (
    _t("Q1_0", 40, 1.125, "1.125 bpw quantization"),
    _t("Q2_0", 41, 2.25, "2.25 bpw quantization (group 64)"),
    _t("Q4_0", 2, 4.5, f"4.34G, +0.4685 {_LLAMA3}"),
    _t("Q4_1", 3, 5.0, f"4.78G, +0.4511 {_LLAMA3}"),
    _t("MXFP4_MOE", 38, 4.25, "MXFP4 MoE"),
    _t("Q5_0", 8, 5.5, f"5.21G, +0.1316 {_LLAMA3}"),
    _t("Q5_1", 9, 6.0, f"5.65G, +0.1062 {_LLAMA3}"),
    _t("IQ2_XXS", 19, 2.06, "2.06 bpw quantization", needs_imatrix=True),
    _t("IQ2_XS", 20, 2.31, "2.31 bpw quantization", needs_imatrix=True),
    _t("IQ2_S", 28, 2.5, "2.5  bpw quantization", needs_imatrix=True),
    _t("IQ2_M", 29, 2.7, "2.7  bpw quantization", needs_imatrix=True),
    _t("IQ1_S", 24, 1.56, "1.56 bpw quantization", needs_imatrix=True),
    _t("IQ1_M", 31, 1.75, "1.75 bpw quantization", needs_imatrix=True),
    _t("TQ1_0", 36, 1.69, "1.69 bpw ternarization"),
    _t("TQ2_0", 37, 2.06, "2.06 bpw ternarization"),
    _t("Q2_K", 10, 2.625, f"2.96G, +3.5199 {_LLAMA3}"),
    _t("Q2_K_S", 21, 2.625, f"2.96G, +3.1836 {_LLAMA3}", needs_imatrix=True),
    _t("IQ3_XXS", 23, 3.06, "3.06 bpw quantization", needs_imatrix=True),
    _t("IQ3_S", 26, 3.44, "3.44 bpw quantization"),
    _t("IQ3_M", 27, 3.66, "3.66 bpw quantization mix"),
    _t("Q3_K", 12, 3.4375, "alias for Q3_K_M", alias_of="Q3_K_M"),
    _t("IQ3_XS", 22, 3.3, "3.3 bpw quantization", needs_imatrix=True),
    _t("Q3_K_S", 11, 3.4375, f"3.41G, +1.6321 {_LLAMA3}"),
    _t("Q3_K_M", 12, 3.4375, f"3.74G, +0.6569 {_LLAMA3}"),
    _t("Q3_K_L", 13, 3.4375, f"4.03G, +0.5562 {_LLAMA3}"),
    _t("IQ4_NL", 25, 4.5, "4.50 bpw non-linear quantization"),
    _t("IQ4_XS", 30, 4.25, "4.25 bpw non-linear quantization"),
    _t("Q4_K", 15, 4.5, "alias for Q4_K_M", alias_of="Q4_K_M"),
    _t("Q4_K_S", 14, 4.5, f"4.37G, +0.2689 {_LLAMA3}"),
    _t("Q4_K_M", 15, 4.5, f"4.58G, +0.1754 {_LLAMA3}"),
    _t("Q5_K", 17, 5.5, "alias for Q5_K_M", alias_of="Q5_K_M"),
    _t("Q5_K_S", 16, 5.5, f"5.21G, +0.1049 {_LLAMA3}"),
    _t("Q5_K_M", 17, 5.5, f"5.33G, +0.0569 {_LLAMA3}"),
    _t("Q6_K", 18, 6.5625, f"6.14G, +0.0217 {_LLAMA3}"),
    _t("Q8_0", 7, 8.5, f"7.96G, +0.0026 {_LLAMA3}"),
    _t("F16", 1, 16.0, "14.00G, +0.0020 ppl @ Mistral-7B"),
    _t("BF16", 32, 16.0, "14.00G, -0.0050 ppl @ Mistral-7B"),
    _t("F32", 0, 32.0, "26.00G              @ 7B"),
    _t("COPY", 0, None, "only copy tensors, no quantizing"),
)
BY_NAME = {t.name: t for t in QUANT_TYPES}

# ggml tensor types accepted by --output-tensor-type/--token-embedding-type (ggml's numbering).
GGML_TENSOR_TYPES: dict[str, int] = {
    "F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q2_K": 10, "Q3_K": 11,
    "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "IQ2_XXS": 16, "IQ2_XS": 17, "IQ3_XXS": 18, "IQ1_S": 19,
    "IQ4_NL": 20, "IQ3_S": 21, "IQ2_S": 22, "IQ4_XS": 23, "IQ1_M": 29, "BF16": 30, "TQ1_0": 34,
    "TQ2_0": 35, "MXFP4": 39, "NVFP4": 40, "Q1_0": 41, "Q2_0": 42,
}


def find_type(text: str) -> QuantType | None:
    """A type by name (any case) or by llama.cpp file-type number; numbers give the full name."""
    quant = BY_NAME.get(text.strip().upper())
    if quant is not None:
        return quant
    if not re.fullmatch(r"[0-9]+", text.strip()):  # int() would also read "1_5" and "١٥" as 15
        return None
    number = int(text)
    return next((t for t in QUANT_TYPES if t.ftype == number and t.alias_of is None), None)


def parse_type(text: str) -> QuantType:
    """Like find_type, but an unknown name is an error that lists the close matches."""
    quant = find_type(text)
    if quant is None:
        raise _unknown("quantization type", text, list(BY_NAME), "pyllama quantize --list shows every type")
    return quant


def parse_tensor_type(text: str | None, flag: str) -> int | None:
    """A ggml tensor type name (q8_0, Q4_K, f16, ...) as its ggml number (None stays None)."""
    if text is None:
        return None
    number = GGML_TENSOR_TYPES.get(text.strip().upper())
    if number is None:
        raise _unknown(f"tensor type for {flag}", text, list(GGML_TENSOR_TYPES),
                       "tensor types: " + ", ".join(t.lower() for t in GGML_TENSOR_TYPES))
    return number


def _unknown(what: str, text: str, names: list[str], fallback_hint: str) -> UsageError:
    close = difflib.get_close_matches(text.upper(), names, n=4, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}? ({fallback_hint})" if close else fallback_hint
    return UsageError(f"unknown {what} {text!r}", hint=hint)


def size_label(n_params: int) -> str:
    """A parameter count as GGUF converters write general.size_label: two significant digits at least."""
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n_params >= scale:
            scaled = n_params / scale
            decimals = max(2 - len(str(round(scaled))), 0)
            return f"{scaled:.{decimals}f}{suffix}"
    return str(n_params)
