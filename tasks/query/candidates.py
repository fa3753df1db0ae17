"""The offline answer's candidate sentences: every sentence of the context's sources, and the ``MAX_CANDIDATES`` of
them it compares with the question piece by piece (``preselect``)."""

from __future__ import annotations

import functools
import re

import numpy as np

from tasks.retrieval.context import Context
from tasks.runtime.text import is_heading, split_sentences

WORD = re.compile(r"[a-z0-9]+")


STOP_WORDS = set(
    "the a an of in on at to for and or is was were are be by with from as that this which who what when where how why did does do".split()
)


def answer_candidates(ctx: Context) -> list[tuple[str, str]]:
    """(sentence, its source's title) for every sentence of the context's sources (``split_sentences``: whole
    sentences, abbreviations and initials kept), in context order, without repeats. Entity descriptions, reports
    and reasoning paths are left out: they are stitched from many places (a path's "X belongs to Y / Z" answers
    nothing; taking them lowered the hit rate from 0.28 to 0.23 on MuSiQue's subset, docs/benchmarks.md, "The offline
    answer")."""
    out: dict[str, str] = {}
    for c in ctx.chunks:
        label = c.get("title") or c.get("document_id") or ""
        for s in chunk_sentences(c["text"], c.get("title")):
            out.setdefault(s, label)
    return list(out.items())


def chunk_sentences(text: str, title: str | None) -> list[str]:
    """A source's candidate sentences: those of its text past its title line, longer than 20 characters, its
    Markdown headings left out (a heading names a section; it says nothing of it)."""
    return [s for s in source_sentences(text.removeprefix(f"[{title}] ")) if len(s) > 20 and not is_heading(s)]


@functools.lru_cache(maxsize=2048)
def source_sentences(text: str) -> tuple[str, ...]:
    """``split_sentences`` of a source, kept for the next question it answers: pySBD builds a regular expression per
    abbreviation it meets, past what Python's pattern cache holds, so a warm query spent half its time (~45 ms of
    ~90 on MuSiQue) splitting the same sources again."""

    return tuple(split_sentences(text))


#: candidates scored (``preselect``): embedding them is the answer's cost
MAX_CANDIDATES = 32


def stem(word: str) -> str:
    """A crude stem for matching words across inflections ("works" / "work", "apprenticeship" / "apprentice")."""
    return word[:6] if len(word) > 6 else word.removesuffix("s")


def preselect(question: str, cands: list[tuple[str, str]], k: int) -> list[tuple[str, str]]:
    """The ``k`` candidates compared piece by piece (embedding them is the answer's cost), in context order: the
    first ``k / 2``, then those of the rest that share the most of the question's words (stop words aside, crudely
    stemmed), each weighted by its rarity among the candidates (idf); all of them when there are at most ``k``. A
    context of long narrative chunks holds hundreds of sentences, and its first ``k`` are one chunk's opening
    (figures: docs/benchmarks.md, "The offline answer's candidates")."""
    if len(cands) <= k:
        return cands
    asked = {stem(w) for w in WORD.findall(question.lower()) if w not in STOP_WORDS}
    held = [asked & {stem(w) for w in WORD.findall(t.lower())} for t, _ in cands]
    df: dict[str, int] = {}
    for words in held:
        for w in words:
            df[w] = df.get(w, 0) + 1
    score = np.asarray([sum(np.log1p(len(cands) / df[w]) for w in words) for words in held], dtype=np.float64)
    score[: k // 2] = np.inf  # the first half: the best-ranked sources' sentences, as before
    order = np.arange(len(cands))
    keep = np.sort(np.lexsort((order, -score))[:k])
    return [cands[i] for i in keep]
