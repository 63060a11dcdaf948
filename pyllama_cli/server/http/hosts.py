"""The Host header check (--allowed-hosts): a browser page on another site cannot reach a server on
loopback through DNS rebinding, because its requests name that site's host, not a loopback one.

By default a server bound to loopback only answers requests that name a loopback host (localhost,
127.0.0.0/8, ::1); a server bound elsewhere answers any host, as does `--allowed-hosts '*'`.
"""

from __future__ import annotations

import ipaddress

from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import APIError

ANY_HOST = "*"
LOOPBACK_NAMES = ("localhost",)


def _is_loopback(host: str) -> bool:
    name = host.strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def allowed_hosts(bind: str, given: list[str]) -> tuple[str, ...]:
    """What the check lets through: () for any host, else lower-case host names (loopback ones are
    always let through). `bind` is --host (comma-separated addresses), `given` --allowed-hosts."""
    names = tuple(name.strip().lower() for value in given for name in value.split(",") if name.strip())
    if ANY_HOST in names:
        return ()
    if not names and not all(_is_loopback(addr) for addr in bind.split(",") if addr.strip()):
        return ()
    return (*LOOPBACK_NAMES, *names)


def host_name(header: str) -> str:
    """The host of a Host header, without its port (`[::1]:8080` -> `::1`)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    return header.rpartition(":")[0] if header.count(":") == 1 else header


class AllowedHostsMiddleware:
    """403 for a request whose Host names a host the server was not told to answer to."""

    def __init__(self, app: ASGIApp, hosts: tuple[str, ...]):
        self.app = app
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        header = next((v for k, v in scope.get("headers", ()) if k == b"host"), None) \
            if scope["type"] == "http" else None
        host = host_name(header.decode("latin-1")) if header is not None else ""
        if not self.hosts or header is None or host in self.hosts or _is_loopback(host):
            await self.app(scope, receive, send)
            return
        error = APIError(403, f"the host {host!r} is not one this server answers to; start it with "
                         f"--allowed-hosts {host} (or '*') to allow it", code="host_not_allowed")
        await error.response(path=scope["path"])(scope, receive, send)
