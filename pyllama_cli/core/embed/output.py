"""llama-embedding's output formats: raw (one embedding per line), array, json (OpenAI's list) and
json+ (json plus the cosine similarity matrix). Numbers are written as it writes them: 7 decimals,
or none with --embd-normalize 0 (int16-scaled values)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

FORMATS = ("raw", "array", "json", "json+")


def _number(value: float, mode: int) -> str:
    return f"{value:.0f}" if mode == 0 else f"{value:.7f}"


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """llama.cpp's common_embd_similarity_cos (1 for two zero vectors, 0 for one)."""
    x, y = a.astype(np.float64), b.astype(np.float64)
    both, na, nb = float(np.dot(x, y)), float(np.dot(x, x)), float(np.dot(y, y))
    if na == 0.0 or nb == 0.0:
        return 1.0 if na == nb == 0.0 else 0.0
    return both / (math.sqrt(na) * math.sqrt(nb))


def format_embeddings(vectors: Sequence[np.ndarray], fmt: str, mode: int, n_prompts: int) -> str:
    """The text llama-embedding writes for `vectors` in format `fmt` (normalisation `mode`)."""
    rows = [",".join(_number(float(v), mode) for v in vector) for vector in vectors]
    if fmt == "raw":
        return "".join(" ".join(_number(float(v), mode) for v in vector) + "\n" for vector in vectors)
    if fmt == "array":
        return "[" + ",".join(f"[{row}]" for row in rows) + "]\n"
    items = ",\n".join(f'    {{\n      "object": "embedding",\n      "index": {i},\n      "embedding": [{row}]\n    }}'
                       for i, row in enumerate(rows))
    text = '{\n  "object": "list",\n  "data": [\n' + items + "\n  ]"
    if fmt == "json+" and n_prompts > 1:
        matrix = ",\n".join("    [" + ", ".join(f"{cosine(a, b):6.2f}" for b in vectors) + " ]" for a in vectors)
        text += ',\n  "cosineSimilarity": [\n' + matrix + "\n  ]"
    return text + "\n}\n"
