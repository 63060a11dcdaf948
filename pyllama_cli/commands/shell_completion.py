"""`pyllama completion`: install the shell completion script, or print it."""

from __future__ import annotations

from enum import Enum
from typing import Annotated

import typer

from ..click_text import PyllamaCommand, PyllamaGroup
from ..console import info

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

app = typer.Typer(name="completion", help="Shell completion for pyllama: install it, or print the script.",
                  no_args_is_help=True, epilog=EXAMPLES, rich_markup_mode=None, cls=PyllamaGroup)


class Shell(str, Enum):
    bash = "bash"
    zsh = "zsh"
    fish = "fish"


@app.command("install", epilog=INSTALL_EXAMPLES, cls=PyllamaCommand)
def install(
    ctx: typer.Context,
    shell: Annotated[Shell | None, typer.Argument(
        help="The shell (default: the one named by $SHELL).", show_default=False)] = None,
) -> None:
    """Install the completion script for your shell; running it again changes nothing."""
    from ..shell_completion import install as installing

    name = shell.value if shell else installing.detect_shell()
    plan = installing.install_plan(name)
    done = installing.install(plan, _script(ctx, name))
    if not done.wrote_script and not done.added_rc_lines:
        info(f"{name} completion is already installed ({installing.tilde(plan.script)}); nothing changed.")
        return
    info(f"{'Wrote' if done.wrote_script else 'Up to date:'} {installing.tilde(plan.script)}")
    if done.added_rc_lines and plan.rc_file:
        info(f"Added to {installing.tilde(plan.rc_file)}: " + "; ".join(plan.rc_lines))
    info(f"Open a new {name} to use it.")


@app.command("show", epilog=SHOW_EXAMPLES, cls=PyllamaCommand)
def show(ctx: typer.Context, shell: Annotated[Shell, typer.Argument(help="The shell.", show_default=False)]) -> None:
    """Print the completion script for SHELL."""
    typer.echo(_script(ctx, shell.value), nl=False)


def _script(ctx: typer.Context, shell: str) -> str:
    """The completion script for `shell`, from the tree of the CLI this command runs in (every command)."""
    from ..shell_completion.scripts import render
    from ..shell_completion.tree import root_command_tree

    return render(shell, root_command_tree(ctx.find_root().command))
