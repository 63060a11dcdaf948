"""Shell completion scripts (bash, zsh, fish) generated from the command tree.

- `tree`: the command tree read from click's public objects.
- `scripts`: each shell's rendering of it.
- `install`: where each shell looks for scripts, and installing one there.

May import: `core.paths`, `console`, `errors`.
"""
