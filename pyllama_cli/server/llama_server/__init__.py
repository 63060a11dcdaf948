"""llama-server's native API: /completion, /infill, /slots (and save/restore), /props, /tokenize,
/detokenize, /apply-template and token counting.

schemas.py holds the request bodies, prepare.py turns them into engine jobs, answers.py shapes the
engine's events into llama-server's bodies and stream chunks; routes.py (`add_routes(app, models)`)
and tokens.py add the routes. (http/header_case.py writes response header names as llama-server
does, for every route.)

May import: the spine (server's top-level modules), `openai`'s public names (its chat messages and
prompt rendering), `core`.
"""
