"""/docs (Swagger UI) only with --docs: FastAPI's page loads its scripts from a CDN, which a machine
without internet cannot reach and which a CSP of this server's own origin would refuse. The schema
itself stays at /openapi.json."""

from __future__ import annotations

from typing import Any


def docs_urls(enabled: bool) -> dict[str, Any]:
    """FastAPI's keyword arguments for its documentation pages: /docs when `enabled`, never /redoc."""
    return {"docs_url": "/docs" if enabled else None, "redoc_url": None}
