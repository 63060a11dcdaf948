"""Token probabilities after the sampler chain's cuts (llama-server's `post_sampling_probs`).

llama.cpp's default chain cuts the candidates with top-k, top-p and min-p, then applies the
temperature; the probabilities a client sees are those of what is left, renormalised. The chain
itself keeps no copy of them, so they are worked out here from the same logits and settings.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..generate.sampling import SamplingSettings
from .jobs import TokenProb


def candidate_probs(logits: np.ndarray, settings: SamplingSettings) -> tuple[np.ndarray, np.ndarray]:
    """The ids left after top-k, top-p and min-p (likeliest first) and their probabilities."""
    values = logits.astype(np.float64)
    for token, bias in settings.logit_bias:
        values[token] += bias
    order = np.argsort(-values, kind="stable")
    stages = set(settings.samplers)  # a stage the order leaves out does not run
    temperature = settings.temperature if "temperature" in stages else 1.0
    if temperature <= 0:  # greedy: one candidate, certain
        return order[:1], np.ones(1)
    if settings.top_k > 0 and "top_k" in stages:
        order = order[:settings.top_k]
    probs = _softmax(values[order])
    if settings.top_p < 1.0 and "top_p" in stages:
        keep = int(np.searchsorted(np.cumsum(probs), settings.top_p)) + 1
        order = order[:keep]
        probs = _softmax(values[order])
    if settings.min_p > 0 and "min_p" in stages:
        kept = probs >= settings.min_p * probs[0]
        order = order[kept]
    probs = _softmax(values[order] / temperature)
    return order, probs


def post_sampling_prob(engine: Any, logits: np.ndarray, token: int, k: int, settings: SamplingSettings) -> TokenProb:
    """`token`'s probability among the candidates (0 when it was cut) and the `k` likeliest candidates,
    as a TokenProb whose log-probabilities are the logs of those probabilities."""
    ids, probs = candidate_probs(logits, settings)
    where = np.nonzero(ids == token)[0]
    chosen = float(probs[where[0]]) if len(where) else 0.0
    top = tuple((int(i), engine.piece(int(i)), math.log(p)) for i, p in zip(ids[:k], probs[:k]) if p > 0)
    return TokenProb(token, engine.piece(token), math.log(chosen) if chosen > 0 else -math.inf, top)


def _softmax(values: np.ndarray) -> np.ndarray:
    e = np.exp(values - values.max())
    return e / e.sum()
