"""Command-line options shared by several commands, declared once (one name, help and default each).

- `load`: `-m`/`-hf` and the load flags, `ModelRequest`/`ModelRequests`/`LoadSettings` builders
  (`model_options`, over `with_flags`, which every group of flags uses), shared aliases (`JsonOpt`,
  `VerboseOpt`, `ChatTemplateOpt`, `SystemPromptOpt`, ...), and what adapts a shared flag to one
  command: `in_panel` (its own help panel), `repeatable` (given several times), and
  `model_options(own=...)` (its own meaning, as perplexity's -c).
- `hardware/`: where the model runs (part of the load flags): `devices` (`--rpc`, `-dev/--device`,
  `-ts/--tensor-split`, `--list-devices`), `cpu` (`-tb`, `-C/-Cr`, `--prio`, `--poll`, `--cpu-strict`
  and their batch variants: how the context's thread pools run), `placement` (-ot/--cpu-moe/--n-cpu-moe/
  -sm/-mg).
- `adapters`: `--lora`, `--lora-scaled`, `--control-vector` and their kin (part of the load flags).
- `embedding`: `--pooling`, `--embd-normalize`, and serve's `--embeddings` and `--rerank`.
- `sampling`: sampling and output-constraint flags of complete, chat and serve.
- `kv_cache`, `context`: llama.cpp's -ctk/-ctv/--swa-full/-kvo, RoPE/YaRN/--keep (part of the load flags).
- `sampler_chain`: DRY, XTC, top-n-sigma, dynatemp, adaptive-p, --samplers/--sampler-seq (with `sampling`).
- `llama_env`: llama.cpp's LLAMA_ARG_* environment variables for the shared flags.
- `speculative`: speculative decoding flags of complete, chat and serve (`--spec-type`, `-md`, ...).
- `limits`: serve's HTTP limits and shutdown grace (builds `server.settings.ServerLimits`), and its prompt
  cache's budgets, --cache-ram and --cache-disk (builds `core.serving.cache.settings.CacheSettings`).

May import: typer, `core` (settings only), `server.settings`, `errors`.
"""
