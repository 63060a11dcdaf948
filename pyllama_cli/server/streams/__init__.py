"""Streams that survive their client: llama-server's replay buffer (docs/streams.md).

A streamed generation request that carries `X-Conversation-Id` is detached from its connection: its
SSE bytes go into a bounded buffer (buffer.py) that the request and any later reader follow from a
byte offset; sessions.py keeps the sessions by conversation id (bounds, grace, replacement, lookup),
detach.py turns a family's SSE response into a session, and endpoints.py is the HTTP side
(GET /v1/stream, POST /v1/streams/lookup, DELETE /v1/stream). Part of the spine: it imports no API
family and wraps whatever SSE bytes a family's `stream` makes.
"""
