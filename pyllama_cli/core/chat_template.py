"""Render a conversation with a chat template: the model's own (GGUF `tokenizer.chat_template`),
a named built-in, or a Jinja file.

Templates are Jinja2, rendered in a sandbox with the helpers HF-style templates expect
(`raise_exception`, `strftime_now`, `bos_token`, `eos_token`, `add_generation_prompt`, `tools`).
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..errors import InputError

# Built-in templates, written for pyllama. Each renders `messages` (role, content) and, with
# add_generation_prompt, opens the assistant's turn.
BUILTIN_TEMPLATES: dict[str, str] = {
    "chatml": (
        "{%- for m in messages -%}"
        "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' -}}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
    ),
    # Llama 2 chat: the system prompt sits in <<SYS>> inside the first [INST]; every exchange is
    # wrapped in BOS ... EOS.
    "llama2": (
        "{%- set ns = namespace(system='') -%}"
        "{%- for m in messages -%}"
        "{%- if m['role'] == 'system' -%}{%- set ns.system = m['content'] -%}"
        "{%- elif m['role'] == 'user' -%}"
        "{{- bos_token + '[INST] ' -}}"
        "{%- if ns.system -%}{{- '<<SYS>>\\n' + ns.system + '\\n<</SYS>>\\n\\n' -}}{%- set ns.system = '' -%}{%- endif -%}"
        "{{- m['content'] | trim + ' [/INST]' -}}"
        "{%- else -%}{{- ' ' + m['content'] | trim + ' ' + eos_token -}}"
        "{%- endif -%}"
        "{%- endfor -%}"
    ),
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
        "{{- '<|' + m['role'] + '|>\\n' + m['content'] + eos_token + '\\n' -}}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}"
    ),
}

# Text that ends a turn in each built-in format: a stop string in case the model's vocabulary does
# not treat it as an end-of-generation token (a template forced onto another model family).
TURN_END_MARKERS: dict[str, tuple[str, ...]] = {
    "chatml": ("<|im_end|>",), "llama3": ("<|eot_id|>",), "gemma": ("<end_of_turn>",),
    "phi3": ("<|end|>",), "llama2": (), "mistral": (), "zephyr": (),
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
        if path.suffix in {".jinja", ".j2", ".txt"} or path.is_file():
            try:
                return path.read_text(encoding="utf-8"), path.name
            except OSError as exc:
                raise TemplateError(f"cannot read chat template file {path}: {exc.strerror}") from exc
        if "{%" in override or "{{" in override:
            return override, "custom"
        raise TemplateError(f"unknown chat template {override!r}",
                            hint="built-in names: " + ", ".join(template_names()) + "; or give a .jinja file")
    if model_template:
        return model_template, "model (GGUF)"
    raise TemplateError("the model has no chat template",
                        hint="pass --chat-template NAME|FILE (built-ins: " + ", ".join(template_names()) + ")")


@lru_cache(maxsize=16)
def _compile(template: str) -> Any:
    from jinja2 import TemplateSyntaxError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.filters["tojson"] = lambda v, indent=None, **_: json.dumps(v, ensure_ascii=False, indent=indent)
    try:
        return env.from_string(template)
    except TemplateSyntaxError as exc:
        raise TemplateError(f"chat template does not parse: {exc.message} (line {exc.lineno})") from exc


def _raise_exception(message: str) -> None:
    raise TemplateError(f"chat template refused the conversation: {message}")


def render_template(template: str, messages: list[dict[str, Any]], *, bos_token: str = "", eos_token: str = "",
                    add_generation_prompt: bool = True, tools: list[dict[str, Any]] | None = None,
                    **extra: Any) -> str:
    """Render `messages` with a Jinja chat template text."""
    from jinja2 import TemplateError as JinjaError

    try:
        return _compile(template).render(
            messages=messages, bos_token=bos_token, eos_token=eos_token,
            add_generation_prompt=add_generation_prompt, tools=tools, **extra,
        )
    except TemplateError:
        raise
    except JinjaError as exc:
        raise TemplateError(f"chat template failed to render: {exc}") from exc


def render_chat(model: Any, messages: list[dict[str, Any]], template: str | None = None,
                add_generation_prompt: bool = True, tools: list[dict[str, Any]] | None = None) -> str:
    """Render a conversation for `model` (a native.Model) with its template or `template` (NAME|FILE|JINJA)."""
    text, _ = resolve_template(model.chat_template(), template)
    return render_template(
        text, messages, bos_token=_token_text(model, model.bos), eos_token=_token_text(model, model.eos),
        add_generation_prompt=add_generation_prompt, tools=tools,
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
        content = m.get("content", "")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        if not isinstance(content, str):
            raise InputError(f"message {i} \"content\" must be a string or a list of text parts")
        out.append({**m, "content": content})
    return out
