"""The command table: each command's name, module and function, and the one-line summaries
`pyllama --help` lists without loading any command module (cli.py builds the app from it, and
click_text.py's group lists it)."""

from __future__ import annotations

COMMANDS = [
    ("chat", "chat", "chat"),
    ("complete", "complete", "complete"),
    ("serve", "serve", "serve"),
    ("bench", "bench", "bench"),
    ("perplexity", "perplexity", "perplexity"),
    ("embed", "embedding.embed", "embed"),
    ("tokenize", "tokenize", "tokenize"),
    ("detokenize", "tokenize", "detokenize"),
    ("quantize", "quantize", "quantize"),
    ("imatrix", "quantization.imatrix", "imatrix"),
    ("gguf-split", "quantization.gguf_split", "gguf_split"),
    ("info", "info", "info"),
    ("rpc-server", "rpc_server", "rpc_server"),
    ("list", "models", "list_models"),
    ("ls", "models", "list_models"),
    ("pull", "models", "pull"),
    ("rm", "models", "rm"),
    ("ps", "running", "ps"),
    ("stop", "running", "stop"),
    ("completion", "shell_completion", "app"),
]
COMMAND_NAMES = frozenset(name for name, _, _ in COMMANDS)
# What `pyllama --help` lists, written here so that it needs none of the command modules (a fast
# help); tests check that each is the start of its command's own help.
SUMMARIES = {
    "chat": "Chat with a model using its chat template",
    "complete": "Complete a prompt and stream the generated text to stdout",
    "serve": "Serve a model over an OpenAI-compatible HTTP API",
    "bench": "Measure prompt processing (pp) and generation (tg) speed",
    "perplexity": "Score a model on a text as llama-perplexity does",
    "embed": "Print the embeddings of prompts, as llama-embedding does",
    "tokenize": "Print the tokens a model turns text into",
    "detokenize": "Print the text that token ids stand for",
    "quantize": "Quantize a GGUF model to another type",
    "imatrix": "Compute an importance matrix over a text, as llama.cpp's llama-imatrix does",
    "gguf-split": "Split a GGUF model into parts, or merge the parts, as llama.cpp's llama-gguf-split does",
    "info": "Show what a GGUF model holds",
    "rpc-server": "Run ggml's RPC server",
    "list": "List the GGUF models in the Hugging Face cache and in --models-dir folders",
    "pull": "Download a model from Hugging Face into its cache",
    "rm": "Delete a downloaded model",
    "ps": "Show the models a running server has loaded",
    "stop": "Unload a model from a running server",
    "completion": "Shell completion for pyllama",
}
# Second names, left out of --help and the docs: `ls` is `list`.
HIDDEN_ALIASES = frozenset({"ls"})
# Commands that read the whole command tree from the app they run in (the completion scripts).
NEEDS_EVERY_COMMAND = frozenset({"completion"})
