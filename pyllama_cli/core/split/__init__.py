"""Split GGUF files as llama-gguf-split makes and merges them, byte for byte.

- `plan`: which tensors and metadata go into each part, the part names, the --dry-run table.
- `files`: writing the parts or the merged file (each one whole or not at all), and the checks that
  a merge's parts belong together.

May import: `core.gguf`, `core.paths`, `pyllama_cli.errors`.
"""
