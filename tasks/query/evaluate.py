"""Context-recall evaluation of retrieval modes (no LLM needed).

Dataset folder: ``corpus.jsonl`` (id, title, text) and ``queries.jsonl`` (id, question, answer
(may be null), answer_aliases (optional), supporting_passage_ids). A passage id is a document's
``source_id``. Per token budget and mode:

* supporting-passage recall: share of a question's supporting passages whose whole text is in the
  context — every chunk of the passage's document(s) in the source section, none truncated;
* recall@k (k = 2, 5, 10): share of the supporting passages among the first k distinct passages of
  the mode's ranking before budgeting (``Context.ranked_chunk_ids`` when retrieval provides it,
  else the order of the context's chunks);
* answer-in-context rate: the normalised answer or an alias appears in the normalised context
  (questions without an answer are left out of this rate);
* mean context tokens, and retrieval latency p50 / p95 (question embedding included);
* against ``naive`` at the same budget, over the questions with supporting passages: wins, losses
  and ties of the per-question passage recall, the mean difference and its paired-bootstrap 95 %
  interval;
* with an answer model (``llm.answers``): exact match and token F1 of the generated answers against the answer and
  its aliases (SQuAD's normalisation and F1, the best over the gold answers, as HotpotQA, 2Wiki and MuSiQue report
  them), with F1's paired interval against ``naive``.
"""

from __future__ import annotations

import json
import re
import string
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from schemas.config import RetrievalConfig
from tasks.query.answer import TokenVectors, answer_embedder, best_sentences
from tasks.query.answer import answer as answer_with
from tasks.query.retrieve import retrieve
from tasks.retrieval.context import Context
from tasks.retrieval.view import IndexView

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans({c: " " for c in string.punctuation})
RECALL_KS = (2, 5, 10)


def normalize_answer(text: str) -> str:
    """SQuAD-style: lowercase, punctuation and articles removed, whitespace collapsed."""
    text = str(text).lower().translate(_PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def answer_in_context(answers: list[str], context: str) -> bool:
    norm = f" {normalize_answer(context)} "
    return any(a and f" {a} " in norm for a in (normalize_answer(x) for x in answers))


def exact_match(prediction: str, answers: list[str]) -> float:
    """1.0 when the normalised prediction equals a normalised gold answer, else 0.0."""
    said = normalize_answer(prediction)
    return float(any(said == normalize_answer(a) for a in answers))


def token_f1(prediction: str, answers: list[str]) -> float:
    """SQuAD's token F1 of the normalised prediction against its best gold answer."""
    said = normalize_answer(prediction).split()
    best = 0.0
    for answer in answers:
        gold = normalize_answer(answer).split()
        common = sum((Counter(said) & Counter(gold)).values())
        if common:
            precision, recall = common / len(said), common / len(gold)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def passage_recall(supporting: list[str], retrieved: set[str]) -> float:
    if not supporting:
        return float("nan")
    return sum(1 for p in supporting if p in retrieved) / len(supporting)


_PASSAGE_CHUNKS: dict[int, tuple[IndexView, Counter[str]]] = {}


def passage_chunk_counts(view: IndexView) -> Counter[str]:
    """Chunks per passage id, over all of its documents; computed once per view (the last one is kept)."""
    cached = _PASSAGE_CHUNKS.get(id(view))
    if cached is None or cached[0] is not view:
        counts = Counter(p for p in (view.doc_source.get(d) for d in view.chunk_doc) if p is not None)
        _PASSAGE_CHUNKS.clear()
        cached = _PASSAGE_CHUNKS[id(view)] = (view, counts)
    return cached[1]


def retrieved_passages(ctx: Context, view: IndexView) -> set[str]:
    """Passages whose whole text is in the context: all their chunks present and none truncated."""
    present: dict[str, set[str]] = {}
    for c in ctx.chunks:
        if c.get("source_id") is not None and not c.get("truncated"):
            present.setdefault(c["source_id"], set()).add(c["id"])
    totals = passage_chunk_counts(view)
    return {p for p, ids in present.items() if len(ids) == totals.get(p, 0)}


def ranked_passages(ctx: Context, view: IndexView, limit: int) -> list[str]:
    """The first ``limit`` distinct passages in rank order: ``ctx.ranked_chunk_ids`` when the context
    has a non-empty one (the mode's ranking before budgeting), else the order of ``ctx.chunks``."""
    ranked = ctx.ranked_chunk_ids or [c["id"] for c in ctx.chunks]
    out: list[str] = []
    for cid in ranked:
        j = view.chunk_index.get(cid)
        p = view.doc_source.get(view.chunk_doc[j]) if j is not None else None
        if p is not None and p not in out:
            out.append(p)
            if len(out) >= limit:
                break
    return out


def recall_at_k(supporting: list[str], ranked: list[str], k: int) -> float:
    """Share of the supporting passages among the first k ranked passages (NaN without any)."""
    return passage_recall(supporting, set(ranked[:k]))


def paired_bootstrap(a: np.ndarray, b: np.ndarray, n_resamples: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Paired comparison of per-question scores, diff = a - b: wins / losses / ties, the mean difference
    and its bootstrap 95 % interval (question indices resampled with replacement; percentiles 2.5, 97.5)."""
    diff = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    n = len(diff)
    out: dict[str, Any] = {"n": n, "wins": int(np.sum(diff > 1e-12)), "losses": int(np.sum(diff < -1e-12))}
    out["ties"] = n - out["wins"] - out["losses"]
    if n == 0:
        return out | {"mean_diff": float("nan"), "ci_low": float("nan"), "ci_high": float("nan")}
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, n, size=(n_resamples, n))].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return out | {"mean_diff": float(diff.mean()), "ci_low": float(low), "ci_high": float(high)}


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
    token_budget: int
    n_queries: int
    passage_recall: float
    recall_at_2: float
    recall_at_5: float
    recall_at_10: float
    answer_in_context: float
    answer_in_extractive: float  # the gold answer in the offline answer's sentences (``best_sentences``)
    n_answerable: int
    mean_context_tokens: float
    latency_p50_ms: float
    latency_p95_ms: float
    vs_naive: dict[str, Any] | None = None  # paired_bootstrap(this mode, naive) on passage recall
    exact_match: float = float("nan")  # of the answer model's answers (NaN: no answer model)
    f1: float = float("nan")
    f1_vs_naive: dict[str, Any] | None = None  # paired_bootstrap(this mode, naive) on F1


def _mean(values: list[Any]) -> float:
    """Mean over the values that are not None / NaN (NaN when none is left)."""
    kept = [float(v) for v in values if v is not None and not np.isnan(v)]
    return float(np.mean(kept)) if kept else float("nan")


def _run_mode(
    view: IndexView,
    embed,
    queries: list[dict[str, Any]],
    mode: str,
    cfg: RetrievalConfig,
    sentence_embed=None,
    client=None,
) -> tuple[ModeResult, list[dict[str, Any]]]:
    """Every question through one mode at ``cfg.token_budget``: the summary and one row per question (with
    ``client``, the answer model's answer, its exact match and F1)."""

    rows: list[dict[str, Any]] = []
    for q in queries:
        t0 = time.perf_counter()
        vec = embed([q["question"]])[0]
        ctx = retrieve(view, q["question"], vec, mode, cfg)
        ms = (time.perf_counter() - t0) * 1000
        supporting = q["supporting_passage_ids"]
        ranked = ranked_passages(ctx, view, max(RECALL_KS))
        answers = ([q["answer"]] if q.get("answer") else []) + list(q.get("answer_aliases") or [])
        rows.append(
            {
                "mode": mode,
                "token_budget": cfg.token_budget,
                "query_id": q["id"],
                "passage_recall": passage_recall(supporting, retrieved_passages(ctx, view)),
                **{f"recall_at_{k}": recall_at_k(supporting, ranked, k) for k in RECALL_KS},
                "answer_in_context": answer_in_context(answers, ctx.text()) if answers else None,
                "answer_in_extractive": answer_in_context(
                    answers, " ".join(s for s, _ in best_sentences(ctx, sentence_embed))
                )
                if answers
                else None,
                "context_tokens": sum(ctx.tokens.values()),
                "latency_ms": ms,
                "n_chunks": len(ctx.chunks),
            }
        )
        if client is not None and answers:
            said = answer_with(ctx, client, sentence_embed)
            generated = said["text"] if said["kind"] == "llm" else ""  # a failed call scores 0, not the extractive
            rows[-1] |= {"answer": generated, "em": exact_match(generated, answers), "f1": token_f1(generated, answers)}
    lat = [r["latency_ms"] for r in rows]
    hits = [r["answer_in_context"] for r in rows if r["answer_in_context"] is not None]
    recall_at: dict[str, Any] = {f"recall_at_{k}": _mean([r[f"recall_at_{k}"] for r in rows]) for k in RECALL_KS}
    result = ModeResult(
        mode=mode,
        token_budget=cfg.token_budget,
        n_queries=len(queries),
        passage_recall=_mean([r["passage_recall"] for r in rows]),
        **recall_at,  # the recall_at_k fields
        answer_in_context=_mean(hits),
        n_answerable=len(hits),
        answer_in_extractive=_mean([r["answer_in_extractive"] for r in rows if r["answer_in_extractive"] is not None]),
        mean_context_tokens=float(np.mean([r["context_tokens"] for r in rows])) if rows else 0.0,
        latency_p50_ms=float(np.percentile(lat, 50)) if lat else 0.0,
        latency_p95_ms=float(np.percentile(lat, 95)) if lat else 0.0,
    )
    if client is not None:
        result.exact_match = _mean([r.get("em") for r in rows])
        result.f1 = _mean([r.get("f1") for r in rows])
    return result, rows


def evaluate(
    view: IndexView,
    embed,
    queries: list[dict[str, Any]],
    modes: list[str],
    cfg: RetrievalConfig,
    budgets: list[int] | None = None,
    client=None,
) -> tuple[list[ModeResult], list[dict[str, Any]]]:
    """Run every question through every mode at every budget (None: ``cfg.token_budget``); returns the
    per-(budget, mode) summaries, budget by budget in mode order, and the per-question rows. ``client``: the
    answer model's (``llm.answers``), whose answers are scored by exact match and F1."""
    rows: list[dict[str, Any]] = []
    summaries: list[ModeResult] = []
    sentences = TokenVectors(answer_embedder(), None)  # the offline answer's candidates: the modes share most sentences
    embed(["warm-up"])  # load the model before timing anything
    passage_chunk_counts(view)
    for budget in dict.fromkeys(budgets or [cfg.token_budget]):
        bcfg = cfg.model_copy(update={"token_budget": budget})
        recalls: dict[str, np.ndarray] = {}
        f1s: dict[str, np.ndarray] = {}
        results: list[ModeResult] = []
        for mode in modes:
            result, mode_rows = _run_mode(view, embed, queries, mode, bcfg, sentences, client)
            recalls[mode] = np.array([r["passage_recall"] for r in mode_rows], dtype=float)
            f1s[mode] = np.array([r.get("f1", np.nan) for r in mode_rows], dtype=float)
            results.append(result)
            rows.extend(mode_rows)
        if "naive" in recalls:
            for r in results:
                if r.mode != "naive":
                    r.vs_naive = _paired(recalls[r.mode], recalls["naive"])  # questions with supporting passages
                    if client is not None:
                        r.f1_vs_naive = _paired(f1s[r.mode], f1s["naive"])  # questions with an answer
        summaries.extend(results)
    return summaries, rows


def _paired(a: np.ndarray, base: np.ndarray) -> dict[str, Any]:
    """``paired_bootstrap`` over the questions both measure (not NaN)."""
    keep = ~np.isnan(a) & ~np.isnan(base)
    return paired_bootstrap(a[keep], base[keep])


def plot_results(results: list[ModeResult], path: Path, title: str) -> Path:
    """Bar chart of passage recall and answer-in-context rate per mode (one budget's results)."""
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
