"""`pyllama list`, `pull`, `rm`, `ps` and `stop` against the fake Hub, a pre-filled cache and servers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pyllama_cli.core.store.servers import register_server, running_servers
from tests.fixtures.fake_hf import FakeHub
from tests.fixtures.fake_router import FakeRouter
from tests.fixtures.make_gguf import TINY, write_quantized, write_split_gguf
from tests.fixtures.terminal import Terminal
from tests.helpers import REPO_ROOT, run_cli

REPO = "org/tiny-GGUF"
CACHE_REPO = "models--org--tiny-GGUF"
JAN_2024 = 1704067200  # 2024-01-01 00:00 UTC


@pytest.fixture(scope="module")
def hub(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory):
    """org/tiny-GGUF with a Q8_0, a Q4_K_M and a two-part F16 model."""
    src = tmp_path_factory.mktemp("hub-files")
    parts = write_split_gguf(src / "split", replace(TINY, ftype="F16"), 2)
    files = {
        "tiny-Q8_0.gguf": write_quantized(tiny_model, src / "q8.gguf", "Q8_0"),
        "tiny-Q4_K_M.gguf": write_quantized(tiny_model, src / "q4km.gguf", "Q4_K_M"),
        "tiny-F16-00001-of-00002.gguf": parts[0], "tiny-F16-00002-of-00002.gguf": parts[1],
    }
    with FakeHub() as fake:
        fake.add_repo(REPO, {**files, "README.md": b"# tiny\n"})
        yield fake


@pytest.fixture
def endpoint(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> FakeHub:
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    hub.clear_requests()
    hub.range_headers.clear()
    hub.stall_after = None
    return hub


def pull(spec: str) -> Path:
    result = run_cli("pull", "-hf", spec)
    assert result.exit_code == 0, result.stderr
    return Path(result.stdout.strip())


def fill_cache(*specs: str) -> None:
    for spec in specs:
        pull(spec)
    for blob in (Path(os.environ["HF_HOME"]) / "hub" / CACHE_REPO / "blobs").iterdir():
        os.utime(blob, (JAN_2024, JAN_2024))


# ---------------------------------------------------------------- list


def test_list_shows_cached_models_and_models_dir_folders(endpoint: FakeHub, tiny_model: Path, tmp_path: Path) -> None:
    fill_cache(f"{REPO}:Q8_0", f"{REPO}:F16")
    folder = tmp_path / "models"
    folder.mkdir()
    write_split_gguf(folder / "tiny", replace(TINY, ftype="F16"), 2)
    (folder / "mmproj-tiny-F16.gguf").write_bytes(b"GGUF")  # a vision projector is not a model
    for part in folder.iterdir():
        os.utime(part, (JAN_2024, JAN_2024))
    result = run_cli("list", "--models-dir", str(folder))
    assert result.exit_code == 0, result.stderr
    split = str(folder / "tiny-00001-of-00002.gguf")
    width = len(split)  # the widest name sets the first column
    assert result.stdout.splitlines() == [
        f"{'NAME':<{width}}  QUANT  SIZE      PARTS  MODIFIED",
        f"{'org/tiny-GGUF:F16':<{width}}  F16    3.28 MiB  2      2024-01-01 00:00",
        f"{'org/tiny-GGUF:Q8_0':<{width}}  Q8_0   1.75 MiB  1      2024-01-01 00:00",
        f"{split:<{width}}  F16    3.28 MiB  2      2024-01-01 00:00",  # from the header: the name has no tag
    ]


def test_list_reads_the_quant_from_the_header_not_the_file_name(tiny_model: Path, tmp_path: Path) -> None:
    # Before: an F32 file named bar-Q8_0.gguf was listed as Q8_0, and a Q4_0 file named foo.gguf as "-".
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "bar-Q8_0.gguf").write_bytes(tiny_model.read_bytes())
    write_quantized(tiny_model, folder / "foo.gguf", "Q4_0")
    result = run_cli("list", "--models-dir", str(folder), "--json")
    assert result.exit_code == 0, result.stderr
    assert [(Path(m["path"]).name, m["quant"]) for m in json.loads(result.stdout)] == [
        ("bar-Q8_0.gguf", "F32"), ("foo.gguf", "Q4_0")]
    table = run_cli("list", "--models-dir", str(folder)).stdout.splitlines()
    assert [line.split()[:2] for line in table[1:]] == [
        [str(folder / "bar-Q8_0.gguf"), "F32"], [str(folder / "foo.gguf"), "Q4_0"]]


def test_list_json_and_the_ls_alias(endpoint: FakeHub) -> None:
    fill_cache(f"{REPO}:F16")
    result = run_cli("ls", "--json")
    assert result.exit_code == 0, result.stderr
    [entry] = json.loads(result.stdout)
    snapshot = Path(os.environ["HF_HOME"]).resolve() / "hub" / CACHE_REPO / "snapshots" / "0123456789abcdef0123456789abcdef01234567"
    assert entry == {
        "name": "org/tiny-GGUF:F16", "id": "tiny-F16", "repo": REPO, "file": "tiny-F16-00001-of-00002.gguf",
        "quant": "F16", "path": str(snapshot / "tiny-F16-00001-of-00002.gguf"), "parts": 2, "size": entry["size"],
        "modified": "2024-01-01T00:00:00Z",
    }
    assert entry["size"] == sum((snapshot / f"tiny-F16-0000{i}-of-00002.gguf").stat().st_size for i in (1, 2))


def test_list_with_nothing_cached() -> None:
    result = run_cli("list")
    assert (result.exit_code, result.stdout) == (0, "")
    cache = Path(os.environ["HF_HOME"]) / "hub"
    assert result.stderr == f"No GGUF models in {cache} yet; fetch one with: pyllama pull -hf user/repo[:quant]\n"
    assert run_cli("list", "--json").stdout == "[]\n"
    missing = run_cli("list", "--models-dir", "/nonexistent")
    assert (missing.exit_code, missing.first_stderr_line) == (1, "Error: --models-dir /nonexistent: no such folder")


# ---------------------------------------------------------------- pull


def test_pull_prints_the_path_and_json(endpoint: FakeHub) -> None:
    path = pull(f"{REPO}:Q8_0")
    assert path.name == "tiny-Q8_0.gguf" and path.is_file()
    result = run_cli("pull", "-hf", f"{REPO}:F16", "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert (data["repo"], data["file"]) == (REPO, "tiny-F16-00001-of-00002.gguf")
    assert [Path(p).name for p in data["parts"]] == ["tiny-F16-00001-of-00002.gguf", "tiny-F16-00002-of-00002.gguf"]
    assert data["size"] == sum(Path(p).stat().st_size for p in data["parts"])


def test_pull_resumes_after_a_killed_download(endpoint: FakeHub) -> None:
    endpoint.stall_after = 3 * 2**20 // 2  # the Q8_0 file is 1.75 MiB: hold it halfway
    blobs = Path(os.environ["HF_HOME"]) / "hub" / CACHE_REPO / "blobs"
    proc = subprocess.Popen([sys.executable, "-m", "pyllama_cli", "pull", "-hf", f"{REPO}:Q8_0"], cwd=REPO_ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    partial = blobs / (endpoint.get_repo(REPO).files["tiny-Q8_0.gguf"].sha256 + ".incomplete")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and _size(partial) < 2**20:
        time.sleep(0.05)
    proc.kill()
    proc.wait(timeout=10)
    kept = _size(partial)
    assert kept == 2**20, proc.stderr.read().decode()  # one whole chunk written, flushed
    endpoint.stall_after = None
    path = pull(f"{REPO}:Q8_0")
    assert endpoint.range_headers == [f"bytes={kept}-"]
    assert path.read_bytes() == endpoint.get_repo(REPO).files["tiny-Q8_0.gguf"].source.read_bytes()
    assert not partial.exists()


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


# ---------------------------------------------------------------- rm


def test_rm_one_quant_keeps_the_others(endpoint: FakeHub) -> None:
    fill_cache(f"{REPO}:Q8_0", f"{REPO}:F16")
    result = run_cli("rm", f"{REPO}:q8_0", "-y")
    assert result.exit_code == 0, result.stderr
    assert result.stderr == "Deleted org/tiny-GGUF:Q8_0 (1.75 MiB: 1 file(s) of the repo; its other quants stay)\n"
    assert [m["name"] for m in json.loads(run_cli("list", "--json").stdout)] == ["org/tiny-GGUF:F16"]
    assert len(list((Path(os.environ["HF_HOME"]) / "hub" / CACHE_REPO / "blobs").iterdir())) == 2


def test_rm_a_split_quant_deletes_every_part(endpoint: FakeHub, tmp_path: Path) -> None:
    fill_cache(f"{REPO}:Q8_0", f"{REPO}:F16")
    assert run_cli("rm", f"{REPO}:F16", "-y").stderr.startswith("Deleted org/tiny-GGUF:F16 (3.28 MiB: 2 file(s)")
    assert len(list((Path(os.environ["HF_HOME"]) / "hub" / CACHE_REPO / "blobs").iterdir())) == 1
    parts = write_split_gguf(tmp_path / "local", replace(TINY, ftype="F16"), 2)
    (tmp_path / "keep.txt").write_text("not a model")
    result = run_cli("rm", str(parts[0]), "-y", "--json")
    assert json.loads(result.stdout)["paths"] == [str(p) for p in parts]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home", "keep.txt"]
    refused = run_cli("rm", str(tmp_path / "keep.txt"), "-y")
    assert refused.first_stderr_line == f"Error: {tmp_path / 'keep.txt'} is not a GGUF model (or is a later part of a split model)"


def test_rm_a_repo_deletes_it_whole_with_json(endpoint: FakeHub) -> None:
    fill_cache(f"{REPO}:Q8_0", f"{REPO}:F16")
    result = run_cli("rm", REPO, "-y", "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    repo_dir = Path(os.environ["HF_HOME"]).resolve() / "hub" / CACHE_REPO
    assert data["deleted"] == ["org/tiny-GGUF:F16", "org/tiny-GGUF:Q8_0"]
    assert data["how"] == f"the whole repo, {repo_dir}"
    assert len(data["paths"]) == 3
    assert not repo_dir.exists()


def test_rm_off_a_terminal_needs_yes(endpoint: FakeHub) -> None:
    fill_cache(f"{REPO}:Q8_0")
    result = run_cli("rm", f"{REPO}:Q8_0")
    assert result.exit_code == 1
    assert result.stderr.splitlines() == ["Error: rm asks before deleting, and stdin is not a terminal",
                                          f"Hint: add -y to delete without asking: pyllama rm {REPO}:Q8_0 -y"]
    assert json.loads(run_cli("list", "--json").stdout)[0]["name"] == f"{REPO}:Q8_0"


def test_rm_names_what_is_not_there(endpoint: FakeHub, tmp_path: Path) -> None:
    fill_cache(f"{REPO}:Q8_0")
    result = run_cli("rm", f"{REPO}:Q2_K", "-y")
    assert result.stderr.splitlines() == [f"Error: {REPO} has no cached GGUF for quant 'Q2_K'",
                                          f"Hint: cached quants of {REPO}: Q8_0"]
    result = run_cli("rm", "org/other-GGUF", "-y")
    cache = Path(os.environ["HF_HOME"]) / "hub"
    assert result.first_stderr_line == f"Error: org/other-GGUF is not in the Hugging Face cache ({cache})"
    assert run_cli("rm", str(tmp_path / "gone.gguf"), "-y").first_stderr_line == f"Error: no such file: {tmp_path / 'gone.gguf'}"


def test_rm_refuses_a_model_a_server_has_loaded(endpoint: FakeHub) -> None:
    path = pull(f"{REPO}:Q8_0")
    card = {"id": "tiny-Q8_0", "object": "model", "path": str(path), "status": {"value": "loaded"}}
    with FakeRouter([card]) as router, register_server(router.url):
        result = run_cli("rm", f"{REPO}:Q8_0", "-y")
        assert result.exit_code == 1
        assert result.stderr.splitlines() == [
            f"Error: {REPO}:Q8_0 is loaded by the server at {router.url} (model 'tiny-Q8_0')",
            f"Hint: unload it first: pyllama stop tiny-Q8_0 --url {router.url}; or delete anyway with --force"]
        assert path.is_file()
        card["status"] = {"value": "unloaded"}
        assert run_cli("rm", f"{REPO}:Q8_0", "-y").exit_code == 0
    assert not path.exists()


def test_rm_force_deletes_a_loaded_file(tiny_model: Path, tmp_path: Path) -> None:
    model = tmp_path / "tiny-copy.gguf"
    model.write_bytes(tiny_model.read_bytes())
    with FakeRouter([{"id": "tiny-copy", "status": {"value": "loaded"}}]) as router, register_server(router.url):
        assert run_cli("rm", str(model), "-y").exit_code == 1
        result = run_cli("rm", str(model), "-y", "--force")
    assert (result.exit_code, result.stderr) == (0, f"Deleted {model} (6.53 MiB: 1 file(s))\n")
    assert not model.exists()


def test_the_registry_drops_servers_that_are_gone() -> None:
    with register_server("http://127.0.0.1:1"):
        [server] = running_servers()
        assert (server.pid, server.url) == (os.getpid(), "http://127.0.0.1:1")
        ghost = server_file = next((Path(os.environ["PYLLAMA_HOME"]) / "servers").glob("*.json"))
        ghost = server_file.with_name("999999999.json")
        ghost.write_text(json.dumps({"pid": 999999999, "url": "http://127.0.0.1:2"}))
        assert [s.url for s in running_servers()] == ["http://127.0.0.1:1"]
        assert not ghost.exists()
    assert running_servers() == []


# ---------------------------------------------------------------- ps and stop

CARDS = [
    {"id": "tiny-Q8_0", "object": "model", "path": "/m/tiny-Q8_0.gguf", "size": 1845000, "aliases": [],
     "status": {"value": "loaded"},
     "runtime": {"n_ctx": 4096, "slots_total": 2, "slots_busy": 1, "idle_s": 0, "memory_bytes": 150 * 2**20}},
    {"id": "big", "object": "model", "status": {"value": "unloaded"}},
    {"id": "tiny-F16", "object": "model", "status": {"value": "loaded"},
     "runtime": {"n_ctx": 512, "slots_total": 1, "slots_busy": 0, "idle_s": 12.5, "memory_bytes": 2 * 2**30}},
    {"id": "other", "object": "model", "status": {"value": "loading"}},
]


def test_ps_lists_the_loaded_models() -> None:
    with FakeRouter([dict(c) for c in CARDS]) as router:
        result = run_cli("ps", "--url", router.url)
    assert (result.exit_code, result.stderr) == (0, "")
    assert result.stdout.splitlines() == [
        "NAME       STATUS   MEMORY      CONTEXT  SLOTS     IDLE",
        "tiny-Q8_0  loaded   150.00 MiB  4096     1/2 busy  0s",
        "tiny-F16   loaded   2.00 GiB    512      0/1 busy  12s",
        "other      loading  -           -        -         -",
    ]


def test_ps_json_sends_the_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYLLAMA_API_KEY", "k1")
    with FakeRouter([dict(c) for c in CARDS[:2]], api_key="k1") as router:
        result = run_cli("ps", "--url", router.url, "--json")
    assert json.loads(result.stdout) == [{"id": "tiny-Q8_0", "status": "loaded", "memory_bytes": 150 * 2**20,
                                          "n_ctx": 4096, "slots_busy": 1, "slots_total": 2, "idle_s": 0,
                                          "path": "/m/tiny-Q8_0.gguf"}]
    assert router.requests == [("GET", "/v1/models", "Bearer k1", None)]


def test_ps_and_stop_say_what_is_wrong() -> None:
    result = run_cli("ps", "--url", "http://127.0.0.1:9")
    assert result.stderr.splitlines() == ["Error: no server answers at http://127.0.0.1:9 (Connection refused)",
                                          "Hint: start one with `pyllama serve`, or give its address with --host/--port or --url"]
    with FakeRouter([], api_key="k1") as router:
        result = run_cli("stop", "tiny", "--url", router.url)
    assert result.stderr.splitlines() == [f"Error: the server at {router.url} needs an API key",
                                          "Hint: give it with --api-key KEY or PYLLAMA_API_KEY"]


def test_stop_unloads_a_model() -> None:
    with FakeRouter([dict(c) for c in CARDS]) as router:
        result = run_cli("stop", "tiny-F16", "--url", router.url)
        assert (result.exit_code, result.stderr) == (0, f"Unloaded tiny-F16 from {router.url}.\n")
        assert router.requests[-1] == ("POST", "/models/unload", None, {"model": "tiny-F16"})
        result = run_cli("stop", "tiny-Q8_0", "--url", router.url, "--json")
        assert json.loads(result.stdout) == {"model": "tiny-Q8_0", "url": router.url, "unloaded": True}
        assert run_cli("ps", "--url", router.url, "--json").stdout.count('"loaded"') == 0
        again = run_cli("stop", "tiny-F16", "--url", router.url)
        unknown = run_cli("stop", "nope", "--url", router.url)
    assert again.first_stderr_line == f"Error: the server at {router.url} answered 400: model 'tiny-F16' is not loaded"
    assert unknown.first_stderr_line == (f"Error: the server at {router.url} answered 404: model 'nope' not found; "
                                         "models: tiny-Q8_0, big, tiny-F16, other")


def test_stop_takes_a_cached_repo_and_quant_as_the_server_names_it(endpoint: FakeHub) -> None:
    pull(f"{REPO}:F16")
    with FakeRouter([dict(c) for c in CARDS]) as router:
        assert run_cli("stop", f"{REPO}:f16", "--url", router.url).exit_code == 0
    assert router.requests[-1] == ("POST", "/models/unload", None, {"model": "tiny-F16"})


def test_stop_on_a_one_model_server() -> None:
    with FakeRouter([dict(CARDS[0])], one_model=True) as router:
        result = run_cli("stop", "tiny-Q8_0", "--url", router.url)
    assert result.stderr.splitlines() == [f"Error: the server at {router.url} serves one model and cannot unload it",
                                          "Hint: stop that server instead (Ctrl-C, or SIGTERM to its process)"]


def test_ps_and_stop_take_host_and_port_as_serve_does_and_a_bare_host_port() -> None:
    # Before: only --url, and --url 127.0.0.1:P without http:// was refused.
    with FakeRouter([dict(c) for c in CARDS[:2]]) as router:
        port = router.url.rsplit(":", 1)[1]
        by_port = run_cli("ps", "--host", "127.0.0.1", "--port", port, "--json")
        bare = run_cli("ps", "--url", f"127.0.0.1:{port}", "--json")
        stopped = run_cli("stop", "tiny-Q8_0", "--port", port)
    assert (by_port.exit_code, bare.exit_code) == (0, 0), by_port.stderr + bare.stderr
    assert [row["id"] for row in json.loads(by_port.stdout)] == ["tiny-Q8_0"]
    assert json.loads(bare.stdout) == json.loads(by_port.stdout)
    assert (stopped.exit_code, stopped.stderr) == (0, f"Unloaded tiny-Q8_0 from http://127.0.0.1:{port}.\n")
    assert router.requests[-1] == ("POST", "/models/unload", None, {"model": "tiny-Q8_0"})


class _PlainLlamaServer(BaseHTTPRequestHandler):
    """llama-server without router mode: a card with no status, and 404 "File Not Found" elsewhere."""

    def do_GET(self) -> None:  # noqa: N802 - the handler's API
        if self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": "tiny.gguf", "object": "model", "owned_by": "llamacpp"}]})
        else:
            self._send(404, {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}})

    do_POST = do_GET

    def _send(self, status: int, body: dict) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args: object) -> None:
        pass


def test_ps_and_stop_against_a_server_without_the_router_api_say_so_in_one_line() -> None:
    # Before: ps printed a row of "-" and "older than pyllama's router"; stop "answered 404: File Not Found".
    server = ThreadingHTTPServer(("127.0.0.1", 0), _PlainLlamaServer)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        listed = run_cli("ps", "--url", url)
        stopped = run_cli("stop", "tiny", "--url", url)
    finally:
        server.shutdown()
        server.server_close()
    assert (listed.exit_code, listed.stdout) == (0, "")
    assert listed.stderr == f"The server at {url} has no router API (llama-server?): it serves tiny.gguf.\n"
    assert stopped.exit_code == 1
    assert stopped.stderr.splitlines() == [
        f"Error: the server at {url} has no router API (llama-server, or a server that is not pyllama's): "
        "it serves one model and cannot unload it",
        "Hint: stop that server instead (Ctrl-C, or SIGTERM to its process)"]


def test_rm_refuses_what_a_real_server_has_loaded(endpoint: FakeHub, tmp_path: Path) -> None:
    path = pull(f"{REPO}:Q8_0")
    log = tmp_path / "serve.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "pyllama_cli", "serve", "-m", str(path), "--port", "0",
                                 "-t", "1", "-c", "128"], stdout=subprocess.DEVNULL, stderr=sink, cwd=REPO_ROOT)
    try:
        deadline = time.monotonic() + 60
        while "ready at" not in log.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        [server] = running_servers()
        assert server.pid == proc.pid
        result = run_cli("rm", f"{REPO}:Q8_0", "-y")
        assert result.first_stderr_line == f"Error: {REPO}:Q8_0 is loaded by the server at {server.url} (model 'tiny-Q8_0')"
        assert path.is_file()
        ps = json.loads(run_cli("ps", "--url", server.url, "--json").stdout)
        assert [(row["id"], row["status"]) for row in ps] == [("tiny-Q8_0", "loaded")]
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    assert running_servers() == []
    assert run_cli("rm", f"{REPO}:Q8_0", "-y").exit_code == 0


def test_rm_asks_on_a_terminal(endpoint: FakeHub) -> None:
    path = pull(f"{REPO}:Q8_0")
    term = Terminal("rm", f"{REPO}:Q8_0")
    try:
        term.wait_for(f"Delete {REPO}:Q8_0 (1.75 MiB: the whole repo, ")
        term.wait_for("[y/N]:")
        term.type("n\r")
        assert term.close() == 0
    finally:
        term.proc.kill()
    assert "Nothing deleted." in term.seen and path.exists()
    term = Terminal("rm", f"{REPO}:Q8_0")
    try:
        term.wait_for("[y/N]:")
        term.type("y\r")
        assert term.close() == 0
    finally:
        term.proc.kill()
    assert f"Deleted {REPO}:Q8_0" in term.seen and not path.exists()
