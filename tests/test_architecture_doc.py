"""docs/architecture.md's tree names every package and module of pyllama_cli, and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pyllama_cli"


def _tree_block() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## The tree", 1)[1]
    return section.split("```", 2)[1]


def _modules() -> list[Path]:
    return [p for p in PACKAGE.rglob("*.py") if p.stem not in ("__init__", "__main__") or p.parent != PACKAGE]


def test_every_package_is_in_the_tree() -> None:
    tree = _tree_block()
    packages = sorted(p.parent.name for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE)
    assert [name for name in packages if f"{name}/" not in tree] == []


def test_every_module_is_in_the_tree() -> None:
    tree = _tree_block()
    stems = sorted({p.stem for p in _modules() if p.stem != "__init__"})
    assert [stem for stem in stems if not re.search(rf"\b{stem}\b", tree)] == []


def test_every_file_the_tree_names_exists() -> None:
    named = set(re.findall(r"\b(\w+)\.py\b", _tree_block()))
    existing = {p.stem for p in PACKAGE.rglob("*.py")}
    assert sorted(named - existing) == []
