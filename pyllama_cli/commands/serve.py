"""`pyllama serve`: an OpenAI-compatible HTTP server for one model, or for many (router mode)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import typer

from ..console import download_tqdm, warn
from ..core.model.resolve import ModelRequests, resolve_model
from ..core.model.session import trained_context_warning
from ..core.model.settings import LoadSettings
from ..errors import UsageError
from ..core.serving.cache.settings import CacheSettings
from ..options.embedding import EmbeddingMode, embedding_options
from ..options.limits import cache_options, limit_options, media_policy_options
from ..options.load import ChatTemplateOpt, in_panel, media_options, model_options
from ..options.sampling import SamplingOptions, sampling_options
from ..options.speculative import SpeculativeOptions, speculative_options
from ..server.settings import MediaPolicy, ServerLimits
from ..options.serve import (
    DEFAULT_HOST, DEFAULT_MODELS_MAX, DEFAULT_PORT, SERVER_PANEL, AliasOpt, AllowedHostsOpt, ApiKeyOpt,
    CorsOriginOpt, LogFormatOpt, QuietOpt, ServeVerboseOpt, VerboseNativeOpt, DocsOpt, HostOpt, KvUnifiedOpt,
    MaxBodySizeOpt, MetricsOpt, ModelsAutoloadOpt, TagsOpt, ToolsOpt, UiMcpProxyOpt, ModelsCacheOpt, ModelsDirOpt, ModelsMaxOpt,
    ModelsPresetOpt, NoWebuiOpt, ParallelOpt, PortOpt, SleepIdleOpt, SlotSavePathOpt, ReasoningBudgetOpt,
    ReasoningFormatOpt, parse_size,
)
from ..core.text.reasoning import FORMAT_DEEPSEEK, UNLIMITED

EXAMPLES = """\
Examples:
  pyllama serve -m model.gguf
  pyllama serve -hf ggml-org/gemma-3-1b-it-GGUF --port 8000 --alias gemma
  pyllama serve -m model.gguf --host 0.0.0.0 --api-key "$(cat key.txt)" --cors-origin https://app.example
  pyllama serve -m model.gguf -np 4 -c 16384        # 4 requests at once, 4096 tokens each
  pyllama serve -m embedder.gguf --embeddings
  pyllama serve --models-dir ~/models --models-max 2 --sleep-idle-seconds 600   # router mode
  pyllama serve                                     # router mode over every GGUF in the HF cache
  curl http://127.0.0.1:8080/v1/chat/completions -d '{"messages": [{"role": "user", "content": "Hi"}]}'
"""

@model_options(load=True, several=True, own={"verbose": ServeVerboseOpt})  # -v: the server's own detail
@sampling_options()
@speculative_options()
@limit_options()
@cache_options()
@embedding_options()
@media_options()
@media_policy_options()
def serve(
    ctx: typer.Context,
    model: ModelRequests,
    load: LoadSettings,
    sampling: SamplingOptions,
    speculative: SpeculativeOptions,
    limits: ServerLimits,
    prompt_cache: CacheSettings,
    media: Any,
    media_policy: MediaPolicy,
    host: HostOpt = DEFAULT_HOST,
    port: PortOpt = DEFAULT_PORT,
    alias: AliasOpt = None,
    api_key: ApiKeyOpt = None,
    cors_origin: CorsOriginOpt = None,
    allowed_hosts: AllowedHostsOpt = None,
    docs: DocsOpt = False,
    slot_save_path: SlotSavePathOpt = None,
    embeddings: EmbeddingMode = EmbeddingMode(),
    max_body_size: MaxBodySizeOpt = "8MiB",
    chat_template: in_panel(ChatTemplateOpt, SERVER_PANEL) = None,
    parallel: ParallelOpt = 1,
    kv_unified: KvUnifiedOpt = False,
    no_webui: NoWebuiOpt = False,
    metrics: MetricsOpt = True,
    tags: TagsOpt = None,
    models_autoload: ModelsAutoloadOpt = True,
    ui_mcp_proxy: UiMcpProxyOpt = False,
    tools: ToolsOpt = None,
    models_dir: ModelsDirOpt = None,
    models_cache: ModelsCacheOpt = False,
    models_max: ModelsMaxOpt = DEFAULT_MODELS_MAX,
    sleep_idle_seconds: SleepIdleOpt = -1,
    models_preset: ModelsPresetOpt = None,
    reasoning_format: ReasoningFormatOpt = FORMAT_DEEPSEEK,
    reasoning_budget: ReasoningBudgetOpt = UNLIMITED,
    log_format: LogFormatOpt = "text",
    quiet: QuietOpt = False,
    verbose_native: VerboseNativeOpt = False,
) -> None:
    """Serve a model over an OpenAI-compatible HTTP API: chat, completions, embeddings.

    Official OpenAI clients work with base_url http://HOST:PORT/v1. The server answers /health with
    503 while the model loads and 200 after; /docs has the API's schema. Sampling flags set the
    defaults that requests override; -n sets the default max_tokens (default: the rest of the context).

    A browser at http://HOST:PORT/ gets a chat page (--no-webui turns it off).

    Router mode (several -m or -hf, --models-dir, --models-cache, --sleep-idle-seconds, or no model at
    all): a request's `model` picks the model, loaded on first use; see docs/router.md.
    """
    from ..core.generate.speculative import resolve_draft
    from ..server import run as server
    from ..server.http.hosts import allowed_hosts as hosts_allowed
    from ..server.settings import ServerSettings
    from ..core.media.projector import with_hf_projector


    if chat_template:
        from ..core.text.chat_template import resolve_template

        resolve_template(None, chat_template)  # an unknown name fails before the model loads
    if embeddings and speculative.settings.enabled:
        raise UsageError("--spec-type and -md speed up generation; an --embeddings server generates nothing",
                         hint="drop --spec-type/-md, or serve a generating model without --embeddings")
    spec = resolve_draft(speculative.settings, speculative.draft, download_tqdm())
    router = (model.count != 1 or bool(models_dir) or models_cache or models_preset is not None
              or sleep_idle_seconds >= 0)  # a model that unloads when idle and loads again on demand
    settings = ServerSettings(
        alias=alias or "", sampling=sampling.settings, n_predict=sampling.n_predict,
        stop=sampling.stop, api_key=api_key or None, cors_origins=tuple(cors_origin or ()),
        max_body_size=parse_size(max_body_size), chat_template=chat_template, webui=not no_webui,
        limits=limits, speculative=spec, slot_save_path=slot_save_path.resolve() if slot_save_path else None,
        reasoning_format=reasoning_format, reasoning_budget=reasoning_budget, docs=docs,
        allowed_hosts=hosts_allowed(host, allowed_hosts or []),
        access_log=None if quiet else log_format, verbose=load.verbose, **embeddings.fields,
        prompt_cache=replace(prompt_cache, template=chat_template), projector=media, media=media_policy,
        metrics=metrics, tags=_names(tags), aliases=_names(alias), models_autoload=models_autoload,
        cors_proxy=ui_mcp_proxy, tools=_names(tools))
    load = replace(load, verbose=verbose_native)  # -v is the server's detail; llama.cpp's log is its own switch
    if router:
        _serve_router(ctx, model, load, settings, host, port, embeddings=embeddings, alias=alias,
                      models_dir=models_dir or [], models_cache=models_cache, models_max=models_max,
                      idle=sleep_idle_seconds, preset=models_preset, parallel=parallel, kv_unified=kv_unified)
        return
    resolved = resolve_model(model.first(), tqdm_class=download_tqdm())
    per_request = load.n_ctx if kv_unified else load.n_ctx // parallel  # what llama.cpp checks: n_ctx_seq
    if past := trained_context_warning(resolved.path, per_request, f"a context of {per_request} tokens per request"):
        warn(past)
    _add_rpc_servers(load)
    # The id is the first alias in order (llama-server keeps them in a sorted set); default: the file's stem.
    settings = replace(settings, alias=settings.aliases[0] if settings.aliases else resolved.path.stem,
                       projector=with_hf_projector(media, model.first(), resolved, download_tqdm()))
    socks = server.listen_for(host, port, settings)
    server.serve(socks, resolved.path, load, settings, embeddings=embeddings, parallel=parallel, kv_unified=kv_unified)


def _serve_router(ctx: typer.Context, model: ModelRequests, load: LoadSettings, settings: Any, host: str, port: int, *, embeddings: bool, alias: str | None, models_dir: list[Path],
                  models_cache: bool, models_max: int, idle: float, preset: Path | None, parallel: int,
                  kv_unified: bool) -> None:
    from ..server import run as server
    from ..server.router.presets import load_presets
    from ..server.router.start import RouterOptions, find_models, router_models, serve_router

    if embeddings:
        raise UsageError("--embeddings serves one model, and this server has several (router mode)",
                         hint="give one model without --sleep-idle-seconds")
    if load.rpc and models_max != 1:  # two models decoding on one RPC server at once hang in ggml's RPC client
        raise UsageError("--rpc in router mode runs one model at a time", hint="add --models-max 1")
    if len(model.hf_repos) > 1 and model.hf_file:
        raise UsageError("-hff picks a file of one -hf repo, and there are several", hint="use -hf user/repo:QUANT")
    found = find_models(model, models_dir, models_cache or not (model.count or models_dir), tqdm_class=download_tqdm())
    if alias and len(found) != 1:  # one model that sleeps when idle (--sleep-idle-seconds) may have its alias
        raise UsageError("--alias serves one model, and this server has several (router mode)",
                         hint="give one model, or set aliases with `alias = NAME` in --models-preset")
    given = frozenset(name for name in ctx.params
                      if (source := ctx.get_parameter_source(name)) is not None
                      and source.name in ("COMMANDLINE", "ENVIRONMENT"))
    options = RouterOptions(models_max, idle, parallel, kv_unified,
                            load_presets(preset) if preset is not None else None, given)
    models, preload = router_models(found, load, settings, options)
    _add_rpc_servers(load)
    socks = server.listen_for(host, port, settings)
    serve_router(socks, models, preload, settings, options, settings.verbose, load=load, named=model)


def _names(text: str | None) -> tuple[str, ...]:
    """--alias and --tags: comma-separated names, sorted and without repeats (as llama-server keeps them)."""
    return tuple(sorted({name.strip() for name in (text or "").split(",") if name.strip()}))


def _add_rpc_servers(load: LoadSettings) -> None:
    if load.rpc:
        from ..core.model.rpc import add_servers

        add_servers(load.rpc)  # an unreachable server fails now, before the port opens
