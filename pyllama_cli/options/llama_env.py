"""llama.cpp's `LLAMA_ARG_*` environment variables, as llama-server and its container recipes set them:
each names the flag it stands for, and a flag given on the command line beats it (Click's order).

`with_llama_env(params)` gives the options among `params` whose flag has a variable in llama.cpp that
variable, leaving the others as they are; the shared option lists (load, sampling, serve) pass
through it, so a flag gets its variable wherever it is declared.
"""

from __future__ import annotations

import copy
import inspect
import typing
from typing import Annotated

# Flag -> variable, for the flags llama.cpp's common arguments read from the environment.
LLAMA_ARG_ENV = {
    "--threads": "LLAMA_ARG_THREADS", "--ctx-size": "LLAMA_ARG_CTX_SIZE", "--n-predict": "LLAMA_ARG_N_PREDICT",
    "--batch-size": "LLAMA_ARG_BATCH", "--ubatch-size": "LLAMA_ARG_UBATCH", "--swa-full": "LLAMA_ARG_SWA_FULL",
    "--context-shift": "LLAMA_ARG_CONTEXT_SHIFT", "--flash-attn": "LLAMA_ARG_FLASH_ATTN",
    "--temp": "LLAMA_ARG_TEMPERATURE", "--top-k": "LLAMA_ARG_TOP_K", "--top-p": "LLAMA_ARG_TOP_P",
    "--min-p": "LLAMA_ARG_MIN_P", "--repeat-penalty": "LLAMA_ARG_REPEAT_PENALTY",
    "--presence-penalty": "LLAMA_ARG_PRESENCE_PENALTY", "--frequency-penalty": "LLAMA_ARG_FREQUENCY_PENALTY",
    "--rope-scaling": "LLAMA_ARG_ROPE_SCALING_TYPE", "--rope-scale": "LLAMA_ARG_ROPE_SCALE",
    "--rope-freq-base": "LLAMA_ARG_ROPE_FREQ_BASE", "--rope-freq-scale": "LLAMA_ARG_ROPE_FREQ_SCALE",
    "--yarn-orig-ctx": "LLAMA_ARG_YARN_ORIG_CTX", "--yarn-ext-factor": "LLAMA_ARG_YARN_EXT_FACTOR",
    "--yarn-attn-factor": "LLAMA_ARG_YARN_ATTN_FACTOR", "--yarn-beta-slow": "LLAMA_ARG_YARN_BETA_SLOW",
    "--yarn-beta-fast": "LLAMA_ARG_YARN_BETA_FAST", "--kv-offload": "LLAMA_ARG_KV_OFFLOAD",
    "--cache-type-k": "LLAMA_ARG_CACHE_TYPE_K", "--cache-type-v": "LLAMA_ARG_CACHE_TYPE_V",
    "--parallel": "LLAMA_ARG_N_PARALLEL", "--rpc": "LLAMA_ARG_RPC", "--device": "LLAMA_ARG_DEVICE",
    "--override-tensor": "LLAMA_ARG_OVERRIDE_TENSOR", "--cpu-moe": "LLAMA_ARG_CPU_MOE",
    "--n-cpu-moe": "LLAMA_ARG_N_CPU_MOE", "--n-gpu-layers": "LLAMA_ARG_N_GPU_LAYERS",
    "--split-mode": "LLAMA_ARG_SPLIT_MODE", "--tensor-split": "LLAMA_ARG_TENSOR_SPLIT",
    "--main-gpu": "LLAMA_ARG_MAIN_GPU", "--alias": "LLAMA_ARG_ALIAS", "--model": "LLAMA_ARG_MODEL",
    "--hf-repo": "LLAMA_ARG_HF_REPO", "--hf-file": "LLAMA_ARG_HF_FILE", "--host": "LLAMA_ARG_HOST",
    "--port": "LLAMA_ARG_PORT", "--api-key-file": "LLAMA_ARG_API_KEY_FILE", "--timeout": "LLAMA_ARG_TIMEOUT",
    "--metrics": "LLAMA_ARG_ENDPOINT_METRICS", "--slots": "LLAMA_ARG_ENDPOINT_SLOTS",
    "--models-dir": "LLAMA_ARG_MODELS_DIR", "--models-preset": "LLAMA_ARG_MODELS_PRESET",
    "--models-max": "LLAMA_ARG_MODELS_MAX", "--jinja": "LLAMA_ARG_JINJA",
    "--reasoning-budget": "LLAMA_ARG_THINK_BUDGET", "--chat-template": "LLAMA_ARG_CHAT_TEMPLATE",
    "--chat-template-file": "LLAMA_ARG_CHAT_TEMPLATE_FILE", "--log-file": "LLAMA_ARG_LOG_FILE",
    "--offline": "LLAMA_ARG_OFFLINE", "--model-draft": "LLAMA_ARG_SPEC_DRAFT_MODEL",
    "--spec-type": "LLAMA_ARG_SPEC_TYPE", "--draft-max": "LLAMA_ARG_DRAFT_MAX", "--draft-min": "LLAMA_ARG_DRAFT_MIN",
    "--n-gpu-layers-draft": "LLAMA_ARG_N_GPU_LAYERS_DRAFT", "--cont-batching": "LLAMA_ARG_CONT_BATCHING",
    "--cache-reuse": "LLAMA_ARG_CACHE_REUSE", "--embeddings": "LLAMA_ARG_EMBEDDINGS",
    "--kv-unified": "LLAMA_ARG_KV_UNIFIED", "--pooling": "LLAMA_ARG_POOLING", "--rerank": "LLAMA_ARG_RERANKING",
    "--fit": "LLAMA_ARG_FIT", "--fit-target": "LLAMA_ARG_FIT_TARGET", "--fit-ctx": "LLAMA_ARG_FIT_CTX",
    "--mmproj": "LLAMA_ARG_MMPROJ", "--mmproj-auto": "LLAMA_ARG_MMPROJ_AUTO",
    "--mmproj-offload": "LLAMA_ARG_MMPROJ_OFFLOAD", "--image-min-tokens": "LLAMA_ARG_IMAGE_MIN_TOKENS",
    "--image-max-tokens": "LLAMA_ARG_IMAGE_MAX_TOKENS",
    "--ui-mcp-proxy": "LLAMA_ARG_UI_MCP_PROXY", "--tools": "LLAMA_ARG_TOOLS",
}


def env_var(info: typing.Any) -> str | None:
    """The variable of an option's flags (any of its spellings, either side of an on/off pair)."""
    decls = ((info.default,) if isinstance(info.default, str) else ()) + tuple(info.param_decls or ())
    names = [name for decl in decls for name in decl.split("/")]
    return next((LLAMA_ARG_ENV[name] for name in names if name in LLAMA_ARG_ENV), None)


def with_env(alias: typing.Any) -> typing.Any:
    """An Annotated option alias with its LLAMA_ARG_* variable (the alias itself when it has none)."""
    args = typing.get_args(alias)
    if len(args) < 2 or not hasattr(args[1], "param_decls"):
        return alias
    kind, info = args[:2]
    name = env_var(info)
    if name is None or info.envvar:
        return alias
    placed = copy.copy(info)
    placed.envvar = name
    # Named in the help by hand: Click's own display would also put it in every error about the flag,
    # even when the value came from the command line.
    placed.show_envvar = False
    placed.help = f"{info.help} (env: {name})" if info.help else f"(env: {name})"
    return Annotated[kind, placed]


def with_llama_env(params: list[inspect.Parameter]) -> list[inspect.Parameter]:
    return [p.replace(annotation=with_env(p.annotation)) for p in params]
