"""`pyllama chat`'s REPL: what the user types and what they see.

- `repl`: the loop, slash commands and their settings, over a `core.generate.conversation.ChatEngine`.
- `set_values`: what `/set NAME VALUE` takes: the parameters, their aliases, types and ranges.
- `chain_values`: /set values of the newer samplers that are not numbers (DRY breakers, sampler order).
- `ui`: the front ends: prompt-toolkit with live Markdown on a terminal, plain lines elsewhere.

May import: `core`, `console`, `errors`.
"""
