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
