"""pyllama's version, in a module of its own so that the CLI reads it without importing the package
that starts the CLI."""

__version__ = "0.1.0"
