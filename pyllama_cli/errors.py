"""The errors pyllama raises for conditions a user can fix.

Core code raises these with a message and, where there is one, a hint naming the next step.
`cli.main()` is the only place that turns them into output and an exit code.
"""

from __future__ import annotations


class PyllamaError(Exception):
    """A user-fixable failure: shown as one `Error:` line plus an optional hint, exit code 1."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint


class UsageError(PyllamaError):
    """Options that do not fit together (checked after parsing)."""


class ModelNotFound(PyllamaError):
    """A local path or Hugging Face repo/file that does not exist."""


class NoModelGiven(PyllamaError):
    """A command that needs a model was run without -m or -hf."""


class InvalidGGUF(PyllamaError):
    """A file that is not a complete, readable GGUF model."""


class QuantNotFound(PyllamaError):
    """A `repo:quant` tag that matches none of the repo's GGUF files."""


class OfflineMiss(PyllamaError):
    """Offline mode with nothing usable in the local cache."""


class HubError(PyllamaError):
    """The Hugging Face Hub refused or failed a request."""


class ModelLoadError(PyllamaError):
    """llama.cpp could not load a model or create a context for it."""


class ThreadPoolError(PyllamaError):
    """This llama.cpp build lacks the functions that make and attach CPU thread pools."""


class RpcError(PyllamaError):
    """llama.cpp's RPC backend failed: a library built without it, or a server that cannot be reached or is gone."""


class ServerError(PyllamaError):
    """A running `pyllama serve` that cannot be reached, or that refused what `ps`, `stop` or `rm` asked."""


class ModelInUse(PyllamaError):
    """A model `rm` would delete that a running server has loaded."""


class ContextOverflow(PyllamaError):
    """A prompt or conversation that does not fit in the context window."""


class InputError(PyllamaError):
    """Bad user input other than a model: an unreadable file, malformed JSON, an id out of range."""


class Interrupted(PyllamaError):
    """The user stopped an operation (Ctrl-C) at a point where the core had to unwind."""

    exit_code = 130


class ServerShutdown(PyllamaError):
    """A served request was cut short by the server, not finished: it is shutting down (SIGTERM,
    Ctrl-C) or its model is being unloaded. Clients get it in the API's error shape (503, retry later)."""

    def __init__(self, message: str = "the server is shutting down", hint: str | None = "retry the request"):
        super().__init__(message, hint=hint)


class OutputClosed(PyllamaError):
    """The reader of stdout went away (`pyllama tokenize ... | head`): stop quietly, as Unix tools do.

    Exit code 141 is what a shell reports for a tool killed by SIGPIPE, as llama.cpp's are.
    """

    exit_code = 141

    def __init__(self) -> None:
        super().__init__("stdout was closed by its reader")
