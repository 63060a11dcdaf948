"""Generating text: sampling, the one token loop, prompt reuse, conversations.

- `sampling`: sampler settings (llama.cpp's names and defaults) and the native sampler chain.
- `sampler_names`: the chain's order as llama.cpp names it (`--samplers`, `--sampler-seq`).
- `decide`: the per-token decision every generator makes (end of generation, grammar end, stop
  string, budget, full context, interrupted) and the prefix reuse of a cached sequence.
- `stats`: what one generation and a run of them measured.
- `generator`: `Generator`, one sequence of a context driven by `decide` (complete, chat).
- `one_shot`: `pyllama complete`'s prompt handling and prompt cache use.
- `prompt_cache`: `--prompt-cache FILE` on disk.
- `conversation`: a chat conversation and the engine that answers it.
- `speculative`: `--spec-type`/`-md`: drafters and the check of a draft in one batch.
- `context_checkpoints`: llama-server's context checkpoints for a memory that cannot be cut anywhere
  (recurrent, hybrid, sliding windows): where prompt batches end, saving and restoring (chat and serve).

May import: `core.constrain`, `core.text`, `core.model`, `core.paths`, `core.interrupt`, `pyllama_cli.errors`.
"""
