"""Context-recall evaluation of retrieval modes (no LLM needed).

Dataset folder: ``corpus.jsonl`` (id, title, text) and ``queries.jsonl`` (id, question, answer
(may be null), answer_aliases (optional), supporting_passage_ids). Per mode:

* supporting-passage recall: share of a question's supporting passages that have a chunk in
  the context's source section;
* answer-in-context rate: the normalised answer or an alias appears in the normalised context
  (questions without an answer are left out of this rate);
* mean context tokens, and retrieval latency p50 / p95 (question embedding included).
"""

from __future__ import annotations

import json
import re
import string
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from schemas.config import RetrievalConfig
from tasks.retrieve import IndexView, retrieve

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans({c: " " for c in string.punctuation})


def normalize_answer(text: str) -> str:
    """SQuAD-style: lowercase, punctuation and articles removed, whitespace collapsed."""
    text = str(text).lower().translate(_PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def answer_in_context(answers: list[str], context: str) -> bool:
    norm = f" {normalize_answer(context)} "
    return any(a and f" {a} " in norm for a in (normalize_answer(x) for x in answers))


def passage_recall(supporting: list[str], retrieved: set[str]) -> float:
    if not supporting:
        return float("nan")
    return sum(1 for p in supporting if p in retrieved) / len(supporting)


def load_queries(dataset: Path) -> list[dict[str, Any]]:
    path = dataset / "queries.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: a dataset folder holds corpus.jsonl and queries.jsonl")
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        if "question" not in row:
            raise ValueError(f"{path}:{n}: a query needs a 'question'")
        row.setdefault("id", f"q{n}")
        row.setdefault("supporting_passage_ids", [])
        rows.append(row)
    return rows


@dataclass
class ModeResult:
    mode: str
    n_queries: int
    passage_recall: float
    answer_in_context: float
    n_answerable: int
    mean_context_tokens: float
    latency_p50_ms: float
    latency_p95_ms: float


def evaluate(
    view: IndexView, embed, queries: list[dict[str, Any]], modes: list[str], cfg: RetrievalConfig
) -> tuple[list[ModeResult], list[dict[str, Any]]]:
    """Run every question through every mode; returns per-mode summaries and per-question rows."""
    rows: list[dict[str, Any]] = []
    summaries = []
    embed(["warm-up"])  # load the model before timing anything
    for mode in modes:
        lat, recalls, hits, tokens = [], [], [], []
        for q in queries:
            t0 = time.perf_counter()
            vec = embed([q["question"]])[0]
            ctx = retrieve(view, q["question"], vec, mode, cfg)
            lat.append((time.perf_counter() - t0) * 1000)
            retrieved = {c["source_id"] for c in ctx.chunks}
            rec = passage_recall(q["supporting_passage_ids"], retrieved)
            answers = ([q["answer"]] if q.get("answer") else []) + list(q.get("answer_aliases") or [])
            hit = answer_in_context(answers, ctx.text()) if answers else None
            n_tok = sum(ctx.tokens.values())
            if not np.isnan(rec):
                recalls.append(rec)
            if hit is not None:
                hits.append(hit)
            tokens.append(n_tok)
            rows.append({"mode": mode, "query_id": q["id"], "passage_recall": rec, "answer_in_context": hit,
                         "context_tokens": n_tok, "latency_ms": lat[-1], "n_chunks": len(ctx.chunks)})
        summaries.append(
            ModeResult(
                mode=mode, n_queries=len(queries),
                passage_recall=float(np.mean(recalls)) if recalls else float("nan"),
                answer_in_context=float(np.mean(hits)) if hits else float("nan"), n_answerable=len(hits),
                mean_context_tokens=float(np.mean(tokens)) if tokens else 0.0,
                latency_p50_ms=float(np.percentile(lat, 50)) if lat else 0.0,
                latency_p95_ms=float(np.percentile(lat, 95)) if lat else 0.0,
            )
        )
    return summaries, rows


def plot_results(results: list[ModeResult], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = [r.mode for r in results]
    x = np.arange(len(modes))
    fig, ax = plt.subplots(figsize=(6.5, 3.6), dpi=120)
    ax.bar(x - 0.2, [r.passage_recall for r in results], 0.4, label="supporting-passage recall")
    ax.bar(x + 0.2, [r.answer_in_context for r in results], 0.4, label="answer in context")
    ax.set_xticks(x, modes)
    ax.set_ylim(0, 1)
    ax.set_title(title)
    ax.legend(fontsize=8)
    for i, r in enumerate(results):
        ax.annotate(f"{r.mean_context_tokens:.0f} tok", (i, 0.02), ha="center", fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
