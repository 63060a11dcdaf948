"""ollama's REST API over the same engine and router: schemas (request bodies), names (ollama's model
names onto served models), prepare (chat and generate requests as jobs), answers (bodies and NDJSON
streams), routes (generation, embeddings, `add_routes`), models (tags, show, ps, pull, delete, copy).

May import: the spine (server's top-level modules), `core`, openai/'s public chat path (prepare_chat,
chat_request, streamed_parts: a chat is an OpenAI chat request, reshaped) and webui/'s page (GET / for a
browser).
"""
