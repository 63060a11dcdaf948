"""Where pyllama keeps its own files (chat history and the like)."""

from __future__ import annotations

import os
from pathlib import Path


def data_dir() -> Path:
    """pyllama's data folder: $PYLLAMA_HOME, else $XDG_DATA_HOME/pyllama, else ~/.local/share/pyllama.

    Not created here; callers create it when they first write.
    """
    if os.environ.get("PYLLAMA_HOME"):
        return Path(os.environ["PYLLAMA_HOME"]).expanduser()
    if os.environ.get("XDG_DATA_HOME"):
        return Path(os.environ["XDG_DATA_HOME"]).expanduser() / "pyllama"
    return Path("~/.local/share/pyllama").expanduser()
