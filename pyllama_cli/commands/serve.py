"""`pyllama serve`: an OpenAI-compatible HTTP server for one model."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer

from ..console import download_tqdm, warn
from ..core.model.resolve import ModelRequest, resolve_model
from ..core.model.settings import LoadSettings
from ..options.limits import limit_options
from ..options.load import ChatTemplateOpt, in_panel, model_options
from ..options.sampling import SamplingOptions, sampling_options
from ..server.settings import ServerLimits

EXAMPLES = """\
Examples:
  pyllama serve -m model.gguf
  pyllama serve -hf ggml-org/gemma-3-1b-it-GGUF --port 8000 --alias gemma
  pyllama serve -m model.gguf --host 0.0.0.0 --api-key "$(cat key.txt)" --cors-origin https://app.example
  pyllama serve -m model.gguf -np 4 -c 16384        # 4 requests at once, 4096 tokens each
  pyllama serve -m embedder.gguf --embeddings
  curl http://127.0.0.1:8080/v1/chat/completions -d '{"messages": [{"role": "user", "content": "Hi"}]}'
"""

SERVER_PANEL = "Server"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
_SIZE = re.compile(r"^\s*(\d+)\s*([kmg]?)(i?b)?\s*$", re.IGNORECASE)


@model_options(load=True)
@sampling_options()
@limit_options()
def serve(
    model: ModelRequest,
    load: LoadSettings,
    sampling: SamplingOptions,
    limits: ServerLimits,
    host: Annotated[str, typer.Option("--host", help="Address to listen on (several: comma-separated, as "
                                      "127.0.0.1,::1).", rich_help_panel=SERVER_PANEL)]
    = DEFAULT_HOST,
    port: Annotated[int, typer.Option(
        "--port", min=0, max=65535, help="Port to listen on (0 = any free port; the URL is printed).",
        rich_help_panel=SERVER_PANEL)] = DEFAULT_PORT,
    alias: Annotated[str | None, typer.Option(
        "-a", "--alias", help="Model id clients use (default: the model file's name without .gguf).",
        rich_help_panel=SERVER_PANEL, show_default=False)] = None,
    api_key: Annotated[str | None, typer.Option(
        "--api-key", envvar="PYLLAMA_API_KEY", help="Require 'Authorization: Bearer KEY' (all routes but /health).",
        rich_help_panel=SERVER_PANEL, show_default=False)] = None,
    cors_origin: Annotated[list[str] | None, typer.Option(
        "--cors-origin", help="Also allow browser requests from this origin (repeatable; '*' = any origin, as "
        "llama-server does). Loopback origins (localhost, 127.0.0.1, [::1], any port) are always allowed.",
        rich_help_panel=SERVER_PANEL, show_default=False)] = None,
    slot_save_path: Annotated[Path | None, typer.Option(
        "--slot-save-path", help="Folder for /slots/ID?action=save|restore files (off unless given).",
        rich_help_panel=SERVER_PANEL, show_default=False, file_okay=False, exists=True)] = None,
    embeddings: Annotated[bool, typer.Option(
        "--embeddings", help="Serve an embedding model: /v1/embeddings only.", rich_help_panel=SERVER_PANEL)] = False,
    max_body_size: Annotated[str, typer.Option(
        "--max-body-size", help="Largest request body accepted (bytes, or with K/M/G; larger gets 413).",
        rich_help_panel=SERVER_PANEL)] = "8MiB",
    chat_template: in_panel(ChatTemplateOpt, SERVER_PANEL) = None,
    parallel: Annotated[int, typer.Option(
        "-np", "--parallel", min=1, help="Slots: requests generated at once, batched together (continuous "
        "batching); more wait in a queue. -c is shared: each slot gets c/N tokens unless --kv-unified.",
        rich_help_panel=SERVER_PANEL)] = 1,
    kv_unified: Annotated[bool, typer.Option(
        "--kv-unified", help="One KV cache for all slots: each may use the whole context while there is room.",
        rich_help_panel=SERVER_PANEL)] = False,
    no_webui: Annotated[bool, typer.Option(
        "--no-webui", help="Do not serve the chat page at / (the API is unchanged).",
        rich_help_panel=SERVER_PANEL)] = False,
) -> None:
    """Serve a model over an OpenAI-compatible HTTP API: chat, completions, embeddings.

    Official OpenAI clients work with base_url http://HOST:PORT/v1. The server answers /health with
    503 while the model loads and 200 after; /docs has the API's schema. Sampling flags set the
    defaults that requests override; -n sets the default max_tokens (default: the rest of the context).

    A browser at http://HOST:PORT/ gets a chat page (--no-webui turns it off).
    """
    from ..server import run as server
    from ..server.settings import ServerSettings

    if chat_template:
        from ..core.text.chat_template import resolve_template

        resolve_template(None, chat_template)  # an unknown name fails before the model loads
    resolved = resolve_model(model, tqdm_class=download_tqdm())
    if load.rpc:
        from ..core.model.rpc import add_servers

        add_servers(load.rpc)  # an unreachable server fails now, before the port opens
    settings = ServerSettings(
        alias=alias or _default_alias(resolved.path), sampling=sampling.settings, n_predict=sampling.n_predict,
        stop=sampling.stop, api_key=api_key or None, cors_origins=tuple(cors_origin or ()),
        max_body_size=parse_size(max_body_size), chat_template=chat_template, webui=not no_webui,
        limits=limits, slot_save_path=slot_save_path.resolve() if slot_save_path else None,
    )
    if "*" in settings.cors_origins:
        warn("--cors-origin '*': any web page a browser opens may call this server with the browser's "
             "credentials and read its answers")
    socks = server.listen_all(host, port)
    for sock in socks:
        if not settings.api_key and not server.is_loopback(sock):
            warn(f"{server.url(sock)} is reachable from other machines and there is no --api-key: anyone who can "
                 "reach it can use the model")
    server.serve(socks, resolved.path, load, settings, embeddings=embeddings, parallel=parallel, kv_unified=kv_unified)


def _default_alias(path: Path) -> str:
    return path.stem


def parse_size(text: str) -> int:
    """Bytes in '8388608', '8M', '8MiB', '512K'... (powers of 1024)."""
    match = _SIZE.match(text)
    if not match:
        raise typer.BadParameter(f"{text!r} is not a size such as 8388608, 512K or 8MiB",
                                 param_hint="'--max-body-size'")
    return int(match.group(1)) * 1024 ** " kmg".index(match.group(2).lower() or " ")
