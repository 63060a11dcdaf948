"""What output may look like: GBNF grammars, JSON schemas, number ranges, tool calls.

- `grammar`: find (shipped, file, inline), check and build GBNF grammars.
- `grammar_check`: the GBNF syntax checker that mirrors llama.cpp's parser.
- `json_schema`: check a JSON schema and prepare it for the schema-to-GBNF converter.
- `number_ranges`, `schema_splice`: the GBNF pyllama writes where the converter falls short.
- `tools`: tool (function) calls: templates, the forcing grammar, reading calls back.

May import: `core.text`, `core.model`, `pyllama_cli.errors`.
"""
