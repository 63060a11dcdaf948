"""llama-server's built-in tools (`serve --tools`) on a real server: POST /tools runs read_file,
write_file, edit_file, file_glob_search, grep_search and exec_shell_command with llama-server's result
shapes; X-Tool-Cwd decides the folder; bad runtimes and injections are refused; off by default."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.test_serve import Server, spawn_serve


@pytest.fixture(scope="module")
def server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = spawn_serve(tmp_path_factory.mktemp("tools") / "stderr.log", ["-m", str(tiny_model), "-c", "256",
                                                                        "--tools", "all"])
    yield srv
    srv.stop()


def _call(server: Server, tool: str, params: dict, headers: dict | None = None) -> httpx.Response:
    return httpx.post(f"{server.url}/tools", json={"tool": tool, "params": params}, headers=headers, timeout=30)


def _ok(server: Server, tool: str, params: dict, headers: dict | None = None) -> dict:
    response = _call(server, tool, params, headers)
    assert response.status_code == 200, response.text
    return response.json()


def test_write_read_and_edit_a_file(server: Server, tmp_path: Path) -> None:
    path = str(tmp_path / "notes.txt")
    assert _ok(server, "write_file", {"path": path, "content": "alpha\nbeta\ngamma\n"}) == {
        "result": "file written successfully", "path": path, "bytes": 17}
    assert _ok(server, "read_file", {"path": path, "start_line": 2, "append_loc": True}) == {
        "plain_text_response": "2\u2192beta\n3\u2192gamma\n"}
    edits = [{"old_text": "gamma\n", "new_text": "gamma\ndelta\n"}, {"old_text": "alpha", "new_text": "ALPHA"}]
    assert _ok(server, "edit_file", {"path": path, "edits": edits}) == {
        "result": "file edited successfully", "path": path, "edits_applied": 2}
    assert Path(path).read_text() == "ALPHA\nbeta\ngamma\ndelta\n"


def test_edits_that_are_not_unique_or_overlap_change_nothing(server: Server, tmp_path: Path) -> None:
    target = tmp_path / "dup.txt"
    target.write_text("one\none\ntwo\n")
    same = _ok(server, "edit_file", {"path": str(target), "edits": [{"old_text": "one", "new_text": "1"}]})
    assert same == {"error": f"found 2 occurrences of edits[0].old_text in {target}, it must be unique"}
    overlapping = [{"old_text": "one\ntwo", "new_text": "x"}, {"old_text": "two\n", "new_text": "y"}]
    assert _ok(server, "edit_file", {"path": str(target), "edits": overlapping}) == {
        "error": f"edits[0] and edits[1] overlap in {target}; merge them into one edit or target disjoint regions"}
    missing = _ok(server, "edit_file", {"path": str(target), "edits": [{"old_text": "three", "new_text": "3"}]})
    assert missing["error"].startswith("could not find edits[0].old_text")
    assert target.read_text() == "one\none\ntwo\n"


def test_file_glob_search_lists_dirs_skips_junk_and_limits(server: Server, tmp_path: Path) -> None:
    (tmp_path / "src" / "deep").mkdir(parents=True)
    (tmp_path / "node_modules" / "pkg").mkdir(parents=True)
    (tmp_path / "node_modules" / "pkg" / "index.js").write_text("x")
    (tmp_path / "src" / "a.py").write_text("a")
    (tmp_path / "src" / "deep" / "b.py").write_text("b")
    (tmp_path / "top.py").write_text("t")
    files = _ok(server, "file_glob_search", {"path": str(tmp_path), "include": "*.py"})
    assert files == {"plain_text_response": "src/a.py\nsrc/deep/b.py\ntop.py\n\n---\nTotal matches: 3\n",
                     "entries": [{"path": "src/a.py", "type": "file"}, {"path": "src/deep/b.py", "type": "file"},
                                 {"path": "top.py", "type": "file"}], "base": str(tmp_path)}
    dirs = _ok(server, "file_glob_search", {"path": str(tmp_path), "type": "dir", "max_depth": 1})
    assert dirs["entries"] == [{"path": "node_modules", "type": "dir"}, {"path": "src", "type": "dir"}]
    limited = _ok(server, "file_glob_search", {"path": str(tmp_path), "include": "src/**", "limit": 1})
    assert limited["plain_text_response"] == (
        "src/a.py\n\n---\nTotal matches: 2\n"
        "[1 results limit reached (2 total matches). Refine the glob pattern to narrow the search.]\n")
    assert _ok(server, "file_glob_search", {"path": str(tmp_path), "type": "bogus"}) == {
        "error": 'invalid type: bogus (expected "file", "dir" or "all")'}


def test_grep_search_names_each_match(server: Server, tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("red\ngreen\nblue\n")
    (tmp_path / "b.md").write_text("greenish\n")
    found = _ok(server, "grep_search", {"path": str(tmp_path), "pattern": "gre+n", "return_line_numbers": True})
    assert found == {"plain_text_response": "a.txt:2:green\nb.md:1:greenish\n\n---\nTotal matches: 2\n"}
    only_txt = _ok(server, "grep_search", {"path": str(tmp_path), "pattern": "green", "include": "*.txt"})
    assert only_txt == {"plain_text_response": "a.txt:green\n\n---\nTotal matches: 1\n"}


def test_the_cwd_header_places_relative_paths_and_commands(server: Server, tmp_path: Path) -> None:
    headers = {"X-Tool-Cwd": str(tmp_path)}
    _ok(server, "write_file", {"path": "sub/out.txt", "content": "hi", "cwd": "/nowhere"}, headers)
    assert (tmp_path / "sub" / "out.txt").read_text() == "hi"
    ran = _ok(server, "exec_shell_command", {"command": "cat sub/out.txt; pwd; exit 3"}, headers)
    assert ran == {"plain_text_response": f"hi{tmp_path}\n\n[exit code: 3]"}


def test_a_streamed_command_sends_chunks_then_done(server: Server, tmp_path: Path) -> None:
    body = {"tool": "exec_shell_command", "params": {"command": "echo one; echo twö >&2"}, "stream": True}
    with httpx.stream("POST", f"{server.url}/tools", json=body, timeout=30) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[len("data: "):]) for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == {"done": True}
    assert "".join(event["chunk"] for event in events[:-1]) == "one\ntwö\n\n[exit code: 0]"


def test_a_command_past_its_timeout_is_ended_with_its_children(server: Server) -> None:
    started = time.monotonic()
    ran = _ok(server, "exec_shell_command", {"command": "echo begun; sleep 30 & sleep 30", "timeout": 1})
    assert time.monotonic() - started < 10
    text = ran["plain_text_response"]
    assert text.startswith("begun\n\n[exit code: ") and text.endswith("] [exit due to timed out]")


@pytest.mark.parametrize(("runtime", "message"), [
    ("fake:x", "unknown tool runtime: fake:x"),
    ("ssh:-oProxyCommand=touch /tmp/pwned", "invalid ssh target: -oProxyCommand=touch /tmp/pwned"),
    ("docker-container:--privileged", "invalid container id: --privileged"),
    ("podman:busybox", "tool runtime must name a running container: podman:busybox"),
])
def test_runtimes_that_could_escape_are_refused(server: Server, runtime: str, message: str) -> None:
    response = _call(server, "exec_shell_command", {"command": "echo hi"}, {"X-Tool-Runtime": runtime})
    assert response.status_code == 500
    assert response.json()["error"]["message"] == message


def test_unknown_tools_and_other_origins_are_refused(server: Server) -> None:
    unknown = _call(server, "rm_rf", {})
    assert (unknown.status_code, unknown.json()["error"]["message"]) == (404, 'unknown tool "rm_rf"')
    elsewhere = _call(server, "get_info", {}, {"Origin": "http://evil.example"})
    assert (elsewhere.status_code, elsewhere.json()["error"]["message"]) == (
        403, "the built-in tools answer loopback clients only")
    listed = httpx.get(f"{server.url}/tools", timeout=30).json()
    assert [t["tool"] for t in listed] == ["read_file", "file_glob_search", "grep_search", "exec_shell_command",
                                          "write_file", "edit_file", "get_info"]
    assert listed[3]["permissions"] == {"write": True} and listed[3]["definition"]["function"]["name"] == (
        "exec_shell_command")


def test_tools_are_off_unless_asked(tiny_model: Path, tmp_path: Path) -> None:
    srv = spawn_serve(tmp_path / "stderr.log", ["-m", str(tiny_model), "-c", "256"])
    try:
        for response in (httpx.get(f"{srv.url}/tools", timeout=30),
                         httpx.post(f"{srv.url}/tools", json={"tool": "get_info", "params": {}}, timeout=30)):
            assert response.status_code == 403
            assert response.json()["error"]["message"] == "this feature is disabled"
            assert response.json()["error"]["type"] == "feature_disabled"
    finally:
        srv.stop()


def test_an_unknown_tool_name_stops_the_server_from_starting() -> None:
    from tests.helpers import run_cli

    result = run_cli("serve", "-m", "unused.gguf", "--tools", "read_file,rm_rf")
    assert result.exit_code == 2
    assert result.stderr.splitlines()[0] == (
        'Error: --tools: unknown tool "rm_rf". available tools: read_file, file_glob_search, grep_search, '
        "exec_shell_command, write_file, edit_file, get_info")
