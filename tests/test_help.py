"""`--help`: whole option names at 80 columns, pyllama's words for ranges, and a root help that
loads no command."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from pyllama_cli import cli, command_table
from tests.helpers import REPO_ROOT


def _help(*args: str) -> str:
    env = {**os.environ, "COLUMNS": "80", "TERMINAL_WIDTH": "80"}
    proc = subprocess.run([sys.executable, "-m", "pyllama_cli", *args, "--help"], capture_output=True, text=True,
                          env=env, cwd=REPO_ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _option_names(command: str) -> list[str]:
    import typer.main

    click_command = typer.main.get_command(cli.build_app(command)).get_command(None, command)  # type: ignore[attr-defined]
    return [name for param in click_command.params if not param.hidden for name in param.opts + param.secondary_opts]


@pytest.mark.parametrize("command", ["chat", "complete", "serve"])
def test_every_option_name_is_whole_at_80_columns(command: str) -> None:
    # Before: 11 or 12 names per command were cut ("--spec-ngram-simple-…") by the boxed layout.
    text = _help(command)
    assert "…" not in text
    words = set(text.replace(",", " ").split())
    missing = [name for name in _option_names(command) if name not in words]
    assert missing == []
    options = text.split("\n\n  Examples:")[0]  # examples are commands, written out whole
    assert [line for line in options.splitlines() if len(line) > 80] == []


def test_types_and_ranges_read_in_words() -> None:
    # Before: "<int range> [x>=1]" and "[default: 8080; 0<=x<=65535]".
    text = " ".join(_help("serve").split())
    assert "-np, --parallel <int> Slots:" in text
    assert "[default: 1; at least 1]" in text and "[default: 8080; from 0 to 65535]" in text
    words = re.sub(r"--[\w-]+", "", text).replace("arrange", "")  # flag names such as --cpu-range aside
    assert "range" not in words and "x>=" not in words


def test_examples_keep_their_lines() -> None:
    assert _help("ps").endswith("\n  Examples:\n    pyllama ps\n    pyllama ps --port 8000 --json\n"
                                "    pyllama ps --url 192.168.1.5:8080\n")


def test_the_root_help_lists_every_command_without_loading_one() -> None:
    # What made `pyllama --help` take a second: every command module, rich and asyncio were imported.
    code = ("import sys\nfrom pyllama_cli.cli import run\nrun(['--help'])\n"
            "print(sorted(m for m in sys.modules if m.startswith(('pyllama_cli.commands', 'pyllama_cli.options', "
            "'pyllama_cli.core', 'rich', 'asyncio'))))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)
    assert proc.stdout.splitlines()[-1] == "[]", proc.stderr
    listed = [line.split()[0] for line in proc.stdout.split("Commands:\n")[1].splitlines()[:-1] if line[2:3] != " "]
    assert listed == [name for name, _, _ in command_table.COMMANDS if name not in command_table.HIDDEN_ALIASES]


def test_each_summary_starts_its_commands_own_help() -> None:
    import typer.main

    group = typer.main.get_command(cli.build_app())
    assert sorted(command_table.SUMMARIES) == sorted(command_table.COMMAND_NAMES - command_table.HIDDEN_ALIASES)
    for name, summary in command_table.SUMMARIES.items():
        assert group.get_command(None, name).help.startswith(summary), name  # type: ignore[attr-defined]
