"""The search tools: file_glob_search (entries under a folder matching a glob) and grep_search (lines
matching a regular expression), as llama-server's.

A folder is walked in name order; junk folders (.git, node_modules, build, ...) are listed but never
entered. Inside a git work tree, files come from `git ls-files` so .gitignore applies. A glob without
'/' matches an entry's base name at any depth; with '/', the relative path ('**' crosses folders).
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from .place import Place

JUNK_DIRS = frozenset({".git", ".svn", ".hg", "node_modules", "__pycache__", ".venv", "venv", "dist", "build",
                       "target", ".cache", ".idea", ".vscode"})
GLOB_MAX_RESULTS = 100
GREP_MAX_RESULTS = 100
KINDS = ("file", "dir", "all")


@dataclass(frozen=True)
class Entry:
    rel: str  # '/'-separated, relative to the base
    is_dir: bool


def file_glob_search(params: dict[str, Any], place: Place) -> dict[str, Any]:
    path = params["path"]
    base = place.resolve(path)
    include, exclude = params.get("include", "**"), params.get("exclude", "")
    kind = params.get("type", "file")
    max_depth = max(0, int(params.get("max_depth", 0)))
    limit = int(params.get("limit", GLOB_MAX_RESULTS))
    if limit < 1:
        return {"error": f"invalid limit: {limit} (expected 1 or more)"}
    if kind not in KINDS:
        return {"error": f'invalid type: {kind} (expected "file", "dir" or "all")'}
    if not os.path.isdir(base):
        return {"error": f"not a directory: {path}"}
    matches = [e for e in list_entries(base, max_depth, kind) if _selected(e.rel, include, exclude)]
    shown = matches[:min(limit, GLOB_MAX_RESULTS)]
    text = "".join(f"{e.rel}{'/' if e.is_dir else ''}\n" for e in shown)
    text += f"\n---\nTotal matches: {len(matches)}\n"
    if len(matches) > len(shown):
        text += (f"[{len(shown)} results limit reached ({len(matches)} total matches). Refine the glob "
                 "pattern to narrow the search.]\n")
    entries = [{"path": e.rel, "type": "dir" if e.is_dir else "file"} for e in shown]
    return {"plain_text_response": text, "entries": entries, "base": base}


def grep_search(params: dict[str, Any], place: Place) -> dict[str, Any]:
    path, pattern = params["path"], params["pattern"]
    include, exclude = params.get("include", "**"), params.get("exclude", "")
    context = max(0, int(params.get("context_lines", 0)))
    numbered = bool(params.get("return_line_numbers", False)) or context > 0
    source = re.escape(pattern) if params.get("literal", False) else pattern
    try:
        regex = re.compile(source, re.IGNORECASE if params.get("ignore_case", False) else 0)
    except re.error as exc:
        return {"error": f"invalid regex: {exc}"}
    full = place.resolve(path)
    if os.path.isfile(full):
        files = [(full, path)]
    elif os.path.isdir(full):
        files = [(os.path.join(full, e.rel), e.rel) for e in list_entries(full, 0, "file")
                 if _selected(e.rel, include, exclude)]
    else:
        return {"error": f"path does not exist: {path}"}
    text, total, full_up = _grep(files, regex, context, numbered)
    text += f"\n---\nTotal matches: {total}\n"
    if full_up:
        text += f"[{GREP_MAX_RESULTS} matches limit reached. Narrow the path/pattern/include to see more.]\n"
    return {"plain_text_response": text}


def _grep(files: list[tuple[str, str]], regex: re.Pattern[str], context: int, numbered: bool) -> tuple[str, int, bool]:
    out: list[str] = []
    total = 0
    for full, shown in files:
        try:
            with open(full, encoding="utf-8", errors="replace", newline="") as handle:
                lines = handle.read().split("\n")
        except OSError:
            continue
        if lines and lines[-1] == "":
            lines.pop()
        for i, line in enumerate(lines):
            if total >= GREP_MAX_RESULTS:
                return "".join(out), total, True
            if not regex.search(line):
                continue
            for j in range(max(0, i - context), min(len(lines) - 1, i + context) + 1):
                mark = ":" if j == i else "-"
                out.append(f"{shown}{mark}{f'{j + 1}{mark}' if numbered else ''}{lines[j]}\n")
            if context:
                out.append("--\n")
            total += 1
    return "".join(out), total, False


def list_entries(base: str, max_depth: int, kind: str) -> list[Entry]:
    """Entries under `base` of `kind` ("file", "dir", "all"), at most `max_depth` deep (0: any depth)."""
    tracked = _git_files(base) if kind == "file" else None
    if tracked is not None:
        return [Entry(rel, False) for rel in tracked if not max_depth or rel.count("/") < max_depth]
    found: list[Entry] = []
    _walk(base, "", 1, max_depth, kind, found)
    return found


def _walk(folder: str, prefix: str, depth: int, max_depth: int, kind: str, found: list[Entry]) -> None:
    try:
        children = sorted(os.scandir(folder), key=lambda child: child.name)
    except OSError:
        return
    for child in children:
        rel = prefix + child.name
        is_dir = child.is_dir(follow_symlinks=False)
        if is_dir and kind != "file" or not is_dir and kind != "dir" and child.is_file():
            found.append(Entry(rel, is_dir))
        if is_dir and child.name not in JUNK_DIRS and (not max_depth or depth < max_depth):
            _walk(child.path, rel + "/", depth + 1, max_depth, kind, found)


def _git_files(base: str) -> list[str] | None:
    """Files git lists under `base` (tracked and untracked, .gitignore applied); None outside a work tree."""
    try:
        done = subprocess.run(["git", "-C", base, "ls-files", "--cached", "--others", "--exclude-standard"],
                              capture_output=True, text=True, timeout=15, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return sorted(line for line in done.stdout.splitlines() if line and os.path.isfile(os.path.join(base, line)))


def _selected(rel: str, include: str, exclude: str) -> bool:
    return _glob_matches(include, rel) and not (exclude and _glob_matches(exclude, rel))


def _glob_matches(pattern: str, rel: str) -> bool:
    if "/" not in pattern:
        return bool(_glob_regex(pattern).fullmatch(rel.rsplit("/", 1)[-1]))
    if not (pattern == "**" or pattern.startswith(("**/", "/"))):
        pattern = "**/" + pattern
    return bool(_glob_regex(pattern.lstrip("/")).fullmatch(rel))


@lru_cache(maxsize=64)
def _glob_regex(pattern: str) -> re.Pattern[str]:
    """'**/' any folders (none too), '**' anything, '*' and '?' within one name, [...] a class."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and "]" in pattern[i + 2:]:
            close = pattern.index("]", i + 2)
            body = pattern[i + 1:close]
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body).replace("\\", "\\\\") + "]")
            i = close + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out), re.DOTALL)
