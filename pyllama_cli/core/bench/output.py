"""llama-bench's output formats (md, csv, json, jsonl, sql) for benchmark results.

Field names, order, value formats and Markdown column widths are llama-bench's, so scripts
written for its output read ours. pyllama's extra measurements come after llama-bench's fields:
`peak_rss_bytes` and `error` always, `lora` with --lora/--lora-scaled (llama-bench has no adapters),
`ttft_*` with --ttft, `speedup` with --compare.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ...errors import PyllamaError
from .spec import (
    DEFAULT_CACHE_TYPE,
    DEFAULT_CPU_MASK,
    DEFAULT_CPU_STRICT,
    DEFAULT_FLASH_ATTN,
    DEFAULT_LOAD_MODE,
    DEFAULT_N_BATCH,
    DEFAULT_N_GPU_LAYERS,
    DEFAULT_N_UBATCH,
    DEFAULT_NO_KV_OFFLOAD,
    DEFAULT_POLL,
    FLASH_ATTN_TYPES,
    BenchResult,
    BenchSpec,
    BuildInfo,
    mean_int,
    stdev_int,
)

OUTPUT_FORMATS = ("md", "csv", "json", "jsonl", "sql")

FIELDS = (
    "build_commit", "build_number", "cpu_info", "gpu_info", "backends",
    "model_filename", "model_type", "model_size", "model_n_params", "n_batch",
    "n_ubatch", "n_threads", "cpu_mask", "cpu_strict", "poll",
    "type_k", "type_v", "n_gpu_layers", "n_cpu_moe", "split_mode",
    "main_gpu", "no_kv_offload", "flash_attn", "devices", "tensor_split",
    "tensor_buft_overrides", "load_mode", "lazy_mode",
    "embeddings",
    "no_op_offload", "no_host", "repack", "fit_target", "fit_min_ctx",
    "n_prompt", "n_gen", "n_depth",
    "test_time", "avg_ns", "stddev_ns", "avg_ts", "stddev_ts",
)
_INT = {"build_number", "n_batch", "n_ubatch", "n_threads", "poll", "model_size", "model_n_params", "n_gpu_layers",
        "main_gpu", "n_prompt", "n_gen", "n_depth", "avg_ns", "stddev_ns", "no_op_offload", "n_cpu_moe",
        "fit_target", "fit_min_ctx", "flash_attn", "peak_rss_bytes", "ttft_avg_ns", "ttft_stddev_ns"}
_BOOL = {"no_kv_offload", "cpu_strict", "embeddings", "no_host", "repack"}
_FLOAT = {"avg_ts", "stddev_ts", "speedup"}

# Markdown: display names and widths (negative = left-aligned), as llama-bench prints them.
_DISPLAY = {"n_gpu_layers": "ngl", "n_threads": "threads", "no_kv_offload": "nkvo", "flash_attn": "fa",
            "load_mode": "lm", "devices": "dev", "tensor_split": "ts", "tensor_buft_overrides": "ot", "peak_rss_bytes": "peak RSS",
            "ttft": "ttft ms", "speedup": "speed-up"}
_WIDTH = {"model": -30, "t/s": 20, "size": 10, "params": 10, "n_gpu_layers": 3, "n_threads": 7, "n_batch": 7,
          "n_ubatch": 8, "type_k": 6, "type_v": 6, "load_mode": 10, "flash_attn": 3, "test": 15,
          "devices": -12, "ttft": 20, "peak_rss_bytes": 10, "speedup": 8}


@dataclass(frozen=True)
class Extras:
    """Which of pyllama's additions to llama-bench's fields this run writes."""

    ttft: bool = False
    compare: bool = False
    lora: bool = False

    def fields(self) -> list[str]:
        out = ["peak_rss_bytes"] + (["lora"] if self.lora else [])
        if self.ttft:
            out += ["ttft_avg_ns", "ttft_stddev_ns"]
        if self.compare:
            out.append("speedup")
        return out + ["error"]


# ---------------------------------------------------------------- values


def field_values(r: BenchResult, build: BuildInfo) -> dict[str, str]:
    """llama-bench's fields of one result, as the strings it prints (before quoting)."""
    i = r.instance
    return {
        "build_commit": build.build_commit, "build_number": str(build.build_number), "cpu_info": build.cpu_info,
        "gpu_info": build.gpu_info, "backends": build.backends, "model_filename": i.model.label,
        "model_type": r.model_type, "model_size": str(r.model_size), "model_n_params": str(r.model_n_params),
        "n_batch": str(i.n_batch), "n_ubatch": str(i.n_ubatch), "n_threads": str(i.n_threads), "cpu_mask": i.cpu_mask,
        "cpu_strict": str(int(i.cpu_strict)), "poll": str(i.poll), "type_k": i.type_k, "type_v": i.type_v,
        "n_gpu_layers": str(i.n_gpu_layers), "n_cpu_moe": "0", "split_mode": "layer", "main_gpu": "0",
        "no_kv_offload": str(int(i.no_kv_offload)), "flash_attn": str(FLASH_ATTN_TYPES[i.flash_attn]),
        "devices": "/".join(i.devices) or "auto", "tensor_split": tensor_split_text(i.tensor_split),
        "tensor_buft_overrides": ";".join(f"{p}={b}" for p, b in i.tensor_overrides) or "none",
        "load_mode": i.load_mode,
        "lazy_mode": "auto", "embeddings": "0", "no_op_offload": "0", "no_host": "0", "repack": "1",
        "fit_target": "0", "fit_min_ctx": "0", "n_prompt": str(i.n_prompt), "n_gen": str(i.n_gen),
        "n_depth": str(i.n_depth), "test_time": r.test_time, "avg_ns": str(r.avg_ns), "stddev_ns": str(r.stddev_ns),
        "avg_ts": f"{r.avg_ts:f}", "stddev_ts": f"{r.stddev_ts:f}",
    }


def tensor_split_text(split: tuple[float, ...]) -> str:
    """llama-bench's tensor_split: each share with 2 decimals up to the last that is not 0, joined by /."""
    last = max((i for i, share in enumerate(split) if share > 0), default=0)
    return "/".join(f"{share:.2f}" for share in (split or (0.0,))[: last + 1])


def extra_values(r: BenchResult, extras: Extras, speedup: float | None) -> dict[str, str | None]:
    """pyllama's extra fields; None where there is no value (SQL NULL, JSON null, empty CSV cell)."""
    values: dict[str, str | None] = {"peak_rss_bytes": _opt(r.peak_rss_bytes)}
    if extras.lora:
        values["lora"] = r.instance.lora_text
    if extras.ttft:
        has = bool(r.ttft_ns)
        values["ttft_avg_ns"] = str(mean_int(r.ttft_ns)) if has else None
        values["ttft_stddev_ns"] = str(stdev_int(r.ttft_ns)) if has else None
    if extras.compare:
        values["speedup"] = f"{speedup:f}" if speedup is not None else None
    values["error"] = r.error
    return values


def _opt(value: int | None) -> str | None:
    return None if value is None else str(value)


def _g(value: float) -> str:
    """A double as C++'s ostream prints it (6 significant digits), as in llama-bench's samples_ts."""
    return f"{value:g}"


# ---------------------------------------------------------------- printers


class Printer:
    """Writes a header, one row per result as it arrives, and a footer."""

    def __init__(self, write: Callable[[str], None], build: BuildInfo, extras: Extras):
        self.write, self.build, self.extras = write, build, extras

    def header(self) -> None:
        pass

    def row(self, r: BenchResult, speedup: float | None = None) -> None:
        raise NotImplementedError

    def footer(self) -> None:
        pass


class CsvPrinter(Printer):
    def header(self) -> None:
        self.write(",".join(list(FIELDS) + self.extras.fields()) + "\n")

    def row(self, r: BenchResult, speedup: float | None = None) -> None:
        values = list(field_values(r, self.build).values()) + list(extra_values(r, self.extras, speedup).values())
        self.write(",".join(_csv(v) for v in values) + "\n")


def _csv(value: str | None) -> str:
    return "" if value is None else '"' + value.replace('"', '""') + '"'


def _json_value(name: str, value: str | None) -> str:
    if value is None:
        return "null"
    if name in _BOOL:
        return "false" if value == "0" else "true"
    if name in _INT or name in _FLOAT:
        return value
    return json.dumps(value, ensure_ascii=False)


def _json_pairs(r: BenchResult, build: BuildInfo, extras: Extras, speedup: float | None) -> list[tuple[str, str]]:
    pairs = [(k, _json_value(k, v)) for k, v in field_values(r, build).items()]
    pairs.append(("samples_ns", "[ " + ", ".join(map(str, r.samples_ns)) + " ]"))
    pairs.append(("samples_ts", "[ " + ", ".join(_g(t) for t in r.samples_ts) + " ]"))
    if extras.ttft:
        pairs.append(("samples_ttft_ns", "[ " + ", ".join(map(str, r.ttft_ns)) + " ]"))
    pairs += [(k, _json_value(k, v)) for k, v in extra_values(r, extras, speedup).items()]
    return pairs


class JsonPrinter(Printer):
    first = True

    def header(self) -> None:
        self.write("[\n")

    def row(self, r: BenchResult, speedup: float | None = None) -> None:
        if not self.first:
            self.write(",\n")
        self.first = False
        body = ",\n".join(f'    "{k}": {v}' for k, v in _json_pairs(r, self.build, self.extras, speedup))
        self.write("  {\n" + body + "\n  }")

    def footer(self) -> None:
        self.write("\n]\n")


class JsonlPrinter(Printer):
    def row(self, r: BenchResult, speedup: float | None = None) -> None:
        body = ", ".join(f'"{k}": {v}' for k, v in _json_pairs(r, self.build, self.extras, speedup))
        self.write("{" + body + "}\n")


class SqlPrinter(Printer):
    def header(self) -> None:
        names = list(FIELDS) + self.extras.fields()
        cols = ",\n".join(f"  {n} {_sql_type(n)}" for n in names)
        self.write(f"CREATE TABLE IF NOT EXISTS llama_bench (\n{cols}\n);\n\n")

    def row(self, r: BenchResult, speedup: float | None = None) -> None:
        values = {**field_values(r, self.build), **extra_values(r, self.extras, speedup)}
        cells = ", ".join("NULL" if v is None else "'" + v.replace("'", "''") + "'" for v in values.values())
        self.write(f"INSERT INTO llama_bench ({', '.join(values)}) VALUES ({cells});\n")


def _sql_type(name: str) -> str:
    if name in _FLOAT:
        return "REAL"
    return "INTEGER" if name in _INT or name in _BOOL else "TEXT"


# ---------------------------------------------------------------- markdown


def md_columns(spec: BenchSpec, backend: str, extras: Extras, default_threads: int) -> list[str]:
    """llama-bench's column choice: fixed ones, then each parameter that varies or is not default.

    On a CPU backend llama-bench always shows threads and never ngl; pyllama also shows ngl
    there when it was set, so rows that differ only in -ngl can be told apart.
    """
    cols = ["model", "size", "params", "backend"]
    cpu = any(name in backend for name in ("CPU", "BLAS", "ZenDNN"))
    if not cpu or tuple(spec.n_gpu_layers) != DEFAULT_N_GPU_LAYERS:
        cols.append("n_gpu_layers")
    varying = {
        "n_threads": cpu or tuple(spec.n_threads) != (default_threads,),
        "cpu_mask": tuple(spec.cpu_mask) != DEFAULT_CPU_MASK, "cpu_strict": tuple(spec.cpu_strict) != DEFAULT_CPU_STRICT,
        "poll": tuple(spec.poll) != DEFAULT_POLL,
        "n_batch": tuple(spec.n_batch) != DEFAULT_N_BATCH, "n_ubatch": tuple(spec.n_ubatch) != DEFAULT_N_UBATCH,
        "type_k": tuple(spec.type_k) != DEFAULT_CACHE_TYPE, "type_v": tuple(spec.type_v) != DEFAULT_CACHE_TYPE,
        "no_kv_offload": tuple(spec.no_kv_offload) != DEFAULT_NO_KV_OFFLOAD,
        "flash_attn": tuple(spec.flash_attn) != DEFAULT_FLASH_ATTN,
        "devices": tuple(spec.devices) != ((),), "tensor_split": tuple(spec.tensor_split) != ((),),
        "tensor_buft_overrides": tuple(spec.tensor_overrides) != ((),),
        "load_mode": tuple(spec.load_mode) != DEFAULT_LOAD_MODE, "lora": bool(spec.loras),
    }
    cols += [name for name, shown in varying.items() if shown]
    cols += ["test", "t/s"]
    if extras.ttft:
        cols.append("ttft")
    cols.append("peak_rss_bytes")
    if extras.compare:
        cols.append("speedup")
    return cols


def md_heading(col: str) -> str:
    return _DISPLAY.get(col, col)


def md_width(col: str) -> int:
    if col in _WIDTH:
        return _WIDTH[col]
    width = max(len(col), 10)  # llama-bench sizes by the field's name, not its heading
    return -width if col not in _INT and col not in _BOOL and col not in _FLOAT else width


def md_cells(r: BenchResult, cols: Sequence[str], build: BuildInfo, speedup: float | None = None) -> list[str]:
    """The text of each Markdown cell of one result row."""
    values = field_values(r, build)
    special = {
        "model": r.model_type, "size": size_text(r.model_size), "params": params_text(r.model_n_params),
        "backend": build.backends, "test": r.instance.test_name, "lora": r.instance.lora_text,
        "t/s": f"{r.avg_ts:.2f} ± {r.stddev_ts:.2f}" if not r.error else f"error: {r.error}",
        "ttft": _ttft_text(r), "peak_rss_bytes": size_text(r.peak_rss_bytes) if r.peak_rss_bytes else "-",
        "speedup": f"{speedup:.2f}x" if speedup is not None else "-",
    }
    return [special[c] if c in special else values[c] for c in cols]


@dataclass(frozen=True)
class TableColumn:
    """One column of the Markdown format's table as a terminal shows it (console.print_table draws it)."""

    heading: str
    right: bool  # right-aligned (numbers)
    wrap: bool
    accent: bool  # the column to read first (t/s)


def md_table(results: Sequence[BenchResult], speedups: Sequence[float | None], cols: Sequence[str],
             build: BuildInfo) -> tuple[list[TableColumn], list[tuple[list[str], bool]], str]:
    """The Markdown format's table for `-o md` on a terminal: its columns, its rows (cells, and whether
    the test failed), and its caption."""
    columns = [TableColumn(md_heading(col), md_width(col) > 0, col in ("model", "t/s", "ttft"), col == "t/s")
               for col in cols]
    rows = [(md_cells(result, cols, build, gain), bool(result.error)) for result, gain in zip(results, speedups)]
    return columns, rows, build.line


def check_failures(results: Sequence[BenchResult]) -> None:
    """Fail the run when a test failed, once every row is out (the others ran and were printed).

    Raises:
        PyllamaError: naming how many failed, and the first.
    """
    failed = [r for r in results if r.error]
    if failed:
        raise PyllamaError(f"{len(failed)} of {len(results)} tests failed; the first: {failed[0].instance.test_name}: "
                           f"{failed[0].error}", hint="the other tests ran; see the error in each failed row")


def _ttft_text(r: BenchResult) -> str:
    if not r.ttft_ns:
        return "-"
    return f"{mean_int(r.ttft_ns) / 1e6:.2f} ± {stdev_int(r.ttft_ns) / 1e6:.2f}"


def size_text(n: int) -> str:
    return f"{n / 1024 / 1024:.2f} MiB" if n < 1024 ** 3 else f"{n / 1024 ** 3:.2f} GiB"


def params_text(n: int) -> str:
    return f"{n / 1e6:.2f} M" if n < 1e9 else f"{n / 1e9:.2f} B"


class MarkdownPrinter(Printer):
    """llama-bench's Markdown table, a row per test as it finishes, then the build line."""

    def __init__(self, write: Callable[[str], None], build: BuildInfo, extras: Extras, cols: list[str]):
        super().__init__(write, build, extras)
        self.cols = cols

    def header(self) -> None:
        heads = "".join(f" {md_heading(c):{_align(md_width(c))}} |" for c in self.cols)
        rule = "".join(f" {'-' * (abs(md_width(c)) - 1)}{':' if md_width(c) > 0 else '-'} |" for c in self.cols)
        self.write(f"|{heads}\n|{rule}\n")

    def row(self, r: BenchResult, speedup: float | None = None) -> None:
        cells = md_cells(r, self.cols, self.build, speedup)
        self.write("|" + "".join(f" {v:{_align(md_width(c))}} |" for c, v in zip(self.cols, cells)) + "\n")

    def footer(self) -> None:
        self.write(f"\n{self.build.line}\n")


def _align(width: int) -> str:
    return f"<{-width}" if width < 0 else f">{width}"


def make_printer(fmt: str, write: Callable[[str], None], build: BuildInfo, extras: Extras,
                 cols: list[str] | None = None) -> Printer:
    """A printer for one of OUTPUT_FORMATS writing through `write`."""
    if fmt == "md":
        return MarkdownPrinter(write, build, extras, cols or [])
    return {"csv": CsvPrinter, "json": JsonPrinter, "jsonl": JsonlPrinter, "sql": SqlPrinter}[fmt](write, build, extras)
