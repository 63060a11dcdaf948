"""Each built-in tool's name, display name, permissions and OpenAI function definition (what
`GET /tools` lists and a web page hands the model), and the function that runs it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import files, search, shell
from .place import Place


@dataclass(frozen=True)
class Tool:
    name: str
    display_name: str
    run: Callable[[dict[str, Any], Place], dict[str, Any]]
    description: str
    properties: dict[str, tuple[str, str]]  # param: (JSON type, description)
    required: tuple[str, ...] = ()
    write: bool = False
    streams: bool = False

    def listing(self) -> dict[str, Any]:
        props = {name: {"type": kind, "description": text} for name, (kind, text) in self.properties.items()}
        parameters = {"type": "object", "properties": props, "required": list(self.required)}
        return {"display_name": self.display_name, "tool": self.name, "type": "server",
                "permissions": {"write": self.write}, "uses_cwd": True,
                "definition": {"type": "function", "function": {"name": self.name, "description": self.description,
                                                                "parameters": parameters}}}


_GLOB = "Glob pattern of the files to include (default: **); without '/', it matches the base name"
TOOLS = (
    Tool("read_file", "Read file", files.read_file, "Read a text file, optionally a range of its lines.",
         {"path": ("string", "Path to the file"), "start_line": ("integer", "First line, 1-based (default: 1)"),
          "end_line": ("integer", "Last line, 1-based, inclusive (default: the end)"),
          "append_loc": ("boolean", "Prefix each line with its number")}, ("path",)),
    Tool("file_glob_search", "File search", search.file_glob_search,
         "Find entries under a folder matching a glob; junk folders (.git, node_modules, build...) are skipped.",
         {"path": ("string", "Folder to search in"), "include": ("string", _GLOB),
          "exclude": ("string", "Glob pattern of the entries to leave out"),
          "type": ("string", 'Entries to list: "file" (default), "dir" or "all"'),
          "max_depth": ("integer", "How deep to go (default 0 = any depth; 1 = direct children)"),
          "limit": ("integer", f"Most results (at most {search.GLOB_MAX_RESULTS})")}, ("path",)),
    Tool("grep_search", "Grep search", search.grep_search, "Search files for lines matching a regular expression.",
         {"path": ("string", "File or folder to search in"), "pattern": ("string", "Regular expression"),
          "include": ("string", _GLOB), "exclude": ("string", "Glob pattern of the files to leave out"),
          "return_line_numbers": ("boolean", "Show line numbers"),
          "literal": ("boolean", "The pattern is plain text, not a regular expression"),
          "ignore_case": ("boolean", "Ignore case"),
          "context_lines": ("integer", "Lines shown before and after each match")}, ("path", "pattern")),
    Tool("exec_shell_command", "Execute shell command", shell.exec_shell_command, "Run a shell command.",
         {"command": ("string", "Shell command to run"),
          "timeout": ("integer", f"Seconds (default {shell.DEFAULT_TIMEOUT_S}, at most {shell.MAX_TIMEOUT_S})"),
          "max_output_size": ("integer", f"Most output bytes (default {shell.MAX_OUTPUT_BYTES})")},
         ("command",), write=True, streams=True),
    Tool("write_file", "Write file", files.write_file, "Write a file (made or replaced whole).",
         {"path": ("string", "Path of the file"), "content": ("string", "Its content")}, ("path", "content"),
         write=True),
    Tool("edit_file", "Edit file", files.edit_file,
         "Replace exact text in a file: each edits[].old_text must be unique in it, and edits must not overlap.",
         {"path": ("string", "Path of the file"),
          "edits": ("array", "Replacements: objects with old_text and new_text")}, ("path", "edits"), write=True),
    Tool("get_info", "Get Runtime Info", shell.get_info, "The OS name and version, and the working folder.", {}),
)
NAMES = tuple(tool.name for tool in TOOLS)


def enabled(names: tuple[str, ...]) -> tuple[Tool, ...]:
    """The tools `--tools` names ("all": every one), in llama-server's order."""
    return tuple(tool for tool in TOOLS if "all" in names or tool.name in names)


def unknown(names: tuple[str, ...]) -> list[str]:
    return [name for name in names if name != "all" and name not in NAMES]
