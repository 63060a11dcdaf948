"""Embeddings as llama-embedding computes them: pooling choice and check (pooling.py), the vectors of
token inputs with llama.cpp's normalisations (compute.py), and its output formats (output.py)."""
