"""Where a tool runs: the host, in the directory the X-Tool-Cwd header names (the model's own `cwd`
param never counts), or an isolate the X-Tool-Runtime header names.

llama-server's isolates are `ssh:TARGET` and `docker-container:ID` / `podman-container:ID`. pyllama
checks them as it does (a target or id that could be read as an option is refused, an unknown scheme
never falls back to the host) but runs tools on the host only: a valid isolate is refused as not built.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ..errors import APIError

_SSH_TARGET = re.compile(r"[A-Za-z0-9._@-]+")
_CONTAINER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
CONTAINER_ENGINES = ("docker", "podman")


@dataclass(frozen=True)
class Place:
    cwd: str = ""  # "" = the server's own working directory

    def resolve(self, path: str) -> str:
        """`path` made absolute: relative ones against the header's cwd, else the server's."""
        expanded = os.path.expanduser(path)
        if os.path.isabs(expanded):
            return expanded
        return os.path.abspath(os.path.join(self.cwd or os.getcwd(), expanded))

    @property
    def workdir(self) -> str:
        return self.cwd or os.getcwd()


def place_of(cwd: str, runtime: str) -> Place:
    """The place for a request's headers; APIError 500 (llama-server's status) for a runtime refused."""
    if runtime:
        raise APIError(500, _runtime_refusal(runtime))
    return Place(cwd)


def _runtime_refusal(runtime: str) -> str:
    for engine in CONTAINER_ENGINES:
        attach = f"{engine}-container:"
        if runtime.startswith(attach):
            container = runtime[len(attach):]
            if not _CONTAINER_ID.fullmatch(container):
                return f"invalid container id: {container}"
            return f"tool runtime not supported by pyllama (tools run on the host only): {runtime}"
        if runtime.startswith(f"{engine}:"):
            return f"tool runtime must name a running container: {runtime}"
    if runtime.startswith("ssh:"):
        target = runtime[len("ssh:"):]
        if not target or target.startswith("-") or not _SSH_TARGET.fullmatch(target):
            return f"invalid ssh target: {target}"
        return f"tool runtime not supported by pyllama (tools run on the host only): {runtime}"
    return f"unknown tool runtime: {runtime}"
