"""Commands over a model's vectors rather than its text: embed (llama-embedding's embeddings)."""
