"""Remote media: the bytes of an `http(s)` image or audio URL from a host --media-domains lists.

The server fetches an address a client names, so this is a guard against server-side request forgery
(docs/multimodal.md, "Remote media URLs"):

- only listed hosts, matched by name as the URL writes it (no DNS lookup), each redirect checked
  again before it is followed;
- never more than the request's remaining media bytes: Content-Length is looked at first, and the
  body is counted while it streams in (sent uncompressed: a compressed body is refused, so a small
  download cannot unpack into a large one);
- at most FETCH_TIMEOUT_S to connect, for each read, and for the whole fetch;
- no proxy, .netrc or cookies from the server's environment (httpx's `trust_env=False`).

Fetching blocks, so it runs on a worker thread (spine.off_loop sends every request of a server with
--media-domains there); called on the event loop it refuses with a RuntimeError rather than stall it.
Every failure is an APIError 400 with one line: what went wrong, then what to do.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import time
from dataclasses import dataclass

import httpx

from ...version import __version__
from ..errors import APIError

FETCH_TIMEOUT_S = 10.0  # llama-server's own bound on a media download (each read and write)
MAX_REDIRECTS = 5
DEFAULT_PORTS = {"http": 80, "https": 443}
INLINE_HINT = "send the bytes inline as a data: URL"


@dataclass(frozen=True)
class HostRule:
    """One --media-domains entry: `HOST` (on its scheme's default port), `HOST:PORT`, `*.DOMAIN[:PORT]`
    (any name below DOMAIN, not DOMAIN itself), or an IPv6 address in brackets, `[::1]:8080`."""

    host: str  # normalized by _host_key; for a wildcard the domain after "*."
    port: int | None  # None: the scheme's default port only (80 for http, 443 for https)
    wildcard: bool = False

    def allows(self, host: str, port: int, scheme: str) -> bool:
        name_ok = host.endswith("." + self.host) if self.wildcard else host == self.host
        return name_ok and port == (DEFAULT_PORTS[scheme] if self.port is None else self.port)


_ENTRY = re.compile(r"(\*\.)?(\[[0-9a-f:.]+\]|[^\s/:@\[\]*?#]+)(?::([0-9]{1,5}))?")


def host_rule(entry: str) -> HostRule:
    """Parse one --media-domains entry.

    Raises:
        ValueError: not a host name or IP address, with or without a port.
    """
    found = _ENTRY.fullmatch(entry.strip().lower())
    if found is None or (found.group(3) and not 0 < int(found.group(3)) < 65536):
        raise ValueError(entry)
    wildcard, host, port = found.groups()
    try:
        key = _host_key(httpx.URL(f"http://{host}/").host)
    except httpx.InvalidURL:
        raise ValueError(entry) from None
    if not key or (wildcard and _is_ip(key)):
        raise ValueError(entry)
    return HostRule(key, int(port) if port else None, bool(wildcard))


def _host_key(host: str) -> str:
    """A host as rules compare it: lower case without a trailing dot; an IP address in its short form."""
    host = host.lower().rstrip(".")
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def fetch_media(url: str, param: str, domains: tuple[str, ...], limit: int, flag: str) -> bytes:
    """The body of `url`, following redirects among listed hosts, at most `limit` bytes.

    Raises:
        APIError: 400 for a host off the list, an unreachable host, an answer other than 2xx, a body past
            `limit` (`flag` names the flag that sets it), or a fetch slower than FETCH_TIMEOUT_S.
    """
    rules = [host_rule(d) for d in domains]
    target = _listed(url, param, rules)  # refused before anything is fetched, on any thread
    _off_the_event_loop()
    deadline = time.monotonic() + FETCH_TIMEOUT_S
    headers = {"User-Agent": f"pyllama/{__version__}", "Accept-Encoding": "identity"}
    with httpx.Client(trust_env=False, follow_redirects=False, timeout=FETCH_TIMEOUT_S, headers=headers) as client:
        for _ in range(MAX_REDIRECTS + 1):
            try:
                with client.stream("GET", target) as response:
                    if not response.is_redirect:
                        return _body(response, target, param, limit, flag, deadline)
                    target = _listed(response.headers["location"], param, rules, came_from=target)
            except httpx.TimeoutException:
                raise _slow(param, target) from None
            except (httpx.HTTPError, OSError, ValueError) as exc:  # refused, reset, TLS, a malformed answer
                raise _error(param, f"cannot reach {_where(target)} ({_reason(exc)})",
                             hint=f"check that the host is up, or {INLINE_HINT}") from None
            if time.monotonic() > deadline:
                raise _slow(param, target)
    raise _error(param, f"{_shown(target)} is still a redirect after {MAX_REDIRECTS} of them")


def listed(target: httpx.URL, rules: list[HostRule]) -> bool:
    """Whether one of `rules` allows an http(s) URL's host and port (names compared as written, no lookup)."""
    port = target.port or DEFAULT_PORTS[target.scheme]
    return any(rule.allows(_host_key(target.host), port, target.scheme) for rule in rules)


def _listed(url: str, param: str, rules: list[HostRule], came_from: httpx.URL | None = None) -> httpx.URL:
    """`url` (a redirect's Location, relative to `came_from`) parsed as httpx will fetch it, if its scheme
    is http(s) and --media-domains lists its host and port."""
    try:
        target = httpx.URL(url) if came_from is None else came_from.join(url)
    except (httpx.InvalidURL, ValueError):
        raise _error(param, f"{url!r} is not a valid URL") from None
    scheme = target.scheme
    if scheme not in DEFAULT_PORTS or not target.host:
        what = f"{url!r} has no host" if came_from is None else f"{_shown(came_from)} redirects to {url!r}"
        raise _error(param, f"{what}: only http(s) URLs with a host are fetched")
    if not listed(target, rules):
        place = _where(target)
        what = (f"remote media URLs are refused ({place} is not in --media-domains)" if came_from is None else
                f"{_shown(came_from)} redirects to {place}, which is not in --media-domains")
        raise _error(param, what, hint=f"list {place} in --media-domains, or {INLINE_HINT}")
    return target


def _body(response: httpx.Response, target: httpx.URL, param: str, limit: int, flag: str, deadline: float) -> bytes:
    """The 2xx answer's body, counted as it arrives: past `limit` bytes or the deadline the download stops."""
    if not response.is_success:
        raise _error(param, f"{_shown(target)} answered {response.status_code} {response.reason_phrase}".rstrip(),
                     hint=f"check the URL, or {INLINE_HINT}")
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise _error(param, f"{_shown(target)} sent a {encoding}-compressed body, which is not unpacked",
                     hint=f"serve the file uncompressed, or {INLINE_HINT}")
    too_big = _error(param, f"{_shown(target)} is larger than the {limit} bytes this request may still take "
                     f"({flag})", hint="send a smaller file, or raise the flag")
    length = response.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise too_big
    data = bytearray()
    for chunk in response.iter_raw(65536):
        data += chunk
        if len(data) > limit:
            raise too_big
        if time.monotonic() > deadline:
            raise _slow(param, target)
    return bytes(data)


def _slow(param: str, target: httpx.URL) -> APIError:
    return _error(param, f"{_where(target)} did not send {_shown(target)} within {FETCH_TIMEOUT_S:g} s",
                  hint=f"try a faster host, or {INLINE_HINT}")


def _shown(target: httpx.URL) -> str:
    """The URL without its user:password, as errors show it."""
    return str(target.copy_with(userinfo=b"")) if target.userinfo else str(target)


def _where(target: httpx.URL) -> str:
    """host:port as --media-domains would list it ([::1]:8080 for an IPv6 address)."""
    host = f"[{target.host}]" if ":" in target.host else target.host
    return f"{host}:{target.port or DEFAULT_PORTS.get(target.scheme, 0)}"


def _reason(exc: Exception) -> str:
    """The first line of an error, without its errno ("[Errno 111] Connection refused": "Connection refused")."""
    lines = str(exc).strip().splitlines()
    return re.sub(r"^\[Errno -?\d+\] ", "", lines[0]) if lines else type(exc).__name__


def _error(param: str, what: str, hint: str = INLINE_HINT) -> APIError:
    return APIError(400, f"{param}: {what}; {hint}", param=param, code="invalid_value")


def _off_the_event_loop() -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError("a media URL was fetched on the event loop: prepare the request on a worker thread")
