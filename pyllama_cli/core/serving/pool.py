"""Many models behind one server: which are loaded, loading on first use, and unloading the idle ones.

An `EnginePool` knows every model it may serve (`PoolModel`: id, files, how to load it) and keeps at
most `max_loaded` of them loaded, each with its own engine (its own slots and batching). A request
`acquire()`s a model and `release()`s it when its answer is complete; between the two the model is
leased and never unloaded, so a request can never lose its model between finding and using it.

* The first request for a model starts its load; others arriving meanwhile wait for that one load.
* Room is made by unloading the least recently used model with no lease (or waiting for one).
* A model idle for its keep-alive (the last request's `keep_alive`, else `idle_seconds`) is unloaded;
  0 unloads it as soon as its last request ends, a negative value keeps it.
* A model that fails to load stays failed (its requests get the error) until `load()` is asked again.
* The pool is `asleep` from the moment an idle unload leaves no model loaded or loading until the next
  load starts (llama-server's sleeping state); `on_sleep` runs just before that unload, the model still
  loaded, so that the server can keep what it showed then (its /metrics text).

Everything here runs on the event loop except the engines' own threads, whose load callbacks come
back through `call_soon_threadsafe`; closing an engine (joining its thread, freeing the model) runs in
a worker thread so the loop keeps serving the other models.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import InputError
from ..model.settings import LoadSettings

if TYPE_CHECKING:  # the engine (and numpy) load with the first model; `serve --help` reads only this module's defaults
    from .engine import Engine
    from .jobs import EngineStats

UNLOADED, LOADING, LOADED, FAILED = "unloaded", "loading", "loaded", "failed"
DEFAULT_MODELS_MAX = 4
IDLE_CHECK_S = 0.25  # how often idle models are looked for
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|h|m|s)")
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}


def parse_keep_alive(value: float | str | None) -> float | None:
    """ollama's `keep_alive`: seconds as a number or a string ("300", "5m", "1h30m", "-1"); None = unset.

    Raises:
        InputError: not a duration.
    """
    if value is None or isinstance(value, (int, float)) and not isinstance(value, bool):
        return None if value is None else float(value)
    text = str(value).strip()
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    if math.isnan(seconds) and body and _DURATION.sub("", body) == "":
        seconds = sign * sum(float(n) * _UNIT_S[unit] for n, unit in _DURATION.findall(body))
    if not math.isnan(seconds):  # "nan" is no duration: it would mean "never unload" without saying so
        return seconds
    raise InputError(f"keep_alive {value!r} is not a duration: give seconds (300, -1) or text such as 5m or 1h30m")


@dataclass
class PoolModel:
    """One model the pool may serve, and where it stands."""

    id: str
    path: Path
    parts: tuple[Path, ...]
    size: int
    load: LoadSettings
    parallel: int = 1
    kv_unified: bool = False
    config: Any = None  # what the layer above keeps per model (the server's settings)
    state: str = UNLOADED
    engine: Engine | None = None
    error: BaseException | None = None
    leases: int = 0
    waiting: int = 0  # requests waiting for its load: once loaded it is theirs, not room for another load
    loads: int = 0  # loads started, for /metrics
    retired: EngineStats | None = None  # the totals of its engines already unloaded (None: none yet)
    last_used: float = field(default_factory=time.monotonic)  # when its last request ended
    keep_alive: float | None = None  # the last request's keep_alive; None = the pool's idle_seconds
    _loading: asyncio.Task[None] | None = None
    _closing: asyncio.Task[None] | None = None
    _room_made: bool = False  # LOADING past _make_room: it counts against max_loaded (before, it waits)

    @property
    def busy(self) -> bool:
        if self.leases > 0 or self.waiting > 0:
            return True
        if self.engine is None or self.state != LOADED:
            return False
        stats = self.engine.stats()
        return stats.processing > 0 or stats.queue_depth > 0

    def idle_seconds(self) -> float:
        return 0.0 if self.busy else max(time.monotonic() - self.last_used, 0.0)


EngineFactory = Callable[..., "Engine"]  # (model, on_ready=..., on_failure=...) -> an engine not started yet
Report = Callable[[str], None]


class EnginePool:
    """The models of a router and their engines; see the module docstring."""

    def __init__(self, models: Iterable[PoolModel], make_engine: EngineFactory, *,
                 max_loaded: int = DEFAULT_MODELS_MAX, idle_seconds: float = -1, report: Report | None = None):
        self.models = {m.id: m for m in models}
        self._make_engine = make_engine
        self.max_loaded = max_loaded  # 0 = no limit
        self.idle_seconds = idle_seconds  # negative = never unload for idleness
        self._report = report or (lambda _: None)
        self._changed: asyncio.Event | None = None
        self._reaper: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.asleep = False  # every model unloaded for idleness (see the module docstring)
        self.on_sleep: Callable[[], None] | None = None

    # ---------------------------------------------------------------- requests

    async def acquire(self, model_id: str, keep_alive: float | None = None) -> PoolModel:
        """The model, loaded and leased to the caller until `release()`.

        Raises:
            the model's load error (a PyllamaError or what llama.cpp raised).
        """
        model = await self._loaded_model(model_id, retry_failed=False)
        model.leases += 1
        model.keep_alive = keep_alive
        return model

    def release(self, model: PoolModel) -> None:
        """A request on `model` ended: it may become idle (and, with keep_alive 0, unload now)."""
        model.leases -= 1
        model.last_used = time.monotonic()
        if model.keep_alive == 0 and model.state == LOADED and not model.busy:
            self._start_unload(model, "keep_alive 0", idle=True)
        self._notify()

    async def load(self, model_id: str) -> PoolModel:
        """Load a model (again, if it failed before) without leasing it; it stays for `idle_seconds`."""
        model = await self._loaded_model(model_id, retry_failed=True)
        model.keep_alive, model.last_used = None, time.monotonic()
        return model

    async def unload(self, model_id: str) -> bool:
        """Unload a loaded model once it is idle; False when it is not loaded."""
        model = self.models[model_id]
        if model.state not in (LOADED, LOADING):
            return False
        while model.state == LOADING or model.busy:
            await self._wait_change()
        if model.state == LOADED:
            self._start_unload(model, "asked to")
        if model._closing is not None:
            await asyncio.shield(model._closing)
        return True

    def add(self, model: PoolModel) -> None:
        """Serve one more model (a router's POST /models), unloaded until its first request."""
        self.models[model.id] = model
        self._notify()

    async def remove(self, model_id: str) -> PoolModel:
        """Unload the model (once its requests end) and forget it; no request can load it afterwards.

        Raises:
            KeyError: no such model (or another call removed it while this one waited).
        """
        model = self.models[model_id]
        # A request arriving while it unloads may load it again: unload until it stays unloaded.
        while model.state in (LOADED, LOADING) or model.leases > 0 or model._closing is not None:
            if not await self.unload(model_id):
                await self._wait_change()
        if self.models.get(model_id) is not model:
            raise KeyError(model_id)  # removed meanwhile, by another call
        del self.models[model_id]
        self._notify()
        return model

    # ---------------------------------------------------------------- life

    def start(self) -> None:
        """Begin watching for idle models (call on the event loop)."""
        self._changed = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._reaper = self._loop.create_task(self._unload_idle())

    def cancel_all(self, reason: BaseException | None = None) -> None:
        for model in self.models.values():
            if model.engine is not None:
                model.engine.cancel_all(reason)

    def close(self) -> None:
        """Stop every engine and free every model (from any thread, once the loop stops serving)."""
        if self._reaper is not None and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._reaper.cancel)
        for model in self.models.values():
            engine, model.engine = model.engine, None
            if engine is not None:
                engine.close()
            model.state = UNLOADED if model.state != FAILED else FAILED

    def loaded(self) -> list[PoolModel]:
        return [m for m in self.models.values() if m.state == LOADED]

    # ---------------------------------------------------------------- loading

    async def _loaded_model(self, model_id: str, *, retry_failed: bool) -> PoolModel:
        model = self.models[model_id]
        while True:
            if self.models.get(model_id) is not model:  # removed while this request waited
                raise LookupError(f"the model {model_id!r} was removed from this server")
            if model._closing is not None:
                await asyncio.shield(model._closing)
            elif model.state == LOADED:
                return model
            elif model.state == LOADING:
                assert model._loading is not None
                model.waiting += 1  # else another load waiting for room could take it before this request
                try:
                    await asyncio.shield(model._loading)
                finally:
                    model.waiting -= 1
            elif model.state == FAILED and not retry_failed:
                assert model.error is not None
                raise model.error.with_traceback(None)  # raised again per request: keep no old frames
            else:
                retry_failed = False  # one new try per call
                # The load is a task of its own: a client that leaves while it waits does not stop it.
                model.state, model.error = LOADING, None
                self.asleep = False  # a load wakes the server
                model._loading = asyncio.get_running_loop().create_task(self._load(model))

    async def _load(self, model: PoolModel) -> None:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[tuple[Engine | None, BaseException | None]] = loop.create_future()

        def settle(engine: Engine | None, error: BaseException | None) -> None:
            if not done.done():
                done.set_result((engine, error))

        started = time.monotonic()
        try:
            await self._make_room(model)
            model._room_made = True
            model.loads += 1
            self._report(f"loading model {model.id!r} ({model.path.name})")
            started = time.monotonic()
            model.engine = self._make_engine(
                model, on_ready=lambda engine: loop.call_soon_threadsafe(settle, engine, None),
                on_failure=lambda exc: loop.call_soon_threadsafe(settle, None, exc))
            model.engine.start()
            engine, error = await done
        except Exception as exc:  # noqa: BLE001 - the model's requests get it; the server goes on
            engine, error = None, exc
        self._finish_load(model, engine, error)
        if model.state == LOADED and model.engine is not None:
            self._report(f"model {model.id!r} loaded in {time.monotonic() - started:.1f} s, "
                         f"context {model.engine.n_ctx} tokens per request, "
                         f"{model.parallel} slot{'s' * (model.parallel > 1)}")

    def _finish_load(self, model: PoolModel, engine: Engine | None, error: BaseException | None) -> None:
        model._room_made = False
        if error is not None or engine is None or not engine.ready:
            model.state, model.error = FAILED, error or RuntimeError("the model did not load")
            failed_engine, model.engine = model.engine, None
            if failed_engine is not None:  # its thread has ended; join it and free what it holds
                asyncio.get_running_loop().run_in_executor(None, failed_engine.close)
            message = getattr(model.error, "message", None) or str(model.error)
            self._report(f"model {model.id!r} failed to load: {message}")
        else:
            model.state = LOADED
            model.last_used = time.monotonic()
        self._notify()

    async def _make_room(self, model: PoolModel) -> None:
        """Unload least recently used idle models until `model` may load too (waiting while all are busy)."""
        while self.max_loaded > 0:
            # Not the loads still waiting here for room: counted, three first requests under a limit of 2
            # each waited for one of the other two to load, and none ever did.
            others = [m for m in self.models.values() if m is not model and (
                m.state == LOADED or (m.state == LOADING and m._room_made) or m._closing is not None)]
            if len(others) < self.max_loaded:
                return
            idle = [m for m in others if m.state == LOADED and not m.busy and m._closing is None]
            if idle:
                victim = min(idle, key=lambda m: m.last_used)
                self._start_unload(victim, f"to make room for {model.id!r} (--models-max {self.max_loaded})")
                assert victim._closing is not None
                await asyncio.shield(victim._closing)
            else:
                await self._wait_change()

    # ---------------------------------------------------------------- unloading

    def _start_unload(self, model: PoolModel, why: str, *, idle: bool = False) -> None:
        """Mark the model unloaded at once (new requests load it again) and free it in a worker thread;
        `idle`: unloaded for idleness, which puts the pool to sleep when no other model is up."""
        falls_asleep = idle and model.engine is not None and model._closing is None and not any(
            m is not model and m.state in (LOADED, LOADING) for m in self.models.values())
        if falls_asleep and self.on_sleep is not None:
            try:
                self.on_sleep()
            except Exception as exc:  # noqa: BLE001 - a failed hook must not stop the unload (or the reaper)
                self._report(f"while falling asleep: {exc}")
        engine, model.engine, model.state = model.engine, None, UNLOADED
        if engine is None or model._closing is not None:
            return
        self.asleep = falls_asleep  # any other unload leaves some model up, or was asked for
        last = engine.stats()  # /metrics' totals outlive the engine
        model.retired = last if model.retired is None else model.retired.plus(last)
        self._report(f"unloading model {model.id!r} ({why})")

        async def close() -> None:
            try:
                await asyncio.get_running_loop().run_in_executor(None, engine.close)
            finally:
                model._closing = None
                self._notify()

        model._closing = asyncio.get_running_loop().create_task(close())

    async def _unload_idle(self) -> None:
        while True:
            await asyncio.sleep(IDLE_CHECK_S)
            for model in self.loaded():
                limit = model.keep_alive if model.keep_alive is not None else self.idle_seconds
                if limit >= 0 and not model.busy and model.idle_seconds() >= limit:
                    self._start_unload(model, f"idle for {limit:g} s", idle=True)

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()

    async def _wait_change(self) -> None:
        """Wait until some model's state or leases change."""
        if self._changed is None:
            self._changed = asyncio.Event()
        self._changed.clear()
        try:  # an engine finishing a cancelled job changes `busy` without a word: look again soon
            await asyncio.wait_for(self._changed.wait(), IDLE_CHECK_S)
        except asyncio.TimeoutError:
            pass


def memory_bytes(engine: Engine) -> int:
    """The model's weights plus an estimate of its KV cache (F16 K and V for every context cell)."""
    from ..model.library import lib

    summary = engine.summary
    if summary is None or engine.session is None:
        return 0
    handle = engine.session.model.handle
    n_head = int(lib.llama_model_n_head(handle)) or 1
    head_dim = int(lib.llama_model_n_embd(handle)) // n_head
    per_token = int(lib.llama_model_n_layer(handle)) * int(lib.llama_model_n_head_kv(handle)) * head_dim * 2 * 2
    return int(summary.size_bytes) + int(engine.session.ctx.n_ctx) * per_token
