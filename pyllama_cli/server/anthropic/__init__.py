"""Anthropic's Messages API over the same engine: schemas (request bodies), prepare (a Messages request
as a chat job), answers (a message or its SSE events), routes (`add_routes`).

May import: the rest of `server`, `core`.
"""
