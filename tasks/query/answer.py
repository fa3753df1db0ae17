"""Answer generation from the three-level context (HiRAG Algorithm 2, line 18)."""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np

from tasks.query.context import Context
from tasks.runtime.llm import run_sync

PROMPT_VERSION = "answer/1"


def answer_messages(ctx: Context) -> list[dict[str, str]]:
    return [
        {
            "role": "system",
            "content": (
                "You answer questions from the knowledge given: entity descriptions, community reports, reasoning "
                "paths between entities and source passages. Use only that knowledge; say so when it is not enough. "
                "Be concise."
            ),
        },
        {"role": "user", "content": f"{ctx.text()}\n\nQuestion: {ctx.question}\nAnswer:"},
    ]


def answer(ctx: Context, client=None, embed=None) -> dict[str, str]:
    """``{"kind": "llm"|"extractive", "text": ..., "note": ...}``; falls back to extractive when the LLM fails
    (``embed``: the question's embedder, which ranks the extractive answer's sentences). The method that owns the
    mode first ``refine``s the context with the LLM (ArchRAG's adaptive filtering)."""
    from tasks.methods.registry import method_of_mode

    if client is None or ctx.empty:
        return {"kind": "extractive", "text": extractive_answer(ctx, embed)}
    note = None
    method = method_of_mode(ctx.mode)
    if method is not None:
        try:
            ctx = method.refine(ctx, client)
        except Exception as exc:  # noqa: BLE001 - the unrefined context still answers
            note = f"{method.name} context refinement failed, whole context used: {type(exc).__name__}: {exc}"
    try:
        text = run_sync(client.complete(answer_messages(ctx), prompt_version=PROMPT_VERSION))
        return {"kind": "llm", "text": str(text).strip(), **({"note": note} if note else {})}
    except Exception as exc:  # noqa: BLE001
        return {
            "kind": "extractive",
            "text": extractive_answer(ctx, embed),
            "note": f"LLM answer failed: {type(exc).__name__}: {exc}",
        }


# ---------------------------------------------------------------------------- extractive answer
_SENT = re.compile(r"(?<=[.!?])\s+")


_WORD = re.compile(r"[a-z0-9]+")


_STOP = set(
    "the a an of in on at to for and or is was were are be by with from as that this which who what when where how why did does do".split()
)


def answer_candidates(ctx: Context) -> list[tuple[str, str]]:
    """(sentence, where it comes from) for every sentence of the context's sources (labelled by their document's
    title) and reasoning paths, in context order, without repeats. Entity descriptions and reports are left
    out: they are stitched from many places."""
    out: dict[str, str] = {}
    for c in ctx.chunks:
        text, label = c["text"], c.get("title") or c.get("document_id") or ""
        text = text.removeprefix(f"[{c.get('title')}] ")
        for s in _SENT.split(" ".join(text.split())):
            if len(s) > 20:
                out.setdefault(s, label)
    for b in ctx.bridge:
        for s in _SENT.split(" ".join(b["text"].split(": ", 1)[-1].split())):
            if len(s) > 20:
                out.setdefault(s, "reasoning path")
    return list(out.items())


#: candidates scored, in context order (the sources' ranking first): embedding them is the answer's cost
MAX_CANDIDATES = 32


#: added to a second sentence that names something the first names and the question does not (the next hop)
CHAIN_BONUS = 0.6


_NAME = re.compile(r"\b[A-Z][\w'-]*(?:\s+(?:of|the|de|van|von)?\s*[A-Z][\w'-]*)*")


_NOT_NAMES = _STOP | set("he she it they his her its their there these those i we you but if then".split())


def _names(text: str) -> set[str]:
    return {n.lower() for n in _NAME.findall(text)} - _NOT_NAMES


def best_sentences(
    ctx: Context, embed: Callable[[list[str]], np.ndarray] | None = None, k: int = 2
) -> list[tuple[str, str]]:
    """The ``k`` of the first ``MAX_CANDIDATES`` answer candidates (``answer_candidates``) that best answer the
    question: by cosine similarity to the question (``embed``, the question's embedder, with ``ctx.query_vector``;
    without them, by the share of the question's words each holds); after the first, ``CHAIN_BONUS`` for a sentence that names what the first
    names beyond the question (a multi-hop answer's next step). Ties: earlier first. (Chosen on 50 MuSiQue
    questions: adding the question-word share to the cosine lowered the hit rate; README "The offline answer".)"""
    qwords = {w for w in _WORD.findall(ctx.question.lower()) if w not in _STOP}
    cands = answer_candidates(ctx)[:MAX_CANDIDATES]
    if not qwords or not cands:
        return []
    if embed is not None and ctx.query_vector is not None:
        vecs = np.asarray(embed([s for s, _ in cands]), dtype=np.float32)
        q = np.asarray(ctx.query_vector, dtype=np.float32)
        score = vecs @ q / np.maximum(np.linalg.norm(vecs, axis=1) * np.linalg.norm(q), 1e-12)
    else:
        score = np.asarray([len(qwords & set(_WORD.findall(s.lower()))) / len(qwords) for s, _ in cands])
    first = int(np.lexsort((np.arange(len(cands)), -score))[0])
    if score[first] <= 0:
        return []
    hop = _names(cands[first][0]) - _names(ctx.question)
    rest = score + np.asarray([CHAIN_BONUS * bool(hop & _names(s)) for s, _ in cands])
    rest[first] = -np.inf
    order = [first] + [int(i) for i in np.lexsort((np.arange(len(cands)), -rest))[: k - 1] if rest[i] > 0]
    return [cands[i] for i in order]


def extractive_answer(ctx: Context, embed: Callable[[list[str]], np.ndarray] | None = None, k: int = 2) -> str:
    """Without an LLM: the best one or two sentences of the sources (``best_sentences``), each with its source."""
    return " ".join(f"{s} ({label})" if label else s for s, label in best_sentences(ctx, embed, k))
