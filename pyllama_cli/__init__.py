"""pyllama: llama.cpp's command-line tools, in Python, on llama-cpp-python."""

from .version import __version__

__all__ = ["__version__", "main"]


def main() -> None:
    """The `pyllama` script: the CLI, without the collector's passes over objects that live as long as it.

    Importing typer and the command tree creates tens of thousands of objects that live as long as
    the process and form no garbage, so the collections they trigger only cost time (~2 ms of each
    start). They are frozen (never scanned again) before collection resumes for the command's work.
    When the command ends, what it made is frozen too: the interpreter's shutdown would scan it all
    (numpy, the bindings, the command's objects) only to free what the exit frees anyway, ~10 ms
    after `perplexity`. The shutdown still runs every atexit handler and flushes the streams.
    """
    import gc

    gc.disable()
    from .cli import main as run_cli

    gc.freeze()
    gc.enable()
    try:
        run_cli()
    finally:
        gc.freeze()
