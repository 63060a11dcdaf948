"""A (query, document) pair as the tokens a reranker scores, laid out as llama-server lays them out.

A model with a "rerank" chat template gets that template with {query} and {document} filled in;
any other gets BOS (if its vocabulary adds one), the query, EOS (or SEP without one) and SEP where
the vocabulary adds them, the document, and EOS again.
"""

from __future__ import annotations

from typing import Any

MAX_DOCUMENTS = 1000  # documents per /rerank request


def rerank_tokens(model: Any, query: str, document: str) -> list[int]:
    from ..model.native import lib

    template = model.chat_template("rerank")
    if template is not None:
        prompt = template.replace("{query}", query).replace("{document}", document)
        return model.tokenize(prompt.encode("utf-8"), add_special=False, parse_special=True).tolist()
    vocab = model.vocab
    eos = model.eos if model.eos >= 0 else int(lib.llama_vocab_sep(vocab))
    add_eos, add_sep = bool(lib.llama_vocab_get_add_eos(vocab)), bool(lib.llama_vocab_get_add_sep(vocab))
    tokens = [model.bos] if model.add_bos else []
    tokens += model.tokenize(query.encode("utf-8"), add_special=False, parse_special=False).tolist()
    tokens += ([eos] if add_eos else []) + ([int(lib.llama_vocab_sep(vocab))] if add_sep else [])
    tokens += model.tokenize(document.encode("utf-8"), add_special=False, parse_special=False).tolist()
    return tokens + ([eos] if add_eos else [])


def embedding_prompt_tokens(model: Any, prompt: str, rank: bool, cls_separator: str) -> list[int]:
    """A prompt of `embed`, tokenized as llama-embedding does: with rank pooling, `query<sep>document`
    (--cls-separator) goes through the model's rerank template, or has its parts joined by the EOS and
    SEP texts the vocabulary adds; anything else is tokenized as it is."""
    from ..model.native import lib

    def tokens(text: str) -> list[int]:
        return model.tokenize(text.encode("utf-8"), add_special=True, parse_special=True).tolist()

    if not rank or cls_separator not in prompt:
        return tokens(prompt)
    parts = prompt.split(cls_separator)
    template = model.chat_template("rerank")
    if template is not None:
        return tokens(template.replace("{query}", parts[0]).replace("{document}", parts[1]))
    vocab = model.vocab

    def text_of(token: int, added: bool) -> str:
        return lib.llama_vocab_get_text(vocab, token).decode("utf-8", errors="replace") if added else ""

    joint = text_of(model.eos, bool(lib.llama_vocab_get_add_eos(vocab)))
    joint += text_of(int(lib.llama_vocab_sep(vocab)), bool(lib.llama_vocab_get_add_sep(vocab)))
    return tokens(joint.join(parts))
