"""The file tools: read_file (a line range, optionally numbered), write_file, and edit_file (exact
replacements, each old text unique in the file and no two overlapping, all applied or none).

Each returns llama-server's result object; a failure the model should read is `{"error": ...}` with
status 200, as llama-server answers it.
"""

from __future__ import annotations

import os
from typing import Any

from .place import Place

READ_MAX_BYTES = 16 * 1024  # llama-server's cap on a read without an end_line
TRUNCATED = "[output truncated]"


def read_file(params: dict[str, Any], place: Place) -> dict[str, Any]:
    path = params["path"]
    start = int(params.get("start_line", 1))
    end = int(params.get("end_line", -1))
    numbered = bool(params.get("append_loc", False))
    full = place.resolve(path)
    try:
        size = os.path.getsize(full)
    except OSError:
        return {"error": f"cannot stat file: {path}"}
    if size > READ_MAX_BYTES and end == -1:
        return {"error": f"file too large ({size} bytes, max {READ_MAX_BYTES}). "
                         "Use start_line/end_line to read a portion."}
    try:
        with open(full, encoding="utf-8", errors="replace", newline="") as handle:
            lines = handle.read().split("\n")
    except OSError:
        return {"error": f"failed to open file: {path}"}
    if lines and lines[-1] == "":  # a final newline ends the last line; it does not start another
        lines.pop()
    return {"plain_text_response": _numbered_range(lines, start, end, numbered)}


def _numbered_range(lines: list[str], start: int, end: int, numbered: bool) -> str:
    text = ""
    for number, line in enumerate(lines, 1):
        if number < start:
            continue
        if end != -1 and number > end:
            break
        piece = f"{number}\u2192{line}\n" if numbered else f"{line}\n"
        if len((text + piece).encode()) > READ_MAX_BYTES:
            return text + TRUNCATED
        text += piece
    return text


def write_file(params: dict[str, Any], place: Place) -> dict[str, Any]:
    path, content = params["path"], params["content"]
    if not isinstance(content, str):
        raise TypeError('"content" must be a string')
    if not _write(place.resolve(path), content):
        return {"error": f"failed to write file: {path}"}
    return {"result": "file written successfully", "path": path, "bytes": len(content.encode())}


def _write(full: str, content: str) -> bool:
    try:
        os.makedirs(os.path.dirname(full) or ".", exist_ok=True)
        with open(full, "w", encoding="utf-8", newline="") as handle:
            handle.write(content)
    except OSError:
        return False
    return True


def edit_file(params: dict[str, Any], place: Place) -> dict[str, Any]:
    path, edits = params["path"], params["edits"]
    if not isinstance(edits, list) or not edits:
        return {"error": '"edits" must be a non-empty array'}
    pairs = [(str(edit["old_text"]), str(edit["new_text"])) for edit in edits]
    for index, (old, _) in enumerate(pairs):
        if not old:
            return {"error": f"edits[{index}].old_text must not be empty"}
    full = place.resolve(path)
    try:
        with open(full, encoding="utf-8", newline="") as handle:
            original = handle.read()
    except (OSError, UnicodeDecodeError):
        return {"error": f"failed to open file: {path}"}
    spans, refusal = _spans(original, pairs, path)
    if refusal:
        return {"error": refusal}
    edited = _apply(original, spans)
    if edited == original:
        return {"error": "no changes made: the replacement(s) produced identical content"}
    if not _write(full, edited):
        return {"error": f"failed to write file: {path}"}
    return {"result": "file edited successfully", "path": path, "edits_applied": len(spans)}


def _spans(text: str, pairs: list[tuple[str, str]], path: str) -> tuple[list[tuple[int, int, int, str]], str]:
    """(start, end, edit index, new text) of each edit, in file order; or why the edits are refused."""
    spans = []
    for index, (old, new) in enumerate(pairs):
        found = text.count(old)
        if found == 0:
            return [], (f"could not find edits[{index}].old_text in {path}, it must match the file's "
                        "current content exactly")
        if found > 1:
            return [], f"found {found} occurrences of edits[{index}].old_text in {path}, it must be unique"
        start = text.index(old)
        spans.append((start, start + len(old), index, new))
    spans.sort()
    for before, after in zip(spans, spans[1:]):
        if before[1] > after[0]:
            return [], (f"edits[{before[2]}] and edits[{after[2]}] overlap in {path}; merge them into one "
                        "edit or target disjoint regions")
    return spans, ""


def _apply(text: str, spans: list[tuple[int, int, int, str]]) -> str:
    pieces, at = [], 0
    for start, end, _, new in spans:
        pieces += [text[at:start], new]
        at = end
    return "".join(pieces) + text[at:]
