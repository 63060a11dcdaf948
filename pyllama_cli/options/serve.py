"""serve's own flags: the server's (address, key, slots) and router mode's (many models)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer

from ..core.serving.pool import DEFAULT_MODELS_MAX
from .llama_env import with_env

SERVER_PANEL = "Server"
ROUTER_PANEL = "Router mode (many models)"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080

HostOpt = Annotated[str, typer.Option("--host", help="Address to listen on (several: comma-separated, as "
                                      "127.0.0.1,::1).", rich_help_panel=SERVER_PANEL)]
PortOpt = Annotated[int, typer.Option(
    "--port", min=0, max=65535, help="Port to listen on (0 = any free port; the URL is printed).",
    rich_help_panel=SERVER_PANEL)]
AliasOpt = Annotated[str | None, typer.Option(
    "-a", "--alias", help="Model id clients use (default: the model file's name without .gguf; router mode: "
    "alias keys in --models-preset).", rich_help_panel=SERVER_PANEL, show_default=False)]
ApiKeyOpt = Annotated[str | None, typer.Option(
    "--api-key", envvar="PYLLAMA_API_KEY", help="Require 'Authorization: Bearer KEY' (all routes but /health).",
    rich_help_panel=SERVER_PANEL, show_default=False)]
CorsOriginOpt = Annotated[list[str] | None, typer.Option(
    "--cors-origin", help="Also allow browser requests from this origin (repeatable; '*' = any origin, as "
    "llama-server does). Loopback origins (localhost, 127.0.0.1, [::1], any port) are always allowed.",
    rich_help_panel=SERVER_PANEL, show_default=False)]
AllowedHostsOpt = Annotated[list[str] | None, typer.Option(
    "--allowed-hosts", help="Host names the server answers to (repeatable or comma-separated; '*' = any). "
    "Default: bound to loopback, only loopback names (localhost, 127.0.0.1, [::1]), against DNS rebinding; "
    "bound elsewhere, any.", rich_help_panel=SERVER_PANEL, show_default=False)]
DocsOpt = Annotated[bool, typer.Option(
    "--docs", help="Serve Swagger UI at /docs (it loads its scripts from a CDN); /openapi.json is always there.",
    rich_help_panel=SERVER_PANEL)]
SlotSavePathOpt = Annotated[Path | None, typer.Option(
    "--slot-save-path", help="Folder for /slots/ID?action=save|restore files (off unless given).",
    rich_help_panel=SERVER_PANEL, show_default=False, file_okay=False, exists=True)]
EmbeddingsOpt = Annotated[bool, typer.Option(
    "--embeddings", help="Serve an embedding model: /v1/embeddings only.", rich_help_panel=SERVER_PANEL)]
MaxBodySizeOpt = Annotated[str, typer.Option(
    "--max-body-size", help="Largest request body accepted (bytes, or with K/M/G; larger gets 413).",
    rich_help_panel=SERVER_PANEL)]
ParallelOpt = Annotated[int, typer.Option(
    "-np", "--parallel", min=1, help="Slots: requests generated at once, batched together (continuous "
    "batching); more wait in a queue. -c is shared: each slot gets c/N tokens unless --kv-unified. Router "
    "mode: per model.", rich_help_panel=SERVER_PANEL)]
KvUnifiedOpt = Annotated[bool, typer.Option(
    "--kv-unified", help="One KV cache for all slots: each may use the whole context while there is room.",
    rich_help_panel=SERVER_PANEL)]
def _reasoning_format(value: str) -> str:
    from ..core.text.reasoning import REASONING_FORMATS

    if value not in REASONING_FORMATS:
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(REASONING_FORMATS)}")
    return value


ReasoningFormatOpt = Annotated[str, typer.Option(
    "--reasoning-format", callback=_reasoning_format, help="Thinking between the template's markers (<think>...</think>): 'deepseek' puts it "
    "in reasoning_content, thinking blocks and reasoning items; 'none' leaves it in the answer's text.",
    rich_help_panel=SERVER_PANEL)]
ReasoningBudgetOpt = Annotated[int, typer.Option(
    "--reasoning-budget", min=-1, help="Thinking tokens before the think block is closed and the answer "
    "follows: -1 = unlimited, 0 = none. Requests' reasoning_effort or thinking.budget_tokens override it.",
    rich_help_panel=SERVER_PANEL)]
MetricsOpt = Annotated[bool, typer.Option(
    "--metrics/--no-metrics", help="Serve /metrics (Prometheus text: pyllama_* series and llama-server's "
    "llamacpp:* ones); off, it answers 501 as llama-server does without --metrics.", rich_help_panel=SERVER_PANEL)]
UiMcpProxyOpt = Annotated[bool, typer.Option(
    "--ui-mcp-proxy/--no-ui-mcp-proxy", help="Experimental, as llama-server's: GET/POST /cors-proxy?url=URL "
    "fetches URL (for a web page's MCP servers). Anyone who can reach the server can then make it fetch any "
    "http(s) URL, the machine's own services included: keep it on loopback.", rich_help_panel=SERVER_PANEL)]
def _tool_names(value: str | None) -> str | None:
    from ..server.tools.catalog import NAMES, unknown  # here: the server's modules load with serve only

    wrong = unknown(tuple(name.strip() for name in (value or "").split(",") if name.strip()))
    if wrong:
        raise typer.BadParameter(f'unknown tool "{wrong[0]}". available tools: {", ".join(NAMES)}')
    return value


ToolsOpt = Annotated[str | None, typer.Option(
    "--tools", callback=_tool_names, help="Experimental, as llama-server's: built-in tools at GET/POST /tools "
    "for a web page's agent, comma-separated or 'all' (read_file, file_glob_search, grep_search, "
    "exec_shell_command, write_file, edit_file, get_info). They read, write and run anything this user may: "
    "answered to loopback clients only, never enable them where others reach the machine.",
    rich_help_panel=SERVER_PANEL, show_default=False)]
TagsOpt = Annotated[str | None, typer.Option(
    "--tags", help="Tags of the model, comma-separated (informational: shown in /v1/models and /props, not "
    "used to route).", rich_help_panel=SERVER_PANEL, show_default=False)]
NoWebuiOpt = Annotated[bool, typer.Option(
    "--no-webui", help="Do not serve the chat page at / (the API is unchanged).", rich_help_panel=SERVER_PANEL)]

ModelsDirOpt = Annotated[list[Path] | None, typer.Option(
    "--models-dir", help="Serve every GGUF in this folder (split models as one); repeatable.",
    rich_help_panel=ROUTER_PANEL, show_default=False, file_okay=False)]
ModelsCacheOpt = Annotated[bool, typer.Option(
    "--models-cache", help="Serve every GGUF in the Hugging Face cache (the default when no model is given).",
    rich_help_panel=ROUTER_PANEL)]
ModelsMaxOpt = Annotated[int, typer.Option(
    "--models-max", min=0, help="Models loaded at once (0 = no limit); the least recently used idle one is "
    "unloaded to make room.", rich_help_panel=ROUTER_PANEL)]
SleepIdleOpt = Annotated[float, typer.Option(
    "--sleep-idle-seconds", help="Unload a model idle this long (-1 = never); a request's keep_alive "
    "overrides it for its model.", rich_help_panel=ROUTER_PANEL)]
ModelsAutoloadOpt = Annotated[bool, typer.Option(
    "--models-autoload/--no-models-autoload", help="Load a model on its first request; off, a request for a "
    "model not loaded gets 400 until POST /models/load loads it.", rich_help_panel=ROUTER_PANEL)]
ModelsPresetOpt = Annotated[Path | None, typer.Option(
    "--models-preset", help="INI file of per-model settings: [MODEL_ID] or [*] sections of flag = value "
    "(c, np, chat-template, alias, temp, ...).", rich_help_panel=ROUTER_PANEL, show_default=False,
    dir_okay=False)]

__all__ = ["DEFAULT_MODELS_MAX"]


# llama-server's LLAMA_ARG_* environment variables for the server flags that have one.
# (-m and -hf get theirs in options/load.py, where they are declared.)
HostOpt, PortOpt, AliasOpt, ParallelOpt, KvUnifiedOpt, EmbeddingsOpt, MetricsOpt, UiMcpProxyOpt, ToolsOpt = (
    with_env(alias) for alias in (HostOpt, PortOpt, AliasOpt, ParallelOpt, KvUnifiedOpt, EmbeddingsOpt, MetricsOpt,
                                  UiMcpProxyOpt, ToolsOpt))

LogFormatOpt = Annotated[str, typer.Option(
    "--log-format", callback=lambda value: _one_of(value, ("text", "json")), help="The access log's form: one "
    "text line per request (method, path, model, status, tokens, time; errors with their reason), or one "
    "JSON object per line for log collectors.", rich_help_panel=SERVER_PANEL)]
QuietOpt = Annotated[bool, typer.Option(
    "-q", "--quiet", help="No access log (the start-up lines and errors that stop the server still show).",
    rich_help_panel=SERVER_PANEL)]
ServeVerboseOpt = Annotated[bool, typer.Option(
    "-v", "--verbose", help="Say more: each request's prompt tokens by part (template, tools, messages) and "
    "uvicorn's log. llama.cpp's own log is --verbose-native.", rich_help_panel=SERVER_PANEL)]
VerboseNativeOpt = Annotated[bool, typer.Option(
    "--verbose-native", help="Show llama.cpp's own log on stderr (what -v shows in the other commands).",
    rich_help_panel=SERVER_PANEL)]

_SIZE = re.compile(r"^\s*(\d+)\s*([kmg]?)(i?b)?\s*$", re.IGNORECASE)


def _one_of(value: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(choices)}")
    return value


def parse_size(text: str, flag: str = "--max-body-size") -> int:
    """Bytes in '8388608', '8M', '8MiB', '512K'... (powers of 1024); `flag` names the option in the error."""
    match = _SIZE.match(text)
    if not match:
        raise typer.BadParameter(f"{text!r} is not a size such as 8388608, 512K or 8MiB", param_hint=f"'{flag}'")
    return int(match.group(1)) * 1024 ** " kmg".index(match.group(2).lower() or " ")
