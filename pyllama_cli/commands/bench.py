"""`pyllama bench`: llama-bench's measurements, tables and formats, plus TTFT, memory, compare and plot."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from ..console import bench_progress, download_tqdm, print_table, stdout_is_tty
from ..core.bench import spec as defaults
from ..errors import Interrupted, UsageError
from ..options.hardware.cpu import BenchCpuMaskOpt, BenchCpuStrictOpt, BenchPollOpt, PrioOpt
from ..options.hardware.devices import BenchDeviceOpt, BenchTensorSplitOpt, ListDevicesOpt, RpcOpt, list_devices, parse_rpc
from ..options.load import HfTokenOpt, OfflineOpt, VerboseOpt, in_panel
from ..options.hardware.placement import BenchOverrideTensorOpt
from ..options.adapters import LoraOpt, LoraScaledOpt, lora_files
from ..options.bench import (RUN, SWEEP, BatchSizesOpt, CacheTypeKOpt, CacheTypeVOpt, FlashAttnListOpt,
                             GpuLayersListOpt, HfFilesOpt, HfReposOpt, LoadModeOpt, MmapOpt, ModelsOpt, NDepthOpt,
                             NGenOpt, NoKvOffloadOpt, NPgOpt, NPromptOpt, ThreadsListOpt, UBatchSizesOpt)

EXAMPLES = """\
Examples:
  pyllama bench -m model.gguf
  pyllama bench -m model.gguf -p 256 -n 64 -t 1-4 -o csv
  pyllama bench -m a.gguf -m b.gguf -pg 512,128 -d 0,1024 -fa on,off
  pyllama bench -m model.gguf -ctk f16,q8_0 -ctv f16,q8_0 -fa on
  pyllama bench -m model.gguf --ttft -o json > base.json && pyllama bench -m model.gguf --compare base.json
  pyllama bench -m model.gguf --rpc 10.0.0.5:50052,10.0.0.6:50052 -ts 3/1
  pyllama bench -m model.gguf --lora-scaled adapter.gguf:0.5 -n 64 -o json

Values: 1,2,4 or ranges 1-8, 1-8+2 (step), 1-16*2 (factor); a flag may repeat.
"""


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
    cpu_mask: in_panel(BenchCpuMaskOpt, SWEEP) = None,
    cpu_strict: in_panel(BenchCpuStrictOpt, SWEEP) = None,
    poll: in_panel(BenchPollOpt, SWEEP) = None,
    prio: in_panel(PrioOpt, RUN) = 0,
    rpc: RpcOpt = None,
    device: BenchDeviceOpt = None,
    tensor_split: BenchTensorSplitOpt = None,
    override_tensor: BenchOverrideTensorOpt = None,
    list_devices_only: ListDevicesOpt = False,
    lora: LoraOpt = None,
    lora_scaled: LoraScaledOpt = None,
    repetitions: Annotated[int, typer.Option("-r", "--repetitions", help="Timed runs of each test.",
                                             rich_help_panel=RUN)] = defaults.DEFAULT_REPETITIONS,
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
                       "name's ending (needs matplotlib: pip install matplotlib).", rich_help_panel=RUN,
        show_default=False, dir_okay=False)] = None,
    verbose: VerboseOpt = False,
) -> None:
    """Measure prompt processing (pp) and generation (tg) speed, as llama-bench does.

    Random tokens go through llama_decode (no tokenizer, no sampler) in a fresh context per test.

    After a warmup run each test is timed -r times: mean ± sample stddev t/s. Test parameters take lists and ranges.

    peak RSS: the process's peak resident memory during the test (VmHWM, reset per test on Linux), model included.

    --lora/--lora-scaled: the adapters are applied to every test's context (a `lora` column and field say which).
    """
    from ..core.bench.compare import load_baseline
    from ..core.bench.output import OUTPUT_FORMATS
    from ..core.bench.params import check_loras, make_spec, model_requests, resolve_models
    from ..core.bench.plot import check_plot_target
    from ..core.bench.runner import build_info
    from ..core.model.rpc import add_servers

    if list_devices_only:
        list_devices(parse_rpc(rpc))
    if output not in OUTPUT_FORMATS:
        raise UsageError(f"-o {output!r} is not one of {', '.join(OUTPUT_FORMATS)}", hint="e.g. -o json")
    spec = replace(make_spec(dict(locals())), loras=lora_files(lora, lora_scaled))
    baseline = load_baseline(compare) if compare is not None else None
    if plot is not None:
        check_plot_target(plot)
    requests = model_requests(model_path, hf_repo, hf_file, hf_token, offline)
    spec = replace(spec, models=resolve_models(requests, download_tqdm()))
    check_loras(spec)
    add_servers(spec.rpc)  # before build_info: the backend is RPC once servers lend devices
    _run(spec, build_info(), output, progress, baseline, plot)


def _run(spec: Any, build: Any, fmt: str, detail: bool, baseline: list[dict[str, Any]] | None,
         plot: Path | None) -> None:
    """Run the sweep, streaming rows in the chosen format (a rich table for md on a terminal)."""
    from ..core.bench.runner import run_benchmark
    from ..core.interrupt import remembered_sigint
    from ..core.bench.compare import speedup
    from ..core.bench.output import Extras, check_failures, make_printer, md_columns
    from ..core.bench.plot import plot_sweep
    from ..core.model.settings import default_threads

    extras = Extras(ttft=spec.ttft, compare=baseline is not None, lora=bool(spec.loras))
    cols = md_columns(spec, build.backends, extras, default_threads())
    rich_table = fmt == "md" and stdout_is_tty()
    printer = None if rich_table else make_printer(fmt, _write, build, extras, cols)
    results, speedups = [], []
    if printer:
        printer.header()
    try:
        with remembered_sigint() as ctrl_c, bench_progress([inst.test_name for inst in spec.instances()],
                                                           detail) as on_step:
            for result in run_benchmark(spec, on_step):
                gain = speedup(result, build, baseline) if baseline is not None else None
                results.append(result)
                speedups.append(gain)
                if printer:
                    printer.row(result, gain)
                if ctrl_c:  # a Ctrl-C that a native callback swallowed: stop after this test
                    raise KeyboardInterrupt
    except KeyboardInterrupt:
        # The tests that finished are still a valid document (json closes its list) and say so.
        _finish_output(printer, results, speedups, cols, build)
        raise Interrupted(f"benchmark interrupted: the output holds the {len(results)} of "
                          f"{len(spec.instances())} tests that finished") from None
    _finish_output(printer, results, speedups, cols, build)
    if plot is not None:
        plot_sweep(results, cols, build, plot)
    check_failures(results)


def _finish_output(printer: Any, results: list[Any], speedups: list[float | None], cols: list[str],
                   build: Any) -> None:
    if printer:
        printer.footer()
    elif results:
        from ..core.bench.output import md_table

        print_table(*md_table(results, speedups, cols, build))


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
