"""The bash, zsh and fish renderings of pyllama's command tree (see completion_gen).

Each script has two parts: fixed shell functions for what is only known at TAB time (files, the
Hugging Face cache) and generated tables of commands, options and value lists.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from .tree import GENERATED_BY, PROG, QUANT_TAG_ERE, Argument, Command, Option, Values

# ---------------------------------------------------------------- bash

_BASH_HELPERS = r"""
# The Hugging Face hub cache, found as huggingface_hub finds it.
_pyllama_hub_dir() {
    local dir
    if [[ -n ${HF_HUB_CACHE-} ]]; then dir=$HF_HUB_CACHE
    elif [[ -n ${HUGGINGFACE_HUB_CACHE-} ]]; then dir=$HUGGINGFACE_HUB_CACHE
    elif [[ -n ${HF_HOME-} ]]; then dir=$HF_HOME/hub
    else dir=${XDG_CACHE_HOME:-$HOME/.cache}/huggingface/hub
    fi
    printf '%s\n' "${dir/#\~/$HOME}"
}

# Repo ids (user/name) of the models in the Hugging Face cache.
_pyllama_hf_repos() {
    local dir name
    for dir in "$(_pyllama_hub_dir)"/models--*--*; do
        [[ -d $dir ]] || continue
        name=${dir##*/models--}
        printf '%s\n' "${name/--//}"
    done
}

# Quant tags (Q4_K_M, F16, ...) in the names of the GGUF files cached for repo $1.
_pyllama_hf_tags() {
    local snap file name re='@QUANT_TAG_ERE@'
    snap="$(_pyllama_hub_dir)/models--${1//\//--}/snapshots"
    for file in "$snap"/*/*.gguf "$snap"/*/*/*.gguf; do
        [[ -e $file ]] || continue
        name=${file##*/}
        name=${name^^}
        [[ $name == *MMPROJ* ]] && continue
        [[ $name =~ $re ]] && printf '%s\n' "${BASH_REMATCH[2]}"
    done | sort -u
}

# -hf: a cached repo id, or after "repo:" one of its cached quant tags.
_pyllama_hf() {
    if [[ $cur == *:* ]]; then
        local repo=${cur%%:*}
        COMPREPLY+=($(compgen -P "$repo:" -W "$(_pyllama_hf_tags "$repo")" -- "${cur#*:}"))
    else
        COMPREPLY+=($(compgen -W "$(_pyllama_hf_repos)" -- "$cur"))
    fi
}

# Files matching the glob $1 ('' for any file), and directories to walk into.
_pyllama_files() {
    local IFS=$'\n'
    compopt -o filenames 2>/dev/null
    if [[ -n $1 ]]; then
        COMPREPLY+=($(compgen -f -X "!$1" -- "$cur") $(compgen -d -- "$cur"))
    else
        COMPREPLY+=($(compgen -f -- "$cur"))
    fi
}

# A value: $1 is what the shell completes (none, file, dir, gguf, hf), the rest are fixed names.
_pyllama_values() {
    local kind=$1
    shift
    if (($#)); then COMPREPLY+=($(compgen -W "$*" -- "$cur")); fi
    case $kind in
        gguf) _pyllama_files '*.gguf' ;;
        file) _pyllama_files '' ;;
        dir) compopt -o filenames 2>/dev/null; COMPREPLY+=($(compgen -d -- "$cur")) ;;
        hf) _pyllama_hf ;;
    esac
}

# COMP_WORDS with the pieces bash splits at ':' joined back, so user/repo:Q4_K_M is one word.
_pyllama_words() {
    local i w n
    for ((i = 0; i < ${#COMP_WORDS[@]}; i++)); do
        w=${COMP_WORDS[i]}
        n=${#words[@]}
        if ((n > 1)) && [[ $COMP_WORDBREAKS == *:* && ( $w == : || ${words[n-1]} == *: ) ]]; then
            words[n-1]+=$w
        else
            words+=("$w")
        fi
        if ((i == COMP_CWORD)); then cword=$((${#words[@]} - 1)); fi
    done
}

# Bash replaces only the text after the last ':' of the word: drop what comes before it.
_pyllama_trim_colon() {
    [[ $cur == *:* && $COMP_WORDBREAKS == *:* ]] || return 0
    local prefix=${cur%"${cur##*:}"} i
    for i in "${!COMPREPLY[@]}"; do COMPREPLY[i]=${COMPREPLY[i]#"$prefix"}; done
}

_pyllama() {
    local cur words=() cword=0 path="" subs="" opts="" npos=0 value_of="" skip=0 i w
    _pyllama_words
    cur=${words[cword]}
    # Find the (sub)command and count its positional arguments, stepping over option values.
    for ((i = 1; i < cword; i++)); do
        w=${words[i]}
        if ((skip)); then skip=$((skip - 1)); continue; fi
        _pyllama_spec "$path"
        if [[ $w == -* ]]; then
            if [[ " $opts " == *" $w= "* ]]; then
                value_of=$w
                if [[ ${words[i+1]-} == = ]]; then skip=2; else skip=1; fi
            fi
        elif [[ " $subs " == *" $w "* ]]; then
            path=${path:+$path }$w
        else
            npos=$((npos + 1))
        fi
    done
    _pyllama_spec "$path"
    COMPREPLY=()
    if ((skip)); then
        [[ $cur == = ]] && cur=""
        _pyllama_value "$path" "$value_of"
    elif [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "${opts//=/}" -- "$cur"))
    elif [[ -n $subs ]]; then
        COMPREPLY=($(compgen -W "$subs" -- "$cur"))
    else
        _pyllama_positional "$path" "$npos"
    fi
    _pyllama_trim_colon
}
"""


def render_bash(tree: Command) -> str:
    lines = [f"# bash completion for {PROG}{' ' * 44}-*- shell-script -*-", f"# {GENERATED_BY}",
             f"# Install: {PROG} completion install bash"]
    lines += _BASH_HELPERS.replace("@QUANT_TAG_ERE@", QUANT_TAG_ERE).rstrip("\n").split("\n")
    lines += ["", "# Subcommands and options of each command; options that take a value end in '='.",
              "_pyllama_spec() {", "    case $1 in"]
    for cmd in tree.walk():
        opts = [f"{n}=" if o.values else n for o in cmd.options for n in o.names]
        lines += [f'        "{cmd.key}")', *_bash_assign("subs", [s.path[-1] for s in cmd.subcommands]),
                  *_bash_assign("opts", opts), "            ;;"]
    lines += ["    esac", "}", "", "# The value of option $2 of command $1.", "_pyllama_value() {", '    case "$1|$2" in']
    lines += _bash_arms((cmd.key, name, opt.values) for cmd in tree.walk() for opt in cmd.options
                        if opt.values and opt.values != Values() for name in opt.names)
    lines += ["    esac", "}", "", "# Positional argument number $2 (from 0) of command $1.",
              "_pyllama_positional() {", '    case "$1|$2" in']
    lines += _bash_arms((cmd.key, "*" if arg.variadic else str(i), arg.values) for cmd in tree.walk()
                        for i, arg in enumerate(cmd.arguments) if arg.values != Values())
    lines += ["    esac", "}", "", f"complete -F _pyllama {PROG}", ""]
    return "\n".join(lines)


def _bash_assign(var: str, words: list[str]) -> list[str]:
    return _wrap(f'            {var}="', words, '"', indent=16)


def _bash_arms(entries: Iterable[tuple[str, str, Values]]) -> list[str]:
    """`case` arms grouping the "command|option" keys that complete the same way."""
    groups: dict[Values, list[str]] = {}
    for key, name, values in entries:
        pattern = f'"{key}|"*' if name == "*" else f'"{key}|{name}"'
        groups.setdefault(values, []).append(pattern)
    lines = []
    for values, patterns in groups.items():
        lines += _wrap("        ", patterns, ")", sep=" | ", indent=8)
        lines += _wrap(f"            _pyllama_values {values.kind}", list(values.names), " ;;", first_gap=" ")
    return lines


def _wrap(head: str, words: list[str], tail: str, sep: str = " ", first_gap: str = "", indent: int = 16,
          width: int = 110) -> list[str]:
    """`head`, the words joined by `sep`, then `tail`, over lines of at most `width` columns continued
    with a backslash (bash removes backslash-newline even inside double quotes)."""
    lines, line, gap = [], head, first_gap
    for i, word in enumerate(words):
        piece = word + (sep.rstrip() if i < len(words) - 1 else "")
        if line.strip() and line != head and len(line) + len(gap) + len(piece) + 2 > width:
            lines.append(line + " \\")
            line, gap = " " * indent, ""
        line += gap + piece
        gap = " "
    lines.append(line + tail)
    return lines


# ---------------------------------------------------------------- zsh

_ZSH_HELPERS = r"""
# The Hugging Face hub cache, found as huggingface_hub finds it.
_pyllama_hub_dir() {
  local dir
  if [[ -n $HF_HUB_CACHE ]]; then dir=$HF_HUB_CACHE
  elif [[ -n $HUGGINGFACE_HUB_CACHE ]]; then dir=$HUGGINGFACE_HUB_CACHE
  elif [[ -n $HF_HOME ]]; then dir=$HF_HOME/hub
  else dir=${XDG_CACHE_HOME:-$HOME/.cache}/huggingface/hub
  fi
  print -r -- ${dir/#\~/$HOME}
}

# -hf: a cached repo id, or after "repo:" one of its cached quant tags.
_pyllama_hf() {
  local hub=$(_pyllama_hub_dir) dir file name re='@QUANT_TAG_ERE@'
  local -aU found
  if compset -P '*:'; then
    local snap=$hub/models--${${IPREFIX%:}//\//--}/snapshots
    for file in $snap/*/*.gguf(N) $snap/*/*/*.gguf(N); do
      name=${(U)file:t}
      [[ $name == *MMPROJ* ]] && continue
      [[ $name =~ $re ]] && found+=($match[2])
    done
    _wanted quants expl 'quant tag' compadd -a found
  else
    for dir in $hub/models--*--*(N/); do
      name=${dir:t}
      name=${name#models--}
      found+=(${name/--//})
    done
    _wanted repos expl 'Hugging Face repo' compadd -a found
  fi
}

# A value: $1 is what the shell completes (none, file, dir, gguf, hf), the rest are fixed names.
_pyllama_values() {
  local kind=$1 ret=1 expl
  shift
  local -a names=("$@")
  (( $#names )) && _wanted values expl value compadd -a names && ret=0
  case $kind in
    gguf) _files -g '*.gguf' && ret=0 ;;
    file) _files && ret=0 ;;
    dir) _files -/ && ret=0 ;;
    hf) _pyllama_hf && ret=0 ;;
  esac
  return ret
}
"""


def render_zsh(tree: Command) -> str:
    lines = [f"#compdef {PROG}", f"# zsh completion for {PROG}. {GENERATED_BY}", f"# Install: {PROG} completion install zsh"]
    lines += _ZSH_HELPERS.replace("@QUANT_TAG_ERE@", QUANT_TAG_ERE).rstrip("\n").split("\n")
    for cmd in reversed(list(tree.walk())):
        lines += ["", *_zsh_function(cmd)]
    lines += ["", 'if [[ "$funcstack[1]" == _pyllama ]]; then', '  _pyllama "$@"', "else",
              f"  compdef _pyllama {PROG}", "fi", ""]
    return "\n".join(lines)


def _zsh_name(cmd: Command) -> str:
    return "_pyllama" + "".join("_" + re.sub(r"\W", "_", p) for p in cmd.path)


def _zsh_function(cmd: Command) -> list[str]:
    specs = [_zsh_option(o) for o in cmd.options]
    if cmd.subcommands:
        specs += ["'1: :->command'", "'*:: :->args'"]
    else:
        specs += [_zsh_argument(i, a) for i, a in enumerate(cmd.arguments, 1)]
    label = f"{PROG} {cmd.key}".strip()
    lines = [f"{_zsh_name(cmd)}() {{"]
    if not cmd.subcommands:
        return lines + ["  _arguments \\", *_continued(specs, "    "), "}"]
    described = [_zsh_quote(f"{s.path[-1]}:{s.help}") for s in cmd.subcommands]
    lines += ["  local curcontext=$curcontext state state_descr line ret=1", "  typeset -A opt_args",
              "  _arguments -C \\", *_continued(specs, "    ", " && ret=0"), "  case $state in", "    command)",
              "      local -a commands", "      commands=(", *[f"        {d}" for d in described], "      )",
              f"      _describe -t commands {_zsh_quote(label + ' command')} commands && ret=0", "      ;;",
              "    args)", f'      curcontext="${{curcontext%:*:*}}:{label.replace(" ", "-")}-$words[1]:"',
              "      case $words[1] in"]
    lines += [f"        {s.path[-1]}) {_zsh_name(s)} && ret=0 ;;" for s in cmd.subcommands]
    return lines + ["      esac", "      ;;", "  esac", "  return ret", "}"]


def _continued(items: list[str], indent: str, last: str = "") -> list[str]:
    return [f"{indent}{item} \\" if i < len(items) - 1 else f"{indent}{item}{last}" for i, item in enumerate(items)]


def _zsh_option(opt: Option) -> str:
    desc = "[" + re.sub(r"([\\\[\]])", r"\\\1", opt.help) + "]"
    value = f":{_zsh_message(opt.names)}:{_zsh_action(opt.values)}" if opt.values else ""
    if opt.repeatable:
        head = "'*'" + (f"{{{','.join(opt.names)}}}" if len(opt.names) > 1 else opt.names[0])
    elif len(opt.names) > 1:
        head = f"'({' '.join(opt.names)})'{{{','.join(opt.names)}}}"
    else:
        head = opt.names[0]
    return head + _zsh_quote(desc + value)


def _zsh_argument(position: int, arg: Argument) -> str:
    where = "*" if arg.variadic else f"{position}" + ("" if arg.required else ":")
    return _zsh_quote(f"{where}:{arg.name.lower()}:{_zsh_action(arg.values)}")


def _zsh_message(names: tuple[str, ...]) -> str:
    return max(names, key=len).lstrip("-").replace("-", " ")


def _zsh_action(values: Values) -> str:
    if values == Values():
        return " "
    # The {...} form runs as written; a bare `function args` action gets compadd options put first.
    return "{" + " ".join(["_pyllama_values", values.kind, *values.names]) + "}"


def _zsh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


# ---------------------------------------------------------------- fish

_FISH_HELPERS = r"""
# The (sub)command being completed, as words: "", "info", "completion install", ...
function __pyllama_path
    set -l tokens (commandline -opc)
    set -e tokens[1]
    set -l path
    for token in $tokens
        string match -q -- '-*' $token; and continue
        contains -- (string join ' ' -- $path $token) @COMMANDS@; or break
        set path $path $token
    end
    string join ' ' -- $path
end

function __pyllama_using
    set -l path (__pyllama_path)
    test "$path" = "$argv"
end

# The Hugging Face hub cache, found as huggingface_hub finds it.
function __pyllama_hub_dir
    if test -n "$HF_HUB_CACHE"
        echo $HF_HUB_CACHE
    else if test -n "$HUGGINGFACE_HUB_CACHE"
        echo $HUGGINGFACE_HUB_CACHE
    else if test -n "$HF_HOME"
        echo $HF_HOME/hub
    else if test -n "$XDG_CACHE_HOME"
        echo $XDG_CACHE_HOME/huggingface/hub
    else
        echo $HOME/.cache/huggingface/hub
    end
end

# -hf: a cached repo id, or after "repo:" one of its cached quant tags.
function __pyllama_hf
    set -l hub (__pyllama_hub_dir)
    set -l current (commandline -ct)
    if string match -q -- '*:*' $current
        set -l repo (string split -m 1 -- : $current)[1]
        set -l snap $hub/models--(string replace -a -- / -- $repo)/snapshots
        for file in $snap/*/*.gguf $snap/*/*/*.gguf
            set -l name (string upper -- (string replace -r -- '.*/' '' $file))
            string match -q -- '*MMPROJ*' $name; and continue
            string match -rg -- '@QUANT_TAG_RE@' $name
        end | sort -u | string replace -r -- '^' "$repo:"
    else
        for dir in $hub/models--*--*/
            string replace -r -- '^.*/models--(.*?)/?$' '$1' $dir | string replace -- -- /
        end
    end
end

# A value: $argv[1] is what the shell completes (none, file, dir, gguf, hf), the rest are fixed names.
function __pyllama_values
    set -l kind $argv[1]
    set -e argv[1]
    test (count $argv) -gt 0; and printf '%s\n' $argv
    switch $kind
        case gguf  # fish's helper lists every file, the .gguf ones first: keep those and directories
            __fish_complete_suffix .gguf | string match -r -- '^.*(?:\.gguf|/)$'
        case file
            __fish_complete_path (commandline -ct)
        case dir
            __fish_complete_directories (commandline -ct)
        case hf
            __pyllama_hf
    end
end
"""


def render_fish(tree: Command) -> str:
    keys = " ".join(_fish_quote(c.key) for c in tree.walk() if c.path)
    # fish's regexes are PCRE: the same tag pattern, with its groups made non-capturing but the tag.
    tag_re = QUANT_TAG_ERE.replace("(^|", "(?:^|").replace("(_[A-Z0-9]+)", "(?:_[A-Z0-9]+)").replace("(_MOE)", "(?:_MOE)")
    helpers = _FISH_HELPERS.replace("@COMMANDS@", keys).replace("@QUANT_TAG_RE@", tag_re)
    lines = [f"# fish completion for {PROG}. {GENERATED_BY}", f"# Install: {PROG} completion install fish", "",
             "# Files only where a value is a file.", f"complete -c {PROG} -f"]
    lines += helpers.rstrip("\n").split("\n")
    for cmd in tree.walk():
        cond = f"-n {_fish_quote(('__pyllama_using ' + cmd.key).strip())}"
        lines += ["", f"# {PROG} {cmd.key}".rstrip()]
        lines += [f"complete -c {PROG} {cond} -a {_fish_quote(s.path[-1])} -d {_fish_quote(s.help)}"
                  for s in cmd.subcommands]
        lines += [f"complete -c {PROG} {cond} {_fish_option(o)}" for o in cmd.options]
        for arg in cmd.arguments:
            if arg.values != Values():
                lines.append(f"complete -c {PROG} {cond} -a {_fish_quote('(' + _fish_values(arg.values) + ')')}")
    return "\n".join(lines) + "\n"


def _fish_option(opt: Option) -> str:
    flags = []
    for name in opt.names:
        if name.startswith("--"):
            flags.append(f"-l {name[2:]}")
        elif len(name) == 2:
            flags.append(f"-s {name[1:]}")
        else:  # llama.cpp's single-dash long names: -hf, -ngl
            flags.append(f"-o {name[1:]}")
    text = " ".join(flags) + f" -d {_fish_quote(opt.help)}"
    if opt.values:
        text += " -x" + (f" -a {_fish_quote('(' + _fish_values(opt.values) + ')')}" if opt.values != Values() else "")
    return text


def _fish_values(values: Values) -> str:
    return " ".join(["__pyllama_values", values.kind, *values.names])


def _fish_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
