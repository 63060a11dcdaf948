"""What every request passes through before (and after) a route: the HTTP guards.

- `limits`: uvicorn's httptools protocol with header, URL, head-time, body-time and connection
  limits (431, 414, 408, 503 before the app sees the request).
- `middleware`: the body limit (413) and CORS (loopback origins, --cors-origin).
- `auth`: the API key (Bearer, X-Api-Key), compared in constant time.
- `leases`: a request holds its model from the route until the answer is sent (no unload under it).
- `redact`: no key or token in any log line.
- `memory`: glibc's mmap threshold, so a huge request's memory goes back.
- `header_case`: response header names written as llama-server writes them (for its clients).
"""
