"""Where pyllama keeps its own files (chat history and the like), and checks on the files it will write."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import InputError


def data_dir() -> Path:
    """pyllama's data folder: $PYLLAMA_HOME, else $XDG_DATA_HOME/pyllama, else ~/.local/share/pyllama.

    Not created here; callers create it when they first write.
    """
    if os.environ.get("PYLLAMA_HOME"):
        return Path(os.environ["PYLLAMA_HOME"]).expanduser()
    if os.environ.get("XDG_DATA_HOME"):
        return Path(os.environ["XDG_DATA_HOME"]).expanduser() / "pyllama"
    return Path("~/.local/share/pyllama").expanduser()


def require_folder(path: Path, what: str) -> None:
    """Refuse to write `what` at `path` when its folder is missing: no command makes folders unasked.

    Raises:
        InputError: the folder does not exist, or is a file.
    """
    folder = path.expanduser().parent
    if folder.is_dir():
        return
    if folder.exists():
        raise InputError(f"cannot write {what} {path}: {folder} is not a folder", hint="choose another path")
    raise InputError(f"cannot write {what} {path}: the folder {folder} does not exist", hint="create it first")
