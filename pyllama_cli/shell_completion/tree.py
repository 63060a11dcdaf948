"""pyllama's command tree, read from the CLI into plain data for the completion scripts.

Every command, option and argument, with what each value completes to: a fixed list of names
(click's choices, or a value list of the domain such as the quant types), or something only known
at TAB time (`.gguf` files, the repo ids in the local Hugging Face cache) that the scripts leave to
the shell. Read through click's public API only: a parameter's `type`, `opts`, `nargs`, `help`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

PROG = "pyllama"

_TYPEABLE = re.compile(r"[\w.+,:/@%=-]+")  # names the scripts can hold unquoted


@dataclass(frozen=True)
class Values:
    """What an option or argument value completes to."""

    kind: str = "none"  # done by the shell at TAB time: none, file, dir, gguf (.gguf files) or hf (cached repos)
    names: tuple[str, ...] = ()  # fixed names offered as well


@dataclass(frozen=True)
class Option:
    names: tuple[str, ...]
    help: str
    values: Values | None  # None: a flag, which takes no value
    repeatable: bool = False


@dataclass(frozen=True)
class Argument:
    name: str
    values: Values
    required: bool
    variadic: bool


@dataclass(frozen=True)
class Command:
    path: tuple[str, ...]  # () for pyllama itself
    help: str
    options: tuple[Option, ...]
    arguments: tuple[Argument, ...]
    subcommands: tuple[Command, ...]

    @property
    def key(self) -> str:
        return " ".join(self.path)

    def walk(self) -> Iterator[Command]:
        yield self
        for sub in self.subcommands:
            yield from sub.walk()


# ---------------------------------------------------------------- the domain's value lists


def _quant_types() -> list[str]:
    from ..core.gguf.ftypes import QUANT_TYPES

    return [t.name for t in QUANT_TYPES]


def _tensor_types() -> list[str]:
    from ..core.gguf.ftypes import GGML_TENSOR_TYPES

    return [name.lower() for name in GGML_TENSOR_TYPES]


def _grammars() -> list[str]:
    from ..core.constrain.grammar import shipped_grammars

    return shipped_grammars()


def _chat_templates() -> list[str]:
    from ..core.text.chat_template import template_names

    return template_names()


def _flash_attn() -> list[str]:
    from ..core.model.settings import FLASH_ATTN_CHOICES

    return list(FLASH_ATTN_CHOICES)


def _bench_formats() -> list[str]:
    from ..core.bench.output import OUTPUT_FORMATS

    return list(OUTPUT_FORMATS)


def _kv_cache_types() -> list[str]:
    from ..core.bench.spec import KV_CACHE_TYPES

    return list(KV_CACHE_TYPES)


def _cache_types() -> list[str]:
    from ..core.model.settings import KV_CACHE_TYPES

    return list(KV_CACHE_TYPES)


def _sampler_names() -> list[str]:
    from ..core.generate.sampler_names import SAMPLER_LETTERS

    return list(SAMPLER_LETTERS)


def _rope_scaling() -> list[str]:
    from ..core.model.settings import ROPE_SCALING_TYPES

    return list(ROPE_SCALING_TYPES)


def _split_modes() -> list[str]:
    from ..core.model.settings import SPLIT_MODES

    return list(SPLIT_MODES)


_DOMAINS: dict[str, Callable[[], list[str]]] = {
    "quant_types": _quant_types, "tensor_types": _tensor_types, "grammars": _grammars,
    "chat_templates": _chat_templates, "flash_attn": _flash_attn, "bench_formats": _bench_formats,
    "kv_cache_types": _kv_cache_types, "cache_types": _cache_types, "sampler_names": _sampler_names,
    "rope_scaling": _rope_scaling, "split_modes": _split_modes,
}

# (command, option name or argument name) -> (kind, domain list); command "*" matches any command.
_HOOKS: dict[tuple[str, str], tuple[str, str | None]] = {
    ("*", "--model"): ("gguf", None),
    ("*", "--hf-repo"): ("hf", None),
    ("*", "--hf-file"): ("none", None),
    ("*", "--hf-token"): ("none", None),
    ("*", "--grammar"): ("none", "grammars"),
    ("*", "--chat-template"): ("file", "chat_templates"),  # a name, or a Jinja file
    ("*", "--flash-attn"): ("none", "flash_attn"),
    ("*", "--imatrix"): ("file", None),
    ("*", "--cache-type-k"): ("none", "cache_types"),
    ("*", "--cache-type-v"): ("none", "cache_types"),
    ("*", "--samplers"): ("none", "sampler_names"),
    ("*", "--rope-scaling"): ("none", "rope_scaling"),
    ("*", "--split-mode"): ("none", "split_modes"),
    ("rm", "target"): ("hf", None),  # user/repo[:quant] from the cache (a file path is typed out)
    ("stop", "model"): ("hf", None),
    ("quantize", "args"): ("gguf", "quant_types"),  # INPUT [OUTPUT] TYPE [NTHREADS]
    ("quantize", "--output-tensor-type"): ("none", "tensor_types"),
    ("quantize", "--token-embedding-type"): ("none", "tensor_types"),
    ("bench", "--output"): ("none", "bench_formats"),
    ("bench", "--cache-type-k"): ("none", "kv_cache_types"),
    ("bench", "--cache-type-v"): ("none", "kv_cache_types"),
}


def domain_names(domain: str) -> tuple[str, ...]:
    """A named value list, sorted; empty when the module that owns it is not there."""
    try:
        return tuple(sorted(set(_DOMAINS[domain]())))
    except (ImportError, AttributeError):
        return ()


# ---------------------------------------------------------------- reading the command tree


def command_tree(app: Any) -> Command:
    """Walk a Typer app's command tree (through Click's public API) into plain data."""
    import typer.main

    return root_command_tree(typer.main.get_command(app))


def root_command_tree(root: Any) -> Command:
    """Walk the tree under `root`, the click command of `pyllama` itself, into plain data."""
    return _command(root, (), root.make_context(PROG, [], resilient_parsing=True))


def _command(cmd: Any, path: tuple[str, ...], ctx: Any) -> Command:
    options, arguments = [], []
    for param in cmd.get_params(ctx):
        if getattr(param, "hidden", False):
            continue
        if param.param_type_name == "argument":
            arguments.append(Argument(param.name, _values(path, (param.name,), param, ctx),
                                      bool(param.required), param.nargs == -1))
        else:
            # Sorted: Click keeps some names (the help option's) in a set, whose order varies by run.
            names = tuple(sorted(param.opts, key=_name_order)) + tuple(sorted(param.secondary_opts, key=_name_order))
            flag = bool(getattr(param, "is_flag", False) or getattr(param, "count", False))
            options.append(Option(names, _first_sentence(param.help or ""),
                                  None if flag else _values(path, names, param, ctx), bool(param.multiple)))
    subs = []
    group = getattr(cmd, "commands", None)
    if group is not None:
        for name in sorted(cmd.list_commands(ctx)):
            sub = cmd.get_command(ctx, name)
            if sub is None or getattr(sub, "hidden", False):
                continue
            subs.append(_command(sub, path + (name,), sub.make_context(name, [], parent=ctx, resilient_parsing=True)))
    return Command(path, cmd.get_short_help_str(limit=90) if path else _first_sentence(cmd.help or ""),
                   tuple(options), tuple(arguments), tuple(subs))


def _name_order(name: str) -> tuple[bool, str]:
    return (name.startswith("--"), name)  # short names first, as in --help


def _values(path: tuple[str, ...], names: tuple[str, ...], param: Any, ctx: Any) -> Values:
    command = path[-1] if path else ""
    for name in names:
        hook = _HOOKS.get((command, name)) or _HOOKS.get(("*", name))
        if hook:
            kind, domain = hook
            return Values(kind, _typeable(domain_names(domain)) if domain else ())
    choices = _typeable(_choices(param, ctx))
    if choices:
        return Values("none", choices)
    if _is_path(param):
        return Values("dir" if _dir_only(param) else "file")
    if param.name == "file" or param.name.endswith("_file"):  # str-typed file options (-f FILE)
        return Values("file")
    return Values()


def _typeable(names: tuple[str, ...]) -> tuple[str, ...]:
    # The scripts embed names unquoted; one that would need quoting on a command line is left out.
    return tuple(n for n in names if _TYPEABLE.fullmatch(n))


def _choices(param: Any, ctx: Any) -> tuple[str, ...]:
    try:
        items = param.shell_complete(ctx, "")
    except Exception:  # noqa: BLE001 - a custom completer wanting more context than we have: no fixed list
        return ()
    return tuple(str(item.value) for item in items if getattr(item, "type", "plain") == "plain")


def _is_path(param: Any) -> bool:
    # click.Path names itself by what it accepts: "path", "file" or "directory".
    return getattr(getattr(param, "type", None), "name", "") in ("path", "file", "directory")


def _dir_only(param: Any) -> bool:
    path_type = getattr(param, "type", None)  # click.Path's dir_okay and file_okay
    return bool(getattr(path_type, "dir_okay", False)) and not getattr(path_type, "file_okay", True)


def _first_sentence(text: str) -> str:
    text = " ".join(text.split())
    match = re.search(r"(?<=[.!?])\s", text)
    return text[: match.start()] if match else text

