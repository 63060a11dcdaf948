"""pyllama: llama.cpp's command-line tools, in Python, on llama-cpp-python."""

__version__ = "0.1.0"
