"""llama-server's built-in tools for its web page (`serve --tools all`): `GET /tools` lists them and
`POST /tools {"tool": NAME, "params": {...}}` runs one on this machine: read_file, write_file,
edit_file, file_glob_search, grep_search, exec_shell_command (streamable) and get_info.

routes.py answers the HTTP side (off by default: 403; loopback clients only), place.py reads the
X-Tool-Cwd / X-Tool-Runtime headers, files.py, search.py and shell.py hold the tools, catalog.py
their names and definitions.
"""
