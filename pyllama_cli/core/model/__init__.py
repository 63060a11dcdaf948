"""A model on this machine: naming it (`-m`/`-hf` resolution), loading it, and owning it.

- `resolve`: `-m FILE` / `-hf user/repo[:quant]` -> local GGUF file(s) (the only Hugging Face Hub user).
- `settings`: load and context settings with llama.cpp's defaults (no llama_cpp import).
- `library`: llama-cpp-python's bindings (`lib`, the only llama_cpp import), llama.cpp's log, the
  backend, and ggml's device registry.
- `rpc`: llama.cpp's RPC backend: adding `--rpc` servers (with a timeout), `-dev`/`-ts` as model
  parameters, ggml's RPC server, and one error line when a server dies mid-run (GGML_ABORT).
- `native`: the handles over libllama: `Model`, `Context`, `Batch` (re-exports `lib`).
- `threads`: the persistent CPU thread pools a context runs on.
- `memory`: the KV cache types (-ctk/-ctv) and RoPE/YaRN as context parameters, and whether a
  context's KV cache fits in this machine's memory.
- `placement`: `-ot`, `--cpu-moe`, `--n-cpu-moe` as tensor buffer-type overrides; `-sm`, `-mg`.
- `mapped_file`: the memory-mapped model file, checked against truncation.
- `session`: `open_model()`, the one owner of a loaded model and its context.
- `info`: what a GGUF holds, from its header alone (for `pyllama info`).

May import: `core.gguf`, `core.paths`, `core.interrupt`, `pyllama_cli.errors`.
"""
