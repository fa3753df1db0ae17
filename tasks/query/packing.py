"""One budget, one scale (``retrieval.level_budget = "value"``): the sources in their ranking's order while they fit,
then every candidate left — the later sources, the entity descriptions, the community reports, the path triples —
taken greedily by its value per token for this question until the budget is spent.

An item's value per token is ``relevance × novelty``: its relevance is the cosine of its own embedded text to the
question (a source's chunk vector, an entity's vector, a report's vector; a path triple, which has none, the mean of
its two ends'), the one similarity every kind has, from the one model; its novelty is the share of its content words
(stop words aside, crudely stemmed) that the context does not hold yet, recomputed after every pick. So an item
worth its tokens is both about the question and new: a report whose words the sources already hold is worth
nothing, one that adds a fact is worth its relevance. Items keep their sections, each in its own order.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from schemas.config import RetrievalConfig
from tasks.query.candidates import STOP_WORDS, WORD, stem
from tasks.retrieval.context import Context, source_item
from tasks.retrieval.view import IndexView
from tasks.runtime.tokens import count_tokens

#: the sections the levels fill, in the order a tie between two items of equal value is broken
SECTIONS = ("chunks", "entities", "communities", "bridge")


@dataclass
class Candidate:
    section: str
    order: int  # its place in its section's own order
    item: dict[str, Any]
    relevance: float
    tokens: int
    words: frozenset[str]


@functools.lru_cache(maxsize=8192)
def content_words(text: str, scaffold: frozenset[str] = frozenset()) -> frozenset[str]:
    """The words novelty counts: lower-cased, stop words and one- or two-letter words aside, crudely stemmed;
    without ``scaffold``, the words the sections' own layout adds (an entity's type and layer, a path's kind).
    Kept for the next question: the same sources and descriptions come back (10 ms of a 30 ms query, uncached)."""
    words = {w for w in WORD.findall(text.lower()) if len(w) > 2}
    return frozenset(stem(w) for w in words - STOP_WORDS) - scaffold


def layout_words(view: IndexView) -> frozenset[str]:
    """The words the context's sections add around what they quote, for ``content_words`` to leave aside: the
    view's entity types, its relation kinds, "layer" (kept on the view: the same for every question)."""

    def build() -> frozenset[str]:
        kinds = {r["kind"].replace("_", " ") for r in view.rel_rows}
        return content_words(" ".join(["layer", *set(view.ent_type), *kinds]))

    return view._once("layout_words", build)


def novelty(words: frozenset[str], held: set[str]) -> float:
    """The share of ``words`` not in ``held``; 0 for an item with no content words."""
    return len(words - held) / len(words) if words else 0.0


def _value(c: Candidate, held: set[str]) -> float:
    """A candidate's value per token: its relevance, times its novelty for a level item (a source is the evidence
    itself, whole: the next hop of a question shares the words of the hop before, which novelty would count
    against it)."""
    return c.relevance if c.section == "chunks" else c.relevance * novelty(c.words, held)


def by_value(candidates: list[Candidate], held: set[str], budget: int, min_relevance: float) -> list[Candidate]:
    """The candidates taken, greedily: each time the one of highest ``relevance × novelty`` that fits the budget
    left (ties: section order, then its own order), until none left with a value above zero fits. ``held``: the
    content words of what the context holds already (updated in place)."""
    pool = sorted(
        (c for c in candidates if c.relevance >= min_relevance and c.tokens > 0),
        key=lambda c: (SECTIONS.index(c.section), c.order),
    )
    chosen: list[Candidate] = []
    left = budget
    while pool:
        best, best_value = -1, 0.0
        for k, c in enumerate(pool):
            if c.tokens <= left and (value := _value(c, held)) > best_value:
                best, best_value = k, value
        if best < 0:
            break
        pick = pool.pop(best)
        chosen.append(pick)
        left -= pick.tokens
        held |= pick.words
    return chosen


#: the later sources (in ranking order) that compete with the levels for what the first ones leave
SOURCE_CANDIDATES = 30


def fill_by_value(
    view: IndexView,
    ctx: Context,
    rest: list[int],
    chunk_scores: np.ndarray,
    ent_scores: np.ndarray,
    q: np.ndarray,
    budget: int,
    cfg: RetrievalConfig,
) -> None:
    """``ctx``'s sections refilled within ``budget`` tokens by value (``by_value``): ``ctx.chunks`` holds the sources
    packed first, its level sections the method's candidates (each filled up to the whole budget, in the method's
    order); ``rest``: the later sources, in ranking order."""
    scaffold = layout_words(view)
    cands: list[Candidate] = []
    for k, j in enumerate(rest[:SOURCE_CANDIDATES]):
        item = source_item(view, j, chunk_scores)
        cands.append(
            Candidate(
                "chunks", k, item, float(chunk_scores[j]), view.tokens(j, item["text"]), content_words(item["text"])
            )
        )
    for section in SECTIONS[1:]:
        for k, item in enumerate(getattr(ctx, section)):
            if item.get("truncated"):  # a section's last item, cut to its budget: here items are whole
                continue
            rel = _relevance(view, section, item, ent_scores, q)
            words = content_words(item["text"], scaffold)
            cands.append(Candidate(section, k, item, rel, count_tokens(item["text"]), words))
    held = set().union(*(content_words(c["text"]) for c in ctx.chunks)) if ctx.chunks else set()
    chosen = by_value(cands, held, budget, cfg.min_similarity)
    for section in SECTIONS:
        picked = sorted((c for c in chosen if c.section == section), key=lambda c: c.order)
        items = [c.item for c in picked]
        if section == "chunks":
            ctx.chunks = ctx.chunks + items
            ctx.tokens["chunks"] = ctx.tokens.get("chunks", 0) + sum(c.tokens for c in picked)
        else:
            setattr(ctx, section, items)
            ctx.tokens[section] = sum(c.tokens for c in picked)


def _relevance(view: IndexView, section: str, item: dict[str, Any], ent_scores: np.ndarray, q: np.ndarray) -> float:
    """An item's cosine to the question: its own score where the method gave one (an entity's, a report's), a
    report's vector, or for a path triple the mean of its two ends'."""
    if "score" in item:
        return float(item["score"])
    if section == "communities":
        sim = view.report_similarity(item["id"], q)
        return sim if sim is not None else 0.0
    ends = [view.ent_index.get(item.get("source", "")), view.ent_index.get(item.get("target", ""))]
    known = [float(ent_scores[e]) for e in ends if e is not None and e < len(ent_scores)]
    return sum(known) / len(known) if known else 0.0
