"""`pyllama bench`'s flags read into a BenchSpec (llama-bench's defaults are in spec.py).

Free of llama.cpp imports at module level: `pyllama bench --help` reads the defaults from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...errors import UsageError
from ..model import settings
from ..model.settings import parse_cpu_mask
from ..model.resolve import ModelRequest
from .spec import (
    DEFAULT_CACHE_TYPE,
    DEFAULT_CPU_MASK,
    DEFAULT_CPU_STRICT,
    DEFAULT_FLASH_ATTN,
    DEFAULT_LOAD_MODE,
    DEFAULT_N_BATCH,
    DEFAULT_N_DEPTH,
    DEFAULT_N_GEN,
    DEFAULT_N_GPU_LAYERS,
    DEFAULT_N_PROMPT,
    DEFAULT_N_UBATCH,
    DEFAULT_NO_KV_OFFLOAD,
    DEFAULT_POLL,
    KV_CACHE_TYPES,
    LOAD_MODES,
    MAX_TESTS,
    BenchSpec,
)

# -fa's spellings, as llama-bench reads them.
_FLASH_ATTN = {"on": "on", "1": "on", "true": "on", "enabled": "on", "off": "off", "0": "off", "false": "off",
               "disabled": "off", "auto": "auto", "-1": "auto"}


def make_spec(flags: Mapping[str, Any]) -> Any:
    """Parse every sweep flag (ranges, lists, choices) into a BenchSpec without models yet.

    `flags` holds the command's flag values by parameter name (`n_prompt`, `cache_type_k`, ...).

    Raises:
        UsageError: a malformed value, nothing to measure, or more tests than one bench runs.
    """
    from . import ranges

    def ints(name: str, flag: str, default: tuple[int, ...], minimum: int = 0, negative: bool = False,
             maximum: int = settings.INT32_MAX) -> tuple:
        return tuple(ranges.parse_int_values(flags[name], default, flag=flag, minimum=minimum,
                                             allow_negative=negative, maximum=maximum))

    def choices(name: str, flag: str, default: tuple[str, ...], allowed: dict[str, str]) -> tuple:
        return tuple(ranges.parse_choice_values(flags[name], default, flag=flag, choices=allowed))

    kv = {k: k for k in KV_CACHE_TYPES}
    load_modes = _load_modes(flags["load_mode"], flags["mmap"])
    _check_repetitions(flags["repetitions"])
    spec = BenchSpec(
        models=(), n_threads=ints("threads", "-t", (settings.default_threads(),), 1, maximum=settings.MAX_THREADS),
        n_prompt=ints("n_prompt", "-p", DEFAULT_N_PROMPT), n_gen=ints("n_gen", "-n", DEFAULT_N_GEN),
        n_pg=tuple(ranges.parse_pairs(flags["n_pg"], flag="-pg")), n_depth=ints("n_depth", "-d", DEFAULT_N_DEPTH),
        n_batch=ints("batch_size", "-b", DEFAULT_N_BATCH, 1), n_ubatch=ints("ubatch_size", "-ub", DEFAULT_N_UBATCH, 1),
        type_k=choices("cache_type_k", "-ctk", DEFAULT_CACHE_TYPE, kv),
        type_v=choices("cache_type_v", "-ctv", DEFAULT_CACHE_TYPE, kv),
        n_gpu_layers=ints("n_gpu_layers", "-ngl", DEFAULT_N_GPU_LAYERS, -1, negative=True),
        no_kv_offload=tuple(ranges.parse_bool_values(flags["no_kv_offload"], DEFAULT_NO_KV_OFFLOAD, flag="-nkvo")),
        flash_attn=choices("flash_attn", "-fa", DEFAULT_FLASH_ATTN, _FLASH_ATTN),
        load_mode=load_modes or DEFAULT_LOAD_MODE, **_placement(flags), **_cpu(flags),
        repetitions=flags["repetitions"], warmup=not flags["no_warmup"], ttft=flags["ttft"], verbose=flags["verbose"],
    )
    if not any(p > 0 for p in spec.n_prompt + spec.n_gen) and not any(pg != (0, 0) for pg in spec.n_pg):
        raise UsageError("nothing to measure: every -p and -n is 0, and so is every -pg pair",
                         hint="give -p N for prompt speed, -n N for generation speed, or -pg P,N")
    if spec.tests_per_model() > MAX_TESTS:
        raise UsageError(f"the lists and ranges make {spec.tests_per_model()} tests per model; at most "
                         f"{MAX_TESTS} run in one bench", hint="shorten the lists, or use ranges with a step")
    return spec


def _placement(flags: Mapping[str, Any]) -> dict[str, tuple]:
    """--rpc, and -dev and -ts as llama-bench reads them: configurations separated by commas, the items
    of one by / (`-dev RPC0/RPC1,RPC1 -ts 3/1,1/1` makes four)."""
    from ..model.settings import bench_overrides, parse_devices, parse_rpc, parse_tensor_split

    def configs(value: list[str] | None, parse: Any) -> tuple:
        raw = [part for item in value or [] for part in item.split(",") if part.strip()]
        return tuple(parse(part.replace("/", ",")) for part in raw) or ((),)

    return {"rpc": parse_rpc(flags["rpc"]), "devices": configs(flags["device"], parse_devices),
            "tensor_split": configs(flags["tensor_split"], parse_tensor_split),
            "tensor_overrides": bench_overrides(flags["override_tensor"])}


def _cpu(flags: Mapping[str, Any]) -> dict[str, Any]:
    """llama-bench's thread-pool flags: -C masks, --cpu-strict and --poll as sweeps, --prio for the run."""
    from . import ranges

    masks = [m.strip() for raw in flags["cpu_mask"] or [] for m in raw.split(",") if m.strip()]
    for mask in masks:
        parse_cpu_mask(mask, "-C")
    return {"cpu_mask": tuple(masks) or DEFAULT_CPU_MASK,
            "cpu_strict": tuple(ranges.parse_bool_values(flags["cpu_strict"], DEFAULT_CPU_STRICT, flag="--cpu-strict")),
            "poll": tuple(ranges.parse_int_values(flags["poll"], DEFAULT_POLL, flag="--poll", minimum=0, maximum=100)),
            "prio": flags["prio"]}


def _load_modes(load_mode: list[str] | None, mmap: list[str] | None) -> tuple[str, ...]:
    """-lm's modes, then -mmp's 0/1 as the modes none/mmap (both flags may be given)."""
    from . import ranges

    modes = list(ranges.parse_choice_values(load_mode, (), flag="-lm", choices={m: m for m in LOAD_MODES}))
    return tuple(modes + ["mmap" if m else "none" for m in ranges.parse_bool_values(mmap, (), flag="--mmap")])


def _check_repetitions(repetitions: int) -> None:
    if not 1 <= repetitions <= settings.INT32_MAX:  # llama-bench reads -r as a 32-bit int
        raise UsageError(f"-r {repetitions}: give 1 to {settings.INT32_MAX} repetitions", hint="e.g. -r 5")


def model_requests(paths: list[str] | None, repos: list[str] | None, files: list[str] | None, token: str | None,
                   offline: bool) -> list[tuple[str | None, ModelRequest]]:
    """Every -m (split on commas, as llama-bench does, unless the path exists) and -hf, in that order,
    each with the label the user wrote for it (None for -hf: the resolved path is shown).

    Raises:
        UsageError: more -hff than -hf.
    """
    names = [p for raw in paths or [] for p in ([raw] if Path(raw).exists() else [s for s in raw.split(",") if s])]
    files = files or []
    if len(files) > len(repos or []):
        raise UsageError("more -hff files than -hf repos", hint="give one -hff per -hf, in the same order")
    requests: list[tuple[str | None, ModelRequest]] = [(n, ModelRequest(model=n)) for n in names]
    requests += [(None, ModelRequest(hf_repo=r, hf_file=files[i] if i < len(files) else None, hf_token=token,
                                     offline=offline)) for i, r in enumerate(repos or [])]
    return requests or [(None, ModelRequest())]  # an empty request raises the shared "no model given" error


def check_loras(spec: Any) -> None:
    """Refuse a missing adapter, or one made for another architecture than a model's, before any test runs.

    Raises:
        UsageError, ModelLoadError: check_lora_file's errors, naming the adapter and the model.
    """
    from ..gguf.reader import read_gguf
    from ..model.adapters import check_lora_file

    for model in spec.models if spec.loras else ():
        arch = read_gguf(model.path, check_data=False, strings=False).architecture  # resolve_models checked the file
        for lora in spec.loras:
            check_lora_file(lora.path, model.path, arch)


def resolve_models(requests: list[tuple[str | None, ModelRequest]], tqdm_class: type | None) -> tuple[Any, ...]:
    """The models to benchmark, each labelled as the user named it (else by its resolved path)."""
    from ..model.resolve import resolve_model
    from .spec import BenchModel

    models = []
    for label, request in requests:
        resolved = resolve_model(request, tqdm_class=tqdm_class)
        models.append(BenchModel(label or str(resolved.path), resolved.path))
    return tuple(models)
