"""Answer generation from the three-level context (HiRAG Algorithm 2, line 18)."""

from __future__ import annotations

from tasks.llm import run_sync
from tasks.retrieve import Context, extractive_answer

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


MAP_VERSION = "archrag-map/1"
#: ArchRAG's map step: pieces the LLM rates under this (0-10) are left out of the answer's context
MIN_USEFUL = 3


def map_messages(question: str, pieces: list[str]) -> list[dict[str, str]]:
    listing = "\n".join(f"{i}. {p}" for i, p in enumerate(pieces, 1))
    return [
        {"role": "system", "content": "You judge retrieved knowledge before a question is answered from it. Answer with JSON only."},
        {"role": "user", "content": (
            f"Question: {question}\n\nRetrieved pieces:\n{listing}\n\nRate how useful each piece is for answering "
            f'the question, from 0 (useless) to 10 (answers it), as {{"scores": [one integer per piece, in order]}}.')},
    ]


def adaptive_filter(ctx: Context, client) -> Context:
    """ArchRAG's adaptive filtering with an LLM (§3.2.2): the map step rates every retrieved entity, community
    report and relation in one call; those under ``MIN_USEFUL`` are dropped and the rest ordered by rating
    (the reduce step answers from what is left)."""
    from dataclasses import replace

    from tasks.llm import ParseError, parse_json

    sections = ("entities", "communities", "bridge")
    pieces = [(name, item) for name in sections for item in getattr(ctx, name)]
    if not pieces:
        return ctx

    def parse(text: str) -> list[float]:
        data = parse_json(text)
        scores = data.get("scores") if isinstance(data, dict) else data
        if not isinstance(scores, list) or len(scores) != len(pieces):
            raise ParseError(f"{len(pieces)} scores expected")
        return [float(x) for x in scores]

    scores = run_sync(client.complete(map_messages(ctx.question, [item["text"] for _, item in pieces]),
                                      prompt_version=MAP_VERSION, json_mode=True, parse=parse))
    kept = {name: [it for (n, it), sc in sorted(zip(pieces, scores), key=lambda p: -p[1]) if n == name and sc >= MIN_USEFUL]
            for name in sections}
    return replace(ctx, **kept)


def answer(ctx: Context, client=None, embed=None) -> dict[str, str]:
    """``{"kind": "llm"|"extractive", "text": ..., "note": ...}``; falls back to extractive when the LLM fails
    (``embed``: the question's embedder, which ranks the extractive answer's sentences). In mode ``archrag`` the
    LLM first filters the context (``adaptive_filter``)."""
    if client is None or ctx.empty:
        return {"kind": "extractive", "text": extractive_answer(ctx, embed)}
    note = None
    if ctx.mode == "archrag":
        try:
            ctx = adaptive_filter(ctx, client)
        except Exception as exc:  # noqa: BLE001 - the unfiltered context still answers
            note = f"adaptive filtering failed, unfiltered context used: {type(exc).__name__}: {exc}"
    try:
        text = run_sync(client.complete(answer_messages(ctx), prompt_version=PROMPT_VERSION))
        return {"kind": "llm", "text": str(text).strip(), **({"note": note} if note else {})}
    except Exception as exc:  # noqa: BLE001
        return {"kind": "extractive", "text": extractive_answer(ctx, embed), "note": f"LLM answer failed: {type(exc).__name__}: {exc}"}
