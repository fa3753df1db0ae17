"""Lexical signal: BM25 over texts (bm25s, Lucene variant) and reciprocal rank fusion.

Dense MiniLM vectors are weak on rare names, which is what multi-hop questions hinge on; BM25
matches them exactly. ``rrf`` fuses any number of rankings (Cormack et al. 2009):
``score(d) = Σ_r 1 / (k + rank_r(d))`` with ranks counted from 1.
"""

from __future__ import annotations

import logging

import numpy as np


def bm25s():
    """The bm25s module, imported without numba where nothing imported numba before: its numba backend is not
    used (scores come from the numpy one), and importing numba costs a cold query ~0.15 s and ~30 MB."""
    import sys

    if "bm25s" not in sys.modules and "numba" not in sys.modules:
        sys.modules["numba"] = None  # type: ignore[assignment]  # ``import numba`` raises ImportError meanwhile
        try:
            import bm25s as module
        finally:
            del sys.modules["numba"]
    import bm25s as module

    logging.getLogger("bm25s").setLevel(logging.WARNING)  # its DEBUG "Building index from tokens" on every build
    return module


def tokenize(texts: list[str]) -> list[list[str]]:
    """Lowercased word tokens of two or more characters, English stop words dropped."""
    return bm25s().tokenize(texts, stopwords="en", return_ids=False, show_progress=False)


class BM25Index:
    """BM25 scores of every indexed text for a query; unknown query words are ignored."""

    def __init__(self, texts: list[str], k1: float = 1.5, b: float = 0.75):
        self.n = len(texts)
        self._bm25 = bm25s().BM25(k1=k1, b=b, backend="numpy")
        tokens = tokenize(texts) if texts else []
        self._empty = not any(tokens)  # nothing but stop words: every score is 0
        if not self._empty:
            self._bm25.index(tokens, show_progress=False)

    def scores(self, query: str) -> np.ndarray:
        words = tokenize([query])[0] if query.strip() else []
        if self._empty or not words:
            return np.zeros(self.n, dtype=np.float32)
        return np.asarray(self._bm25.get_scores(words), dtype=np.float32)


def ranks(scores: np.ndarray) -> np.ndarray:
    """1-based rank of every item by descending score, ties broken by index (deterministic)."""
    order = np.argsort(-scores, kind="stable")
    out = np.empty(len(scores), dtype=np.int64)
    out[order] = np.arange(1, len(scores) + 1)
    return out


def rrf(scores: list[np.ndarray], k: int = 60, weights: list[float] | None = None) -> np.ndarray:
    """Reciprocal rank fusion of several score arrays over the same items.

    Items with a score of exactly 0 (BM25: no query word) get nothing from that ranking, so the
    order of tied non-matches (table order) never leaks into the fused ranking."""
    weights = weights or [1.0] * len(scores)
    fused = np.zeros(len(scores[0]), dtype=np.float64)
    for w, s in zip(weights, scores):
        fused += np.where(s != 0, w / (k + ranks(s)), 0.0)
    return fused
