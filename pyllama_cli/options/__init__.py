"""Command-line options shared by several commands, declared once (one name, help and default each).

- `load`: `-m`/`-hf` and the load flags, `ModelRequest`/`LoadSettings` builders, shared aliases
  (`JsonOpt`, `VerboseOpt`, `ChatTemplateOpt`, `SystemPromptOpt`, ...) and `in_panel`, which shows
  a shared alias in a command's own help panel.
- `sampling`: sampling and output-constraint flags of complete, chat and serve.

May import: typer, `core` (settings only), `errors`.
"""
