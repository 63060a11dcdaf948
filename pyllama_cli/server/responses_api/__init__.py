"""OpenAI's Responses API over the same engine: schemas (request bodies), prepare (input items as a chat
job), store (earlier responses for previous_response_id, bounded), answers (a response object or its
SSE events), routes (`add_routes`).

May import: the spine (server's top-level modules), `openai`'s public names (the chat request and
its answer's parts, which this API reshapes), `core`; never another family's private names.
"""
