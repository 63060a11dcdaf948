"""`pyllama ps` and `stop`: the models a running `pyllama serve` has loaded, and unloading one."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from ..console import human_size, info, warn
from ..core.store.servers import DEFAULT_HOST, DEFAULT_PORT
from ..options.load import JsonOpt
from .models import ApiKeyOpt

PS_EXAMPLES = """\
Examples:
  pyllama ps
  pyllama ps --port 8000 --json
  pyllama ps --url 192.168.1.5:8080
"""
STOP_EXAMPLES = """\
Examples:
  pyllama stop gemma-3-1b-it-Q4_K_M
  pyllama stop tiny --port 8000
"""

HostOpt = Annotated[str, typer.Option("--host", help="The server's address, as serve's --host.")]
PortOpt = Annotated[int, typer.Option("--port", min=1, max=65535, help="The server's port, as serve's --port.")]
UrlOpt = Annotated[str | None, typer.Option(
    "--url", help="The server's URL (http://host:port, or a bare host:port); replaces --host and --port.",
    show_default=False)]
RUNTIME_FIELDS = ("memory_bytes", "n_ctx", "slots_busy", "slots_total", "idle_s")


def ps(host: HostOpt = DEFAULT_HOST, port: PortOpt = DEFAULT_PORT, url: UrlOpt = None, api_key: ApiKeyOpt = None,
       as_json: JsonOpt = False) -> None:
    """Show the models a running server has loaded: memory, context, busy slots, idle time."""
    from ..core.store.servers import has_router_api, model_status, server_models, server_url

    url = server_url(url, host, port)
    served = server_models(url, api_key)
    if not has_router_api(served):
        if as_json:
            typer.echo(json.dumps([_row(card) for card in served], indent=2, ensure_ascii=False))
        ids = ", ".join(card["id"] for card in served)
        info(f"The server at {url} has no router API (llama-server?): it serves {ids or 'no model'}.")
        return
    cards = [c for c in served if model_status(c) in ("loaded", "loading")]
    rows = [_row(card) for card in cards]
    missing = [row["id"] for row in rows if row["status"] == "loaded" and row["memory_bytes"] is None]
    if missing:
        warn(f"the server at {url} does not report 'runtime' (memory, context, slots, idle time) for "
             f"{', '.join(missing)}: it is older than pyllama's router")
    if as_json:
        typer.echo(json.dumps(rows, indent=2, ensure_ascii=False))
    elif not rows:
        info(f"No model is loaded on {url}.")
    else:
        _print_table(rows)


def _row(card: dict[str, Any]) -> dict[str, Any]:
    from ..core.store.servers import model_status

    runtime = card.get("runtime") if isinstance(card.get("runtime"), dict) else {}
    return {"id": card["id"], "status": model_status(card), **{k: runtime.get(k) for k in RUNTIME_FIELDS},
            "path": card.get("path")}


def _print_table(rows: list[dict[str, Any]]) -> None:
    def shown(value: Any, render: Any = str) -> str:
        return "-" if value is None else render(value)

    table = [("NAME", "STATUS", "MEMORY", "CONTEXT", "SLOTS", "IDLE")] + [
        (r["id"], r["status"], shown(r["memory_bytes"], human_size), shown(r["n_ctx"]),
         "-" if r["slots_total"] is None else f"{r['slots_busy']}/{r['slots_total']} busy",
         shown(r["idle_s"], lambda s: f"{s:.0f}s")) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(5)]
    for row in table:
        typer.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[5])


def _served_id(name: str) -> str:
    """The id a server gives a cached `user/repo[:quant]` (its file stem); other names as they are."""
    if "/" not in name:
        return name
    from ..core.store.catalog import cached_models

    repo, _, tag = name.partition(":")
    matches = [m for m in cached_models(repo) if not tag or tag.upper() in (m.quant, m.id.upper())]
    return matches[0].id if len(matches) == 1 else name


def stop(
    model: Annotated[str, typer.Argument(
        help="The model's id on the server (as `pyllama ps` shows it), or a cached user/repo[:quant].",
        show_default=False)],
    host: HostOpt = DEFAULT_HOST,
    port: PortOpt = DEFAULT_PORT,
    url: UrlOpt = None,
    api_key: ApiKeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Unload a model from a running server (it loads again on its next request)."""
    from ..core.store.servers import server_url, unload_model

    url = server_url(url, host, port)
    model = _served_id(model)
    unload_model(url, model, api_key)
    if as_json:
        typer.echo(json.dumps({"model": model, "url": url, "unloaded": True}))
    else:
        info(f"Unloaded {model} from {url}.")
