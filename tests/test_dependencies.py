"""What pyproject.toml declares is what pyllama_cli imports: nothing missing, nothing unused."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pyllama_cli"
# Distribution name -> the module it is imported as, where the two differ.
MODULE_OF = {"llama-cpp-python": "llama_cpp", "huggingface-hub": "huggingface_hub", "prompt-toolkit": "prompt_toolkit",
             "markdown-it-py": "markdown_it"}
# Declared for uvicorn to find by itself (a faster event loop); never imported.
USED_BY_UVICORN = {"uvloop"}


def _module(requirement: str) -> str:
    name = re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].strip().lower()
    return MODULE_OF.get(name, name.replace("-", "_"))


def _declared() -> tuple[set[str], set[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    required = {_module(r) for r in project["dependencies"]}
    optional = {_module(r) for group in ("plot",) for r in project["optional-dependencies"][group]}
    return required, optional


def _imported() -> set[str]:
    names: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n != "pyllama_cli"}


def test_every_imported_package_is_declared() -> None:
    required, optional = _declared()
    assert sorted(_imported() - required - optional) == []


def test_every_declared_package_is_imported() -> None:
    required, optional = _declared()
    assert sorted((required | optional) - _imported() - USED_BY_UVICORN) == []


def test_package_data_names_files_that_exist() -> None:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for pattern in data["pyllama_cli"]:
        assert list(PACKAGE.glob(pattern)), pattern
