"""OpenAI's Responses API over the same engine: schemas (request bodies), prepare (input items as a chat
job), store (earlier responses for previous_response_id, bounded), answers (a response object or its
SSE events), routes (`add_routes`).

May import: the rest of `server`, `core`.
"""
