"""`--compare BASELINE.json`: find each result's row in an earlier `-o json` (or jsonl) run.

A baseline row matches when every identifying field it has equals ours, so a baseline written
by llama-bench itself (which lacks pyllama's extra fields, or some newer ones) still matches.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ...errors import InputError
from ..text import json_text
from ..gguf.ftypes import size_label
from .spec import BenchResult, BuildInfo
from .output import field_values

# The fields that say which test a row measured (not when, where or how fast).
MATCH_FIELDS = ("model_type", "model_n_params", "n_prompt", "n_gen", "n_depth", "n_batch", "n_ubatch", "type_k",
                "type_v", "n_threads", "n_gpu_layers", "no_kv_offload", "flash_attn")


def load_baseline(path: Path) -> list[dict[str, Any]]:
    """The rows of a `-o json` or `-o jsonl` file from pyllama bench or llama-bench.

    Raises:
        InputError: a missing or unreadable file, or one that holds no benchmark rows.
    """
    hint = "pass a file written by `pyllama bench -o json` or `llama-bench -o json`"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot read baseline {path}: {exc.strerror or exc}", hint=hint) from exc
    try:
        rows = (json_text.loads(text, f"baseline {path}") if text.lstrip().startswith("[")
                else [json_text.loads(line, f"baseline {path}") for line in text.splitlines() if line.strip()])
    except json.JSONDecodeError as exc:
        raise InputError(f"baseline {path} is not valid JSON (line {exc.lineno})", hint=hint) from exc
    rows = [r for r in rows if isinstance(r, dict) and "avg_ts" in r]
    if not rows:
        raise InputError(f"baseline {path} holds no benchmark results", hint=hint)
    return [_sized(r) for r in rows]


def _sized(row: dict[str, Any]) -> dict[str, Any]:
    """A llama-bench row's "llama ?B all F32" with the size pyllama names (Model.description)."""
    kind, n_params = row.get("model_type"), row.get("model_n_params")
    if isinstance(kind, str) and isinstance(n_params, int) and " ?B " in kind:
        return {**row, "model_type": kind.replace(" ?B ", f" {size_label(n_params)} ", 1)}
    return row


def speedup(result: BenchResult, build: BuildInfo, baseline: list[dict[str, Any]]) -> float | None:
    """avg t/s of `result` divided by its baseline row's, or None without a match (or a failed test)."""
    if result.error or not result.samples_ns:
        return None
    ours = field_values(result, build)
    for row in baseline:
        if all(_norm(row[k]) == _norm(ours[k]) for k in MATCH_FIELDS if k in row):
            base = float(row.get("avg_ts") or 0)
            return result.avg_ts / base if base > 0 else None
    return None


def _norm(value: Any) -> str:
    """One spelling per value: booleans as 0/1 (older llama-bench wrote flash_attn as a bool)."""
    if isinstance(value, bool):
        return str(int(value))
    return str(value)
