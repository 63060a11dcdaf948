"""`pyllama completion`: install the shell completion script, or print it."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from ..console import info
from ..core.paths import atomic_write, make_folders, output_target
from ..errors import PyllamaError, UsageError

EXAMPLES = """\
Examples:
  pyllama completion install
  pyllama completion install zsh
  pyllama completion show bash > ~/.local/share/bash-completion/completions/pyllama
"""
INSTALL_EXAMPLES = """\
Examples:
  pyllama completion install          (the shell named by $SHELL)
  pyllama completion install fish
"""
SHOW_EXAMPLES = """\
Examples:
  pyllama completion show bash
  source <(pyllama completion show bash)
  pyllama completion show fish > ~/.config/fish/completions/pyllama.fish
"""

# bash-completion's loader; when present, it loads scripts from the user's completions dir by itself.
BASH_COMPLETION_SCRIPTS = (
    "/usr/share/bash-completion/bash_completion", "/etc/bash_completion",
    "/usr/local/share/bash-completion/bash_completion", "/opt/homebrew/etc/profile.d/bash_completion.sh",
    "/usr/local/etc/profile.d/bash_completion.sh",
)
RC_COMMENT = "# pyllama shell completion"

app = typer.Typer(name="completion", help="Shell completion for pyllama: install it, or print the script.",
                  no_args_is_help=True, epilog=EXAMPLES)


class Shell(str, Enum):
    bash = "bash"
    zsh = "zsh"
    fish = "fish"


@dataclass(frozen=True)
class InstallPlan:
    script: Path
    rc_file: Path | None = None
    rc_lines: tuple[str, ...] = ()  # added to rc_file unless rc_lines[0] is there already


@app.command("install", epilog=INSTALL_EXAMPLES)
def install(
    shell: Annotated[Shell | None, typer.Argument(
        help="The shell (default: the one named by $SHELL).", show_default=False)] = None,
) -> None:
    """Install the completion script for your shell; running it again changes nothing."""
    from ..shell_completion.tree import generate

    name = shell.value if shell else detect_shell()
    plan = install_plan(name)
    _check_targets(plan)
    wrote = _write_if_changed(plan.script, generate(name))
    added = _add_rc_lines(plan.rc_file, plan.rc_lines) if plan.rc_file else False
    if not wrote and not added:
        info(f"{name} completion is already installed ({_tilde(plan.script)}); nothing changed.")
        return
    info(f"{'Wrote' if wrote else 'Up to date:'} {_tilde(plan.script)}")
    if added and plan.rc_file:
        info(f"Added to {_tilde(plan.rc_file)}: " + "; ".join(plan.rc_lines))
    info(f"Open a new {name} to use it.")


@app.command("show", epilog=SHOW_EXAMPLES)
def show(shell: Annotated[Shell, typer.Argument(help="The shell.", show_default=False)]) -> None:
    """Print the completion script for SHELL."""
    from ..shell_completion.tree import generate

    typer.echo(generate(shell.value), nl=False)


def detect_shell() -> str:
    """bash, zsh or fish, from $SHELL."""
    login = os.environ.get("SHELL", "")
    name = Path(login).name
    if name not in {s.value for s in Shell}:
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


def _tilde(path: Path) -> str:
    try:
        return "~/" + path.relative_to(Path.home()).as_posix()
    except ValueError:
        return str(path)


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
