"""The quantizer's workflow beside `quantize` (commands/quantize.py): `imatrix` (imatrix.py, llama-imatrix)
and `gguf-split` (gguf_split.py, llama-gguf-split)."""
