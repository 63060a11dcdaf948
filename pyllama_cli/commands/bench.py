"""`pyllama bench`: llama-bench's measurements, tables and formats, plus TTFT, memory, compare and plot."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from ..console import bench_progress, download_tqdm, out, stdout_is_tty
from ..core.bench.params import (
    DEFAULT_CACHE_TYPE,
    DEFAULT_FLASH_ATTN,
    DEFAULT_LOAD_MODE,
    DEFAULT_N_BATCH,
    DEFAULT_N_DEPTH,
    DEFAULT_N_GEN,
    DEFAULT_N_GPU_LAYERS,
    DEFAULT_N_PROMPT,
    DEFAULT_N_UBATCH,
    DEFAULT_NO_KV_OFFLOAD,
    DEFAULT_REPETITIONS,
)
from ..core.model.resolve import ModelRequest, resolve_model
from ..errors import Interrupted, PyllamaError, UsageError
from ..options.load import HfFileOpt, HfRepoOpt, HfTokenOpt, ModelPathOpt, OfflineOpt, VerboseOpt

EXAMPLES = """\
Examples:
  pyllama bench -m model.gguf
  pyllama bench -m model.gguf -p 256 -n 64 -t 1-4 -o csv
  pyllama bench -m a.gguf -m b.gguf -pg 512,128 -d 0,1024 -fa on,off
  pyllama bench -m model.gguf -ctk f16,q8_0 -ctv f16,q8_0 -fa on
  pyllama bench -m model.gguf --ttft -o json > base.json
  pyllama bench -m model.gguf --compare base.json --plot speed.png

Values: 1,2,4 or ranges 1-8, 1-8+2 (step), 1-16*2 (factor); a flag may repeat.
"""

SWEEP = "Test parameters (lists and ranges)"
RUN = "Run and output"


def _repeatable(alias: Any, help_suffix: str = "") -> Any:
    """The shared model flag `alias` (same names, help and panel), made repeatable for several models."""
    info = alias.__metadata__[0]
    decls = ((info.default,) if isinstance(info.default, str) else ()) + tuple(info.param_decls)
    return Annotated[list[str] | None, typer.Option(
        *decls, help=info.help + help_suffix, rich_help_panel=info.rich_help_panel, show_default=False)]


def _sweep(*decls: str, help: str) -> Any:
    return Annotated[list[str] | None, typer.Option(
        *decls, help=help, rich_help_panel=SWEEP, show_default=False, metavar="LIST")]


ModelsOpt = _repeatable(ModelPathOpt, " Repeat the flag (or separate with ,) to compare models.")
HfReposOpt = _repeatable(HfRepoOpt, " Repeatable.")
HfFilesOpt = _repeatable(HfFileOpt, " Repeatable: the n-th -hff goes with the n-th -hf.")
NPromptOpt = _sweep("-p", "--n-prompt",
                    help=f"Prompt lengths to time (pp tests); 0 = none. (default: {DEFAULT_N_PROMPT[0]})")
NGenOpt = _sweep("-n", "--n-gen", help=f"Generation lengths to time (tg tests); 0 = none. (default: {DEFAULT_N_GEN[0]})")
NPgOpt = _sweep("-pg", help="A PROMPT,GEN pair timed together (pp+tg test); repeatable.")
NDepthOpt = _sweep("-d", "--n-depth",
                   help=f"Tokens already in the context (untimed prefill). (default: {DEFAULT_N_DEPTH[0]})")
BatchSizesOpt = _sweep("-b", "--batch-size", help=f"Logical batch size. (default: {DEFAULT_N_BATCH[0]})")
UBatchSizesOpt = _sweep("-ub", "--ubatch-size", help=f"Physical batch size. (default: {DEFAULT_N_UBATCH[0]})")
CacheTypeKOpt = _sweep("-ctk", "--cache-type-k", help="K cache type: f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, "
                       f"iq4_nl. (default: {DEFAULT_CACHE_TYPE[0]})")
CacheTypeVOpt = _sweep("-ctv", "--cache-type-v", help=f"V cache type (as -ctk). (default: {DEFAULT_CACHE_TYPE[0]})")
ThreadsListOpt = _sweep("-t", "--threads", help="CPU threads. (default: physical cores)")
GpuLayersListOpt = _sweep("-ngl", "--n-gpu-layers",
                          help=f"Layers offloaded to the GPU (-1 = all). (default: {DEFAULT_N_GPU_LAYERS[0]})")
FlashAttnListOpt = _sweep("-fa", "--flash-attn",
                          help=f"Flash attention: on, off or auto. (default: {DEFAULT_FLASH_ATTN[0]})")
NoKvOffloadOpt = _sweep("-nkvo", "--no-kv-offload",
                        help=f"Keep the KV cache off the GPU: 0 or 1. (default: {DEFAULT_NO_KV_OFFLOAD[0]:d})")
MmapOpt = _sweep("-mmp", "--mmap",
                 help=f"Memory-map the model: 0 or 1 (sets the load mode). (default: {DEFAULT_LOAD_MODE[0]})")
LoadModeOpt = _sweep("-lm", "--load-mode", help="Load mode: auto, none, mmap, mlock, mmap+mlock, dio.")


def bench(
    model_path: ModelsOpt = None,
    hf_repo: HfReposOpt = None,
    hf_file: HfFilesOpt = None,
    hf_token: HfTokenOpt = None,
    offline: OfflineOpt = False,
    n_prompt: NPromptOpt = None,
    n_gen: NGenOpt = None,
    n_pg: NPgOpt = None,
    n_depth: NDepthOpt = None,
    batch_size: BatchSizesOpt = None,
    ubatch_size: UBatchSizesOpt = None,
    cache_type_k: CacheTypeKOpt = None,
    cache_type_v: CacheTypeVOpt = None,
    threads: ThreadsListOpt = None,
    n_gpu_layers: GpuLayersListOpt = None,
    flash_attn: FlashAttnListOpt = None,
    no_kv_offload: NoKvOffloadOpt = None,
    mmap: MmapOpt = None,
    load_mode: LoadModeOpt = None,
    repetitions: Annotated[int, typer.Option("-r", "--repetitions", help="Timed runs of each test.",
                                             rich_help_panel=RUN)] = DEFAULT_REPETITIONS,
    output: Annotated[str, typer.Option("-o", "--output", help="Output format: md, csv, json, jsonl or sql.",
                                        rich_help_panel=RUN)] = "md",
    progress: Annotated[bool, typer.Option("--progress", help="Print each step of each test on stderr.",
                                           rich_help_panel=RUN)] = False,
    no_warmup: Annotated[bool, typer.Option("--no-warmup", help="Skip the untimed warmup run of each test.",
                                            rich_help_panel=RUN)] = False,
    ttft: Annotated[bool, typer.Option(
        "--ttft", help="Also report time to first token (ms) for tests with a prompt: the timed prompt plus "
                       "picking the first token from its logits.", rich_help_panel=RUN)] = False,
    compare: Annotated[Path | None, typer.Option(
        "--compare", help="A previous `-o json` run (pyllama or llama-bench): add a speed-up column against it.",
        rich_help_panel=RUN, show_default=False, dir_okay=False)] = None,
    plot: Annotated[Path | None, typer.Option(
        "--plot", help="Draw t/s per test and parameter to this image: PNG, or SVG, PDF, ... by the "
                       "name's ending (needs matplotlib: pip install matplotlib).", rich_help_panel=RUN, show_default=False, dir_okay=False)] = None,
    verbose: VerboseOpt = False,
) -> None:
    """Measure prompt processing (pp) and generation (tg) speed, as llama-bench does.

    Random tokens go through llama_decode (no tokenizer, no sampler) in a fresh context per test.

    After a warmup run each test is timed -r times: mean ± sample stddev t/s. Test parameters take lists and ranges.

    peak RSS: the process's peak resident memory during the test (VmHWM, reset per test on Linux), model included.
    """
    from dataclasses import replace

    from ..core.bench.runner import build_info
    from ..core.bench.output import OUTPUT_FORMATS

    if output not in OUTPUT_FORMATS:
        raise UsageError(f"-o {output!r} is not one of {', '.join(OUTPUT_FORMATS)}", hint="e.g. -o json")
    spec = _make_spec(dict(locals()))
    baseline = _load_compare(compare)
    _check_plot(plot)
    spec = replace(spec, models=_resolve_models(model_path, hf_repo, hf_file, hf_token, offline))
    _run(spec, build_info(), output, progress, baseline, plot)


def _make_spec(args: dict[str, Any]) -> Any:
    """Parse every sweep flag (ranges, lists, choices) into a BenchSpec without models yet."""
    from ..core.bench import runner as core
    from ..core.bench import ranges
    from ..core.model.settings import INT32_MAX, MAX_THREADS, default_threads

    def ints(name: str, flag: str, default: tuple[int, ...], minimum: int = 0, negative: bool = False,
             maximum: int = INT32_MAX) -> tuple:
        return tuple(ranges.parse_int_values(args[name], default, flag=flag, minimum=minimum,
                                             allow_negative=negative, maximum=maximum))

    kv = {k: k for k in core.KV_CACHE_TYPES}
    fa = {"on": "on", "1": "on", "true": "on", "enabled": "on", "off": "off", "0": "off", "false": "off",
          "disabled": "off", "auto": "auto", "-1": "auto"}
    load_modes = list(ranges.parse_choice_values(args["load_mode"], (), flag="-lm", choices={m: m for m in core.LOAD_MODES}))
    load_modes += ["mmap" if m else "none" for m in ranges.parse_bool_values(args["mmap"], (), flag="--mmap")]
    if not 1 <= args["repetitions"] <= INT32_MAX:  # llama-bench reads -r as a 32-bit int
        raise UsageError(f"-r {args['repetitions']}: give 1 to {INT32_MAX} repetitions", hint="e.g. -r 5")
    spec = core.BenchSpec(
        models=(), n_threads=ints("threads", "-t", (default_threads(),), minimum=1, maximum=MAX_THREADS),
        n_prompt=ints("n_prompt", "-p", core.DEFAULT_N_PROMPT), n_gen=ints("n_gen", "-n", core.DEFAULT_N_GEN),
        n_pg=tuple(ranges.parse_pairs(args["n_pg"], flag="-pg")), n_depth=ints("n_depth", "-d", core.DEFAULT_N_DEPTH),
        n_batch=ints("batch_size", "-b", core.DEFAULT_N_BATCH, 1),
        n_ubatch=ints("ubatch_size", "-ub", core.DEFAULT_N_UBATCH, 1),
        type_k=tuple(ranges.parse_choice_values(args["cache_type_k"], core.DEFAULT_CACHE_TYPE, flag="-ctk", choices=kv)),
        type_v=tuple(ranges.parse_choice_values(args["cache_type_v"], core.DEFAULT_CACHE_TYPE, flag="-ctv", choices=kv)),
        n_gpu_layers=ints("n_gpu_layers", "-ngl", core.DEFAULT_N_GPU_LAYERS, -1, negative=True),
        no_kv_offload=tuple(ranges.parse_bool_values(args["no_kv_offload"], core.DEFAULT_NO_KV_OFFLOAD, flag="-nkvo")),
        flash_attn=tuple(ranges.parse_choice_values(args["flash_attn"], core.DEFAULT_FLASH_ATTN, flag="-fa", choices=fa)),
        load_mode=tuple(load_modes) or core.DEFAULT_LOAD_MODE, repetitions=args["repetitions"],
        warmup=not args["no_warmup"], ttft=args["ttft"], verbose=args["verbose"],
    )
    if not any(p > 0 for p in spec.n_prompt + spec.n_gen) and not any(pg != (0, 0) for pg in spec.n_pg):
        raise UsageError("nothing to measure: every -p and -n is 0, and so is every -pg pair",
                         hint="give -p N for prompt speed, -n N for generation speed, or -pg P,N")
    if spec.tests_per_model() > core.MAX_TESTS:
        raise UsageError(f"the lists and ranges make {spec.tests_per_model()} tests per model; at most "
                         f"{core.MAX_TESTS} run in one bench", hint="shorten the lists, or use ranges with a step")
    return spec


def _resolve_models(paths: list[str] | None, repos: list[str] | None, files: list[str] | None,
                    token: str | None, offline: bool) -> tuple[Any, ...]:
    """Resolve every -m (split on commas, as llama-bench does, unless the path exists) and -hf."""
    from ..core.bench.runner import BenchModel

    names = [p for raw in paths or [] for p in ([raw] if Path(raw).exists() else [s for s in raw.split(",") if s])]
    if len(files or []) > len(repos or []):
        raise UsageError("more -hff files than -hf repos", hint="give one -hff per -hf, in the same order")
    requests = [(n, ModelRequest(model=n)) for n in names]
    requests += [(None, ModelRequest(hf_repo=r, hf_file=(files or [])[i] if i < len(files or []) else None,
                                     hf_token=token, offline=offline)) for i, r in enumerate(repos or [])]
    if not requests:
        requests = [(None, ModelRequest())]  # raises the shared "no model given" error
    models = []
    for label, request in requests:
        resolved = resolve_model(request, tqdm_class=download_tqdm())
        models.append(BenchModel(label or str(resolved.path), resolved.path))
    return tuple(models)


def _load_compare(path: Path | None) -> list[dict[str, Any]] | None:
    if path is None:
        return None
    from ..core.bench.compare import load_baseline

    return load_baseline(path)


def _check_plot(path: Path | None) -> None:
    if path is None:
        return
    from ..core.bench.plot import check_plot_format
    from ..core.paths import output_target

    check_plot_format(path)
    folder = output_target(path).parent  # a symlink's target is what gets written
    if not folder.is_dir():
        if folder.exists():
            raise UsageError(f"--plot {path}: {folder} is not a folder", hint="pick another path")
        raise UsageError(f"--plot {path}: folder {folder} does not exist", hint="create it or pick another path")


def _run(spec: Any, build: Any, fmt: str, detail: bool, baseline: list[dict[str, Any]] | None,
         plot: Path | None) -> None:
    """Run the sweep, streaming rows in the chosen format (a rich table for md on a terminal)."""
    from ..core.bench.runner import run_benchmark
    from ..core.bench.compare import speedup
    from ..core.bench.output import Extras, make_printer, md_columns
    from ..core.model.settings import default_threads

    extras = Extras(ttft=spec.ttft, compare=baseline is not None)
    cols = md_columns(spec, build.backends, extras, default_threads())
    rich_table = fmt == "md" and stdout_is_tty()
    printer = None if rich_table else make_printer(fmt, _write, build, extras, cols)
    results, speedups = [], []
    if printer:
        printer.header()
    try:
        with bench_progress([inst.test_name for inst in spec.instances()], detail) as on_step:
            for result in run_benchmark(spec, on_step):
                gain = speedup(result, build, baseline) if baseline is not None else None
                results.append(result)
                speedups.append(gain)
                if printer:
                    printer.row(result, gain)
    except KeyboardInterrupt:
        # The tests that finished are still a valid document (json closes its list) and say so.
        _finish_output(printer, results, speedups, cols, build)
        raise Interrupted(f"benchmark interrupted: the output holds the {len(results)} of "
                          f"{len(spec.instances())} tests that finished") from None
    _finish_output(printer, results, speedups, cols, build)
    if plot is not None:
        _plot(results, cols, build, plot)
    _fail_if_errors(results)


def _finish_output(printer: Any, results: list[Any], speedups: list[float | None], cols: list[str],
                   build: Any) -> None:
    if printer:
        printer.footer()
    elif results:
        _print_rich_table(results, speedups, cols, build)


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _print_rich_table(results: list[Any], speedups: list[float | None], cols: list[str], build: Any) -> None:
    from rich import box
    from rich.table import Table

    from ..core.bench.output import md_cells, md_heading, md_width

    table = Table(box=box.SIMPLE_HEAVY, caption=f"build: {build.build_commit} ({build.build_number})")
    for col in cols:
        table.add_column(md_heading(col), justify="right" if md_width(col) > 0 else "left",
                         style="accent" if col == "t/s" else None, no_wrap=col not in ("model", "t/s", "ttft"))
    for result, gain in zip(results, speedups):
        table.add_row(*md_cells(result, cols, build, gain), style="error" if result.error else None)
    out().print(table)


def _plot(results: list[Any], cols: list[str], build: Any, path: Path) -> None:
    """Label each bar with the model (when several) and the parameters that differ between rows."""
    from ..core.bench.output import field_values, md_heading
    from ..core.bench.plot import plot_results

    values = [field_values(r, build) for r in results]
    params = [c for c in cols if c in values[0] and c not in ("model", "size", "params", "backend")]
    varying = [c for c in ["model_type", *params] if len({v[c] for v in values}) > 1]
    labels = [" ".join(v[c] if c == "model_type" else f"{md_heading(c)}={v[c]}" for c in varying) for v in values]
    plot_results(results, labels, path)


def _fail_if_errors(results: list[Any]) -> None:
    failed = [r for r in results if r.error]
    if failed:
        raise PyllamaError(f"{len(failed)} of {len(results)} tests failed; the first: {failed[0].instance.test_name}: "
                           f"{failed[0].error}", hint="the other tests ran; see the error in each failed row")
