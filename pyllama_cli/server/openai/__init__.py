"""OpenAI's API: chat completions, completions, embeddings and the model list (routes.py), the chat
path the other families build on.

schemas.py holds the request bodies (and, for /docs, the answers' shapes), prepare.py turns a request
into engine jobs (the chat template, tools, reasoning; job_rules.py does the rest), answers.py runs
them and answers whole or as SSE, bodies.py builds the bodies and chunks, extras.py adds
llama-server's extras on chat (assistant prefill, n choices, timings, progress).

May import: the spine (server's top-level modules), `core`; no other API family.
"""
