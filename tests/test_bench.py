"""`pyllama bench`: llama-bench's sweeps, measurement loop and output formats, on the tiny model."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from pyllama_cli.core.bench.spec import BenchModel, BenchResult, BenchSpec, BuildInfo, Instance, stdev, stdev_int
from pyllama_cli.core.bench.output import FIELDS, Extras, MarkdownPrinter, md_columns
from pyllama_cli.core.bench.ranges import (
    parse_bool_values,
    parse_choice_values,
    parse_int_range,
    parse_int_values,
    parse_pairs,
)
from pyllama_cli.errors import UsageError
from tests.helpers import run_cli

# One thread and two repetitions of a few tokens keep every run in milliseconds.
FAST = ("-t", "1", "-r", "2")
MD_HEADER = ("| model                          |       size |     params | backend    | threads "
             "|            test |                  t/s |   peak RSS |")
MD_RULE = ("| ------------------------------ | ---------: | ---------: | ---------- | ------: "
           "| --------------: | -------------------: | ---------: |")


def bench(model: Path, *args: str):
    return run_cli("bench", "-m", str(model), *FAST, *args)


# ---------------------------------------------------------------- ranges


@pytest.mark.parametrize(("text", "expected"), [
    ("512", [512]),
    ("1,2,4", [1, 2, 4]),
    ("1-8", [1, 2, 3, 4, 5, 6, 7, 8]),
    ("1-8+2", [1, 3, 5, 7]),
    ("1-16*2", [1, 2, 4, 8, 16]),
    ("1-20*3", [1, 3, 9]),
    ("0-1024+256", [0, 256, 512, 768, 1024]),
    ("1,4-6,16", [1, 4, 5, 6, 16]),
    ("4,", [4]),
    ("5-5", [5]),
])
def test_int_ranges_expand_like_llama_bench(text: str, expected: list[int]) -> None:
    assert parse_int_range(text, flag="-t") == expected


def test_negative_values_only_where_allowed() -> None:
    assert parse_int_range("-1,0-2", flag="-ngl", allow_negative=True) == [-1, 0, 1, 2]
    with pytest.raises(UsageError) as exc:
        parse_int_range("-1", flag="-t")
    assert exc.value.message == "-t '-1': negative values are not allowed"


@pytest.mark.parametrize(("text", "message"), [
    ("8-1", "-t '8-1': the range 8-1 is empty (first > last)"),
    ("1-8*1", "-t '1-8*1': the range 1-8*1 never advances"),
    ("0-8*2", "-t '0-8*2': the range 0-8*2 never advances"),
    ("1-8+0", "-t '1-8+0': the range 1-8+0 never advances"),
    ("", "-t '': empty value"),
    ("1,,2", "-t '1,,2': empty value"),
    ("four", "-t 'four': 'four' is not a number or range"),
    ("1-8/2", "-t '1-8/2': '1-8/2' is not a number or range"),
])
def test_bad_ranges_are_usage_errors(text: str, message: str) -> None:
    with pytest.raises(UsageError) as exc:
        parse_int_range(text, flag="-t")
    assert exc.value.message == message
    assert exc.value.hint == "write values as 1,2,4 or ranges as first-last, first-last+step or first-last*factor"


def test_repeated_flags_concatenate_and_absent_flags_take_the_default() -> None:
    assert parse_int_values(["1,2", "8-16*2"], (4,), flag="-t") == [1, 2, 8, 16]
    assert parse_int_values(None, (4,), flag="-t") == [4]
    with pytest.raises(UsageError, match="every value must be at least 1"):
        parse_int_values(["0,1"], (4,), flag="-b", minimum=1)


def test_bool_choice_and_pair_values() -> None:
    assert parse_bool_values(["0,1", "on"], (False,), flag="-nkvo") == [False, True, True]
    fa = {"on": "on", "1": "on", "off": "off", "0": "off", "auto": "auto"}
    assert parse_choice_values(["on,0", "AUTO"], ("auto",), flag="-fa", choices=fa) == ["on", "off", "auto"]
    assert parse_pairs(["512,128", "64,16"], flag="-pg") == [(512, 128), (64, 16)]
    with pytest.raises(UsageError, match="not 0 or 1"):
        parse_bool_values(["2"], (False,), flag="-nkvo")
    with pytest.raises(UsageError, match="expected two numbers PROMPT,GEN"):
        parse_pairs(["512"], flag="-pg")
    with pytest.raises(UsageError, match="expected two numbers PROMPT,GEN"):
        parse_pairs(["\u00b2,1"], flag="-pg")  # a digit to str.isdigit, not to int()


# ---------------------------------------------------------------- sweep and statistics


def test_instances_cross_every_list_in_llama_bench_order() -> None:
    model = BenchModel("m.gguf", Path("m.gguf"))
    spec = BenchSpec(models=(model,), n_threads=(1, 2), n_prompt=(512,), n_gen=(128,), n_pg=((512, 128),),
                     n_depth=(0, 512))
    names = [(i.n_threads, i.test_name) for i in spec.instances()]
    assert names == [
        (1, "pp512"), (1, "tg128"), (1, "pp512+tg128"),
        (1, "pp512 @ d512"), (1, "tg128 @ d512"), (1, "pp512+tg128 @ d512"),
        (2, "pp512"), (2, "tg128"), (2, "pp512+tg128"),
        (2, "pp512 @ d512"), (2, "tg128 @ d512"), (2, "pp512+tg128 @ d512"),
    ]
    assert BenchSpec(models=(model,), n_threads=(1,), n_prompt=(0,), n_gen=(0, 64)).instances()[0].test_name == "tg64"


def test_tokens_per_second_is_the_mean_of_per_repetition_rates() -> None:
    inst = Instance(BenchModel("m", Path("m")), 512, 0, 0, 2048, 512, "f16", "f16", 1, -1, False, "auto", "auto")
    result = BenchResult(inst, samples_ns=[1_000_000_000, 2_000_000_000])
    assert result.samples_ts == [512.0, 256.0]
    assert result.avg_ts == 384.0  # not 512 tokens / 1.5 s = 341.33
    assert result.stddev_ts == pytest.approx(181.01933598375618, rel=1e-12)
    assert result.avg_ns == 1_500_000_000
    assert result.stddev_ns == 707_106_781
    assert stdev([5.0]) == 0.0 and stdev_int([7]) == 0
    assert stdev([3.0, 3.0, 3.0]) == 0.0


def test_md_columns_show_parameters_that_vary_or_are_not_default() -> None:
    model = BenchModel("m", Path("m"))
    plain = BenchSpec(models=(model,), n_threads=(4,))
    assert md_columns(plain, "CPU", Extras(), 4) == [
        "model", "size", "params", "backend", "n_threads", "test", "t/s", "peak_rss_bytes"]
    swept = BenchSpec(models=(model,), n_threads=(4,), n_batch=(256, 512), n_ubatch=(128,), type_k=("q8_0",),
                      flash_attn=("on",), no_kv_offload=(False, True), load_mode=("none", "mmap"))
    assert md_columns(swept, "CUDA", Extras(ttft=True, compare=True), 4) == [
        "model", "size", "params", "backend", "n_gpu_layers", "n_batch", "n_ubatch", "type_k", "no_kv_offload",
        "flash_attn", "load_mode", "test", "t/s", "ttft", "peak_rss_bytes", "speedup"]


def test_md_header_matches_llama_bench_widths_for_a_sweep() -> None:
    spec = BenchSpec(models=(BenchModel("m", Path("m")),), n_threads=(1,), n_batch=(64,), type_k=("q8_0",),
                     no_kv_offload=(False, True), flash_attn=("on", "off"), load_mode=("mmap",))
    lines: list[str] = []
    cols = md_columns(spec, "CPU", Extras(), 2)
    MarkdownPrinter(lines.append, BuildInfo("c", 1, "", "", "CPU"), Extras(), cols).header()
    # What llama-bench prints for `-t 1 -b 64 -ctk q8_0 -nkvo 0,1 -fa on,off -lm mmap`, plus peak RSS.
    assert lines == [(
        "| model                          |       size |     params | backend    | threads | n_batch | type_k "
        "|          nkvo |  fa |         lm |            test |                  t/s |   peak RSS |\n"
        "| ------------------------------ | ---------: | ---------: | ---------- | ------: | ------: | -----: "
        "| ------------: | --: | ---------: | --------------: | -------------------: | ---------: |\n")]


# ---------------------------------------------------------------- output formats


def _markdown_for_this_build() -> tuple[str, str, list[str]]:
    """The header, rule and leading row cells llama-bench prints for this build's backends: a build
    with any backend besides the CPU (RPC, as the README's install builds it; CUDA) also shows ngl."""
    from pyllama_cli.core.bench.runner import build_info
    from pyllama_cli.core.bench.spec import DEFAULT_N_GPU_LAYERS

    backend = build_info().backends
    if backend == "CPU":
        return MD_HEADER, MD_RULE, ["CPU", "1"]
    header = MD_HEADER.replace("| backend    | threads ", "| backend    | ngl | threads ")
    rule = MD_RULE.replace("| ---------- | ------: ", "| ---------- | --: | ------: ")
    return header, rule, [backend, str(DEFAULT_N_GPU_LAYERS[0]), "1"]


def test_markdown_table_has_llama_bench_columns(tiny_model: Path) -> None:
    result = bench(tiny_model, "-p", "16", "-n", "4")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    header, rule, cells = _markdown_for_this_build()
    assert lines[0] == header
    assert lines[1] == rule
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in lines[2:4]]
    for row, test in zip(rows, ("pp16", "tg4")):
        n = 4 + len(cells)
        assert row[:n] == ["llama 1.7M all F32", "6.50 MiB", "1.71 M", *cells, test]
        mean, _, std = row[n].partition(" ± ")
        assert float(mean) > 0 and float(std) >= 0 and len(mean.split(".")[1]) == 2
        assert row[n + 1].endswith(" MiB")
    assert lines[4] == "" and len(lines) == 6
    # llama-bench's "build: COMMIT (NUMBER)"; before: "build: llama-cpp-python unknown (0)".
    from importlib.metadata import version

    assert re.fullmatch(rf"build: [0-9a-f]{{7,}}(-dirty)? \(llama-cpp-python {re.escape(version('llama-cpp-python'))}\)",
                        lines[5]), lines[5]
    assert result.stderr == ""  # no progress off a terminal


def test_csv_header_and_rows(tiny_model: Path) -> None:
    result = bench(tiny_model, "-p", "16", "-n", "4", "-o", "csv")
    assert result.exit_code == 0, result.stderr
    header, *rows = result.stdout.splitlines()
    assert header == ",".join([*FIELDS, "peak_rss_bytes", "error"])
    assert header.startswith("build_commit,build_number,cpu_info,gpu_info,backends,model_filename,model_type,")
    assert all(line.startswith('"') for line in rows)
    records = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [(r["n_prompt"], r["n_gen"], r["n_depth"]) for r in records] == [("16", "0", "0"), ("0", "4", "0")]
    assert records[0]["model_filename"] == str(tiny_model)
    assert records[0]["type_k"] == "f16" and records[0]["flash_attn"] == "-1" and records[0]["error"] == ""


def test_json_fields_types_and_layout(tiny_model: Path) -> None:
    result = bench(tiny_model, "-p", "16", "-n", "4", "-o", "json", "--ttft")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith('[\n  {\n    "build_commit": "')
    assert result.stdout.endswith("\n  }\n]\n")
    pp, tg = json.loads(result.stdout)
    assert list(pp) == [*FIELDS, "samples_ns", "samples_ts", "samples_ttft_ns", "peak_rss_bytes", "ttft_avg_ns",
                        "ttft_stddev_ns", "error"]
    assert pp["model_type"] == "llama 1.7M all F32"  # before: "?B", though the size is known
    assert pp["model_size"] == 6_820_864 and pp["model_n_params"] == 1_705_216
    assert (pp["n_threads"], pp["n_prompt"], pp["n_gen"], pp["n_depth"]) == (1, 16, 0, 0)
    assert (tg["n_prompt"], tg["n_gen"]) == (0, 4)
    assert pp["no_kv_offload"] is False and pp["repack"] is True and pp["n_gpu_layers"] == -1
    for row in (pp, tg):
        tokens = row["n_prompt"] + row["n_gen"]
        assert len(row["samples_ns"]) == len(row["samples_ts"]) == 2
        assert all(isinstance(ns, int) and ns > 0 for ns in row["samples_ns"])
        for ns, ts in zip(row["samples_ns"], row["samples_ts"]):
            assert ts == pytest.approx(1e9 * tokens / ns, rel=1e-5)
        assert row["avg_ts"] == pytest.approx(sum(row["samples_ts"]) / 2, rel=1e-5)
        assert isinstance(row["stddev_ts"], float) and row["avg_ns"] == sum(row["samples_ns"]) // 2
        assert row["peak_rss_bytes"] > 1_000_000 and row["error"] is None
    assert len(pp["samples_ttft_ns"]) == 2 and pp["ttft_avg_ns"] >= min(pp["samples_ns"])
    assert tg["samples_ttft_ns"] == [] and tg["ttft_avg_ns"] is None


def test_jsonl_is_one_object_per_test(tiny_model: Path) -> None:
    result = bench(tiny_model, "-p", "8", "-n", "2", "-pg", "8,2", "-o", "jsonl")
    assert result.exit_code == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["n_prompt"], r["n_gen"]) for r in rows] == [(8, 0), (0, 2), (8, 2)]
    assert list(rows[0])[-4:] == ["samples_ns", "samples_ts", "peak_rss_bytes", "error"]


def test_sql_inserts_load_into_sqlite(tiny_model: Path) -> None:
    result = bench(tiny_model, "-p", "8", "-n", "2", "-o", "sql")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("CREATE TABLE IF NOT EXISTS llama_bench (\n  build_commit TEXT,\n")
    db = sqlite3.connect(":memory:")
    db.executescript(result.stdout)
    rows = db.execute("SELECT model_type, n_prompt, n_gen, typeof(avg_ts), avg_ts > 0, error FROM llama_bench").fetchall()
    assert rows == [("llama 1.7M all F32", 8, 0, "real", 1, None), ("llama 1.7M all F32", 0, 2, "real", 1, None)]
    columns = [c[1] for c in db.execute("PRAGMA table_info(llama_bench)")]
    assert columns == [*FIELDS, "peak_rss_bytes", "error"]


# ---------------------------------------------------------------- measurement


def test_depth_prefill_is_cached_across_repetitions(tiny_model: Path) -> None:
    result = run_cli("bench", "-m", str(tiny_model), "-t", "1", "-r", "3", "-p", "8", "-n", "0", "-d", "8",
                     "--progress", "-o", "jsonl")
    assert result.exit_code == 0, result.stderr
    steps = [line.removeprefix("pyllama bench: benchmark 1/1: ") for line in result.stderr.splitlines()]
    assert steps == ["starting", "warmup prompt run",
                     "depth run 1/3", "prompt run 1/3",
                     "depth run 2/3 (cached)", "prompt run 2/3",
                     "depth run 3/3 (cached)", "prompt run 3/3"]
    row = json.loads(result.stdout)
    assert (row["n_prompt"], row["n_depth"], len(row["samples_ns"])) == (8, 8, 3)


def test_no_warmup_and_several_models(tiny_model: Path) -> None:
    both = f"{tiny_model},{tiny_model}"
    result = run_cli("bench", "-m", both, "-t", "1", "-r", "1", "-p", "4", "-n", "0", "--no-warmup", "--progress",
                     "-o", "jsonl")
    assert result.exit_code == 0, result.stderr
    assert "warmup" not in result.stderr
    assert [json.loads(line)["model_filename"] for line in result.stdout.splitlines()] == [str(tiny_model)] * 2


def test_a_failing_combination_is_reported_in_its_row_and_the_rest_run(tiny_model: Path) -> None:
    result = bench(tiny_model, "-p", "8", "-n", "0", "-ctv", "q8_0", "-fa", "off,on")
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    columns = [c.strip() for c in lines[0].split("|")[1:-1]]
    assert columns[columns.index("type_v"):columns.index("type_v") + 2] == ["type_v", "fa"]
    failed, passed = lines[2], lines[3]
    reason = "llama.cpp could not create a context of 8 tokens for tiny.gguf: quantized V cache requires flash_attn"
    assert f"| error: {reason} to be enabled |" in failed
    assert "|   q8_0 |   1 |             pp8 |" in passed and " ± " in passed
    assert result.first_stderr_line == f"Error: 1 of 2 tests failed; the first: pp8: {reason} to be enabled"


# ---------------------------------------------------------------- beyond llama-bench


def test_compare_adds_a_speed_up_against_a_baseline(tiny_model: Path, tmp_path: Path) -> None:
    baseline = tmp_path / "base.json"
    # A hand-made baseline in llama-bench's shape: only pp8 at 1 thread has a row.
    baseline.write_text(json.dumps([{"model_type": "llama ?B all F32", "model_n_params": 1705216, "n_prompt": 8,
                                     "n_gen": 0, "n_depth": 0, "n_threads": 1, "flash_attn": -1, "avg_ts": 1000.0}]))
    result = bench(tiny_model, "-p", "8", "-n", "2", "--compare", str(baseline), "-o", "json")
    assert result.exit_code == 0, result.stderr
    pp, tg = json.loads(result.stdout)
    assert pp["speedup"] == pytest.approx(pp["avg_ts"] / 1000.0, rel=1e-5)
    assert tg["speedup"] is None
    md = bench(tiny_model, "-p", "8", "-n", "0", "--compare", str(baseline))
    assert md.stdout.splitlines()[0].endswith("|   peak RSS | speed-up |")
    assert md.stdout.splitlines()[2].endswith("x |")


def test_plot_writes_a_png(tiny_model: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "speed.png"
    result = bench(tiny_model, "-p", "8", "-n", "2", "-b", "4,8", "--plot", str(png), "-o", "csv")
    assert result.exit_code == 0, result.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "home") == ["speed.png"]  # no temporary left


def test_plot_to_a_format_matplotlib_lacks_is_refused_before_any_test(tiny_model: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    result = bench(tiny_model, "-p", "8", "-n", "0", "--plot", str(tmp_path / "speed.txt"))
    assert result.exit_code == 1 and result.stdout == ""  # before: a traceback after the whole run
    assert result.first_stderr_line == f"Error: --plot {tmp_path / 'speed.txt'}: matplotlib cannot write .txt files"
    assert result.stderr.splitlines()[1].startswith("Hint: end the name in one of: ")
    assert list(tmp_path.iterdir()) == []


def test_plot_without_matplotlib_is_a_clear_error(tiny_model: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    result = bench(tiny_model, "-p", "8", "--plot", str(tmp_path / "x.png"))
    assert result.exit_code == 1
    assert result.stderr.splitlines() == ["Error: --plot needs matplotlib, which is not installed",
                                          "Hint: install it with: pip install 'pyllama-cli[plot]' (or pip install matplotlib)"]
    assert result.stdout == "" and not (tmp_path / "x.png").exists()


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(("args", "error"), [
    (("-t", "8-1"), "Error: -t '8-1': the range 8-1 is empty (first > last)"),
    (("-p", "0", "-n", "0"), "Error: nothing to measure: every -p and -n is 0, and so is every -pg pair"),
    (("-o", "xml"), "Error: -o 'xml' is not one of md, csv, json, jsonl, sql"),
    (("-ctk", "q9"), "Error: -ctk 'q9': 'q9' is not one of bf16, f16, iq4_nl, q4_0, q4_1, q5_0, q5_1, q8_0"),
    (("-r", "0"), "Error: -r 0: give 1 to 2147483647 repetitions"),
    (("-r", "99999999999999999999"), "Error: -r 99999999999999999999: give 1 to 2147483647 repetitions"),
    # Ranges whose expansion used to exhaust memory (the process was killed) before the first test.
    (("-p", "1-100000000"), "Error: -p '1-100000000': the range 1-100000000 has more than 100000 values"),
    (("-p", "1-1000", "-n", "1-1000", "-d", "0-100"),
     "Error: the lists and ranges make 202000 tests per model; at most 100000 run in one bench"),
    # A long range out of bounds is listed cut short, not as a thousand numbers.
    (("-t", "1-1000"), "Error: -t: every value must be at most 512, got 1,2,3,4,5,6,7,...,1000 (1000 values)"),
])
def test_bad_options_are_one_line_errors(tiny_model: Path, args: tuple[str, ...], error: str) -> None:
    result = run_cli("bench", "-m", str(tiny_model), *args)
    assert result.exit_code == 1
    assert result.first_stderr_line == error
    assert len(result.stderr.splitlines()) == 2 and result.stderr.splitlines()[1].startswith("Hint: ")
    assert result.stdout == ""


def test_ctrl_c_leaves_a_json_document_of_the_finished_tests(tiny_model: Path) -> None:
    from tests.helpers import REPO_ROOT, default_sigint

    proc = subprocess.Popen([sys.executable, "-m", "pyllama_cli", "bench", "-m", str(tiny_model), "-p", "0",
                             "-n", "16-4000+1", "-r", "2", "-o", "json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT, preexec_fn=default_sigint)
    try:
        started = proc.stdout.readline() + proc.stdout.readline()  # "[" and the start of the first row
        proc.send_signal(signal.SIGINT)
        output, err = started + proc.stdout.read(), proc.stderr.read()  # (communicate would skip buffered text)
        proc.wait(timeout=60)
    finally:
        proc.kill()
    rows = json.loads(output)  # before: the list was never closed
    assert proc.returncode == 130 and 1 <= len(rows) < 3985
    assert err.strip() == f"benchmark interrupted: the output holds the {len(rows)} of 3985 tests that finished"


def test_a_baseline_nested_too_deeply_is_one_error_line(tiny_model: Path, tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    result = bench(tiny_model, "-p", "8", "-n", "0", "--compare", str(deep))
    assert result.exit_code == 1 and result.stdout == ""
    assert result.first_stderr_line == f"Error: baseline {deep} nests too deeply to read"


def test_models_that_cannot_load_fail_before_any_test(tmp_path: Path, tiny_model: Path) -> None:
    missing = run_cli("bench", "-m", str(tiny_model), "-m", str(tmp_path / "nope.gguf"), "-p", "8", "-n", "0")
    assert missing.exit_code == 1
    assert missing.first_stderr_line == f"Error: model file not found: {tmp_path / 'nope.gguf'}"
    assert missing.stdout == ""
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model at all")
    bad = run_cli("bench", "-m", str(junk))
    assert bad.exit_code == 1 and bad.first_stderr_line.startswith(f"Error: {junk} is not a GGUF file")


def test_ttft_mean_is_in_milliseconds_in_markdown(tiny_model: Path) -> None:
    result = bench(tiny_model, "-p", "8", "-n", "0", "--ttft")
    assert result.exit_code == 0, result.stderr
    header, _, row = result.stdout.splitlines()[:3]
    assert header.endswith("|                  t/s |              ttft ms |   peak RSS |")
    ttft = row.split("|")[-3].strip()
    mean, _, std = ttft.partition(" ± ")
    assert math.isfinite(float(mean)) and float(mean) > 0 and float(std) >= 0


# ---------------------------------------------------------------- against llama-bench itself


def _llama_bench() -> Path | None:
    folder = os.environ.get("LLAMA_CPP_BIN")
    tool = Path(folder) / "llama-bench" if folder else None
    return tool if tool is not None and tool.is_file() else None


@pytest.mark.reference
@pytest.mark.skipif(_llama_bench() is None, reason="set LLAMA_CPP_BIN to a folder with llama-bench")
def test_same_fields_and_values_as_llama_bench(tiny_model: Path) -> None:
    args = ["-m", str(tiny_model), "-t", "1", "-r", "2", "-p", "8", "-n", "2", "-d", "0,4", "-b", "4", "-ctk", "q8_0",
            "-fa", "on", "-o", "json"]
    proc = subprocess.run([str(_llama_bench()), *args], check=True, capture_output=True, timeout=120)
    theirs = json.loads(proc.stdout)
    ours = json.loads(run_cli("bench", *args).stdout)
    timing = {"build_commit", "build_number", "test_time", "avg_ns", "stddev_ns", "avg_ts", "stddev_ts",
              "samples_ns", "samples_ts"}
    assert [list(row) for row in theirs] == [list(row)[:len(row) - 2] for row in ours]
    for row in theirs:  # llama.cpp names no size for this model: "?B"; pyllama counts its parameters
        row["model_type"] = row["model_type"].replace(" ?B ", " 1.7M ")
    assert [{k: v for k, v in row.items() if k not in timing} for row in theirs] == \
        [{k: v for k, v in row.items() if k not in timing and k in FIELDS} for row in ours]
