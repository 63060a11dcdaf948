"""Where each shell looks for pyllama's completion script, and installing one there.

Installing twice changes nothing: the script is rewritten only when it differs, and the rc file
gets its lines only when they are not there yet.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from ..core.paths import atomic_write, make_folders, output_target
from ..errors import PyllamaError, UsageError
from .scripts import SHELLS

# bash-completion's loader; when present, it loads scripts from the user's completions dir by itself.
BASH_COMPLETION_SCRIPTS = (
    "/usr/share/bash-completion/bash_completion", "/etc/bash_completion",
    "/usr/local/share/bash-completion/bash_completion", "/opt/homebrew/etc/profile.d/bash_completion.sh",
    "/usr/local/etc/profile.d/bash_completion.sh",
)
RC_COMMENT = "# pyllama shell completion"


@dataclass(frozen=True)
class InstallPlan:
    script: Path
    rc_file: Path | None = None
    rc_lines: tuple[str, ...] = ()  # added to rc_file unless rc_lines[0] is there already


@dataclass(frozen=True)
class Installed:
    """What installing changed."""

    wrote_script: bool
    added_rc_lines: bool


def detect_shell() -> str:
    """bash, zsh or fish, from $SHELL."""
    login = os.environ.get("SHELL", "")
    name = Path(login).name
    if name not in SHELLS:
        raise UsageError(f"cannot tell which shell to install for from $SHELL ({login or 'unset'})",
                         hint="name it: pyllama completion install bash|zsh|fish")
    return name


def install_plan(shell: str) -> InstallPlan:
    """Where the script goes for `shell` and what, if anything, the rc file needs."""
    home = home_folder()
    if shell == "fish":
        config = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config")
        return InstallPlan(config / "fish" / "completions" / "pyllama.fish")  # fish loads it by itself
    if shell == "zsh":
        rc = Path(os.environ.get("ZDOTDIR") or home) / ".zshrc"
        # fpath must hold the dir before compinit runs, so compinit follows.
        return InstallPlan(home / ".zfunc" / "_pyllama", rc, ("fpath=(~/.zfunc $fpath)", "autoload -Uz compinit && compinit"))
    data = Path(os.environ.get("XDG_DATA_HOME") or home / ".local" / "share")
    user_dir = Path(os.environ["BASH_COMPLETION_USER_DIR"]) if os.environ.get("BASH_COMPLETION_USER_DIR") \
        else data / "bash-completion"
    script = user_dir / "completions" / "pyllama"
    if any(Path(p).is_file() for p in BASH_COMPLETION_SCRIPTS):
        return InstallPlan(script)
    quoted = _shell_path(script)
    return InstallPlan(script, home / ".bashrc", (f"[ -f {quoted} ] && . {quoted}",))


def home_folder() -> Path:
    """$HOME, which must name a folder: with it empty, Python's "~" would be "/".

    Raises:
        UsageError: HOME is unset or empty, or is not a folder.
    """
    home = os.environ.get("HOME", "")
    hint = "set HOME to your home folder, or write the script yourself: pyllama completion show SHELL > FILE"
    if not home:
        raise UsageError("HOME is not set", hint=hint)
    if not os.path.isdir(home):
        state = "does not exist" if not os.path.lexists(home) else "is not a folder"
        raise UsageError(f"HOME is {home}, which {state}", hint=hint)
    return Path(home)


def install(plan: InstallPlan, script: str) -> Installed:
    """Write `script` where `plan` says and add the rc lines; a FIFO, device or folder in the way is
    refused before anything is written."""
    _check_targets(plan)
    wrote = _write_if_changed(plan.script, script)
    added = _add_rc_lines(plan.rc_file, plan.rc_lines) if plan.rc_file else False
    return Installed(wrote, added)


def tilde(path: Path) -> str:
    """`path` for a message: "~/..." when under the home dir."""
    try:
        return "~/" + path.relative_to(Path.home()).as_posix()
    except ValueError:
        return str(path)


def _check_targets(plan: InstallPlan) -> None:
    """Refuse a FIFO, device or folder where a file goes, before writing anything."""
    output_target(plan.script)
    if plan.rc_file is not None:
        output_target(plan.rc_file)


def _shell_path(path: Path) -> str:
    """`path` for a shell line: "$HOME/..." when under the home dir, so the rc file stays portable."""
    try:
        rest = path.relative_to(Path.home()).as_posix()
    except ValueError:
        return shlex.quote(str(path))
    return f'"$HOME/{rest}"' if not any(c in rest for c in '"$`\\') else shlex.quote(str(path))


def _write_if_changed(path: Path, text: str) -> bool:
    """Write `text` to `path` (whole or not at all, through a symlink); False when it already holds exactly that."""
    target = output_target(path)
    try:
        if target.is_file() and target.read_bytes() == text.encode():
            return False
    except OSError as exc:
        raise PyllamaError(f"cannot read {path}: {exc.strerror or exc}", hint="check the file's permissions") from exc
    make_folders(target.parent, path)
    with atomic_write(path) as temp:
        temp.write_text(text, encoding="utf-8")
    return True


def _add_rc_lines(rc: Path, lines: tuple[str, ...]) -> bool:
    """Append `lines` to the rc file unless its first line is there already."""
    try:
        current = rc.read_text(encoding="utf-8") if rc.is_file() else ""
        if lines[0] in (line.strip() for line in current.splitlines()):
            return False
        make_folders(rc.parent, rc)
        sep = "" if not current or current.endswith("\n") else "\n"
        with rc.open("a", encoding="utf-8") as fh:
            fh.write(sep + ("\n" if current else "") + "\n".join((RC_COMMENT, *lines)) + "\n")
    except OSError as exc:
        raise PyllamaError(f"cannot update {rc}: {exc.strerror or exc}",
                           hint="add these lines yourself: " + "; ".join(lines)) from exc
    return True
