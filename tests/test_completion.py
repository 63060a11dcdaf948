"""Shell completion: the committed scripts and docs match the code, bash completes the domain's
values, zsh and fish parse their scripts, and `completion install` is idempotent."""

from __future__ import annotations

import os
import re
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pyllama_cli.shell_completion import install as installing
from tests.helpers import REPO_ROOT, run_cli, run_process

REPO = Path(REPO_ROOT)
SCRIPTS = REPO / "completions"
BASH_SCRIPT = SCRIPTS / "pyllama.bash"

# Drives the completion function as bash's `complete -F` would: COMP_LINE, COMP_POINT, COMP_WORDS, COMP_CWORD.
_BASH_DRIVER = r"""
source "$SCRIPT"
complete -p pyllama >&2
line=$1; shift
COMP_LINE=$line COMP_POINT=${#line} COMP_WORDS=("$@") COMP_CWORD=$(($# - 1)) COMPREPLY=()
_pyllama pyllama "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
printf '%s\n' "${COMPREPLY[@]}"
"""


def bash_words(line: str) -> list[str]:
    """COMP_WORDS for `line` as bash splits it (at blanks, and ':' and '=' are words of their own)."""
    words = re.findall(r"[^\s:=]+|[:=]", line)
    return words + [""] if line.endswith(" ") else words


def bash_complete(line: str, cwd: Path = REPO) -> list[str]:
    proc = subprocess.run(["bash", "--norc", "--noprofile", "-c", _BASH_DRIVER, "bash", line, *bash_words(line)],
                          check=False, capture_output=True, text=True, cwd=cwd, env={**os.environ, "SCRIPT": str(BASH_SCRIPT)},
                          timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines()[0] == "complete -F _pyllama pyllama"
    return sorted(w for w in proc.stdout.splitlines() if w)


def command_with(option: str) -> str:
    """The first command that has `option`; a test of its completion fails when no command has it any more."""
    from pyllama_cli.cli import app
    from pyllama_cli.shell_completion.tree import command_tree

    for cmd in command_tree(app).walk():
        if any(option in o.names for o in cmd.options):
            return cmd.key
    pytest.fail(f"no command has {option}: its completion is untested")


# ---------------------------------------------------------------- generated files


def test_committed_scripts_and_docs_match_the_code() -> None:
    proc = subprocess.run([sys.executable, "scripts/gen_cli_docs.py", "--check"], cwd=REPO, check=False, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "up to date\n"


def test_docs_hold_every_commands_help_with_examples() -> None:
    from pyllama_cli.cli import app
    from pyllama_cli.shell_completion.tree import command_tree

    docs = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    sections = dict(re.findall(r"^## (pyllama[^\n]*)\n\n```text\n(.*?)```", docs, flags=re.DOTALL | re.MULTILINE))
    for cmd in command_tree(app).walk():
        title = f"pyllama {cmd.key}".strip()
        assert f"Usage: {title} " in sections[title]
        if cmd.path:
            assert "Examples:" in sections[title], f"{title} --help has no Examples epilog"


def test_show_prints_the_committed_script() -> None:
    for shell, name in (("bash", "pyllama.bash"), ("zsh", "_pyllama"), ("fish", "pyllama.fish")):
        result = run_cli("completion", "show", shell)
        assert result.exit_code == 0, result.stderr
        assert result.stdout == (SCRIPTS / name).read_text(encoding="utf-8")


def test_show_rejects_an_unknown_shell() -> None:
    result = run_cli("completion", "show", "powershell")
    assert result.exit_code == 2
    assert "'powershell' is not one of" in result.stderr


# ---------------------------------------------------------------- bash


def test_bash_completes_commands_and_quant_types() -> None:
    assert bash_complete("pyllama qu") == ["quantize"]
    assert bash_complete("pyllama quantize m.gguf out.gguf Q4_K") == ["Q4_K", "Q4_K_M", "Q4_K_S"]
    assert bash_complete("pyllama completion ") == ["install", "show"]
    assert bash_complete("pyllama completion show ") == ["bash", "fish", "zsh"]
    assert bash_complete("pyllama info --hf") == ["--hf-file", "--hf-repo", "--hf-token"]


def test_bash_model_flag_completes_gguf_files_and_directories(tmp_path: Path) -> None:
    for name in ("a.gguf", "b.gguf", "notes.txt"):
        (tmp_path / name).touch()
    (tmp_path / "models").mkdir()
    assert bash_complete("pyllama info -m ", cwd=tmp_path) == ["a.gguf", "b.gguf", "models"]
    assert bash_complete("pyllama info --model=a", cwd=tmp_path) == ["a.gguf"]


def _fake_hub_cache() -> Path:
    from pyllama_cli.core.model.resolve import hub_cache_dir

    snap = hub_cache_dir() / "models--org--Model-GGUF" / "snapshots" / "abc123"
    (snap / "UD").mkdir(parents=True)
    for name in ("model-Q4_K_M.gguf", "model-q8_0.gguf", "mmproj-model-F16.gguf", "README.md",
                 "UD/model-UD-Q6_K_XL-00001-of-00002.gguf", "UD/model-UD-Q6_K_XL-00002-of-00002.gguf"):
        (snap / name).touch()
    (hub_cache_dir() / "models--bob--tiny" / "snapshots" / "1").mkdir(parents=True)
    return snap


def test_bash_hf_flag_completes_cached_repos_then_their_quant_tags() -> None:
    _fake_hub_cache()
    assert bash_complete("pyllama info -hf ") == ["bob/tiny", "org/Model-GGUF"]
    assert bash_complete("pyllama info -hf org/M") == ["org/Model-GGUF"]
    # Bash splits the word at ':' and replaces only what follows it, so the tags come bare.
    assert bash_complete("pyllama info -hf org/Model-GGUF:") == ["Q4_K_M", "Q6_K_XL", "Q8_0"]
    assert bash_complete("pyllama info --hf-repo org/Model-GGUF:Q4") == ["Q4_K_M"]
    assert bash_complete("pyllama info -hf bob/tiny:") == []


def test_bash_rm_and_stop_complete_cached_repos_and_tags() -> None:
    _fake_hub_cache()
    assert bash_complete("pyllama rm ") == ["bob/tiny", "org/Model-GGUF"]
    assert bash_complete("pyllama rm -y org/Model-GGUF:Q") == ["Q4_K_M", "Q6_K_XL", "Q8_0"]
    assert bash_complete("pyllama stop org/Model-GGUF:Q8") == ["Q8_0"]


def test_bash_hf_tags_agree_with_how_pyllama_reads_them() -> None:
    from pyllama_cli.core.model.resolve import available_quants

    snap = _fake_hub_cache()
    names = [p.name for p in snap.rglob("*.gguf") if "mmproj" not in p.name]
    assert bash_complete("pyllama info -hf org/Model-GGUF:") == sorted(set(available_quants(names)))


def test_bash_completes_grammar_and_chat_template_names() -> None:
    from pyllama_cli.core.text.chat_template import template_names
    from pyllama_cli.core.constrain.grammar import shipped_grammars

    cmd = command_with("--grammar")
    assert bash_complete(f"pyllama {cmd} --grammar ") == sorted(shipped_grammars())
    assert bash_complete(f"pyllama {cmd} --grammar=json") == [g for g in sorted(shipped_grammars()) if g.startswith("json")]
    cmd = command_with("--chat-template")
    assert set(template_names()) <= set(bash_complete(f"pyllama {cmd} --chat-template "))


class _Terminal:
    """An interactive bash on a pseudo-terminal, so readline itself handles the TAB key."""

    def __init__(self, cwd: Path):
        master, slave = os.openpty()
        env = {"PATH": os.environ["PATH"], "HOME": str(cwd), "TERM": "dumb", "INPUTRC": "/dev/null", "PS1": "$ "}
        self.proc = subprocess.Popen(["bash", "--norc", "--noprofile", "-i"], stdin=slave, stdout=slave,
                                     stderr=slave, cwd=cwd, env=env, start_new_session=True)
        os.close(slave)
        self.fd, self.seen = master, ""

    def send(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def expect(self, needle: str, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.seen:
            ready, _, _ = select.select([self.fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise AssertionError(f"{needle!r} never appeared; the terminal shows: {self.seen[-400:]!r}")
            self.seen += os.read(self.fd, 4096).decode("utf-8", "replace")

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        os.close(self.fd)


def test_bash_tab_key_in_an_interactive_shell(tmp_path: Path) -> None:
    term = _Terminal(tmp_path)
    try:
        term.send(f"source {BASH_SCRIPT}; echo sourced-$((40 + 2))\n")
        term.expect("sourced-42")
        term.send("pyllama qu\t")
        term.expect("quantize")
        term.send("\x15pyllama quantize m.gguf out.gguf Q4_K\t\t")  # Ctrl-U clears the line; TAB TAB lists
        term.expect("Q4_K_S")
        assert "Q4_K_M" in term.seen
    finally:
        term.close()


# ---------------------------------------------------------------- zsh and fish


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_script_parses() -> None:
    proc = subprocess.run(["zsh", "-n", str(SCRIPTS / "_pyllama")], check=False, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish is not installed")
def test_fish_script_parses_and_completes(tmp_path: Path) -> None:
    script = SCRIPTS / "pyllama.fish"
    proc = subprocess.run(["fish", "--no-execute", str(script)], check=False, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    (tmp_path / "m.gguf").touch()
    (tmp_path / "notes.txt").touch()

    def complete(line: str) -> list[str]:
        proc = subprocess.run(["fish", "--no-config", "-c", f"source {script}; complete -C '{line}'"],
                              check=False, capture_output=True, text=True, cwd=tmp_path, timeout=30)
        assert proc.returncode == 0, proc.stderr
        return sorted(entry.split("\t")[0] for entry in proc.stdout.splitlines())

    assert complete("pyllama qu") == ["quantize"]
    assert complete("pyllama quantize m.gguf out.gguf Q4_K") == ["Q4_K", "Q4_K_M", "Q4_K_S"]
    assert complete("pyllama info -m ") == ["m.gguf"]


# ---------------------------------------------------------------- install


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "user"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for var in ("ZDOTDIR", "BASH_COMPLETION_USER_DIR", "XDG_DATA_HOME", "XDG_CONFIG_HOME"):
        monkeypatch.delenv(var, raising=False)
    return home


def test_install_fish_writes_the_script_once(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHELL", "/usr/bin/fish")
    result = run_cli("completion", "install")
    assert result.exit_code == 0, result.stderr
    assert result.stderr == "Wrote ~/.config/fish/completions/pyllama.fish\nOpen a new fish to use it.\n"
    target = home / ".config" / "fish" / "completions" / "pyllama.fish"
    assert target.read_text() == (SCRIPTS / "pyllama.fish").read_text()
    again = run_cli("completion", "install", "fish")
    assert again.exit_code == 0
    assert again.stderr == ("fish completion is already installed (~/.config/fish/completions/pyllama.fish); "
                            "nothing changed.\n")


def test_install_zsh_adds_fpath_and_compinit_once(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHELL", "/bin/zsh")
    (home / ".zshrc").write_text("alias ll='ls -l'")  # no final newline
    result = run_cli("completion", "install")
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ("Wrote ~/.zfunc/_pyllama\n"
                             "Added to ~/.zshrc: fpath=(~/.zfunc $fpath); autoload -Uz compinit && compinit\n"
                             "Open a new zsh to use it.\n")
    rc = "alias ll='ls -l'\n\n# pyllama shell completion\nfpath=(~/.zfunc $fpath)\nautoload -Uz compinit && compinit\n"
    assert (home / ".zshrc").read_text() == rc
    assert (home / ".zfunc" / "_pyllama").read_text() == (SCRIPTS / "_pyllama").read_text()
    again = run_cli("completion", "install", "zsh")
    assert again.stderr == "zsh completion is already installed (~/.zfunc/_pyllama); nothing changed.\n"
    assert (home / ".zshrc").read_text() == rc
    if shutil.which("zsh"):  # the rc lines really make zsh load the function for pyllama
        proc = subprocess.run(["zsh", "-c", "source ~/.zshrc; print -r -- $_comps[pyllama]"], check=False, capture_output=True,
                              text=True, env={**os.environ, "HOME": str(home)}, timeout=60)
        assert proc.stdout == "_pyllama\n", proc.stderr


def test_install_bash_without_bash_completion_sources_it_from_bashrc(
        home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(installing, "BASH_COMPLETION_SCRIPTS", ())
    result = run_cli("completion", "install", "bash")
    assert result.exit_code == 0, result.stderr
    line = ('[ -f "$HOME/.local/share/bash-completion/completions/pyllama" ] && '
            '. "$HOME/.local/share/bash-completion/completions/pyllama"')
    assert result.stderr == (f"Wrote ~/.local/share/bash-completion/completions/pyllama\n"
                             f"Added to ~/.bashrc: {line}\nOpen a new bash to use it.\n")
    assert (home / ".bashrc").read_text() == f"# pyllama shell completion\n{line}\n"
    again = run_cli("completion", "install", "bash")
    assert again.stderr == ("bash completion is already installed (~/.local/share/bash-completion/completions/pyllama); "
                            "nothing changed.\n")
    proc = subprocess.run(["bash", "--norc", "--noprofile", "-c", "source ~/.bashrc; complete -p pyllama"],
                          check=False, capture_output=True, text=True, env={**os.environ, "HOME": str(home)}, timeout=30)
    assert proc.stdout == "complete -F _pyllama pyllama\n", proc.stderr


def test_install_bash_with_bash_completion_leaves_bashrc_alone(
        home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loader = tmp_path / "bash_completion"
    loader.touch()
    monkeypatch.setattr(installing, "BASH_COMPLETION_SCRIPTS", (str(loader),))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / "data"))
    result = run_cli("completion", "install", "bash")
    assert result.stderr == "Wrote ~/data/bash-completion/completions/pyllama\nOpen a new bash to use it.\n"
    assert (home / "data" / "bash-completion" / "completions" / "pyllama").read_text() == BASH_SCRIPT.read_text()
    assert not (home / ".bashrc").exists()


def test_install_refreshes_an_outdated_script(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = home / ".config" / "fish" / "completions" / "pyllama.fish"
    target.parent.mkdir(parents=True)
    target.write_text("# an older pyllama's completion\n")
    result = run_cli("completion", "install", "fish")
    assert result.stderr == "Wrote ~/.config/fish/completions/pyllama.fish\nOpen a new fish to use it.\n"
    assert target.read_text() == (SCRIPTS / "pyllama.fish").read_text()
    assert [p.name for p in target.parent.iterdir()] == ["pyllama.fish"]  # no staging file left behind


def test_install_without_a_known_shell_says_how_to_name_it(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHELL", "/bin/tcsh")
    result = run_cli("completion", "install")
    assert result.exit_code == 1
    assert result.stderr == ("Error: cannot tell which shell to install for from $SHELL (/bin/tcsh)\n"
                             "Hint: name it: pyllama completion install bash|zsh|fish\n")


@pytest.mark.parametrize("value", ["", None])
def test_install_without_home_is_refused(home: Path, monkeypatch: pytest.MonkeyPatch, value: str | None) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / "config"))  # were HOME not checked, the script goes here
    if value is None:
        monkeypatch.delenv("HOME")
    else:
        monkeypatch.setenv("HOME", value)  # Python's "~" is then "/": the script went to /.config/fish
    result = run_cli("completion", "install", "fish")
    assert result.exit_code == 1
    assert result.stderr == ("Error: HOME is not set\n"
                             "Hint: set HOME to your home folder, or write the script yourself: "
                             "pyllama completion show SHELL > FILE\n")
    assert list(home.iterdir()) == []


def test_install_with_home_a_file_names_it(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    not_a_folder = home / "file"
    not_a_folder.write_text("x")
    monkeypatch.setenv("HOME", str(not_a_folder))
    result = run_cli("completion", "install", "bash")
    assert result.exit_code == 1
    assert result.first_stderr_line == f"Error: HOME is {not_a_folder}, which is not a folder"
    assert not_a_folder.read_text() == "x"


def test_install_names_a_file_standing_where_a_folder_goes(home: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    loader = tmp_path / "bash_completion"
    loader.touch()
    monkeypatch.setattr(installing, "BASH_COMPLETION_SCRIPTS", (str(loader),))
    data = home / "data"
    data.write_text("x")
    monkeypatch.setenv("XDG_DATA_HOME", str(data))
    result = run_cli("completion", "install", "bash")
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        f"Error: cannot write {data}/bash-completion/completions/pyllama: {data} is not a folder",
        "Hint: move that file out of the way, or choose another path",
    ]


def test_install_writes_through_a_symlinked_script(home: Path) -> None:
    target = home / "dotfiles" / "pyllama.fish"
    target.parent.mkdir()
    target.write_text("# an older pyllama's completion\n")
    link = home / ".config" / "fish" / "completions" / "pyllama.fish"
    link.parent.mkdir(parents=True)
    link.symlink_to(target)
    assert run_cli("completion", "install", "fish").exit_code == 0
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == (SCRIPTS / "pyllama.fish").read_text()
    assert sorted(p.name for p in link.parent.iterdir()) == ["pyllama.fish"]
    assert sorted(p.name for p in target.parent.iterdir()) == ["pyllama.fish"]  # no staging file left behind
    again = run_cli("completion", "install", "fish")
    assert again.stderr.endswith("nothing changed.\n")


def test_install_refuses_a_fifo_rc_file_before_writing_anything(home: Path) -> None:
    # A real process with a time limit: appending to a FIFO, were it not refused, would block forever.
    rc = home / ".zshrc"
    os.mkfifo(rc)
    result = run_process("completion", "install", "zsh", timeout=60)
    assert result.exit_code == 1
    assert result.stderr == f"Error: {rc} is not a regular file\nHint: name a new or regular file\n"
    assert sorted(p.name for p in home.iterdir()) == [".zshrc"]  # not even ~/.zfunc
