"""Quantizing a GGUF as llama-quantize does.

- `arguments`: llama-quantize's positional arguments and type names.
- `quantizer`: the run: checks, temporary output, progress, `llama_model_quantize`.
- `imatrix`: importance matrices, read into the weights the quantizer takes.

May import: `core.gguf`, `core.model`, `core.paths`, `pyllama_cli.errors`.
"""
