"""ollama's REST API over the same engine and router: schemas (request bodies), names (ollama's model
names onto served models), prepare (chat and generate requests as jobs), answers (bodies and NDJSON
streams), routes (generation, embeddings, `add_routes`), models (tags, show, ps, pull, delete, copy).

May import: the rest of `server`, `core`.
"""
