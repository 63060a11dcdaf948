"""Running many requests on one loaded model, for `pyllama serve`.

- `jobs`: the jobs the server submits and the event streams it reads back.
- `engine`: the `Engine` interface the HTTP layer talks to.
- `scheduler`: `ParallelEngine`, continuous batching over N slots (generation).
- `slots`: a slot's state, the step's prompt chunks (shortest rest first) and the step padding trial.
- `arrivals`: requests on their way to submit, which a step waits for a moment.
- `embedding_engine`: `EmbeddingEngine`, one input at a time (`--embeddings`).
- `cache/`: the prompt cache across slots (--cache-ram, --cache-disk): routes, RAM and disk tiers.

May import: `core.generate`, `core.text`, `core.model`, `core.interrupt`, `core.paths`, `pyllama_cli.errors`.
"""
