"""Running `pyllama serve` processes: the registry they write, and the client `ps`, `stop` and `rm` use.

Each server writes `<servers dir>/<pid>.json` ({"pid", "url", "api_key_required"}) while it runs,
so `pyllama rm` can ask every running server what it has loaded before deleting a file. A file
whose process is gone (a server killed with SIGKILL) is removed the next time the list is read.
The client speaks the router's HTTP contract: GET /v1/models, POST /models/unload.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import ServerError, UsageError

DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 8080  # serve's
DEFAULT_URL = f"http://{DEFAULT_HOST}:{DEFAULT_PORT}"
TIMEOUT_S = 10
UNLOAD_TIMEOUT_S = 120  # an unload waits for the model's running requests to finish


@dataclass(frozen=True)
class RunningServer:
    pid: int
    url: str
    api_key_required: bool


def servers_dir() -> Path:
    """$PYLLAMA_HOME/servers, else $XDG_CACHE_HOME/pyllama/servers, else ~/.cache/pyllama/servers."""
    if os.environ.get("PYLLAMA_HOME"):
        return Path(os.environ["PYLLAMA_HOME"]).expanduser() / "servers"
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "pyllama" / "servers"


@contextmanager
def register_server(url: str, *, api_key_required: bool = False) -> Iterator[None]:
    """Announce a running server at `url` for as long as the block runs."""
    folder = servers_dir()
    entry = folder / f"{os.getpid()}.json"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        temporary = entry.with_suffix(".tmp")
        temporary.write_text(json.dumps({"pid": os.getpid(), "url": url, "api_key_required": api_key_required}))
        temporary.replace(entry)  # readers never see half a file
    except OSError:
        entry = None  # a read-only home: the server still runs; only `rm`'s check cannot see it
    try:
        yield
    finally:
        if entry is not None:
            with suppress(OSError):
                entry.unlink()


def running_servers() -> list[RunningServer]:
    """The servers whose process is alive, by pid; stale entries are removed."""
    found = []
    for entry in sorted(servers_dir().glob("*.json")):
        try:
            data = json.loads(entry.read_text())
            server = RunningServer(int(data["pid"]), str(data["url"]), bool(data.get("api_key_required")))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # being written, or not ours: leave it
        if _alive(server.pid):
            found.append(server)
        else:
            with suppress(OSError):
                entry.unlink()
    return sorted(found, key=lambda s: s.pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def server_url(url: str | None, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> str:
    """The server's base URL from --url (a bare host:port taken as http://), else from --host and --port."""
    if url is None:
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    return url if "://" in url else f"http://{url}"


def has_router_api(cards: list[dict[str, Any]]) -> bool:
    """Whether a /v1/models answer comes from a router (pyllama serve, llama-server --models-dir): its
    cards carry a status; a plain llama-server's do not."""
    return all("status" in card for card in cards)


def no_router_api(url: str) -> ServerError:
    return ServerError(f"the server at {url} has no router API (llama-server, or a server that is not "
                       "pyllama's): it serves one model and cannot unload it",
                       hint="stop that server instead (Ctrl-C, or SIGTERM to its process)")


def server_models(url: str, api_key: str | None = None) -> list[dict[str, Any]]:
    """The `data` list of the server's GET /v1/models.

    Raises:
        ServerError: nothing answers at `url`, it wants an API key, or it is not a pyllama server.
    """
    body = _request(url, "GET", "/v1/models", None, api_key, TIMEOUT_S)
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list) or not all(isinstance(m, dict) and "id" in m for m in data):
        raise ServerError(f"{url} did not answer /v1/models with a model list",
                          hint="is it a pyllama serve (or llama-server) address?")
    return data


def unload_model(url: str, model: str, api_key: str | None = None) -> None:
    """POST /models/unload for `model`; returns once the server has unloaded it."""
    _request(url, "POST", "/models/unload", {"model": model}, api_key, UNLOAD_TIMEOUT_S)


def model_status(card: dict[str, Any]) -> str:
    """A model card's status value; a server without router status serves its one model, loaded."""
    status = card.get("status")
    if status is None:
        return "loaded"
    return str(status.get("value", "unknown")) if isinstance(status, dict) else str(status)


def _request(url: str, method: str, route: str, payload: Any, api_key: str | None, timeout: float) -> Any:
    import urllib.error
    import urllib.request

    base = url.rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise UsageError(f"--url {url!r} is not an http:// or https:// address",
                         hint=f"e.g. --url {DEFAULT_URL}, or --url {DEFAULT_HOST}:{DEFAULT_PORT}")
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    data = json.dumps(payload).encode() if payload is not None else None
    request = urllib.request.Request(base + route, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - the user's own URL
            return _json(response.read(), url)
    except urllib.error.HTTPError as exc:
        raise _http_error(url, route, exc.code, _json(exc.read(), url, strict=False)) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ServerError(f"no server answers at {url} ({getattr(reason, 'strerror', None) or reason})",
                          hint="start one with `pyllama serve`, or give its address with --host/--port "
                               "or --url") from None


def _json(raw: bytes, url: str, *, strict: bool = True) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        if not strict:
            return {}
        raise ServerError(f"{url} did not answer with JSON", hint="is it a pyllama serve address?") from None


def _http_error(url: str, route: str, status: int, body: Any) -> ServerError:
    error = body.get("error") if isinstance(body, dict) else None
    error = error if isinstance(error, dict) else {"message": str(error or "")}
    message, code = str(error.get("message") or f"HTTP {status}"), error.get("code")
    if status == 401:
        return ServerError(f"the server at {url} needs an API key",
                           hint="give it with --api-key KEY or PYLLAMA_API_KEY")
    if code in ("not_router", "not_found"):  # a one-model server: by the contract, or one older than it
        return ServerError(f"the server at {url} serves one model and cannot unload it",
                           hint="stop that server instead (Ctrl-C, or SIGTERM to its process)")
    if status in (404, 405) and route.startswith("/models/") and code != "model_not_found":
        return no_router_api(url)  # llama-server's "File Not Found": the route is not there at all
    return ServerError(f"the server at {url} answered {status}: {message}")
