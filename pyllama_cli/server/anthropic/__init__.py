"""Anthropic's Messages API over the same engine: schemas (request bodies), prepare (a Messages request
as a chat job), answers (a message or its SSE events), routes (`add_routes`).

May import: the spine (server's top-level modules), `openai`'s public names (the chat request and
its answer's parts, which this API reshapes), `core`; never another family's private names.
"""
