"""`pyllama bench`'s flags: llama-bench's test parameters, each a list or range to sweep."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from ..core.bench import spec as defaults
from .load import HfFileOpt, HfRepoOpt, ModelPathOpt, repeatable

SWEEP = "Test parameters (lists and ranges)"
RUN = "Run and output"


def sweep(*decls: str, help: str) -> Any:
    return Annotated[list[str] | None, typer.Option(
        *decls, help=help, rich_help_panel=SWEEP, show_default=False, metavar="LIST")]


ModelsOpt = repeatable(ModelPathOpt, " Repeat the flag (or separate with ,) to compare models.")
HfReposOpt = repeatable(HfRepoOpt, " Repeatable.")
HfFilesOpt = repeatable(HfFileOpt, " Repeatable: the n-th -hff goes with the n-th -hf.")
NPromptOpt = sweep("-p", "--n-prompt",
                    help=f"Prompt lengths to time (pp tests); 0 = none. (default: {defaults.DEFAULT_N_PROMPT[0]})")
NGenOpt = sweep("-n", "--n-gen",
                 help=f"Generation lengths to time (tg tests); 0 = none. (default: {defaults.DEFAULT_N_GEN[0]})")
NPgOpt = sweep("-pg", help="A PROMPT,GEN pair timed together (pp+tg test); repeatable.")
NDepthOpt = sweep("-d", "--n-depth",
                   help=f"Tokens already in the context (untimed prefill). (default: {defaults.DEFAULT_N_DEPTH[0]})")
BatchSizesOpt = sweep("-b", "--batch-size", help=f"Logical batch size. (default: {defaults.DEFAULT_N_BATCH[0]})")
UBatchSizesOpt = sweep("-ub", "--ubatch-size", help=f"Physical batch size. (default: {defaults.DEFAULT_N_UBATCH[0]})")
CacheTypeKOpt = sweep("-ctk", "--cache-type-k", help="K cache type: f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, "
                       f"iq4_nl. (default: {defaults.DEFAULT_CACHE_TYPE[0]})")
CacheTypeVOpt = sweep("-ctv", "--cache-type-v",
                       help=f"V cache type (as -ctk). (default: {defaults.DEFAULT_CACHE_TYPE[0]})")
ThreadsListOpt = sweep("-t", "--threads", help="CPU threads. (default: physical cores)")
GpuLayersListOpt = sweep("-ngl", "--n-gpu-layers",
                          help=f"Layers offloaded to the GPU (-1 = all). (default: {defaults.DEFAULT_N_GPU_LAYERS[0]})")
FlashAttnListOpt = sweep("-fa", "--flash-attn",
                          help=f"Flash attention: on, off or auto. (default: {defaults.DEFAULT_FLASH_ATTN[0]})")
NoKvOffloadOpt = sweep("-nkvo", "--no-kv-offload",
                        help=f"Keep the KV cache off the GPU: 0 or 1. (default: {defaults.DEFAULT_NO_KV_OFFLOAD[0]:d})")
MmapOpt = sweep("-mmp", "--mmap",
                 help=f"Memory-map the model: 0 or 1 (sets the load mode). (default: {defaults.DEFAULT_LOAD_MODE[0]})")
LoadModeOpt = sweep("-lm", "--load-mode", help="Load mode: auto, none, mmap, mlock, mmap+mlock, dio.")
