"""Text in and out of a model: tokens, chat templates, escapes, and JSON that users hand in.

- `tokenizer`: llama-tokenize's ids and output formats.
- `chat_template`: rendering a conversation with the model's template, a built-in, or a Jinja file.
- `escapes`: llama.cpp's `\\n`, `\\t`, `\\xHH` in command-line text.
- `json_text`: reading JSON strictly (no NaN), with one-line errors.
- `reasoning`: a reasoning model's think markers, the splitter that keeps thinking apart, and its token budget.

May import: `core.model`, `pyllama_cli.errors`.
"""
