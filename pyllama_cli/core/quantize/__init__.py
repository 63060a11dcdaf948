"""Quantizing a GGUF as llama-quantize does.

- `arguments`: llama-quantize's positional arguments and type names, output names, --override-kv.
- `quantizer`: the request, its checks, the parameters and the run of `llama_model_quantize`.
- `staging`: the hidden temporary output, renamed into place only on success.
- `llama_log`: llama.cpp's log during the run: progress per tensor, warnings, the failure reason.
- `imatrix`: importance matrices, read into the weights the quantizer takes.

May import: `core.gguf`, `core.model`, `core.paths`, `pyllama_cli.errors`.
"""
