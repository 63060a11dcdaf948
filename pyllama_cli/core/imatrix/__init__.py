"""Importance matrices as llama-imatrix makes them, byte for byte.

- `collector`: the evaluation callback that sums squared activations per weight (numpy, in llama.cpp's order).
- `run`: the chunks, batches and context of a collection, with PPL per chunk and saving on Ctrl-C.
- `storage`: the GGUF and legacy .dat files, written whole or not at all, read to combine (--in-file).
- `statistics`: the --show-statistics table.

May import: `core.evaluate`, `core.gguf`, `core.interrupt`, `core.model`, `core.paths`, `pyllama_cli.errors`.
"""
