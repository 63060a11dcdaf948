"""The package's shape: no private internals of typer, click or CPython; modules of a readable size;
core/ by concern; shell_completion's modules importing one way."""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import REPO_ROOT

PACKAGE = Path(REPO_ROOT) / "pyllama_cli"
# Whose private modules and names pyllama must not touch: they may change in any release.
GUARDED = frozenset({"typer", "click"} | set(sys.stdlib_module_names))
# Names with a leading underscore that the standard library documents as public API, so no release
# may change them: os._exit (leave at once, from any thread: pyllama's answer to ggml's abort()).
DOCUMENTED = frozenset({"os._exit"})
_IMPORTERS = frozenset({"import_module", "__import__"})  # importlib.import_module("x._y"), __import__("x._y")


def modules(under: Path = PACKAGE) -> list[Path]:
    return sorted(p for p in under.rglob("*.py") if "__pycache__" not in p.parts)


def name_of(path: Path) -> str:
    return path.relative_to(PACKAGE.parent).as_posix()


def line_count(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


# ---------------------------------------------------------------- private internals


def _private(segment: str) -> bool:
    return segment.startswith("_") and not (segment.startswith("__") and segment.endswith("__"))


def _guarded(dotted: str) -> bool:
    return dotted.split(".")[0] in GUARDED


def _private_dotted(dotted: str) -> bool:
    return _guarded(dotted) and any(_private(s) for s in dotted.split("."))


def _attribute_chain(node: ast.expr) -> tuple[str, list[str]] | None:
    """`a.b.c` as ("a", ["b", "c"]); None when the chain does not start at a plain name."""
    attrs = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    return (node.id, attrs[::-1]) if isinstance(node, ast.Name) else None


def private_uses(source: str) -> Iterator[tuple[int, str]]:
    """(line, what) for each use of a private module or name of typer, click or the standard library.

    Imports (`import typer._click`, `from click._compat import x`, `from atexit import _run_exitfuncs`),
    attribute access on what such an import binds (`atexit._run_exitfuncs()`, `sys._getframe()`),
    `getattr(module, "_name")`, and `importlib.import_module("typer._click")`. Dunders are fine.
    """
    tree = ast.parse(source)
    bound: dict[str, str] = {}  # local name -> the guarded module (or name in it) it stands for
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _private_dotted(alias.name):
                    yield node.lineno, f"import {alias.name}"
                if _guarded(alias.name):
                    bound[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and _guarded(node.module):
            if _private_dotted(node.module):
                yield node.lineno, f"from {node.module} import ..."
            for alias in node.names:
                if _private(alias.name):
                    yield node.lineno, f"from {node.module} import {alias.name}"
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain = _attribute_chain(node)
            if chain and chain[0] in bound and _private(node.attr) \
                    and ".".join((bound[chain[0]], *chain[1])) not in DOCUMENTED:
                yield node.lineno, ".".join((bound[chain[0]], *chain[1]))
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            func_name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            first = node.args[0]
            if func_name == "getattr" and len(node.args) >= 2:
                chain = _attribute_chain(first)
                name = node.args[1]
                if chain and chain[0] in bound and isinstance(name, ast.Constant) and isinstance(name.value, str) \
                        and _private(name.value):
                    yield node.lineno, f"getattr({'.'.join((bound[chain[0]], *chain[1]))}, {name.value!r})"
            elif func_name in _IMPORTERS and isinstance(first, ast.Constant) and isinstance(first.value, str) \
                    and _private_dotted(first.value):
                yield node.lineno, f"{func_name}({first.value!r})"


@pytest.mark.parametrize(("source", "found"), [
    ("from typer._click.exceptions import ClickException", ["from typer._click.exceptions import ..."]),
    ("import click._compat", ["import click._compat"]),
    ("import importlib._bootstrap as b", ["import importlib._bootstrap"]),
    ("from atexit import _run_exitfuncs", ["from atexit import _run_exitfuncs"]),
    ("from typer import _click", ["from typer import _click"]),
    ("def f():\n    import atexit\n    atexit._run_exitfuncs()", ["atexit._run_exitfuncs"]),
    ("import sys\nframe = sys._getframe(1)", ["sys._getframe"]),
    ("import os\nos._exit(1)", []),
    ("import typer\ntyper._click.exceptions.UsageError", ["typer._click"]),
    ("import os.path as p\np._joinrealpath", ["os.path._joinrealpath"]),
    ("import sys\ngetattr(sys, '_getframe')", ["getattr(sys, '_getframe')"]),
    ("import importlib\nimportlib.import_module('typer._click.core')", ["import_module('typer._click.core')"]),
    ("from __future__ import annotations\nimport typer\nprint(typer.__version__, typer.main.get_command)", []),
    ("from ._private import x\nfrom .tree import _helper\nimport rich._loop\nobj._attr", []),
])
def test_the_private_use_check_finds_what_it_should(source: str, found: list[str]) -> None:
    assert [what for _, what in private_uses(source)] == found


def test_no_module_uses_private_internals_of_typer_click_or_cpython() -> None:
    uses = [f"{name_of(p)}:{line}: {what}" for p in modules() for line, what in private_uses(p.read_text(encoding="utf-8"))]
    assert uses == []


def test_no_file_names_typer_click_or_atexit_privates_or_typer_s_type_descriptor() -> None:
    # As `grep -rnE "typer\._|click\._|atexit\._|type_descriptor" pyllama_cli`, comments and strings included.
    pattern = re.compile(r"typer\._|click\._|atexit\._|type_descriptor")
    hits = [f"{name_of(p)}:{number}: {line.strip()}"
            for p in sorted(PACKAGE.rglob("*")) if p.is_file() and "__pycache__" not in p.parts
            for number, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
            if pattern.search(line)]
    assert hits == []


# ---------------------------------------------------------------- sizes and layout


def test_no_module_is_over_500_lines() -> None:
    over = [f"{name_of(p)} ({line_count(p)} lines)" for p in modules() if line_count(p) > 500]
    assert not over, "over 500 lines: " + ", ".join(over)


def test_no_command_module_is_over_200_lines() -> None:
    over = [f"{name_of(p)} ({line_count(p)} lines)" for p in modules(PACKAGE / "commands") if line_count(p) > 200]
    assert not over, "over 200 lines: " + ", ".join(over)


def test_no_package_holds_more_than_twelve_modules() -> None:
    # The house rule: a folder past ~12 modules is split by concern before more moves in.
    packages = [p.parent for p in PACKAGE.rglob("__init__.py") if "__pycache__" not in p.parts]
    crowded = {name_of(p) or "pyllama_cli": n for p in packages
               if (n := len([m for m in p.glob("*.py") if m.name != "__init__.py"])) > 12}
    assert not crowded, crowded


def test_core_has_at_most_two_modules_at_its_top_level() -> None:
    top = sorted(p.name for p in (PACKAGE / "core").glob("*.py") if p.name != "__init__.py")
    assert len(top) <= 2, top


def test_every_core_sub_package_says_what_it_holds() -> None:
    packages = sorted(p.parent for p in (PACKAGE / "core").rglob("__init__.py") if "__pycache__" not in p.parts)
    assert [name_of(p) for p in packages if not ast.get_docstring(ast.parse((p / "__init__.py").read_text()))] == []


# ---------------------------------------------------------------- shell_completion


def _imports(path: Path) -> set[str]:
    """What `path` imports of pyllama_cli, as module names relative to it (`core.paths`, `shell_completion.tree`)."""
    package = path.parent.relative_to(PACKAGE).parts
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - (node.level - 1)]
            parts = (*base, *(node.module.split(".") if node.module else ()))
            found |= {".".join((*parts, a.name)) if not node.module else ".".join(parts) for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pyllama_cli"):
            found.add(node.module.removeprefix("pyllama_cli").lstrip("."))
    return found


def test_shell_completion_imports_run_one_way() -> None:
    # tree <- scripts <- install <- the `completion` command; nothing there reaches back to cli or commands.
    folder = PACKAGE / "shell_completion"
    imports = {p.stem: _imports(p) for p in modules(folder)}
    assert not any(m.startswith(("cli", "commands")) for found in imports.values() for m in found), imports
    assert not {"shell_completion.scripts", "shell_completion.install"} & imports["tree"]
    assert "shell_completion.install" not in imports["scripts"]
    assert "shell_completion.tree" in imports["scripts"]


# ---------------------------------------------------------------- layers and import cycles (scripts/import_graph.py)

CLI_LAYERS = ("options", "server", "commands", "chat", "console", "cli")
CLI_LIBRARIES = frozenset({"typer", "click", "rich", "prompt_toolkit"})
SERVER = PACKAGE / "server"


def import_graph() -> Any:
    """scripts/import_graph.py as a module: the module graph and its cycles, as the script prints them."""
    spec = importlib.util.spec_from_file_location("import_graph", Path(REPO_ROOT) / "scripts" / "import_graph.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _third_party_imports(path: Path) -> set[str]:
    """The top-level names of what `path` imports from outside pyllama_cli, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_core_imports_nothing_from_the_cli_layers_or_their_libraries() -> None:
    # core/ is the library under every command: it raises typed errors and returns data, and whoever
    # calls it (a command, the server) decides how to show them.
    graph = import_graph().module_graph()
    upward = [f"{m} -> {t}" for m, targets in sorted(graph.items()) if m.startswith("pyllama_cli.core")
              for t in sorted(targets) if t.removeprefix("pyllama_cli.").split(".")[0] in CLI_LAYERS]
    libraries = [f"{name_of(p)} -> {lib}" for p in modules(PACKAGE / "core")
                 for lib in sorted(_third_party_imports(p) & CLI_LIBRARIES)]
    assert upward + libraries == []


def test_no_modules_import_each_other_in_a_circle() -> None:
    # Imports inside functions and under TYPE_CHECKING count: they are circles a reader still follows.
    script = import_graph()
    assert script.cycles(script.module_graph()) == []


def test_the_import_graph_script_prints_server_s_parts_and_no_cycles() -> None:
    result = subprocess.run([sys.executable, "scripts/import_graph.py"], cwd=REPO_ROOT, capture_output=True,
                            text=True, timeout=60)
    lines = result.stdout.splitlines()
    assert (result.returncode, lines[0], lines[-2:]) == (0, "pyllama_cli/server: each part -> the parts it imports",
                                                        ["cycles among server's parts: 0",
                                                         "cycles among pyllama_cli's modules: 0"])
    parts = {line.split()[0] for line in lines[1:-2]}
    assert {"app", "spine", "job_rules", "openai/", "llama_server/", "anthropic/", "responses_api/", "ollama/", "webui/"} <= parts


def _api_families() -> list[Path]:
    """server's packages that add routes for an API (each has routes.py with add_routes)."""
    return sorted(p.parent for p in SERVER.glob("*/routes.py") if "def add_routes(" in p.read_text(encoding="utf-8"))


def _package_of(module: str, known: dict[str, Path]) -> str:
    return module if known[module].name == "__init__.py" else module.rpartition(".")[0]


def test_no_server_package_imports_another_s_private_names() -> None:
    # Each API family is a package of server/, and the spine is server's top level: they may use each
    # other's public names (the Messages and Responses APIs reshape OpenAI's chat), but what starts
    # with _ belongs to its own package.
    known = import_graph().module_names()
    found = []
    for path in modules(SERVER):
        name = next(m for m, p in known.items() if p == path)
        package = _package_of(name, known)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        bound: dict[str, str] = {}  # a local name -> the other package's module it stands for
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or not node.level:
                continue
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            source = ".".join([*base, *([node.module] if node.module else [])])
            for alias in node.names:
                target = f"{source}.{alias.name}" if f"{source}.{alias.name}" in known else source
                if target not in known or _package_of(target, known) == package:
                    continue
                if _private(alias.name):
                    found.append(f"{name_of(path)}:{node.lineno}: {alias.name} from {target}")
                if target != source:
                    bound[alias.asname or alias.name] = target
        found += [f"{name_of(path)}:{node.lineno}: {bound[node.value.id]}.{node.attr}" for node in ast.walk(tree)
                  if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                  and node.value.id in bound and _private(node.attr)]
    assert found == []


def test_only_app_py_imports_the_api_families() -> None:
    # The spine (server's top-level modules, http/, router/) is what every family stands on, so it
    # knows none of them: app.py alone adds them, and a new family changes nothing else.
    graph = import_graph().module_graph()
    families = {f"pyllama_cli.server.{p.name}" for p in _api_families()}
    spine = [m for m in graph if m.startswith("pyllama_cli.server") and m != "pyllama_cli.server.app"
             and not any(m == f or m.startswith(f + ".") for f in families)]
    reaching = [f"{m} -> {t}" for m in sorted(spine) for t in sorted(graph[m])
                if any(t == f or t.startswith(f + ".") for f in families)]
    assert reaching == []


def test_every_api_family_is_added_by_add_routes_app_models() -> None:
    # One way in for every API (the coming ones too): create_app calls family.add_routes(app, models).
    families = _api_families()
    assert {p.name for p in families} >= {"openai", "llama_server", "anthropic", "responses_api", "ollama", "webui"}
    signatures = {}
    for family in families:
        tree = ast.parse((family / "routes.py").read_text(encoding="utf-8"))
        [add] = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "add_routes"]
        signatures[family.name] = [(a.arg, ast.unparse(a.annotation) if a.annotation else None) for a in add.args.args]
    assert signatures == {name: [("app", "FastAPI"), ("models", "ModelSet")] for name in signatures}


def test_every_api_family_but_the_page_is_in_api_families() -> None:
    # A family's package alone adds no routes: create_app adds those API_FAMILIES lists (webui/ apart,
    # as --no-webui leaves it out), so a family left out of it would be dead code that its tests miss.
    from pyllama_cli.server.app import API_FAMILIES

    listed = [family.__name__.split(".")[-2] for family in API_FAMILIES]
    assert sorted(listed) == sorted(p.name for p in _api_families() if p.name != "webui")
