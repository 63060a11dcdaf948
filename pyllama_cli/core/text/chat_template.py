"""Render a conversation with a chat template: the model's own (GGUF `tokenizer.chat_template`),
a named built-in, or a Jinja file.

Templates are Jinja2, rendered in a sandbox with the helpers HF-style templates expect
(`raise_exception`, `strftime_now`, `bos_token`, `eos_token`, `add_generation_prompt`, `tools`).
"""

from __future__ import annotations

import json
import math
import re
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from ...errors import InputError

def _llama2(*, system_block: bool, bos_in_history: bool, strip: bool) -> str:
    """Llama 2's [INST] format as llama.cpp's built-ins of that name render it."""
    content = "(m['content'] | trim)" if strip else "m['content']"
    system = (f"'<<SYS>>\\n' + {content} + '\\n<</SYS>>\\n\\n'" if system_block else f"{content} + '\\n'")
    again = "'<s>[INST] '" if bos_in_history else "'[INST] '"
    return (
        "{%- set ns = namespace(inside=true) -%}{{- '[INST] ' -}}"
        "{%- for m in messages -%}"
        f"{{%- if not ns.inside -%}}{{%- set ns.inside = true -%}}{{{{- {again} -}}}}{{%- endif -%}}"
        f"{{%- if m['role'] == 'system' -%}}{{{{- {system} -}}}}"
        f"{{%- elif m['role'] == 'user' -%}}{{{{- {content} + ' [/INST]' -}}}}"
        f"{{%- else -%}}{{{{- {content} + '</s>' -}}}}{{%- set ns.inside = false -%}}"
        "{%- endif -%}"
        "{%- endfor -%}"
    )


# Built-in templates, written for pyllama. Each renders `messages` (role, content) and, with
# add_generation_prompt, opens the assistant's turn.
BUILTIN_TEMPLATES: dict[str, str] = {
    "chatml": (
        "{%- for m in messages -%}"
        "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' -}}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
    ),
    # Llama 2 chat, in llama.cpp's four spellings: "llama2" puts a system prompt before the first
    # message as plain text, the -sys ones in a <<SYS>> block; -sys-bos writes <s> before each later
    # [INST], -sys-strip trims every message. No BOS first: the tokenizer adds it.
    "llama2": _llama2(system_block=False, bos_in_history=False, strip=False),
    "llama2-sys": _llama2(system_block=True, bos_in_history=False, strip=False),
    "llama2-sys-bos": _llama2(system_block=True, bos_in_history=True, strip=False),
    "llama2-sys-strip": _llama2(system_block=True, bos_in_history=False, strip=True),
    # Llama 3 / 3.x instruct: header-delimited turns, each closed by <|eot_id|>.
    "llama3": (
        "{{- bos_token -}}"
        "{%- for m in messages -%}"
        "{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' -}}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}"
    ),
    # Mistral instruct (v1-v3): no system role, so the system prompt leads the first user turn.
    "mistral": (
        "{%- set ns = namespace(system='') -%}"
        "{{- bos_token -}}"
        "{%- for m in messages -%}"
        "{%- if m['role'] == 'system' -%}{%- set ns.system = m['content'] -%}"
        "{%- elif m['role'] == 'user' -%}"
        "{{- '[INST] ' -}}"
        "{%- if ns.system -%}{{- ns.system + '\\n\\n' -}}{%- set ns.system = '' -%}{%- endif -%}"
        "{{- m['content'] + '[/INST]' -}}"
        "{%- else -%}{{- ' ' + m['content'] + eos_token -}}"
        "{%- endif -%}"
        "{%- endfor -%}"
    ),
    # Gemma: roles user/model; no system role, so the system prompt leads the first user turn.
    "gemma": (
        "{%- set ns = namespace(system='') -%}"
        "{{- bos_token -}}"
        "{%- for m in messages -%}"
        "{%- if m['role'] == 'system' -%}{%- set ns.system = m['content'] -%}"
        "{%- else -%}"
        "{{- '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\\n' -}}"
        "{%- if ns.system and m['role'] == 'user' -%}{{- ns.system + '\\n\\n' -}}{%- set ns.system = '' -%}{%- endif -%}"
        "{{- m['content'] | trim + '<end_of_turn>\\n' -}}"
        "{%- endif -%}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}"
    ),
    # Phi-3: <|role|> headers, each turn closed by <|end|>.
    "phi3": (
        "{%- for m in messages -%}"
        "{{- '<|' + m['role'] + '|>\\n' + m['content'] + '<|end|>\\n' -}}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}"
    ),
    # Zephyr: <|role|> headers, each turn closed by the EOS token.
    "zephyr": (
        "{%- for m in messages -%}"
        "{{- '<|' + m['role'] + '|>\\n' + m['content'] + '<|endoftext|>\\n' -}}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}"
    ),
}

# Text that ends a turn in each built-in format: a stop string in case the model's vocabulary does
# not treat it as an end-of-generation token (a template forced onto another model family).
TURN_END_MARKERS: dict[str, tuple[str, ...]] = {
    "chatml": ("<|im_end|>",), "llama3": ("<|eot_id|>",), "gemma": ("<end_of_turn>",),
    "phi3": ("<|end|>",), "llama2": (), "llama2-sys": (), "llama2-sys-bos": (), "llama2-sys-strip": (),
    "mistral": (), "zephyr": ("<|endoftext|>",),
}


class TemplateError(InputError):
    """A chat template that cannot be found, parsed or rendered."""


def template_names() -> list[str]:
    return sorted(BUILTIN_TEMPLATES)


def resolve_template(model_template: str | None, override: str | None) -> tuple[str, str]:
    """The template text and a short name for it (shown in banners).

    Args:
        model_template: the GGUF's `tokenizer.chat_template`, if any.
        override: `--chat-template NAME|FILE|JINJA` from the user, if given.

    Raises:
        TemplateError: no template at all, or an override that names nothing usable.
    """
    if override:
        if override in BUILTIN_TEMPLATES:
            return BUILTIN_TEMPLATES[override], override
        path = Path(override).expanduser()
        if path.suffix in {".jinja", ".j2", ".txt"} or path.exists():
            return _read_template_file(path), path.name
        if "{%" in override or "{{" in override:
            return override, "custom"
        raise TemplateError(f"unknown chat template {override!r}",
                            hint="built-in names: " + ", ".join(template_names()) + "; or give a .jinja file")
    if model_template:
        return model_template, "model (GGUF)"
    raise TemplateError("the model has no chat template",
                        hint="pass --chat-template NAME|FILE (built-ins: " + ", ".join(template_names()) + ")")


def _read_template_file(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TemplateError(f"cannot read chat template file {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise TemplateError(f"chat template file {path} is not UTF-8 text (byte {exc.start})",
                            hint="a template is Jinja text, as in a model's tokenizer_config.json") from None
    if not text.strip():
        raise TemplateError(f"chat template file {path} is empty",
                            hint="a template is Jinja text, as in a model's tokenizer_config.json")
    return text


# Templates come from GGUF files and users, so rendering one must stay bounded: no string or list
# (an intermediate or the output) beyond MAX_ITEMS items, no integer beyond MAX_INT_BITS bits.
# A real chat prompt is far below both (10 million characters are millions of tokens).
MAX_ITEMS = 10_000_000
MAX_INT_BITS = 1_000_000
_SEQUENCES = (str, list, tuple)
# `%`-format conversions: an optional (key), flags, then the width and precision, which size the result.
_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\d*|\*)(?:\.(\d*|\*))?")
_WIDTH_METHODS = frozenset({"center", "ljust", "rjust", "zfill", "expandtabs"})


def check_template(template: str) -> None:
    """Raise TemplateError now for a template that does not parse, instead of at every message.

    Raises:
        TemplateError: a Jinja syntax error (with its line).
    """
    try:
        _compile(template)
    except TemplateError as exc:
        raise TemplateError(exc.message, hint="pass --chat-template NAME|FILE (built-ins: "
                            + ", ".join(template_names()) + ")") from None


@lru_cache(maxsize=16)
def _compile(template: str) -> Any:
    from jinja2 import TemplateSyntaxError

    env = _bounded_environment()
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.filters["tojson"] = _tojson
    try:
        return env.from_string(template)
    except TemplateSyntaxError as exc:
        raise TemplateError(f"chat template does not parse: {exc.message} (line {exc.lineno})") from exc


def _bounded_environment() -> Any:
    """jinja2's immutable sandbox, with the operators and methods that can blow up sizes checked first."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class BoundedEnvironment(ImmutableSandboxedEnvironment):
        # Intercepted operators also escape jinja's constant folding, so `"x" * 10**10` cannot hang the parse.
        intercepted_binops = frozenset({"+", "*", "**", "%"})

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            _check_binop(operator, left, right)
            return super().call_binop(context, operator, left, right)

        # Positional-only, as in jinja: a template may pass keyword arguments named `context` or `obj`.
        def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
            _check_width_call(obj, args, kwargs)
            return super().call(context, obj, *args, **kwargs)

    return BoundedEnvironment(trim_blocks=True, lstrip_blocks=True)


def _check_binop(operator: str, left: Any, right: Any) -> None:
    """Refuse an operation whose result would be too large, before Python starts building it."""
    if operator == "+" and isinstance(left, _SEQUENCES) and isinstance(right, _SEQUENCES):
        _check_items(operator, len(left) + len(right))
    elif operator == "*":
        _check_product(left, right)
    elif operator == "**" and _is_int(left) and _is_int(right) and right > 0 and abs(left) > 1:
        _check_int_bits(operator, int(right * math.log2(abs(left))) + 1)
    elif operator == "%" and isinstance(left, str):
        _check_percent_format(left, right)


def _check_product(left: Any, right: Any) -> None:
    if _is_int(left) and _is_int(right):
        _check_int_bits("*", left.bit_length() + right.bit_length())
    elif isinstance(left, _SEQUENCES) and _is_int(right):
        _check_items("*", len(left) * right)
    elif _is_int(left) and isinstance(right, _SEQUENCES):
        _check_items("*", left * len(right))


def _check_percent_format(fmt: str, args: Any) -> None:
    """`"%10000000000d" % 1` allocates its width: check the widths and precisions, written or given by `*`."""
    sizes = [int(n) for spec in _PERCENT_SPEC.findall(fmt) for n in spec if n.isdigit()]
    if "*" in fmt:
        sizes += [abs(a) for a in (args if isinstance(args, tuple) else (args,)) if _is_int(a)]
    _check_items("%", max(sizes, default=0))


def _check_width_call(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """`"x".ljust(10**10)` and the like allocate their width argument."""
    if isinstance(getattr(func, "__self__", None), str) and getattr(func, "__name__", "") in _WIDTH_METHODS:
        _check_items(f"str.{func.__name__}", max((abs(a) for a in (*args, *kwargs.values()) if _is_int(a)), default=0))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_items(operation: str, size: int) -> None:
    if size > MAX_ITEMS:
        raise _render_failure(f"the result of {operation!r} would hold {_amount(size)} items (the limit is {MAX_ITEMS:,})")


def _check_int_bits(operation: str, bits: int) -> None:
    if bits > MAX_INT_BITS:
        raise _render_failure(f"the result of {operation!r} would be an integer of about {_amount(bits)} bits "
                              f"(the limit is {MAX_INT_BITS:,})")


def _amount(n: int) -> str:
    # Beyond 10**18 the exact figure says nothing more (and past 4300 digits Python will not print it).
    return f"{n:,}" if n < 10**18 else "more than 10^18"


def _tojson(value: Any, indent: Any = None, **_: Any) -> str:
    if _is_int(indent):
        _check_items("tojson indent", indent)
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _raise_exception(message: str) -> None:
    raise TemplateError(f"chat template refused the conversation: {message}")


def render_template(template: str, messages: list[dict[str, Any]], *, bos_token: str = "", eos_token: str = "",
                    add_generation_prompt: bool = True, tools: list[dict[str, Any]] | None = None,
                    **extra: Any) -> str:
    """Render `messages` with a Jinja chat template text.

    Raises:
        TemplateError: the template does not parse, refuses the conversation, or fails while rendering
            (any exception it raises, or a result over the size limits).
    """
    from jinja2 import TemplateError as JinjaError

    try:
        return _render_bounded(_compile(template), dict(
            messages=messages, bos_token=bos_token, eos_token=eos_token,
            add_generation_prompt=add_generation_prompt, tools=tools, **extra,
        ))
    except TemplateError:
        raise
    except JinjaError as exc:
        raise _render_failure(str(exc)) from exc
    except Exception as exc:  # a template is code from a file or a user: whatever it raises is its failure
        raise _render_failure(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__) from exc


def _render_bounded(compiled: Any, variables: dict[str, Any]) -> str:
    """Render piece by piece, stopping as soon as the output outgrows MAX_ITEMS characters
    (a loop printing a large string many times would otherwise fill memory before any check)."""
    pieces, size = [], 0
    for piece in compiled.generate(variables):
        size += len(piece)
        if size > MAX_ITEMS:
            raise _render_failure(f"its output would exceed {MAX_ITEMS:,} characters")
        pieces.append(piece)
    return "".join(pieces)


def _render_failure(detail: str) -> TemplateError:
    # The template is at fault (not the conversation): the way out is another template.
    return TemplateError(f"chat template failed to render: {detail}",
                         hint="pass --chat-template NAME|FILE to use another template (built-ins: "
                              + ", ".join(template_names()) + ")")


def render_chat(model: Any, messages: list[dict[str, Any]], template: str | None = None,
                add_generation_prompt: bool = True, tools: list[dict[str, Any]] | None = None,
                template_kwargs: dict[str, Any] | None = None) -> str:
    """Render a conversation for `model` (a native.Model) with its template or `template` (NAME|FILE|JINJA).

    `template_kwargs` are more variables for the template (a request's chat_template_kwargs, such as
    enable_thinking); they cannot replace the ones set here.
    """
    text, _ = resolve_template(model.chat_template(), template)
    fixed = {"messages", "bos_token", "eos_token", "add_generation_prompt", "tools"}
    extra = {k: v for k, v in (template_kwargs or {}).items() if k not in fixed}
    return render_template(
        text, messages, bos_token=_token_text(model, model.bos), eos_token=_token_text(model, model.eos),
        add_generation_prompt=add_generation_prompt, tools=tools, **extra,
    )


def _token_text(model: Any, token: int) -> str:
    if token < 0:
        return ""
    return model.token_to_piece(token, special=True).decode("utf-8", errors="replace")


def validate_messages(data: Any) -> list[dict[str, Any]]:
    """Check a parsed JSON value is a list of {role, content} messages; content may be text parts."""
    if not isinstance(data, list) or not data:
        raise InputError("chat messages must be a non-empty JSON list of {\"role\", \"content\"} objects")
    out = []
    for i, m in enumerate(data):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise InputError(f"message {i} has no \"role\" string: {json.dumps(m)[:80]}")
        if "content" not in m and not m.get("tool_calls"):  # only a message of tool calls may go without
            raise InputError(f"message {i} has no \"content\": {json.dumps(m)[:80]}")
        content = m.get("content", "")
        if content is None and m.get("tool_calls"):
            content = ""
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        if not isinstance(content, str):
            raise InputError(f"message {i} \"content\" must be a string or a list of text parts")
        out.append({**m, "content": content})
    return out
