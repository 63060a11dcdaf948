"""Starting a server of many models: each model's settings (flags, then presets), the pool, uvicorn.

`router_models()` turns the models found (-m, -hf, --models-dir, the Hugging Face cache) and the
presets into the pool's `PoolModel`s; `serve_router()` serves them until a signal stops the server.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from ...console import err, warn
from ...core.generate.sampling import SamplingSettings
from ...core.model.resolve import ModelRequest, ModelRequests, ResolvedModel
from ...core.model.settings import LoadSettings
from ...core.serving.pool import EnginePool, PoolModel
from ...errors import Interrupted, UsageError
from ..settings import ServerSettings
from .changes import Additions
from .presets import CLI_PARAMS, Presets
from .routed import RoutedConfig, Router

_LOAD_FIELDS = {f.name for f in fields(LoadSettings)}
_SAMPLING_FIELDS = {f.name for f in fields(SamplingSettings)}


@dataclass(frozen=True)
class Found:
    """A model file to serve: its id, the file to load, every part, bytes on disk."""

    id: str
    path: Path
    parts: tuple[Path, ...]
    size: int
    source: str = "file"  # file (-m), cache (-hf, the Hugging Face cache), models_dir, preset: DELETE /models


@dataclass(frozen=True)
class RouterOptions:
    models_max: int
    idle_seconds: float
    parallel: int
    kv_unified: bool
    presets: Presets | None = None
    from_command_line: frozenset[str] = frozenset()  # serve's parameters the user gave (they beat presets)


def find_models(named: ModelRequests, folders: list[Path], cache: bool, tqdm_class: Any = None) -> list[Found]:
    """The models named by -m (files, checked only to exist: one that fails to load fails its own
    requests), -hf (resolved and downloaded now), --models-dir folders and the Hugging Face cache.

    Raises:
        ModelNotFound, UsageError: a file that is not there, a repo that cannot be resolved, no model at all.
    """
    from ...core.store.catalog import cached_models, model_stem, models_in_dir
    from ...core.model.resolve import resolve_model
    from ...errors import ModelNotFound
    from ..model_set import file_size

    found = []
    for text in named.paths:
        path = Path(text).expanduser()
        if not path.is_file():
            raise ModelNotFound(f"model file not found: {text}", hint="check the -m path")
        found.append(Found(model_stem(path.name), path, (path,), file_size(path)))
    for repo in named.hf_repos:
        resolved = resolve_model(named.for_repo(repo), tqdm_class=tqdm_class)
        found.append(found_in_cache(model_stem(resolved.path.name), resolved))
    for folder in folders:
        if not folder.is_dir():
            raise UsageError(f"--models-dir {folder} is not a folder")
        found += [Found(m.id, m.path, m.parts, m.size, "models_dir") for m in models_in_dir(folder)]
    if cache:
        found += [Found(m.id, m.path, m.parts, m.size, "cache") for m in cached_models()]
    if not found:
        where = ", ".join(str(f) for f in folders) or "the Hugging Face cache"
        raise UsageError(f"no GGUF models found in {where}",
                         hint="give a model with -m FILE or -hf user/repo, or download one with pyllama pull")
    return found


def router_models(found: list[Found], load: LoadSettings, settings: ServerSettings,
                  options: RouterOptions) -> tuple[list[PoolModel], tuple[str, ...]]:
    """Every model with its own settings, and the ids to load at startup.

    Raises:
        UsageError: two models with one id or alias, or presets that name no model.
    """
    presets = options.presets
    if len(found) == 1 and not presets and settings.aliases:  # one sleeping model (--sleep-idle-seconds) named by --alias
        found = [replace(found[0], id=settings.aliases[0])]
    found = _unique(found + (_preset_models(presets, {f.id for f in found}) if presets else []))
    if presets is not None:
        presets.check_known({f.id for f in found})
    models, preload, names = [], [], {}
    for model in found:
        pool_model = _pool_model(model, load, settings, options)
        for name in (model.id, *pool_model.config.aliases):
            if names.setdefault(name, model.id) != model.id:
                raise UsageError(f"the name {name!r} is taken by two models ({names[name]!r} and {model.id!r})",
                                 hint="give each model its own alias in --models-preset")
        models.append(pool_model)
        # A lone model that sleeps when idle loads at startup, as llama-server's does (it wakes on demand).
        if _settings_of(model.id, options).get("load_on_startup") or (len(found) == 1 and options.idle_seconds >= 0):
            preload.append(model.id)
    return models, tuple(preload)


def found_in_cache(model_id: str, resolved: ResolvedModel) -> Found:
    """A model -hf (or POST /models) downloaded into the Hugging Face cache."""
    return Found(model_id, resolved.path, resolved.parts, sum(p.stat().st_size for p in resolved.parts), "cache")


def _settings_of(model_id: str, options: RouterOptions) -> dict[str, Any]:
    """The model's presets ([*], then its own section), less what the command line set."""
    presets = options.presets
    return {k: v for k, v in (presets.settings_for(model_id) if presets else {}).items()
            if CLI_PARAMS.get(k) not in options.from_command_line}


def _pool_model(model: Found, load: LoadSettings, settings: ServerSettings, options: RouterOptions) -> PoolModel:
    """A model's pool entry: the serve flags with its presets on top."""
    values = _settings_of(model.id, options)
    config = RoutedConfig(_server_settings(model.id, settings, values), tuple(values.get("aliases", ())), model.source)
    return PoolModel(model.id, model.path, model.parts, model.size,
                     load=replace(load, **{k: v for k, v in values.items() if k in _LOAD_FIELDS}),
                     parallel=values.get("parallel", options.parallel), kv_unified=options.kv_unified, config=config)


def _server_settings(model_id: str, settings: ServerSettings, values: dict[str, Any]) -> ServerSettings:
    sampling = replace(settings.sampling, **{k: v for k, v in values.items() if k in _SAMPLING_FIELDS})
    return replace(settings, alias=model_id, sampling=sampling, n_predict=values.get("n_predict", settings.n_predict),
                   chat_template=values.get("chat_template", settings.chat_template),
                   projector=replace(settings.projector, path=values.get("mmproj")))  # each model its own


def _preset_models(presets: Presets, ids: set[str]) -> list[Found]:
    """Models that a preset section brings with `model = PATH` (a served id's section only sets it up)."""
    from ..model_set import file_size

    added = []
    for name, section in presets.models.items():
        path = section.values.get("model")
        if path is None or name in ids:
            continue
        if not path.is_file():
            raise UsageError(f"{presets.path}:{section.line}: [{name}]'s model {str(path)!r} is not a file")
        added.append(Found(name, path, (path,), file_size(path), "preset"))
    return added


def _unique(found: list[Found]) -> list[Found]:
    """One model per id: a second file with a taken id is left out, with a warning."""
    kept: dict[str, Found] = {}
    for model in found:
        if model.id in kept and kept[model.id].path != model.path:
            warn(f"{model.path} is left out: its id {model.id!r} is taken by {kept[model.id].path}")
        kept.setdefault(model.id, model)
    return list(kept.values())


def serve_router(socks: list[socket.socket], models: list[PoolModel], preload: tuple[str, ...],
                 settings: ServerSettings, options: RouterOptions, verbose: bool, *, load: LoadSettings,
                 named: ModelRequests = ModelRequests()) -> None:
    """Serve `models` on `socks` (one per --host address) until SIGTERM or Ctrl-C; they are closed on return.

    Raises:
        Interrupted: stopped by Ctrl-C (exit 130, as other commands).
    """
    import signal

    from ...core.embed.pooling import RANK, has_classification_head
    from ...errors import ServerShutdown
    from .. import run
    from ..app import create_app
    from ..http.memory import fix_mmap_threshold

    def say(message: str) -> None:
        err().print(f"pyllama serve: {message}", markup=False, highlight=False)

    def make_engine(model: PoolModel, **callbacks: Any) -> Any:
        # Speculation applies to every model; a -md draft whose vocabulary is not a model's fails that model's load.
        # A model with a classification head is a reranker: it answers POST /v1/rerank, as `serve --rerank` does.
        rank = has_classification_head(model.path)
        return run.make_engine(model.path, model.load, rank, model.parallel, model.kv_unified, settings.speculative,
                               RANK if rank else -1, prompt_cache=settings.prompt_cache,
                               projector=model.config.settings.projector, **callbacks)

    pool = EnginePool(models, make_engine, max_loaded=options.models_max, idle_seconds=options.idle_seconds,
                      report=say)
    additions = Additions(  # POST /models: a name as -hf takes it, with the server's -hft and --offline
        request=lambda name: ModelRequest(hf_repo=name, hf_token=named.hf_token, offline=named.offline),
        pool_model=lambda name, resolved: _pool_model(found_in_cache(name, resolved), load, settings, options),
        report=say)
    router = Router(pool, preload, additions)
    fix_mmap_threshold()  # before the first request: big request bodies must not grow the heap for good
    server = run.server_class()(run.uvicorn_config(create_app(router, settings), settings.limits, verbose=verbose))
    server.grace = settings.limits.shutdown_grace
    server.on_stop = lambda: router.cancel_all(ServerShutdown())
    server.on_signal = router.changes.events.close  # /models/sse waits for no answer: it ends at once
    address, ids = run.url(socks[0]), ", ".join(m.id for m in models)
    most = f"up to {options.models_max} loaded at once" if options.models_max > 0 else "no limit on loaded models"
    say(f"listening on {', '.join(run.url(s) for s in socks)} - router mode, {len(models)} models: {ids}")
    for sock in socks:
        sock.listen(2048)  # clients that connect from now on wait in the backlog until uvicorn accepts
    say(f"ready at {address}/v1 - router mode, models loaded on first use ({most})")
    run.run_registered(server, socks, address, bool(settings.api_key))
    if server.stop_signal == signal.SIGINT:
        raise Interrupted("pyllama serve: stopped")
    if server.stop_signal is not None:
        say(f"stopped ({signal.Signals(server.stop_signal).name})")

