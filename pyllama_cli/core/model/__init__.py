"""A model on this machine: naming it (`-m`/`-hf` resolution), loading it, and owning it.

- `resolve`: `-m FILE` / `-hf user/repo[:quant]` -> local GGUF file(s) (the only Hugging Face Hub user).
- `settings`: load and context settings with llama.cpp's defaults (no llama_cpp import).
- `native`: the ctypes layer over libllama: `Model`, `Context`, `Batch` (the only llama_cpp user).
- `session`: `open_model()`, the one owner of a loaded model and its context.
- `info`: what a GGUF holds, from its header alone (for `pyllama info`).

May import: `core.gguf`, `core.paths`, `core.interrupt`, `pyllama_cli.errors`.
"""
