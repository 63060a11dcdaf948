"""Scoring a model as llama-perplexity does: perplexity, KL divergence, HellaSwag, Winogrande.

May import: `core.model`, `core.text`, `core.paths`, `core.interrupt`, `pyllama_cli.errors`.
"""
