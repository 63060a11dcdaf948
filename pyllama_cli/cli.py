"""The `pyllama` command: the Typer app, its subcommands, and the one error boundary."""

from __future__ import annotations

import errno
import functools
import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

import typer

from .click_text import PyllamaCommand, PyllamaGroup
from .command_table import COMMAND_NAMES, COMMANDS, HIDDEN_ALIASES, NEEDS_EVERY_COMMAND
from .errors import InputError, Interrupted, OutputClosed, PyllamaError, UsageError

# The command table (command_table.py): command modules import nothing heavy at module level, and
# `run` imports only the module of the command being run.


def build_app(only: str | None = None) -> typer.Typer:
    """The Typer app with every command, or with just `only` (faster start-up for a known command)."""
    application = typer.Typer(
        name="pyllama",
        help="llama.cpp's command-line tools in Python: chat, complete, serve, bench, perplexity, embed, "
        "tokenize, quantize, imatrix, gguf-split, info, rpc-server; list, pull, rm, ps and stop manage local "
        "models.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
        context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120},
        cls=PyllamaGroup,
    )
    application.callback()(_root)
    for name, module_name, attr in COMMANDS:
        if only is not None and name != only:
            continue
        module = importlib.import_module(f"{__package__}.commands.{module_name}")
        target = getattr(module, attr)
        if isinstance(target, typer.Typer):  # a command group (`pyllama completion install|show`)
            application.add_typer(target, name=name)
        else:
            # A module with several commands names each one's examples <ATTR>_EXAMPLES.
            epilog = getattr(module, f"{attr.upper()}_EXAMPLES", None) or getattr(module, "EXAMPLES", None)
            application.command(name, epilog=epilog, hidden=name in HIDDEN_ALIASES,
                                cls=PyllamaCommand)(_closing_quietly(target))
    return application


def _closing_quietly(command: Callable[..., Any]) -> Callable[..., Any]:
    """`command`, with a write to a stdout whose reader went away (`| head`) ending the run quietly.

    Left alone, click reports that case as a plain failure (exit 1), which scripts cannot tell from
    a real error.
    """

    @functools.wraps(command)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except BrokenPipeError:
            if not _stdout_reader_gone():  # some other pipe or socket: a real error
                raise
            raise OutputClosed() from None

    return guarded


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reading end is closed (poll reports an error on it)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll (Windows), or not a real file
        return False


def _show_version(value: bool) -> None:
    # An eager option's callback runs while the options are parsed, before click asks for a command.
    if value:
        from .version import __version__

        typer.echo(f"pyllama {__version__}")
        raise typer.Exit()


def _root(
    version: bool = typer.Option(False, "--version", help="Show pyllama's version and exit.", is_eager=True,
                                 callback=_show_version),
) -> None:
    pass


def __getattr__(name: str) -> typer.Typer:
    # `cli.app` (every command) is built on first use: docs, completion scripts and tests read it.
    if name == "app":
        globals()["app"] = built = build_app()
        return built
    raise AttributeError(name)


def run(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit code; the single place where errors become output."""
    args = sys.argv[1:] if argv is None else list(argv)
    command = args[0] if args and args[0] in COMMAND_NAMES else None
    # No command named (`pyllama --help`, a typo): the help lists SUMMARIES, so no command is loaded.
    only = None if command in NEEDS_EVERY_COMMAND else (command or "")
    try:
        # Not standalone: click's own errors come back here to be shown as ours are, in one line.
        code = build_app(only)(args=args, prog_name="pyllama", standalone_mode=False)
        return code if isinstance(code, int) else 0  # an int is a typer.Exit's code; commands return None
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except typer.Abort:  # end of input at one of click's own prompts
        return 1
    except OutputClosed as exc:
        from .console import silence_stdout

        silence_stdout()
        return exc.exit_code
    except Interrupted as exc:
        _flush_stdout()
        print(f"\n{exc.message}", file=sys.stderr)
        return exc.exit_code
    except PyllamaError as exc:
        if os.environ.get("PYLLAMA_DEBUG"):
            raise
        from .console import print_error

        _flush_stdout()
        print_error(exc.message, exc.hint or _fallback_hint(exc, command))
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except OSError as exc:  # a read or write the command did not expect to fail: a full disk, a closed stream
        if os.environ.get("PYLLAMA_DEBUG"):
            raise
        return _report_os_error(exc)
    except Exception as exc:
        if not _is_click_error(exc):
            raise
        if _is_no_args_help(exc):  # its message is the group's help
            print(exc.format_message())
            return exc.exit_code
        from .click_text import usage_error
        from .console import print_error

        _flush_stdout()
        message, hint = usage_error(exc, args, COMMAND_NAMES)
        print_error(message, hint or _click_hint(exc, command))
        return exc.exit_code
    return 0


# Click's errors are recognised by what they carry, not by class: since 0.26 typer ships click as a
# private sub-package, whose classes cannot be imported safely (it may move in any release).


def _is_click_error(exc: BaseException) -> bool:
    """Whether `exc` is one of click's errors (a ClickException): an int exit code and a message to show."""
    return isinstance(getattr(exc, "exit_code", None), int) and callable(getattr(exc, "format_message", None))


def _is_usage_error(exc: BaseException) -> bool:
    """A click UsageError (a flag, argument or command click could not read), which carries its context."""
    return _is_click_error(exc) and hasattr(exc, "ctx")


def _is_no_args_help(exc: BaseException) -> bool:
    """Click's NoArgsIsHelpError: a group run without a command, whose help typer has already printed."""
    return _is_usage_error(exc) and any(cls.__name__ == "NoArgsIsHelpError" for cls in type(exc).__mro__)


def _click_hint(exc: Any, command: str | None) -> str | None:
    """For a flag or argument click could not read: where the command's options are listed."""
    if not _is_usage_error(exc):
        return None
    ctx = exc.ctx
    if ctx is None:  # click's option parser raises some (a flag missing its value) without one
        return _fallback_hint(UsageError(""), command)
    return f"{ctx.command_path} --help lists the " + ("options" if ctx.parent is not None else "commands")


def _fallback_hint(exc: PyllamaError, command: str | None) -> str:
    """A hint for an error raised without one: what to read for a usage error, where to look otherwise."""
    if isinstance(exc, UsageError):
        return f"pyllama {command} --help lists the options" if command else "pyllama --help lists the commands"
    if isinstance(exc, InputError):
        return "check the file or value named above"
    return "set PYLLAMA_DEBUG=1 for a traceback"


# Errors of a write that reached the device: the data is not all there.
_WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO})


def _report_os_error(exc: OSError) -> int:
    from .console import print_error

    reason = exc.strerror or str(exc)
    if exc.filename:
        message = f"{exc.filename}: {reason}"
    elif exc.errno in _WRITE_ERRNOS:
        message = f"writing the output failed: {reason}"
    else:
        message = reason
    if exc.errno == errno.EBADF:
        hint = "redirect the stream (e.g. to /dev/null) instead of closing it"
    elif exc.errno in (errno.ENOSPC, errno.EDQUOT):
        hint = "free some space, or send the output somewhere else"
    else:
        hint = "set PYLLAMA_DEBUG=1 for a traceback"
    _flush_stdout()
    print_error(message, hint)
    return 1


def _flush_stdout() -> None:
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass


def main() -> None:
    from .console import stand_in_for_closed_streams

    stand_in_for_closed_streams()
    code = run()
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`| head`): quiet exit, as other Unix tools do.
        from .console import silence_stdout

        silence_stdout()
        code = code or OutputClosed.exit_code
    except OSError as exc:  # the last buffered output could not be written (a full disk)
        code = _report_os_error(exc)
    # The interpreter's normal shutdown, which runs every atexit handler (logging's flush, huggingface_hub's,
    # tqdm's). Skipping its teardown with os._exit saved ~4 ms of a 120 ms tiny-model `quantize`, but only
    # a private function of CPython's atexit module could run the handlers first.
    sys.exit(code)

