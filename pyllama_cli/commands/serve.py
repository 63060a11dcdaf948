"""`pyllama serve`: an OpenAI-compatible HTTP server for one model."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer

from ..console import download_tqdm, warn
from ..core.model.resolve import ModelRequest, resolve_model
from ..core.model.settings import LoadSettings
from ..core.text.reasoning import FORMAT_DEEPSEEK, REASONING_FORMATS, UNLIMITED
from ..options.load import ChatTemplateOpt, in_panel, model_options
from ..options.sampling import SamplingOptions, sampling_options

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
def serve(
    model: ModelRequest,
    load: LoadSettings,
    sampling: SamplingOptions,
    host: Annotated[str, typer.Option("--host", help="Address to listen on.", rich_help_panel=SERVER_PANEL)]
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
        "--cors-origin", help="Allow browser requests from this origin (repeatable; '*' = any). No CORS headers "
        "unless given.", rich_help_panel=SERVER_PANEL, show_default=False)] = None,
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
    reasoning_format: Annotated[str, typer.Option(
        "--reasoning-format", help="Thinking between the template's markers (<think>...</think>): 'deepseek' puts it "
        "in reasoning_content, thinking blocks and reasoning items; 'none' leaves it in the answer's text.",
        rich_help_panel=SERVER_PANEL)] = FORMAT_DEEPSEEK,
    reasoning_budget: Annotated[int, typer.Option(
        "--reasoning-budget", min=-1, help="Thinking tokens before the think block is closed and the answer "
        "follows: -1 = unlimited, 0 = none. Requests' reasoning_effort or thinking.budget_tokens override it.",
        rich_help_panel=SERVER_PANEL)] = UNLIMITED,
) -> None:
    """Serve a model over an OpenAI-compatible HTTP API: chat, completions, embeddings.

    Official OpenAI clients work with base_url http://HOST:PORT/v1. The server answers /health with
    503 while the model loads and 200 after; /docs has the API's schema. Sampling flags set the
    defaults that requests override; -n sets the default max_tokens (default: the rest of the context).
    """
    from ..server import run as server
    from ..server.settings import ServerSettings

    if reasoning_format not in REASONING_FORMATS:
        raise typer.BadParameter(f"{reasoning_format!r} is not one of {', '.join(REASONING_FORMATS)}",
                                 param_hint="'--reasoning-format'")

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
        max_body_size=parse_size(max_body_size), chat_template=chat_template,
        reasoning_format=reasoning_format, reasoning_budget=reasoning_budget,
    )
    sock = server.listen(host, port)
    if not settings.api_key and not server.is_loopback(sock):
        warn(f"{server.url(sock)} is reachable from other machines and there is no --api-key: anyone who can "
             "reach it can use the model")
    server.serve(sock, resolved.path, load, settings, embeddings=embeddings, parallel=parallel, kv_unified=kv_unified)


def _default_alias(path: Path) -> str:
    return path.stem


def parse_size(text: str) -> int:
    """Bytes in '8388608', '8M', '8MiB', '512K'... (powers of 1024)."""
    match = _SIZE.match(text)
    if not match:
        raise typer.BadParameter(f"{text!r} is not a size such as 8388608, 512K or 8MiB",
                                 param_hint="'--max-body-size'")
    return int(match.group(1)) * 1024 ** " kmg".index(match.group(2).lower() or " ")
