"""Command-line options shared by several commands, declared once (one name, help and default each).

- `load`: `-m`/`-hf` and the load flags, `ModelRequest`/`LoadSettings` builders, shared aliases
  (`JsonOpt`, `VerboseOpt`, `ChatTemplateOpt`, `SystemPromptOpt`, ...).
- `sampling`: sampling and output-constraint flags of complete, chat and serve.

May import: typer, `core` (settings only), `errors`.
"""
