"""One context for a question within one token budget, from one published snapshot, for every mode.

* sources: whole chunks, ranked by Personalized PageRank over the entity–chunk graph (``tasks.retrieval.graph_rank``)
  with BM25 + dense as its prior (``ppr``), by BM25 fused with dense (``hybrid``) or by dense search (``naive``);
* the method's levels (HiRAG's local entities, global reports and bridge paths: ``tasks.methods.hirag.retrieval``;
  HyGRAG's and ArchRAG's in their own modules), for the method's own modes only;
* the budget: the sources in rank order while they fit, then what is left by value per token to the later sources
  and the levels' items alike (``retrieval.level_budget``: ``tasks.query.packing``; the other rules below).

Sources are packed whole: a chunk that does not fit the budget left is skipped, never cut. The snapshot is loaded
once (``tasks.retrieval.view``) and reused across questions.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from schemas.config import RetrievalConfig
from tasks.errors import UsageError
from tasks.methods.registry import SHARED_MODES, get_method, index_modes
from tasks.query.packing import fill_by_value
from tasks.retrieval.context import Context, budgets, source_item, top_k
from tasks.retrieval.graph_rank import RankParams, rank_chunks
from tasks.retrieval.lexical import rrf
from tasks.retrieval.view import IndexView

MAX_SOURCES = 200  # candidates considered for the sources section


# ---------------------------------------------------------------------------- sources
def source_ranking(
    view: IndexView, question: str, dense: np.ndarray, ent_scores: np.ndarray, how: str, cfg: RetrievalConfig
) -> tuple[list[int], dict[str, Any]]:
    """Chunk indices best first (at most ``MAX_SOURCES``) by ``how``: dense, hybrid (BM25 + dense by
    reciprocal rank) or ppr (Personalized PageRank with the hybrid score as prior; the dense top-N follow
    the walk's own top-N, so they are always in a context that holds 2N chunks).

    A chunk under ``min_similarity`` with no question word counts for nothing in the fusion; the walk
    may still reach it through the graph (that is the second hop)."""
    if not len(view.chunk_ids):
        return [], {}
    related = dense >= cfg.min_similarity
    if how == "dense":
        return [i for i in top_k(dense, MAX_SOURCES) if related[i]], {}
    fused = rrf([np.where(related, dense, 0.0), view.lexical().scores(question)], cfg.rrf_k)
    if how == "hybrid":
        return [i for i in top_k(fused, MAX_SOURCES) if fused[i] > 0], {}
    params = RankParams.from_config(cfg)
    graph = view.passage_graph(params)
    scores, seeds = rank_chunks(graph, question, fused, params, ent_scores[graph.ent_view])
    ranked = [j for j in top_k(scores, MAX_SOURCES) if scores[j] > 0]
    # safety net: the dense top-N right after the graph's own top-N, wherever the walk put them
    safety = [i for i in top_k(dense, cfg.safety_top) if related[i]] if cfg.safety_top else []
    head = ranked[: cfg.safety_top]
    head += [i for i in safety if i not in head]
    return head + [j for j in ranked[cfg.safety_top :] if j not in head], seeds


def _pack_sources(
    view: IndexView, order: list[int], scores: np.ndarray, budget: int, min_tokens: int = 20, prefix: bool = False
) -> tuple[list[dict[str, Any]], int]:
    """Whole chunks in rank order; one that does not fit the budget left is skipped, never cut (with ``prefix``,
    packing stops there instead)."""
    out, used = [], 0
    for j in order:
        if budget - used < min_tokens:
            break
        item = source_item(view, j, scores)
        n = view.tokens(j, item["text"])
        if used + n > budget and prefix:
            break
        if used + n <= budget:
            out.append(item)
            used += n
    return out, used


def _level_shares(shares: dict[str, int], left: int) -> dict[str, int]:
    """The levels' budgets within ``left`` tokens, in the ratio of their shares (the sources' share aside)."""
    levels = {s: v for s, v in shares.items() if s != "chunks"}
    total = sum(levels.values()) or 1
    return {s: int(left * v / total) for s, v in levels.items()}


def retrieve(view: IndexView, question: str, q: np.ndarray, mode: str, cfg: RetrievalConfig) -> Context:
    """The three-level context (or a sources-only one) for one question, within ``cfg.token_budget``."""
    method = get_method(view.method)
    if mode not in method.modes and mode not in SHARED_MODES:
        raise UsageError(
            f"unknown mode {mode!r}; this {view.method} index offers {', '.join(index_modes(view.method))}"
        )
    q = np.asarray(q, dtype=np.float32)  # a float64 query would upcast the whole vector matrix on every search
    ctx = Context(question=question, mode=mode, version=view.version, query_vector=q)
    shares = budgets(cfg, method.modes.get(mode, ()))
    ranking = SHARED_MODES.get(mode, "ppr")
    chunk_scores = view.similarity("chunks", q, cfg.ann_candidates)
    needs_entities = mode in method.modes or (ranking == "ppr" and cfg.ppr_vector_seeds)
    ent_scores = (
        view.similarity("entities", q, cfg.ann_candidates)
        if needs_entities
        else np.zeros(len(view.ent_ids), np.float32)
    )
    chunk_order, seeds = source_ranking(view, question, chunk_scores, ent_scores, ranking, cfg)

    # sources first (in their share, over the whole budget, or while they fit in rank order); then the method's
    # levels, which skip what only repeats a source; then what is left: by value per token to every candidate left,
    # later sources and level items alike ("value": ``packing``), or to the later sources that fit
    first = {"shares": shares["chunks"], "after_sources": cfg.token_budget}.get(cfg.level_budget, cfg.token_budget)
    prefix = cfg.level_budget in ("after_prefix", "value") and mode in method.modes
    ctx.chunks, ctx.tokens["chunks"] = _pack_sources(view, chunk_order, chunk_scores, first, prefix=prefix)
    if mode in method.modes:
        left = cfg.token_budget - ctx.tokens["chunks"]
        if cfg.level_budget == "value":
            shares = {s: left for s in shares if s != "chunks"}  # each level's candidates up to all that is left
        elif cfg.level_budget != "shares":
            shares = _level_shares(shares, left)
        method.levels(view, ctx, ent_scores, shares, cfg)
        packed = {c["id"] for c in ctx.chunks}
        rest = [j for j in chunk_order if view.chunk_ids[j] not in packed]
        if cfg.level_budget == "value":
            fill_by_value(view, ctx, rest, chunk_scores, ent_scores, q, left, cfg)
        else:
            more, used = _pack_sources(view, rest, chunk_scores, cfg.token_budget - sum(ctx.tokens.values()))
            ctx.chunks += more
            ctx.tokens["chunks"] += used
    ctx.ranked_chunk_ids = [view.chunk_ids[j] for j in chunk_order]
    if seeds:
        graph = view.passage_graph(RankParams.from_config(cfg))
        ctx.seeds = {k: [view.ent_name[graph.ent_view[e]] for e in v] for k, v in seeds.items()}
    best_left_out = bool(chunk_order) and ctx.ranked_chunk_ids[0] not in {c["id"] for c in ctx.chunks}
    if ctx.empty or best_left_out:
        ctx.message = _empty_reason(view, q, chunk_order, cfg, ctx)
    return ctx


def _empty_reason(view: IndexView, q: np.ndarray, chunk_order: list[int], cfg: RetrievalConfig, ctx: Context) -> str:
    """Why a context came out empty: an empty index, nothing related to the question, or no whole source
    small enough for the budget (sources are never cut); or, for one that holds something, that the best-ranked
    related source did not fit in what the budget left (the offline answer quotes sources only)."""
    if not view.ent_ids and not view.chunk_ids:
        return "the index is empty: nothing to retrieve"
    if not ctx.empty:
        top = chunk_order[0]
        size = view.tokens(top, f"[{view.doc_title.get(view.chunk_doc[top])}] {view.chunk_text[top]}")
        return (
            f"the best-ranked related source ({size} tokens) does not fit in the token budget of {cfg.token_budget} "
            f"({sum(ctx.tokens.values())} tokens used; sources are whole chunks): raise the budget (--budget) or "
            "index with smaller chunks (chunking.size)"
        )
    best = float(max(view.similarity("entities", q, 1), default=-1.0)) if len(view.ent_ids) else -1.0
    if chunk_order:
        smallest = min(view.tokens(j, view.chunk_text[j]) for j in chunk_order[:MAX_SOURCES])
        if smallest > cfg.token_budget:
            return (
                f"no related source fits the token budget of {cfg.token_budget} (sources are whole chunks; the "
                f"smallest related one has {smallest} tokens): raise the budget (--budget) or index with smaller "
                "chunks (chunking.size)"
            )
    return (
        f"nothing in the index is related to the question (best similarity {best:.2f}; "
        f"retrieval.min_similarity {cfg.min_similarity})"
    )
