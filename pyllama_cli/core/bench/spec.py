"""What a bench run is made of: llama-bench's parameters and defaults, the sweep, each test and its result."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path

from ..model import settings
from ..model.adapters import AdapterFile

DEFAULT_N_PROMPT = (512,)
DEFAULT_N_GEN = (128,)
DEFAULT_N_DEPTH = (0,)
DEFAULT_N_BATCH = (settings.DEFAULT_N_BATCH,)
DEFAULT_N_UBATCH = (settings.DEFAULT_N_UBATCH,)
DEFAULT_CACHE_TYPE = ("f16",)
DEFAULT_N_GPU_LAYERS = (settings.DEFAULT_N_GPU_LAYERS,)
DEFAULT_NO_KV_OFFLOAD = (False,)
DEFAULT_FLASH_ATTN = ("auto",)
DEFAULT_LOAD_MODE = ("auto",)
DEFAULT_CPU_MASK = ("0x0",)
DEFAULT_CPU_STRICT = (False,)
DEFAULT_POLL = (settings.DEFAULT_POLL,)
DEFAULT_REPETITIONS = 5

# The KV cache types llama-bench accepts, with their ggml type ids.
KV_CACHE_TYPES = {"f16": 1, "bf16": 30, "q8_0": 8, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "iq4_nl": 20}
FLASH_ATTN_TYPES = {"auto": -1, "off": 0, "on": 1}
LOAD_MODES = {"auto": -1, "none": 0, "mmap": 1, "mlock": 2, "mmap+mlock": 3, "dio": 4}


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
    devices: tuple[str, ...] = ()  # -dev (() = llama.cpp's choice, ("none",) = no offload)
    tensor_split: tuple[float, ...] = ()  # -ts
    tensor_overrides: tuple[tuple[str, str], ...] = ()  # -ot: (pattern, buffer type) pairs
    cpu_mask: str = DEFAULT_CPU_MASK[0]  # -C: the test's thread pool runs on these CPUs (0x0 = any)
    cpu_strict: bool = DEFAULT_CPU_STRICT[0]
    poll: int = DEFAULT_POLL[0]
    loras: tuple[AdapterFile, ...] = ()  # --lora/--lora-scaled, on every test's context

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
        return (self.model.path, self.n_gpu_layers, self.load_mode, self.devices, self.tensor_split,
                self.tensor_overrides, self.loras)

    @property
    def lora_text(self) -> str:
        """The adapters as --lora-scaled writes them, FILE:SCALE, comma-separated ("none" without)."""
        return ",".join(f"{a.path.name}:{a.scale:g}" for a in self.loras) or "none"


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
    rpc: tuple[str, ...] = ()  # RPC servers, added once before the run (--rpc)
    devices: tuple[tuple[str, ...], ...] = ((),)  # -dev's configurations (() = llama.cpp's choice)
    tensor_split: tuple[tuple[float, ...], ...] = ((),)  # -ts's configurations (() = by free memory)
    tensor_overrides: tuple[tuple[tuple[str, str], ...], ...] = ((),)  # -ot's configurations (() = none)
    cpu_mask: tuple[str, ...] = DEFAULT_CPU_MASK
    cpu_strict: tuple[bool, ...] = DEFAULT_CPU_STRICT
    poll: tuple[int, ...] = DEFAULT_POLL
    prio: int = 0  # --prio: one priority for the whole run
    loras: tuple[AdapterFile, ...] = ()  # --lora/--lora-scaled: loaded with each model, applied to every test
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
        lists = (self.n_gpu_layers, self.load_mode, self.devices, self.tensor_split, self.tensor_overrides,
                 self.n_batch, self.n_ubatch, self.type_k, self.type_v, self.no_kv_offload, self.flash_attn,
                 self.n_threads, self.cpu_mask, self.cpu_strict, self.n_depth, self.poll)
        return len(self._tests()) * math.prod(map(len, lists))

    def instances(self) -> list[Instance]:
        """Every test to run, in llama-bench's order (model parameters outermost, so reloads are rare)."""
        tests = self._tests()
        out = []
        for m, ngl, lm, dev, ts, ot, nb, nub, tk, tv, nkvo, fa, nt, cm, cs, nd, pl in itertools.product(
                self.models, self.n_gpu_layers, self.load_mode, self.devices, self.tensor_split, self.tensor_overrides,
                self.n_batch, self.n_ubatch, self.type_k, self.type_v, self.no_kv_offload, self.flash_attn,
                self.n_threads, self.cpu_mask, self.cpu_strict, self.n_depth, self.poll):
            out += [Instance(m, p, g, nd, nb, nub, tk, tv, nt, ngl, nkvo, fa, lm, dev, ts, ot, cm, cs, pl, self.loras)
                    for p, g in tests]
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
    bindings: str = ""  # "llama-cpp-python 0.3.36": what runs llama.cpp here

    @property
    def line(self) -> str:
        """The table's last line: llama-bench's "build: COMMIT (NUMBER)", with the bindings when they are known
        (their libllama has no build number)."""
        return f"build: {self.build_commit} ({self.bindings or self.build_number})"
