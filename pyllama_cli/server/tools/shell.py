"""exec_shell_command (`sh -c COMMAND` in the request's cwd; stdout and stderr together, then
"[exit code: N]"), whole or streamed chunk by chunk, and get_info (the OS and the cwd).

A command runs in its own process group, so a timeout (10 s by default, at most 60) ends what it
started too.
"""

from __future__ import annotations

import asyncio
import codecs
import os
import platform
import signal
import subprocess
from collections.abc import AsyncIterator
from typing import Any

from .place import Place

DEFAULT_TIMEOUT_S = 10
MAX_TIMEOUT_S = 60
MAX_OUTPUT_BYTES = 16 * 1024


def _limits(params: dict[str, Any]) -> tuple[str, int, int]:
    command = params["command"]
    if not isinstance(command, str):
        raise TypeError('"command" must be a string')
    timeout = min(int(params.get("timeout", DEFAULT_TIMEOUT_S)), MAX_TIMEOUT_S)
    size = min(int(params.get("max_output_size", MAX_OUTPUT_BYTES)), MAX_OUTPUT_BYTES)
    return command, max(timeout, 1), max(size, 0)


def _tail(code: int, timed_out: bool) -> str:
    return f"\n[exit code: {code}]" + (" [exit due to timed out]" if timed_out else "")


def exec_shell_command(params: dict[str, Any], place: Place) -> dict[str, Any]:
    command, timeout, size = _limits(params)
    process = subprocess.Popen(["sh", "-c", command], cwd=place.workdir, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    timed_out = False
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(process.pid)
        output, _ = process.communicate()
    text = output[:size].decode("utf-8", errors="replace")
    return {"plain_text_response": text + _tail(process.returncode, timed_out)}


async def stream_shell_command(params: dict[str, Any], place: Place) -> AsyncIterator[str]:
    """The command's output as it comes, then its exit line (the caller adds the final event)."""
    command, timeout, size = _limits(params)
    process = await asyncio.create_subprocess_exec(
        "sh", "-c", command, cwd=place.workdir, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        stdin=asyncio.subprocess.DEVNULL, start_new_session=True)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    sent, timed_out = 0, False
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a character split across reads stays whole
    try:
        while True:
            try:
                chunk = await asyncio.wait_for(process.stdout.read(4096), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                timed_out = True
                _kill_group(process.pid)
                break
            if not chunk:
                break
            text = decoder.decode(chunk[:max(0, size - sent)])
            sent += len(chunk)
            if text:
                yield text
        code = await process.wait()
        yield decoder.decode(b"", final=True) + _tail(code, timed_out)
    finally:
        if process.returncode is None:  # the client went away mid-stream
            _kill_group(process.pid)
            await process.wait()


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def get_info(params: dict[str, Any], place: Place) -> dict[str, Any]:
    uname = platform.uname()
    return {"os": f"{uname.system} {uname.node} {uname.release} {uname.version} {uname.machine}",
            "cwd": place.workdir}
