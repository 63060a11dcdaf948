"""Speed measurement as llama-bench does it, and its output formats.

- `spec`: llama-bench's parameters and defaults, the sweep of tests (pp, tg, pg, depth), results.
- `runner`: running the tests and timing them; the build and machine description.
- `ranges`: llama-bench's multi-valued parameters (`1,2,4`, `1-8+2`).
- `output`: md, csv, json, jsonl and sql.
- `compare`, `plot`: `--compare BASELINE.json` and `--plot FILE.png`.

May import: `core.model`, `core.paths`, `core.text`, `pyllama_cli.errors`.
"""
