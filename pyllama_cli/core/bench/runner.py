"""Measure prompt processing and generation speed exactly as llama-bench does.

Each test gets a fresh context of n_prompt + n_gen + n_depth tokens and decodes random tokens
(BOS first when the vocab adds one) with llama_decode: prompts in batches of n_batch tokens,
generation one token per decode with a synchronize after each. Only the decode calls are timed;
there is no tokenizer and no sampler. A depth prefill is untimed and its state is reused by the
repetitions that follow. t/s per repetition = tokens / time; the mean and sample standard
deviation over the repetitions are reported.
"""

from __future__ import annotations

import ctypes
import functools
import resource
import sys
import time
from collections.abc import Callable, Iterator

import numpy as np

from ...errors import ModelLoadError
from ..model import library
from ..model.adapters import AdapterSettings, ModelAdapters
from ..model.native import Context, Model, lib
from ..model.placement import TensorOverrides
from ..model.rpc import ModelDevices
from ..model.settings import CpuPlacement, LoadSettings, parse_cpu_mask
from .spec import KV_CACHE_TYPES, LOAD_MODES, BenchResult, BenchSpec, BuildInfo, Instance

_LOG_ERROR = 4  # GGML_LOG_LEVEL_ERROR
_SEED = 1  # random tokens are reproducible from run to run, as C's unseeded rand() is


Progress = Callable[[int, int, str], None]


def run_benchmark(spec: BenchSpec, on_step: Progress | None = None) -> Iterator[BenchResult]:
    """Run every instance of `spec`, yielding one result per test as it finishes.

    A test that fails (its context cannot be created, a decode fails) yields a result with
    `error` set; the others still run.

    Raises:
        ModelLoadError: a model that llama.cpp cannot load.
        Interrupted: Ctrl-C.
    """
    step = on_step or (lambda i, n, what: None)
    instances = spec.instances()
    model: Model | None = None
    model_key = None
    depth_cache: dict[tuple, ctypes.Array] = {}
    try:
        for index, inst in enumerate(instances, 1):
            step(index, len(instances), "starting")
            if model is None or inst.model_key() != model_key:
                if model is not None:
                    model.close()
                    model = None
                model, model_key = load_bench_model(inst, spec.verbose), inst.model_key()
            progress = functools.partial(step, index, len(instances))
            yield measure(model, inst, spec, depth_cache, progress)
    finally:
        if model is not None:
            model.close()


def load_bench_model(inst: Instance, verbose: bool = False) -> Model:
    """Load a model with llama-bench's model parameters (GPU layers and load mode as given)."""
    library.configure_logging(verbose)
    params = lib.llama_model_default_params()
    params.n_gpu_layers = inst.n_gpu_layers
    params.load_mode = LOAD_MODES[inst.load_mode]
    placement = ModelDevices(inst.devices, inst.tensor_split)  # the --rpc servers were added before the run
    placement.apply(params)
    overrides = TensorOverrides(list(inst.tensor_overrides)) if inst.tensor_overrides else None
    if overrides is not None:  # kept referenced until the load returns: it owns the C strings
        overrides.apply(params)
    handle = lib.llama_model_load_from_file(str(inst.model.path).encode(), params)
    if not handle:
        raise ModelLoadError(f"llama.cpp could not load {inst.model.label}",
                             hint="run again with --verbose to see llama.cpp's reason")
    model = Model(handle, inst.model.path)
    if inst.loras:  # loaded once per model; native.Context applies them to each test's context
        try:
            model.adapters = ModelAdapters.load(model, AdapterSettings(loras=inst.loras))
        except BaseException:
            model.close()
            raise
    return model


def measure(model: Model, inst: Instance, spec: BenchSpec, depth_cache: dict[tuple, ctypes.Array],
            progress: Callable[[str], None]) -> BenchResult:
    """Run one test: a fresh context, the warmup, then the timed repetitions."""
    result = BenchResult(inst, model.description, model.size_bytes, model.n_params)
    reasons: list[str] = []
    reset_peak_rss()
    try:
        with library.log_listener(lambda level, text: reasons.append(text) if level == _LOG_ERROR else None), \
                _bench_context(model, inst, spec.prio) as ctx:
            result.test_time = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            _Runner(ctx, inst, spec, depth_cache, progress).run(result)
    except ModelLoadError as exc:  # a context that cannot be made, a failed decode: report it in the row
        reason = reasons[-1].split(": ", 1)[-1].strip() if reasons else ""
        result.error = f"{exc.message}: {reason}" if reason else exc.message
        result.samples_ns, result.ttft_ns = [], []
    result.peak_rss_bytes = peak_rss_bytes()
    return result


def _bench_context(model: Model, inst: Instance, prio: int) -> Context:
    """The test's context, on one thread pool of the test's threads and placement (as llama-bench makes per test)."""
    cpu = CpuPlacement(cpus=tuple(parse_cpu_mask(inst.cpu_mask)), prio=prio, poll=inst.poll, strict=inst.cpu_strict)
    settings = LoadSettings(n_threads=inst.n_threads, n_batch=inst.n_batch, n_ubatch=inst.n_ubatch,
                            flash_attn=inst.flash_attn, cpu=cpu)
    return Context(model, settings, n_ctx=inst.n_prompt + inst.n_gen + inst.n_depth,
                   type_k=KV_CACHE_TYPES[inst.type_k], type_v=KV_CACHE_TYPES[inst.type_v],
                   offload_kqv=not inst.no_kv_offload, op_offload=True, swa_full=False, no_perf=True)


class _Runner:
    """Random-token decoding on one context; buffers are allocated once, outside the timed loops."""

    def __init__(self, ctx: Context, inst: Instance, spec: BenchSpec, depth_cache: dict[tuple, ctypes.Array],
                 progress: Callable[[str], None]):
        self.ctx, self.handle, self.inst, self.spec = ctx, ctx.handle, inst, spec
        self.depth_cache, self.progress = depth_cache, progress
        self.n_vocab = ctx.model.n_vocab
        self.bos = ctx.model.bos if ctx.model.add_bos else None
        self.rng = np.random.default_rng(_SEED)
        self.tokens = np.zeros(max(inst.n_batch, 1), dtype=np.int32)
        self.tokens_ptr = self.tokens.ctypes.data_as(ctypes.POINTER(lib.llama_token))
        self.one = (lib.llama_token * 1)()
        self.one_batch = lib.llama_batch_get_one(self.one, 1)

    def run(self, result: BenchResult) -> None:
        inst, reps = self.inst, self.spec.repetitions
        self._clear()
        if self.spec.warmup:
            if inst.n_prompt > 0:
                self.progress("warmup prompt run")
                self.prompt(inst.n_prompt)
            if inst.n_gen > 0:
                self.progress("warmup generation run")
                self.generate(1)
        for rep in range(1, reps + 1):
            self._clear()
            if inst.n_depth > 0:
                self._depth(rep, reps)
            self._timed_rep(result, rep, reps)

    def _timed_rep(self, result: BenchResult, rep: int, reps: int) -> None:
        inst = self.inst
        if inst.n_prompt > 0:
            self.progress(f"prompt run {rep}/{reps}")
        t0 = time.perf_counter_ns()
        if inst.n_prompt > 0:
            self.prompt(inst.n_prompt)
        t1 = time.perf_counter_ns()
        if self.spec.ttft and inst.n_prompt > 0:
            result.ttft_ns.append(t1 - t0 + self.first_token_ns())
        if inst.n_gen > 0:
            self.progress(f"generation run {rep}/{reps}")
        t2 = time.perf_counter_ns()
        if inst.n_gen > 0:
            self.generate(inst.n_gen)
        t3 = time.perf_counter_ns()
        # The first-token pick for --ttft sits between t1 and t2 and is not part of t/s.
        result.samples_ns.append((t1 - t0) + (t3 - t2))

    def prompt(self, n_prompt: int) -> None:
        """Decode n_prompt random tokens in batches of n_batch, then wait for the backend."""
        n_batch, done = self.inst.n_batch, 0
        while done < n_prompt:
            n = min(n_prompt - done, n_batch)
            self.tokens[:n] = self.rng.integers(0, self.n_vocab, n, dtype=np.int32)
            if done == 0 and self.bos is not None:
                self.tokens[0] = self.bos
            self._check(lib.llama_decode(self.handle, lib.llama_batch_get_one(self.tokens_ptr, n)), "prompt")
            done += n
        lib.llama_synchronize(self.handle)

    def generate(self, n_gen: int) -> None:
        """Decode n_gen tokens one at a time, synchronizing after each, as a generation loop would."""
        tokens = self.rng.integers(0, self.n_vocab, n_gen).tolist()
        if self.bos is not None:
            tokens[0] = self.bos
        one, batch, handle = self.one, self.one_batch, self.handle
        decode, synchronize = lib.llama_decode, lib.llama_synchronize
        for token in tokens:
            one[0] = token
            rc = decode(handle, batch)
            if rc != 0:
                self._check(rc, "generation")
            synchronize(handle)

    def first_token_ns(self) -> int:
        """Time to pick the first generated token (greedy) from the last prompt logits."""
        start = time.perf_counter_ns()
        logits = np.ctypeslib.as_array(lib.llama_get_logits_ith(self.handle, -1), shape=(self.n_vocab,))
        int(logits.argmax())
        return time.perf_counter_ns() - start

    def _depth(self, rep: int, reps: int) -> None:
        """Fill the context to n_depth untimed; later repetitions restore the saved state instead."""
        inst = self.inst
        key = (inst.n_depth, inst.model_key(), inst.type_k, inst.type_v, inst.flash_attn)
        state = self.depth_cache.get(key)
        if state is not None and lib.llama_state_seq_set_data(self.handle, state, len(state), 0) != 0:
            self.progress(f"depth run {rep}/{reps} (cached)")
            return
        self.progress(f"depth run {rep}/{reps}")
        self.prompt(inst.n_depth)
        size = lib.llama_state_seq_get_size(self.handle, 0)
        state = (ctypes.c_uint8 * size)()
        lib.llama_state_seq_get_data(self.handle, state, size, 0)
        self.depth_cache.clear()  # one saved depth at a time, as llama-bench keeps
        self.depth_cache[key] = state

    def _clear(self) -> None:
        lib.llama_memory_clear(self.ctx.memory, False)

    @staticmethod
    def _check(rc: int, what: str) -> None:
        if rc != 0:
            raise ModelLoadError(f"llama_decode failed on a {what} batch (code {rc})")


# ---------------------------------------------------------------- memory


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM) so the next reading covers one test only (Linux)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int | None:
    """Peak resident memory of this process: VmHWM since the last reset, else ru_maxrss."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


# ---------------------------------------------------------------- build and machine


def build_info() -> BuildInfo:
    """llama-bench's build_commit/number, cpu_info, gpu_info and backends, for this libllama."""
    library.configure_logging(False)
    kinds = library.devices()
    cpu = ", ".join(desc for kind, desc in kinds if kind in library.CPU_DEVICE_TYPES)
    gpu = ", ".join(desc for kind, desc in kinds if kind in library.GPU_DEVICE_TYPES)
    regs = library.backend_names()
    backends = [name for name, _ in regs if name != "CPU" and not name.startswith("RPC")]
    # As llama-bench: RPC compiled in is no backend until it has devices (servers added with --rpc).
    if any(name.startswith("RPC") and n_devices > 0 for name, n_devices in regs):
        backends.append("RPC")
    return BuildInfo(library.llama_cpp_commit(), 0, cpu, gpu, ",".join(backends) or "CPU",
                     bindings=f"llama-cpp-python {library.bindings_version()}")

