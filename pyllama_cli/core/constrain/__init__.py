"""What output may look like: GBNF grammars, JSON schemas, number ranges, tool calls.

- `grammar`: find (shipped, file, inline), check and build GBNF grammars.
- `grammar_check`: the GBNF syntax checker that mirrors llama.cpp's parser.
- `json_schema`: prepare a JSON schema for the schema-to-GBNF converter (`prepare_schema`).
- `schema_check`: the checks that refuse a schema no value can match, naming the place.
- `schema_converter`: what the converter makes of a schema node (which branch writes it).
- `number_ranges`, `schema_splice`: the GBNF pyllama writes where the converter falls short.
- `tools`: tool (function) calls: templates, the forcing grammar, reading calls back.

May import: `core.text`, `core.model`, `pyllama_cli.errors`.
"""
