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
import itertools
import math
import resource
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...errors import ModelLoadError, PyllamaError
from ..model import native
from ..model.native import Context, Model, lib
from ..model.settings import LoadSettings
from .params import (  # llama-bench's defaults, where `bench --help` reads them without loading llama.cpp
    DEFAULT_CACHE_TYPE,
    DEFAULT_FLASH_ATTN,
    DEFAULT_LOAD_MODE,
    DEFAULT_N_BATCH,
    DEFAULT_N_DEPTH,
    DEFAULT_N_GEN,
    DEFAULT_N_GPU_LAYERS,
    DEFAULT_N_PROMPT,
    DEFAULT_N_UBATCH,
    DEFAULT_NO_KV_OFFLOAD,
    DEFAULT_REPETITIONS,
)

# The KV cache types llama-bench accepts, with their ggml type ids.
KV_CACHE_TYPES = {"f16": 1, "bf16": 30, "q8_0": 8, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "iq4_nl": 20}
FLASH_ATTN_TYPES = {"auto": -1, "off": 0, "on": 1}
LOAD_MODES = {"auto": -1, "none": 0, "mmap": 1, "mlock": 2, "mmap+mlock": 3, "dio": 4}
_LOG_ERROR = 4  # GGML_LOG_LEVEL_ERROR
_SEED = 1  # random tokens are reproducible from run to run, as C's unseeded rand() is


@dataclass(frozen=True)
class BenchModel:
    """A model to benchmark: `label` is what the user named (llama-bench's model_filename)."""

    label: str
    path: Path


@dataclass(frozen=True)
class Instance:
    """One parameter combination: a single row of the results."""

    model: BenchModel
    n_prompt: int
    n_gen: int
    n_depth: int
    n_batch: int
    n_ubatch: int
    type_k: str
    type_v: str
    n_threads: int
    n_gpu_layers: int
    no_kv_offload: bool
    flash_attn: str
    load_mode: str

    @property
    def test_name(self) -> str:
        """llama-bench's test label: pp512, tg128, pp512+tg128, with ` @ dN` at depth."""
        if self.n_gen == 0:
            name = f"pp{self.n_prompt}"
        elif self.n_prompt == 0:
            name = f"tg{self.n_gen}"
        else:
            name = f"pp{self.n_prompt}+tg{self.n_gen}"
        return name + (f" @ d{self.n_depth}" if self.n_depth > 0 else "")

    def model_key(self) -> tuple:
        """What the loaded model depends on; a change means a reload."""
        return (self.model.path, self.n_gpu_layers, self.load_mode)


# More tests than one bench can run in any reasonable time; the lists of a sweep multiply, so a few
# long ranges would otherwise build millions of tests in memory before the first one runs.
MAX_TESTS = 100_000


@dataclass(frozen=True)
class BenchSpec:
    """The whole sweep: every list is crossed with every other (models outermost)."""

    models: tuple[BenchModel, ...]
    n_threads: tuple[int, ...]
    n_prompt: tuple[int, ...] = DEFAULT_N_PROMPT
    n_gen: tuple[int, ...] = DEFAULT_N_GEN
    n_pg: tuple[tuple[int, int], ...] = ()
    n_depth: tuple[int, ...] = DEFAULT_N_DEPTH
    n_batch: tuple[int, ...] = DEFAULT_N_BATCH
    n_ubatch: tuple[int, ...] = DEFAULT_N_UBATCH
    type_k: tuple[str, ...] = DEFAULT_CACHE_TYPE
    type_v: tuple[str, ...] = DEFAULT_CACHE_TYPE
    n_gpu_layers: tuple[int, ...] = DEFAULT_N_GPU_LAYERS
    no_kv_offload: tuple[bool, ...] = DEFAULT_NO_KV_OFFLOAD
    flash_attn: tuple[str, ...] = DEFAULT_FLASH_ATTN
    load_mode: tuple[str, ...] = DEFAULT_LOAD_MODE
    repetitions: int = DEFAULT_REPETITIONS
    warmup: bool = True
    ttft: bool = False
    verbose: bool = False

    def _tests(self) -> list[tuple[int, int]]:
        """(n_prompt, n_gen) of each test run for every parameter combination."""
        tests = [(p, 0) for p in self.n_prompt if p > 0] + [(0, g) for g in self.n_gen if g > 0]
        return tests + [pg for pg in self.n_pg if pg != (0, 0)]

    def tests_per_model(self) -> int:
        """How many tests `instances` makes for each model, counted without making them."""
        lists = (self.n_gpu_layers, self.load_mode, self.n_batch, self.n_ubatch, self.type_k, self.type_v,
                 self.no_kv_offload, self.flash_attn, self.n_threads, self.n_depth)
        return len(self._tests()) * math.prod(map(len, lists))

    def instances(self) -> list[Instance]:
        """Every test to run, in llama-bench's order (model parameters outermost, so reloads are rare)."""
        tests = self._tests()
        out = []
        for m, ngl, lm, nb, nub, tk, tv, nkvo, fa, nt, nd in itertools.product(
                self.models, self.n_gpu_layers, self.load_mode, self.n_batch, self.n_ubatch, self.type_k,
                self.type_v, self.no_kv_offload, self.flash_attn, self.n_threads, self.n_depth):
            out += [Instance(m, p, g, nd, nb, nub, tk, tv, nt, ngl, nkvo, fa, lm) for p, g in tests]
        return out


@dataclass
class BenchResult:
    """The measurement of one instance; `error` is set (and samples empty) when it failed."""

    instance: Instance
    model_type: str = ""
    model_size: int = 0
    model_n_params: int = 0
    test_time: str = ""
    samples_ns: list[int] = field(default_factory=list)
    ttft_ns: list[int] = field(default_factory=list)
    peak_rss_bytes: int | None = None
    error: str | None = None

    @property
    def samples_ts(self) -> list[float]:
        n_tokens = self.instance.n_prompt + self.instance.n_gen
        return [1e9 * n_tokens / ns for ns in self.samples_ns]

    @property
    def avg_ts(self) -> float:
        return mean(self.samples_ts)

    @property
    def stddev_ts(self) -> float:
        return stdev(self.samples_ts)

    @property
    def avg_ns(self) -> int:
        return mean_int(self.samples_ns)

    @property
    def stddev_ns(self) -> int:
        return stdev_int(self.samples_ns)


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def stdev(values: list[float]) -> float:
    """Sample standard deviation (n-1), 0 for fewer than two values, by llama-bench's formula."""
    n = len(values)
    if n <= 1:
        return 0.0
    m = mean(values)
    var = sum(v * v for v in values) / (n - 1) - m * m * n / (n - 1)
    return math.sqrt(max(var, 0.0))


def mean_int(values: list[int]) -> int:
    return sum(values) // len(values) if values else 0


def stdev_int(values: list[int]) -> int:
    """llama-bench's stddev_ns: the same formula in integer arithmetic, truncated."""
    n = len(values)
    if n <= 1:
        return 0
    m = mean_int(values)
    var = sum(v * v for v in values) // (n - 1) - m * m * n // (n - 1)
    return int(math.sqrt(max(var, 0)))


@dataclass(frozen=True)
class BuildInfo:
    """What llama-bench reports about the build and machine."""

    build_commit: str
    build_number: int
    cpu_info: str
    gpu_info: str
    backends: str


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
    native.configure_logging(verbose)
    params = lib.llama_model_default_params()
    params.n_gpu_layers = inst.n_gpu_layers
    params.load_mode = LOAD_MODES[inst.load_mode]
    handle = lib.llama_model_load_from_file(str(inst.model.path).encode(), params)
    if not handle:
        raise ModelLoadError(f"llama.cpp could not load {inst.model.label}",
                             hint="run again with --verbose to see llama.cpp's reason")
    return Model(handle, inst.model.path)


def measure(model: Model, inst: Instance, spec: BenchSpec, depth_cache: dict[tuple, ctypes.Array],
            progress: Callable[[str], None]) -> BenchResult:
    """Run one test: a fresh context, the warmup, then the timed repetitions."""
    result = BenchResult(inst, model.description, model.size_bytes, model.n_params)
    reasons: list[str] = []
    reset_peak_rss()
    try:
        with native.log_listener(lambda level, text: reasons.append(text) if level == _LOG_ERROR else None), \
                _bench_context(model, inst) as ctx:
            result.test_time = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            _Runner(ctx, inst, spec, depth_cache, progress).run(result)
    except ModelLoadError as exc:  # a context that cannot be made, a failed decode: report it in the row
        reason = reasons[-1].split(": ", 1)[-1].strip() if reasons else ""
        result.error = f"{exc.message}: {reason}" if reason else exc.message
        result.samples_ns, result.ttft_ns = [], []
    result.peak_rss_bytes = peak_rss_bytes()
    return result


def _bench_context(model: Model, inst: Instance) -> Context:
    settings = LoadSettings(n_threads=inst.n_threads, n_batch=inst.n_batch, n_ubatch=inst.n_ubatch,
                            flash_attn=inst.flash_attn)
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
    native.configure_logging(False)
    ggml = _ggml()
    devices = [ggml.ggml_backend_dev_get(i) for i in range(ggml.ggml_backend_dev_count())]
    kinds = [(ggml.ggml_backend_dev_type(d), ggml.ggml_backend_dev_description(d).decode()) for d in devices]
    cpu = ", ".join(desc for kind, desc in kinds if kind in (0, 3))  # CPU, ACCEL
    gpu = ", ".join(desc for kind, desc in kinds if kind in (1, 2))  # GPU, IGPU
    regs = [ggml.ggml_backend_reg_name(ggml.ggml_backend_reg_get(i)).decode()
            for i in range(ggml.ggml_backend_reg_count())]
    backends = [r for r in regs if r != "CPU" and not r.startswith("RPC")]
    if any(r.startswith("RPC") for r in regs):
        backends.append("RPC")
    version = getattr(lib, "__version__", "unknown")
    return BuildInfo(f"llama-cpp-python {version}", 0, cpu, gpu, ",".join(backends) or "CPU")


def _ggml() -> ctypes.CDLL:
    """libggml (already loaded by llama_cpp) with the device-registry calls llama_cpp does not bind."""
    # Beside the libllama actually loaded (LLAMA_CPP_LIB_PATH can point llama_cpp at another build).
    loaded = getattr(getattr(lib, "llama_cpp", None), "_lib", None)
    lib_dir = Path(loaded._name).parent if loaded is not None else Path(lib.__file__).parent / "lib"
    names = sorted(lib_dir.glob("libggml.*")) or sorted(lib_dir.glob("ggml.*"))
    if not names:
        raise PyllamaError(f"libggml not found in {lib_dir}", hint="reinstall llama-cpp-python")
    ggml = ctypes.CDLL(str(names[0]))
    vp, size = ctypes.c_void_p, ctypes.c_size_t
    for name, args, res in (("ggml_backend_dev_count", [], size), ("ggml_backend_dev_get", [size], vp),
                            ("ggml_backend_dev_type", [vp], ctypes.c_int),
                            ("ggml_backend_dev_description", [vp], ctypes.c_char_p),
                            ("ggml_backend_reg_count", [], size), ("ggml_backend_reg_get", [size], vp),
                            ("ggml_backend_reg_name", [vp], ctypes.c_char_p)):
        fn = getattr(ggml, name)
        fn.argtypes, fn.restype = args, res
    return ggml
