"""What a `pyllama perplexity` run asks for, settled before a model loads.

Free of llama.cpp imports: the command's --help reads DEFAULT_CHUNK_CTX from here.
"""

from __future__ import annotations

DEFAULT_CHUNK_CTX = 512  # llama-perplexity's default -c
