"""Shell completion scripts (bash, zsh, fish) generated from the command tree.

- `tree`: the command tree read from click's public objects into plain data.
- `scripts`: each shell's rendering of it (imports `tree`, never the reverse).
- `install`: where each shell looks for scripts, and installing one there (imports `scripts`).

Nothing here imports `cli` or `commands`: the `pyllama completion` command hands in the command
tree of the app it runs in. May import: `core` (the value lists of the domain, `core.paths`),
`errors`.
"""
