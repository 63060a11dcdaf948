"""Scoring a model as llama-perplexity does: perplexity, KL divergence, HellaSwag, Winogrande.

- `modes`: which evaluation a run asks for and its defaults, settled before a model loads.
- `perplexity`: chunks, their evaluation, and the PPL.
- `kld`: the base log-probs file and the KL divergence against it.
- `multiple_choice`: HellaSwag and Winogrande tasks and their scores.

May import: `core.model`, `core.text`, `core.paths`, `core.interrupt`, `pyllama_cli.errors`.
"""
