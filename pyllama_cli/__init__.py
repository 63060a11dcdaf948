"""pyllama: llama.cpp's command-line tools, in Python, on llama-cpp-python."""

from .version import __version__

__all__ = ["__version__", "main"]


def main() -> None:
    """The `pyllama` script: the CLI, started without the collector's passes over its imports.

    Importing typer and the command tree creates tens of thousands of objects that live as long as
    the process and form no garbage, so the collections they trigger only cost time (~2 ms of each
    start). They are frozen (never scanned again) before collection resumes for the command's work.
    """
    import gc

    gc.disable()
    from .cli import main as run_cli

    gc.freeze()
    gc.enable()
    run_cli()
