"""How the CPU threads run, with llama.cpp's flags: `-tb`, `-C/-Cr`, `--prio`, `--poll`, `--cpu-strict`
and their batch variants (`-Cb/-Crb`, `--prio-batch`, `--poll-batch`, `--cpu-strict-batch`).

Part of the load flags (`load.py` adds `CPU_PARAMS` to every command that loads a model); they
become the `CpuPlacement`s of `LoadSettings`, which the core turns into the context's thread pools.
A batch flag left out takes the generation flag's value, as llama.cpp documents.
"""

from __future__ import annotations

import inspect
from typing import Annotated, Any

import typer

from ...core.model.settings import DEFAULT_POLL, MAX_THREADS, PRIORITIES, CpuPlacement, parse_cpu_mask, parse_cpu_range

CPU_PANEL = "CPU threads"
_PRIO_HELP = ", ".join(f"{name} ({value})" for value, name in PRIORITIES.items())

ThreadsBatchOpt = Annotated[int, typer.Option(
    "-tb", "--threads-batch", min=-1, max=MAX_THREADS,
    help="CPU threads for batch and prompt processing (-1 = same as --threads).", rich_help_panel=CPU_PANEL)]
CpuMaskOpt = Annotated[str | None, typer.Option(
    "-C", "--cpu-mask", metavar="M", help="CPU affinity mask: hex of any length, bit i = CPU i. Complements "
    "--cpu-range (default: any CPU).", rich_help_panel=CPU_PANEL, show_default=False)]
CpuRangeOpt = Annotated[str | None, typer.Option(
    "-Cr", "--cpu-range", metavar="lo-hi", help="Range of CPUs for affinity. Complements --cpu-mask.",
    rich_help_panel=CPU_PANEL, show_default=False)]
CpuStrictOpt = Annotated[int, typer.Option(
    "--cpu-strict", metavar="<0|1>", min=0, max=1, help="Strict CPU placement: one CPU of the mask per thread.",
    rich_help_panel=CPU_PANEL)]
PrioOpt = Annotated[int, typer.Option(
    "--prio", metavar="N", min=-1, max=3, help=f"Process/thread priority: {_PRIO_HELP}.",
    rich_help_panel=CPU_PANEL)]
PollOpt = Annotated[int, typer.Option(
    "--poll", metavar="<0...100>", min=0, max=100, help="Polling level while waiting for work (0 = no polling).",
    rich_help_panel=CPU_PANEL)]
CpuMaskBatchOpt = Annotated[str | None, typer.Option(
    "-Cb", "--cpu-mask-batch", metavar="M", help="CPU affinity mask of the batch threads. Complements "
    "--cpu-range-batch (default: same as --cpu-mask).", rich_help_panel=CPU_PANEL, show_default=False)]
CpuRangeBatchOpt = Annotated[str | None, typer.Option(
    "-Crb", "--cpu-range-batch", metavar="lo-hi", help="Range of CPUs for the batch threads. Complements "
    "--cpu-mask-batch.", rich_help_panel=CPU_PANEL, show_default=False)]
CpuStrictBatchOpt = Annotated[int | None, typer.Option(
    "--cpu-strict-batch", metavar="<0|1>", min=0, max=1, help="Strict CPU placement of the batch threads "
    "(default: same as --cpu-strict).", rich_help_panel=CPU_PANEL, show_default=False)]
PrioBatchOpt = Annotated[int | None, typer.Option(
    "--prio-batch", metavar="N", min=0, max=3, help="Priority of the batch threads: normal (0), medium (1), "
    "high (2), realtime (3) (default: same as --prio).", rich_help_panel=CPU_PANEL, show_default=False)]
PollBatchOpt = Annotated[int | None, typer.Option(
    "--poll-batch", metavar="<0...100>", min=0, max=100, help="Polling level of the batch threads "
    "(default: same as --poll).", rich_help_panel=CPU_PANEL, show_default=False)]

# bench's, as llama-bench's: a sweep each (values separated by commas), one pool per test.
BenchCpuMaskOpt = Annotated[list[str] | None, typer.Option(
    "-C", "--cpu-mask", metavar="LIST", help="CPU affinity masks (hex) of each test's thread pool. (default: 0x0)",
    show_default=False)]
BenchCpuStrictOpt = Annotated[list[str] | None, typer.Option(
    "--cpu-strict", metavar="LIST", help="Strict CPU placement: 0 or 1. (default: 0)", show_default=False)]
BenchPollOpt = Annotated[list[str] | None, typer.Option(
    "--poll", metavar="LIST", help=f"Polling level, 0 to 100. (default: {DEFAULT_POLL})", show_default=False)]


def cpu_params() -> list[inspect.Parameter]:
    """The CPU flags as keyword-only parameters, for `load.py`'s load flags."""
    return [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=alias, default=default)
            for name, alias, default in (
        ("threads_batch", ThreadsBatchOpt, -1), ("cpu_mask", CpuMaskOpt, None), ("cpu_range", CpuRangeOpt, None),
        ("cpu_strict", CpuStrictOpt, 0), ("prio", PrioOpt, 0), ("poll", PollOpt, DEFAULT_POLL),
        ("cpu_mask_batch", CpuMaskBatchOpt, None), ("cpu_range_batch", CpuRangeBatchOpt, None),
        ("cpu_strict_batch", CpuStrictBatchOpt, None), ("prio_batch", PrioBatchOpt, None),
        ("poll_batch", PollBatchOpt, None))]


def cpu_settings(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Pop the CPU flags out of a command's keyword arguments: LoadSettings' n_threads_batch, cpu and cpu_batch.

    Raises:
        UsageError: a malformed mask or range, named by its flag.
    """
    cpu = CpuPlacement(cpus=cpu_set(kwargs.pop("cpu_mask"), kwargs.pop("cpu_range"), "-C", "-Cr"),
                       prio=kwargs.pop("prio"), poll=kwargs.pop("poll"), strict=bool(kwargs.pop("cpu_strict")))
    mask_b, range_b = kwargs.pop("cpu_mask_batch"), kwargs.pop("cpu_range_batch")
    strict_b, prio_b, poll_b = kwargs.pop("cpu_strict_batch"), kwargs.pop("prio_batch"), kwargs.pop("poll_batch")
    batch = CpuPlacement(
        cpus=cpu_set(mask_b, range_b, "-Cb", "-Crb") if mask_b is not None or range_b is not None else cpu.cpus,
        prio=cpu.prio if prio_b is None else prio_b, poll=cpu.poll if poll_b is None else poll_b,
        strict=cpu.strict if strict_b is None else bool(strict_b))
    return {"n_threads_batch": kwargs.pop("threads_batch"), "cpu": cpu, "cpu_batch": batch}


def cpu_set(mask: str | None, cpu_range: str | None, mask_flag: str, range_flag: str) -> tuple[int, ...]:
    """The CPUs a mask and a range name together (they complement each other), in order; () = any."""
    cpus = set(parse_cpu_mask(mask, mask_flag)) if mask is not None else set()
    if cpu_range is not None:
        cpus |= set(parse_cpu_range(cpu_range, range_flag))
    return tuple(sorted(cpus))
