"""The sampler chain's order as llama.cpp's common sampler names it: `--samplers` names, `--sampler-seq`
letters, and the default order. Plain data, no library: options, the server and chat's /set read it.
"""

from __future__ import annotations

from ...errors import UsageError

# Canonical names, each with its --sampler-seq letter, in llama.cpp's table order.
SAMPLER_LETTERS = {
    "dry": "d", "top_k": "k", "typ_p": "y", "top_p": "p", "top_n_sigma": "s", "min_p": "m",
    "temperature": "t", "xtc": "x", "infill": "i", "penalties": "e", "adaptive_p": "a",
}
DEFAULT_SAMPLERS = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")
DEFAULT_SAMPLER_SEQ = "".join(SAMPLER_LETTERS[name] for name in DEFAULT_SAMPLERS)
DEFAULT_DRY_SEQUENCE_BREAKERS = ("\n", ":", '"', "*")


def _aliases() -> dict[str, str]:
    """Every spelling llama.cpp accepts: canonical, kebab-case (top-k), no separator (topk), and a few others."""
    names = {name: name for name in SAMPLER_LETTERS}
    for name in SAMPLER_LETTERS:
        if "_" in name:
            names[name.replace("_", "-")] = name
            names[name.replace("_", "")] = name
    names.update(nucleus="top_p", temp="temperature", typ="typ_p")
    return names


SAMPLER_ALIASES = _aliases()


def samplers_from_names(names: list[str] | tuple[str, ...], flag: str = "--samplers") -> tuple[str, ...]:
    """Canonical names of `names` (any case, any alias), in order.

    Raises:
        UsageError: a name llama.cpp does not know (llama.cpp skips it with a warning; a typo here
            would silently drop a sampler, so it is refused).
    """
    order = []
    for raw in names:
        name = SAMPLER_ALIASES.get(raw.strip().lower())
        if name is None:
            raise UsageError(f"{flag}: unknown sampler {raw!r}",
                             hint=f"allowed values: {', '.join(SAMPLER_LETTERS)}")
        order.append(name)
    return tuple(order)


def samplers_from_text(text: str, flag: str = "--samplers") -> tuple[str, ...]:
    """--samplers' value: names separated by ';' (empty parts skipped)."""
    return samplers_from_names([part for part in text.split(";") if part.strip()], flag)


def samplers_from_letters(letters: str, flag: str = "--sampler-seq") -> tuple[str, ...]:
    """--sampler-seq's value: one letter a sampler (e.g. edskypmxt)."""
    by_letter = {letter: name for name, letter in SAMPLER_LETTERS.items()}
    unknown = [c for c in letters if c not in by_letter]
    if unknown:
        allowed = ", ".join(f"{letter} ({name})" for name, letter in SAMPLER_LETTERS.items())
        raise UsageError(f"{flag} {letters!r}: unknown sampler letter {unknown[0]!r}", hint=f"allowed values: {allowed}")
    return tuple(by_letter[c] for c in letters)
