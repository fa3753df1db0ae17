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
        return {"kind": "extractive", "text": extractive_answer(ctx, embed), "note": f"LLM answer failed: {type(exc).__name__}: {exc}"}
