"""serve's access log: one line per request on stderr by default, errors with their reason, the key
never shown; `--log-format json`; `-q` for none."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx

from tests.test_serve import HELLO, _start

KEY = "s3cret-access-key"
CHAT = {"messages": HELLO, "max_tokens": 3, "temperature": 0, "ignore_eos": True}


def _request_lines(stderr: str) -> list[str]:
    """The lines after start-up and before the stop line."""
    lines = stderr.splitlines()
    ready = next(i for i, line in enumerate(lines) if "ready at" in line)
    return [line for line in lines[ready + 1:] if not line.startswith("pyllama serve: stopped")]


def test_every_request_is_one_line_and_an_error_gives_its_reason(tiny_model: Path, tmp_path: Path) -> None:
    # Before: nothing after start-up without -v, and -v added llama.cpp's log: 319 lines for two requests.
    srv = _start(tiny_model, tmp_path / "stderr.log", "--api-key", KEY)
    auth = {"Authorization": f"Bearer {KEY}"}
    try:
        with httpx.Client(base_url=srv.url, timeout=120) as client:
            usage = client.post("/v1/chat/completions", json=CHAT, headers=auth).json()["usage"]
            assert client.post("/v1/chat/completions", json={**CHAT, "messages": []}, headers=auth).status_code == 400
            assert client.post("/v1/chat/completions", json=CHAT).status_code == 401
            assert client.post(f"/v1/completions?api_key={KEY}", json={"prompt": "hi"}).status_code == 401
            assert client.get("/health").status_code == 200  # polled by balancers: not logged
            with client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}, headers=auth) as stream:
                stream.read()
    finally:
        srv.stop()
    lines = _request_lines(srv.stderr)
    assert KEY not in srv.stderr
    time = r" \d+ms"
    patterns = [
        re.escape(f"POST /v1/chat/completions 200 model=tiny prompt={usage['prompt_tokens']} generated=3") + time,
        re.escape("POST /v1/chat/completions 400 model=- prompt=- generated=-") + time
        + re.escape(" error: messages: List should have at least 1 item after validation, not 0"),
        re.escape("POST /v1/chat/completions 401 model=- prompt=- generated=-") + time + " error: .+",
        re.escape("POST /v1/completions?api_key=[REDACTED] 401 model=- prompt=- generated=-") + time + " error: .+",
        re.escape(f"POST /v1/chat/completions 200 model=tiny prompt={usage['prompt_tokens']} generated=3") + time,
    ]
    assert len(lines) == len(patterns), lines
    for line, pattern in zip(lines, patterns):
        assert re.fullmatch(pattern, line), line


def test_log_format_json_is_one_object_per_line(tiny_model: Path, tmp_path: Path) -> None:
    srv = _start(tiny_model, tmp_path / "stderr.log", "--log-format", "json")
    try:
        usage = httpx.post(f"{srv.url}/v1/chat/completions", json=CHAT, timeout=120).json()["usage"]
        httpx.get(f"{srv.url}/v1/nope", timeout=30)
    finally:
        srv.stop()
    first, second = (json.loads(line) for line in _request_lines(srv.stderr))
    assert isinstance(first.pop("time_ms"), float) and isinstance(second.pop("time_ms"), float)
    assert first == {"method": "POST", "path": "/v1/chat/completions", "model": "tiny", "status": 200,
                     "prompt_tokens": usage["prompt_tokens"], "generated_tokens": 3, "error": None}
    assert second == {"method": "GET", "path": "/v1/nope", "model": None, "status": 404, "prompt_tokens": None,
                      "generated_tokens": None, "error": "no such endpoint: GET /v1/nope"}


def test_quiet_logs_no_request(tiny_model: Path, tmp_path: Path) -> None:
    srv = _start(tiny_model, tmp_path / "stderr.log", "-q")
    try:
        assert httpx.post(f"{srv.url}/v1/chat/completions", json=CHAT, timeout=120).status_code == 200
        assert httpx.get(f"{srv.url}/v1/nope", timeout=30).status_code == 404
    finally:
        srv.stop()
    assert _request_lines(srv.stderr) == []


def test_verbose_gives_the_prompts_tokens_by_part_and_not_llama_cpps_log(tiny_model: Path, tmp_path: Path) -> None:
    from tests.test_serve import WEATHER

    srv = _start(tiny_model, tmp_path / "stderr.log", "-v")
    try:
        body = {**CHAT, "messages": [{"role": "system", "content": "Be brief."}, *HELLO], "tools": [WEATHER]}
        usage = httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=120).json()["usage"]
    finally:
        srv.stop()
    [line] = [line for line in srv.stderr.splitlines() if line.startswith("POST ")]
    parts = re.search(r"\(prompt (\d+) tokens: tools (\d+), system (\d+), messages (\d+), template (\d+)\)", line)
    total, tools, system, messages, template = map(int, parts.groups())
    assert total == usage["prompt_tokens"] == tools + system + messages + template
    assert tools > 100 and 0 < system < 10 and 0 < messages < 10 and template > 0
    assert "llama_" not in srv.stderr  # llama.cpp's own log is --verbose-native now


def test_verbose_native_shows_llama_cpps_own_log(tiny_model: Path, tmp_path: Path) -> None:
    srv = _start(tiny_model, tmp_path / "stderr.log", "--verbose-native")
    srv.stop()
    assert "llama_model_loader: " in srv.stderr


def test_no_stray_llama_cpp_line_at_shutdown_after_a_tool_grammar(tiny_model: Path, tmp_path: Path) -> None:
    # Building a tool call's grammar imported the llama_cpp package, whose own log callback then printed
    # `~llama_context: CPU compute buffer size ...` when the server stopped.
    from tests.test_serve import WEATHER

    srv = _start(tiny_model, tmp_path / "stderr.log")
    try:
        body = {**CHAT, "max_tokens": 2, "tools": [WEATHER], "tool_choice": "required"}
        assert httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=120).status_code == 200
    finally:
        srv.stop()
    assert srv.stderr.splitlines()[-1] == "pyllama serve: stopped (SIGTERM)"
    assert "llama" not in srv.stderr.replace("pyllama", "")
