"""How much memory a model and its context take: the KV cache check before llama.cpp allocates it
(memory.py) and --fit's choice of a context size that fits (fit.py)."""
