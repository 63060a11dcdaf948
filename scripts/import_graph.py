"""Print how the parts of pyllama_cli/server import each other, and count the import cycles.

    python scripts/import_graph.py           # server's parts, then the cycle counts
    python scripts/import_graph.py --modules # every pyllama_cli module that imports another

A part is a top-level module of server/ (app, spine, job_rules...) or one of its packages (openai/,
llama_server/...). Every import counts: at the top of a module, inside a function, or under
`if TYPE_CHECKING:` (a cycle there is one a reader still has to untangle). Exits 1 if there is a cycle.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "pyllama_cli"
SERVER = f"{PACKAGE}.server"


def module_names(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name, for its __init__.py)."""
    names = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        parts = path.relative_to(root).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def imports_of(name: str, path: Path, known: Iterable[str]) -> set[str]:
    """The package's modules that module `name` imports, wherever in it the import is."""
    known = set(known)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in known}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"  # `from . import spine` names a module, not a value
                if submodule in known:
                    found.add(submodule)
                elif source in known:
                    found.add(source)
    found.discard(name)
    return found


def module_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Each module of the package -> the package's modules it imports."""
    names = module_names(root)
    return {name: imports_of(name, path, names) for name, path in names.items()}


def server_part(module: str) -> str | None:
    """The part of server/ a module belongs to ("spine", "openai/"), or None outside server/."""
    if not module.startswith(SERVER + "."):
        return None
    rest = module[len(SERVER) + 1:].split(".")
    return rest[0] + "/" if len(rest) > 1 or _is_package(rest[0]) else rest[0]


def _is_package(name: str) -> bool:
    return (ROOT / PACKAGE / "server" / name / "__init__.py").is_file()


def server_graph(modules: dict[str, set[str]]) -> dict[str, set[str]]:
    """server/'s parts -> the other parts they import."""
    graph: dict[str, set[str]] = {}
    for module, targets in modules.items():
        part = server_part(module)
        if part is None:
            continue
        graph.setdefault(part, set())
        graph[part] |= {p for t in targets if (p := server_part(t)) is not None and p != part}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of nodes that import each other, round and round (Tarjan's strongly connected
    components of more than one node, or of one that imports itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1 or node in graph.get(node, ()):
                groups.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph) + 100))
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(groups)


def _short(module: str) -> str:
    return module.removeprefix(PACKAGE + ".")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--modules", action="store_true", help="list every module's imports, not server's parts")
    args = parser.parse_args(argv)
    modules = module_graph()
    if args.modules:
        for module, targets in sorted(modules.items()):
            if targets:
                print(f"{_short(module)} -> {', '.join(sorted(_short(t) for t in targets))}")
    else:
        parts = server_graph(modules)
        print("pyllama_cli/server: each part -> the parts it imports")
        for part, targets in sorted(parts.items()):
            print(f"  {part:<15} -> {', '.join(sorted(targets)) or '(none)'}")
    part_cycles = cycles(server_graph(modules))
    module_cycles = cycles(modules)
    for group in part_cycles:
        print("  cycle of server parts: " + " <-> ".join(group))
    for group in module_cycles:
        print("  cycle of modules: " + " <-> ".join(_short(m) for m in group))
    print(f"cycles among server's parts: {len(part_cycles)}")
    print(f"cycles among pyllama_cli's modules: {len(module_cycles)}")
    return 1 if part_cycles or module_cycles else 0


if __name__ == "__main__":
    sys.exit(main())
