"""llama.cpp's defaults and bounds for the load flags: plain numbers and names, nothing else.

A module of its own so that declaring flags (options/load.py) and checking a thread count
(quantize) cost no dataclass or library import; `settings` re-exports them beside `LoadSettings`.
"""

DEFAULT_N_CTX = 0  # 0 = the model's trained context length
DEFAULT_N_BATCH = 2048
DEFAULT_N_UBATCH = 512
DEFAULT_N_GPU_LAYERS = -1  # -1 = every layer (when the build supports offload)
DEFAULT_SEED = -1  # -1 = random
FLASH_ATTN_CHOICES = ("auto", "on", "off")
# llama.cpp reads counts (-c, -b, -n, ...) as 32-bit ints and seeds as 32-bit unsigned: bigger values would
# wrap around on the way into the C structs.
INT32_MAX = 2**31 - 1
UINT32_MAX = 2**32 - 1
# ggml's GGML_MAX_N_THREADS: asked for more, ggml aborts, or crashes creating the threads.
MAX_THREADS = 512
DEFAULT_POLL = 50  # ggml's hybrid polling: workers spin a while for the next graph before they sleep
# ggml_sched_priority: --prio's values, as llama.cpp names them.
PRIORITIES = {-1: "low", 0: "normal", 1: "medium", 2: "high", 3: "realtime"}
