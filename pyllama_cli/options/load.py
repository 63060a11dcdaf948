"""Options shared by every command, declared once so a flag has one name, help and default everywhere.

Flag names follow llama.cpp's (`-m`, `-hf`, `-c`, `-t`, `-ngl`, `-fa`, `-b`, `-ub`, `-s`, `-v`).
`model_options` adds the model-naming flags (and, with `load=True`, the load flags) to a command
and hands it a `ModelRequest` (or, with `several=True`, a `ModelRequests`) and a `LoadSettings`.
"""

from __future__ import annotations

import copy
import functools
import inspect
import typing
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..core.model.resolve import DEFAULT_QUANT, ModelRequest, ModelRequests
from ..core.model.limits import (
    DEFAULT_N_BATCH,
    DEFAULT_N_CTX,
    DEFAULT_N_GPU_LAYERS,
    DEFAULT_N_UBATCH,
    DEFAULT_SEED,
    FLASH_ATTN_CHOICES,
    INT32_MAX,
    MAX_THREADS,
    UINT32_MAX,
)
from ..errors import UsageError
from .llama_env import with_llama_env

if TYPE_CHECKING:
    from ..core.model.settings import LoadSettings

# The modules of the load flags (devices, CPU placement, adapters, KV cache, context, --fit) are
# imported where the flags are first needed: commands without them (quantize, tokenize, info) then
# start ~10 ms sooner.

MODEL_PANEL = "Model"
LOAD_PANEL = "Loading"

ModelPathOpt = Annotated[str | None, typer.Option(
    "-m", "--model", help="Local GGUF model file.", rich_help_panel=MODEL_PANEL, show_default=False)]
HfRepoOpt = Annotated[str | None, typer.Option(
    "-hf", "--hf-repo",
    help=f"Hugging Face repo as user/repo[:quant] (default quant: {DEFAULT_QUANT}, else the first GGUF).",
    rich_help_panel=MODEL_PANEL, show_default=False)]
HfFileOpt = Annotated[str | None, typer.Option(
    "-hff", "--hf-file", help="Exact GGUF file in the -hf repo (overrides the quant tag).",
    rich_help_panel=MODEL_PANEL, show_default=False)]
HfTokenOpt = Annotated[str | None, typer.Option(
    "-hft", "--hf-token", help="Hugging Face token for gated or private repos (default: $HF_TOKEN).",
    rich_help_panel=MODEL_PANEL, show_default=False)]
OfflineOpt = Annotated[bool, typer.Option(
    "--offline", help="Resolve -hf from the local cache only, with no network call (also HF_HUB_OFFLINE=1).",
    rich_help_panel=MODEL_PANEL)]

CtxSizeOpt = Annotated[int, typer.Option(
    "-c", "--ctx-size", min=0, help="Context size in tokens (0 = the model's trained context).",
    rich_help_panel=LOAD_PANEL)]
ThreadsOpt = Annotated[int, typer.Option(
    "-t", "--threads", min=-1, max=MAX_THREADS, help="CPU threads (-1 = physical cores).", rich_help_panel=LOAD_PANEL)]
GpuLayersOpt = Annotated[int, typer.Option(
    "-ngl", "--n-gpu-layers", "--gpu-layers", min=-1, help="Layers to offload to the GPU (-1 = all).",
    rich_help_panel=LOAD_PANEL)]
FlashAttnOpt = Annotated[str, typer.Option(
    "-fa", "--flash-attn", help="Flash attention: auto, on or off.", rich_help_panel=LOAD_PANEL)]
BatchOpt = Annotated[int, typer.Option(
    "-b", "--batch-size", min=1, help="Logical batch size (tokens per llama_decode).", rich_help_panel=LOAD_PANEL)]
UBatchOpt = Annotated[int, typer.Option(
    "-ub", "--ubatch-size", min=1, help="Physical batch size.", rich_help_panel=LOAD_PANEL)]
MlockOpt = Annotated[bool, typer.Option(
    "--mlock", help="Keep the model in RAM (no swapping).", rich_help_panel=LOAD_PANEL)]
NoMmapOpt = Annotated[bool, typer.Option(
    "--no-mmap", help="Read the model into memory instead of mapping it.", rich_help_panel=LOAD_PANEL)]
SeedOpt = Annotated[int, typer.Option(
    "-s", "--seed", min=-1, help="Random seed (-1 = random).", rich_help_panel=LOAD_PANEL)]
VerboseOpt = Annotated[bool, typer.Option(
    "-v", "--verbose", help="Show llama.cpp's own log on stderr.", rich_help_panel=LOAD_PANEL)]
LogFileOpt = Annotated[Path | None, typer.Option(
    "--log-file", help="Append llama.cpp's log to this file.", rich_help_panel=LOAD_PANEL, show_default=False,
    dir_okay=False)]

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]

# Chat flags of chat, complete, tokenize and serve; each command shows them in its own panel (`in_panel`).
ChatTemplateOpt = Annotated[str | None, typer.Option(
    "--chat-template", help="Chat template: a built-in name (chatml, llama3, ...), a .jinja file or Jinja text "
    "(default: the model's own).", show_default=False)]
SystemPromptOpt = Annotated[str | None, typer.Option(
    "-sys", "--system-prompt", help="System prompt: the system message that opens the conversation.",
    show_default=False)]


def repeatable(alias: Any, help_suffix: str = "") -> Any:
    """The shared string option `alias` (same flags, panel, and help with `help_suffix`) as a list: the
    flag may be given several times (bench's -m, -hf, -hff for several models)."""
    info = typing.get_args(alias)[1]
    decls = ((info.default,) if isinstance(info.default, str) else ()) + tuple(info.param_decls)
    return Annotated[list[str] | None, typer.Option(
        *decls, help=info.help + help_suffix, rich_help_panel=info.rich_help_panel, show_default=False)]


def in_panel(alias: Any, panel: str) -> Any:
    """The shared option `alias` (same flags, help and default) shown under `panel` in a command's --help."""
    kind, info = typing.get_args(alias)[:2]
    placed = copy.copy(info)
    placed.rich_help_panel = panel
    return Annotated[kind, placed]


def option_param(name: str, annotation: Any, default: Any) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)


ModelPathsOpt = repeatable(ModelPathOpt, " Repeat for router mode: one server, many models.")
HfReposOpt = repeatable(HfRepoOpt, " Repeatable (router mode).")


_MODEL_PARAMS = [
    option_param("model_path", ModelPathOpt, None),
    option_param("hf_repo", HfRepoOpt, None),
    option_param("hf_file", HfFileOpt, None),
    option_param("hf_token", HfTokenOpt, None),
    option_param("offline", OfflineOpt, False),
]
# serve's form: -m and -hf repeatable, for a router of several models (`model_options(several=True)`).
_SEVERAL_MODEL_PARAMS = [
    option_param("model_path", ModelPathsOpt, None),
    option_param("hf_repo", HfReposOpt, None),
    *_MODEL_PARAMS[2:],
]


@functools.cache
def _load_params() -> list[inspect.Parameter]:
    """The load flags, in the order --help shows them (built once, on first use)."""
    from .adapters import ADAPTER_PARAMS
    from .context import CONTEXT_PARAMS
    from .hardware.cpu import cpu_params
    from .hardware.devices import DeviceOpt, ListDevicesOpt, RpcOpt, TensorSplitOpt
    from .hardware.placement import FIT_PARAMS, PLACEMENT_PARAMS
    from .kv_cache import KV_CACHE_PARAMS

    params = [
        option_param("ctx_size", CtxSizeOpt, DEFAULT_N_CTX),
        option_param("threads", ThreadsOpt, -1),
        option_param("n_gpu_layers", GpuLayersOpt, DEFAULT_N_GPU_LAYERS),
        option_param("flash_attn", FlashAttnOpt, "auto"),
        option_param("batch_size", BatchOpt, DEFAULT_N_BATCH),
        option_param("ubatch_size", UBatchOpt, DEFAULT_N_UBATCH),
        option_param("mlock", MlockOpt, False),
        option_param("no_mmap", NoMmapOpt, False),
        option_param("seed", SeedOpt, DEFAULT_SEED),
        option_param("verbose", VerboseOpt, False),
        option_param("log_file", LogFileOpt, None),
        option_param("rpc", RpcOpt, None),
        option_param("device", DeviceOpt, None),
        option_param("tensor_split", TensorSplitOpt, None),
        option_param("list_devices", ListDevicesOpt, False),
        *cpu_params(),  # -tb, -C/-Cr, --prio, --poll, --cpu-strict and their batch variants (options/hardware/cpu.py)
        *ADAPTER_PARAMS,  # --lora, --lora-scaled, --control-vector... (options/adapters.py)
    ]
    # Flags of their own modules, added to the load flags (kept apart so each concern has one module).
    params += KV_CACHE_PARAMS + CONTEXT_PARAMS + PLACEMENT_PARAMS + FIT_PARAMS
    return with_llama_env(params)  # LLAMA_ARG_CTX_SIZE and the others llama.cpp reads


_MODEL_PARAMS = with_llama_env(_MODEL_PARAMS)  # LLAMA_ARG_MODEL, LLAMA_ARG_HF_REPO, LLAMA_ARG_HF_FILE
_SEVERAL_MODEL_PARAMS = with_llama_env(_SEVERAL_MODEL_PARAMS)


@functools.cache
def _media_flags() -> list[inspect.Parameter]:
    from .adapters import MEDIA_PARAMS

    return with_llama_env(MEDIA_PARAMS)  # LLAMA_ARG_MMPROJ, LLAMA_ARG_MMPROJ_OFFLOAD...


def model_request(kwargs: dict[str, Any]) -> ModelRequest:
    """Pop the model-naming flags out of a command's keyword arguments."""
    return ModelRequest(
        model=kwargs.pop("model_path"), hf_repo=kwargs.pop("hf_repo"), hf_file=kwargs.pop("hf_file"),
        hf_token=kwargs.pop("hf_token"), offline=kwargs.pop("offline"),
    )


def model_requests(kwargs: dict[str, Any]) -> ModelRequests:
    """Pop the model-naming flags out of a command's keyword arguments, -m and -hf given any number of times."""
    return ModelRequests(
        paths=tuple(kwargs.pop("model_path") or ()), hf_repos=tuple(kwargs.pop("hf_repo") or ()),
        hf_file=kwargs.pop("hf_file"), hf_token=kwargs.pop("hf_token"), offline=kwargs.pop("offline"),
    )


def load_settings(kwargs: dict[str, Any]) -> LoadSettings:
    """Pop the load flags out of a command's keyword arguments."""
    from ..core.model.settings import LoadSettings  # here, not at the top: quantize, tokenize and info never build one
    from .adapters import adapter_settings
    from .context import context_settings
    from .hardware.cpu import cpu_settings
    from .hardware.devices import list_devices, parse_devices, parse_rpc, parse_tensor_split
    from .hardware.placement import fit_settings, placement_settings
    from .kv_cache import kv_cache_settings

    flash = kwargs.pop("flash_attn").lower()
    if flash not in FLASH_ATTN_CHOICES:
        raise typer.BadParameter(f"{flash!r} is not one of {', '.join(FLASH_ATTN_CHOICES)}", param_hint="'-fa'")
    check_fits(ctx_size=("-c", INT32_MAX), n_gpu_layers=("-ngl", INT32_MAX), batch_size=("-b", INT32_MAX),
               ubatch_size=("-ub", INT32_MAX), seed=("-s", UINT32_MAX), values=kwargs)
    rpc = parse_rpc(kwargs.pop("rpc"))
    if kwargs.pop("list_devices"):
        list_devices(rpc)
    return LoadSettings(
        rpc=rpc, devices=parse_devices(kwargs.pop("device")),
        tensor_split=parse_tensor_split(kwargs.pop("tensor_split")),
        n_ctx=kwargs.pop("ctx_size"), n_threads=kwargs.pop("threads"), n_gpu_layers=kwargs.pop("n_gpu_layers"),
        flash_attn=flash, n_batch=kwargs.pop("batch_size"), n_ubatch=kwargs.pop("ubatch_size"),
        mlock=kwargs.pop("mlock"), mmap=not kwargs.pop("no_mmap"), seed=kwargs.pop("seed"),
        verbose=kwargs.pop("verbose"), log_file=kwargs.pop("log_file"), adapters=adapter_settings(kwargs),
        **kv_cache_settings(kwargs), **context_settings(kwargs), **placement_settings(kwargs),
        **cpu_settings(kwargs), **fit_settings(kwargs),
    )


def check_fits(*, values: dict[str, Any], **limits: tuple[str, int]) -> None:
    """Refuse a count too big for the C field llama.cpp keeps it in, where it would silently wrap
    (`-c 4294967300` became a 4-token context). `limits` maps a parameter name to (flag, largest value)."""
    for name, (flag, limit) in limits.items():
        if values[name] > limit:
            raise UsageError(f"{flag} {values[name]} is too large", hint=f"llama.cpp takes at most {limit}")


def model_options(load: bool = True, *, several: bool = False,
                  own: dict[str, Any] | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command the shared model flags (and load flags when `load`).

    The command declares a `model: ModelRequest` parameter (`model: ModelRequests` with `several`: -m
    and -hf may then be given several times, as serve's router mode takes them), and `load:
    LoadSettings` with `load`; `with_flags` shows the individual flags in their place and builds the
    objects from them. `own` gives a shared flag this command's own declaration, e.g. perplexity's
    -c: {"ctx_size": ChunkCtxOpt}.
    """
    flags = (_SEVERAL_MODEL_PARAMS if several else _MODEL_PARAMS) + (_load_params() if load else [])
    if own:
        flags = [p.replace(annotation=own[p.name]) if p.name in own else p for p in flags]

    def build(kwargs: dict[str, Any]) -> None:
        kwargs["model"] = model_requests(kwargs) if several else model_request(kwargs)
        if load:
            kwargs["load"] = load_settings(kwargs)

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        return with_flags(fn, ("model", "load"), flags, build)

    return decorate


def media_options() -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command the projector flags (options/adapters.py) as one `media: ProjectorSettings` parameter."""

    def build(kwargs: dict[str, Any]) -> None:
        from .adapters import projector_settings

        kwargs["media"] = projector_settings(kwargs)

    return lambda fn: with_flags(fn, ("media",), _media_flags(), build)


def with_flags(fn: Callable[..., Any], replaced: tuple[str, ...], flags: list[inspect.Parameter],
               build: Callable[[dict[str, Any]], None]) -> Callable[..., Any]:
    """A command that takes `flags` in place of `fn`'s `replaced` parameters (objects built of them).

    Typer reads a command's parameters with `inspect.signature`, which gives a function's
    `__signature__` when it has one (PEP 362): the command made here sets its own to `fn`'s other
    parameters followed by `flags`, and that is what `--help` shows. When it runs, `build(kwargs)`
    pops the flags' values and sets the replaced parameters (e.g. a LoadSettings made of the load
    flags) before `fn` is called.
    """
    sig = inspect.signature(fn)
    # Resolve string annotations (PEP 563) in the command's own module, where its names live.
    hints = typing.get_type_hints(fn, include_extras=True)
    params = [p.replace(annotation=hints.get(name, p.annotation))
              for name, p in sig.parameters.items() if name not in replaced] + list(flags)

    def command(**kwargs: Any) -> Any:
        build(kwargs)
        return fn(**kwargs)

    command.__name__, command.__qualname__, command.__module__ = fn.__name__, fn.__qualname__, fn.__module__
    command.__doc__ = fn.__doc__
    command.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    return command
