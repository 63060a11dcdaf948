"""GGUF files read by pyllama itself, before llama.cpp sees them.

- `reader`: a defensive reader of the header, metadata and tensor table (no weights).
- `ftypes`: llama.cpp's file types and llama-quantize's type table.
- `vocab_check`: tokenizer metadata that would crash llama.cpp, caught from the header.

May import: `pyllama_cli.errors` only.
"""
