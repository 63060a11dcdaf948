"""The models kept on this machine, and the servers running them.

- `catalog`: every local GGUF, from the Hugging Face cache (huggingface_hub's `scan_cache_dir`) and
  from model folders, as `LocalModel`s (split models as one).
- `download`: a Hub file into the cache, resumed after an interruption; a silent progress reporter
  for the servers' download events.
- `remove`: deleting a model through huggingface_hub's cache API, refusing what a server has loaded.
- `servers`: the registry of running `pyllama serve` processes, and their model listings.

May import: `core.model` (naming a model), `core.paths`, `pyllama_cli.errors`.
"""
