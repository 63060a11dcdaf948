"""Memory the server frees goes back to the system: glibc's allocator is told not to keep big blocks.

A 7.9 MiB prompt refused for its length left the server's RSS 65 MiB higher for good (issue 27).
Nothing held it: with `MALLOC_MMAP_THRESHOLD_=1048576` the same request leaves +0.7 MiB. glibc
serves a block over its mmap threshold with its own mapping, returned on free, but it raises that
threshold to the size of each such block freed (up to 32 MiB). After the first big request the
next big temporaries (the body, its text, the token lists) come from the heap instead, whose freed
pages stay in the process, interleaved with small blocks still in use, so even `malloc_trim` gives
back only part of them (it returned 67 of the 115 MiB, leaving +49 MiB). `fix_mmap_threshold()` sets
the threshold once, which also stops it moving: +1.3 MiB kept (benchmarks/memory_big_body.py).
It is 4 MiB, not lower, so that what is allocated per token stays on the heap: llama.cpp's sampler
builds an array of n_vocab candidates (12 bytes each, 3 MiB for a 256k vocabulary) at every token.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number (malloc.h)
MMAP_THRESHOLD = 4 * 1024 * 1024  # blocks this large get their own mapping, returned on free


def fix_mmap_threshold(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold (no-op elsewhere: musl and macOS return big blocks anyway).

    Returns whether it was set.
    """
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt if name else None
    except (OSError, AttributeError):
        return False
    return bool(mallopt is not None and mallopt(M_MMAP_THRESHOLD, threshold) == 1)
