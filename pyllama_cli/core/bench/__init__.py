"""Speed measurement as llama-bench does it, and its output formats.

- `spec`: llama-bench's parameters and defaults, the sweep of tests (pp, tg, pg, depth), results.
- `params`: bench's flags read into a `BenchSpec` (no llama.cpp import).
- `runner`: running the tests and timing them; the build and machine description.
- `ranges`: llama-bench's multi-valued parameters (`1,2,4`, `1-8+2`).
- `output`: md, csv, json, jsonl and sql (and the md table drawn with rich on a terminal).
- `compare`, `plot`: `--compare BASELINE.json` and `--plot FILE.png`.

May import: `core.model`, `core.paths`, `core.text`, `pyllama_cli.errors`.
"""
