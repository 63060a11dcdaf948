"""Where pyllama keeps its own files (chat history and the like), and checks on the files it will write.

Every file pyllama writes goes through `atomic_write`: a temporary file next to the real target
that replaces it only once it is complete, so a failure or Ctrl-C never leaves half a file.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import InputError

NOT_REGULAR_HINT = "name a new or regular file"
_NAME_MAX = 255  # bytes in one file name (Linux, macOS)


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
    """Refuse to write `what` at `path` when its folder is missing (no command makes folders unasked),
    or when `path` is there and is not a regular file (see `output_target`).

    Raises:
        InputError: the folder does not exist or is a file; `path` is a FIFO, a device, a folder...
    """
    folder = _follow_link(path.expanduser()).parent
    if not folder.is_dir():
        if folder.exists():
            raise InputError(f"cannot write {what} {path}: {folder} is not a folder", hint="choose another path")
        raise InputError(f"cannot write {what} {path}: the folder {folder} does not exist", hint="create it first")
    output_target(path)


def output_target(path: Path) -> Path:
    """The file that writing `path` replaces: the file a symlink leads to (so the link stays a link),
    else `path` itself. It need not exist yet.

    Raises:
        InputError: it exists and is not a regular file. Replacing a FIFO, a device (/dev/full) or a
            socket would destroy it, and opening one could block or write to hardware.
    """
    path = path.expanduser()
    target = _follow_link(path)
    try:
        mode = target.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        return target  # a new file; a missing folder is reported when it is written
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        raise InputError(f"{path} is not a regular file", hint=NOT_REGULAR_HINT)
    return target


def _follow_link(path: Path) -> Path:
    return Path(os.path.realpath(path)) if path.is_symlink() else path


@contextmanager
def atomic_write(path: Path, what: str = "", suffix: str = ".tmp") -> Iterator[Path]:
    """Write `path` whole or not at all: yields the name of an empty temporary file, in the folder of
    the file `path` leads to, which replaces that file when the block ends without an error.

    The new file gets a plain file's mode (0666 less the umask), or keeps the mode of the file it
    replaces. Any error or interruption removes the temporary file and leaves the old one as it was.

    Args:
        path: the file to write, as the user named it (messages use this name).
        what: what the file is, for messages: "cannot write {what} {path}: ...".
        suffix: the temporary name's ending (matplotlib picks the image format from it).

    Raises:
        InputError: `path` is not a regular file, or the file cannot be written (an OSError raised
            in the block included).
    """
    target = output_target(path)
    failed = f"cannot write {what} {path}" if what else f"cannot write {path}"
    temp = target.with_name(hidden_temp_name(target.name, suffix))
    try:
        # O_EXCL: a name nobody else holds; mode 0666: the kernel applies the umask, as for open().
        os.close(os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    except OSError as exc:
        raise InputError(f"{failed}: {exc.strerror or exc}", hint=_write_hint(exc, target.parent)) from None
    try:
        yield temp
        keep_mode(target, temp)
        os.replace(temp, target)
    except OSError as exc:
        raise InputError(f"{failed}: {exc.strerror or exc}", hint=_write_hint(exc, target.parent)) from None
    finally:
        temp.unlink(missing_ok=True)  # already renamed when all went well


def hidden_temp_name(name: str, suffix: str = ".tmp", room: int = 0) -> str:
    """A hidden, random name for a temporary file that will become `name`: `.NAME.RANDOM{suffix}`.

    NAME is shortened when the whole would pass the 255 bytes a file name may have, so any name that
    can be written can be staged; `room` keeps bytes free for what a caller appends (split part numbers).
    """
    tail = f".{os.urandom(6).hex()}{suffix}"
    budget = _NAME_MAX - 1 - len(tail.encode()) - room
    stem = name.encode()[:budget].decode(errors="ignore")  # never half a UTF-8 character
    return f".{stem}{tail}"


def keep_mode(target: Path, temp: Path) -> None:
    """Give `temp` the permission bits of the file it replaces: a private file stays private."""
    try:
        mode = target.stat().st_mode
    except FileNotFoundError:
        return
    os.chmod(temp, stat.S_IMODE(mode))


def _write_hint(exc: OSError, folder: Path) -> str | None:
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"check that you can write in {folder}, or choose another path"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "free some space, or choose a path on another disk"
    return None


def make_folders(folder: Path, path: Path) -> None:
    """Create `folder` and any missing parents, to write `path` in it.

    Raises:
        InputError: one of those folders is a file (named in the message), or cannot be created.
    """
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        blocker = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
        if blocker is not None:
            raise InputError(f"cannot write {path}: {blocker} is not a folder",
                             hint="move that file out of the way, or choose another path") from None
        raise InputError(f"cannot write {path}: {exc.strerror or exc}", hint=_write_hint(exc, folder)) from None
