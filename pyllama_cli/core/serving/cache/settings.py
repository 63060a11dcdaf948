"""The prompt cache's flags (--cache-ram, --cache-idle-slots, --cache-disk, --cache-reuse..., --ctx-checkpoints)
as one value."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_CACHE_RAM_MIB = 8192  # llama-server's default
DEFAULT_DISK_MAX = "10GiB"
DEFAULT_DISK_MIN_TOKENS = 256
NO_LIMIT = -1
DEFAULT_CTX_CHECKPOINTS = 32  # llama-server's --ctx-checkpoints default


@dataclass(frozen=True)
class CacheSettings:
    """How much host memory and disk the prompt cache may hold."""

    ram_mib: int = DEFAULT_CACHE_RAM_MIB  # 0: off; -1: no limit
    idle_slots: bool = True  # with a unified KV cache: save and clear idle slots when a request starts
    disk_dir: Path | None = None  # None: no disk tier
    disk_max_bytes: int = 10 * 1024 ** 3
    disk_min_tokens: int = DEFAULT_DISK_MIN_TOKENS  # shorter prefixes stay in RAM only
    reuse_chunk: int = 0  # --cache-reuse: shortest run of cached tokens shifted into place (0: off)
    template: str | None = None  # --chat-template as given (None: the model's own), part of the key
    ctx_checkpoints: int = DEFAULT_CTX_CHECKPOINTS  # a slot's context checkpoints (SWA, recurrent: checkpoints.py)

    @property
    def ram_bytes(self) -> int | None:
        """The RAM budget in bytes; None: no limit."""
        return None if self.ram_mib < 0 else self.ram_mib * 1024 * 1024

    @property
    def enabled(self) -> bool:
        return self.ram_mib != 0 or self.disk_dir is not None
