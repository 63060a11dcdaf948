"""llama-bench's test parameters and their defaults.

Free of llama.cpp imports: `pyllama bench --help` reads the defaults from here.
"""

from __future__ import annotations

from ..model import settings

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
DEFAULT_REPETITIONS = 5
