"""HiRetrieval (HiRAG §4.2, eq. 12-16, Algorithm 2): the three levels of HiRAG's modes.

* local  (eq. 12): the top-n entities by cosine similarity to the question, over all layers;
* global (eq. 13): the communities that contain any of them, with their reports;
* bridge (eq. 14-16): from each retrieved community its top-m question-related entities, in a
  deterministic order; shortest paths in G_k between consecutive key entities (at most
  ``max_path_hops`` apart); the triples of G_k whose two ends lie on those paths.

The sources section is shared by every mode (``tasks.query.retrieve``).
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

import numpy as np

from schemas.config import RetrievalConfig
from tasks.methods.attach import SENTENCE_END
from tasks.retrieval.context import Context, fill, top_k
from tasks.retrieval.view import Graph, IndexView


def report_item(view: IndexView, c: int) -> dict[str, Any] | None:
    """Community ``c``'s report as a context item (title, summary, its first three findings), None without one.
    Every method's global level lists communities this way."""
    comm = view.communities[c]
    rep = view.reports.get(comm["id"])
    if rep is None:
        return None
    findings = " ".join(f"• {f}" for f in (rep["findings"] or [])[:3])
    return {
        "id": comm["id"],
        "level": comm["level"],
        "title": rep["title"],
        "rating": rep["rating"],
        "summary": rep["summary"],
        "findings": rep["findings"],
        "text": f"- [{rep['title']}] {rep['summary']} {findings}".strip(),
    }


def named_first(items: list[dict[str, Any]], question: str) -> list[dict[str, Any]]:
    """The entities section's order: those the question names first, then named entities, then generic concept
    phrases ("marriage", "industry"), each group by similarity (the levels are chosen before: this only decides
    what the section's budget shows first)."""
    q = f" {' '.join(re.findall(r'[a-z0-9]+', question.lower()))} "

    def group(item: dict[str, Any]) -> int:
        name = " ".join(re.findall(r"[a-z0-9]+", item["name"].lower()))
        if name and f" {name} " in q:
            return 0
        return 2 if item["type"] == "concept" and not item["name"][:1].isupper() else 1

    return sorted(items, key=group)  # stable: by similarity within a group


def fill_levels(
    view: IndexView, ctx: Context, scores: np.ndarray, budgets: dict[str, int], cfg: RetrievalConfig
) -> None:
    """The local, global and (when budgeted) bridge sections of ``ctx``; ``scores``: entity similarities."""
    flat = ctx.mode == "flat"
    sources = "\n".join(c["text"] for c in ctx.chunks)
    if "entities" in budgets:
        local, scores = local_entities(view, scores, cfg.top_n, flat, cfg.min_similarity)
        ent_items = [
            {
                "id": view.ent_ids[i],
                "name": view.ent_name[i],
                "type": view.ent_type[i],
                "layer": int(view.ent_layer[i]),
                "score": round(float(scores[i]), 4),
                "text": f"- {view.ent_name[i]} ({view.ent_type[i]}, layer {int(view.ent_layer[i])}): {view.ent_desc[i]}",
            }
            for i in local
            if not repeats(view.ent_desc[i], sources)
        ]
        ctx.entities, ctx.tokens["entities"] = fill(named_first(ent_items, ctx.question), budgets["entities"])

        comms = global_communities(view, local, cfg.max_communities)
        comm_items = [item for item in (report_item(view, c) for c in comms) if item is not None]
        ctx.communities, ctx.tokens["communities"] = fill(comm_items, budgets["communities"])

        if "bridge" in budgets:
            graph = view.flat_graph if flat else view.graph
            keys = key_entities(view, comms, scores, cfg.top_m, flat, cfg.max_key_entities)
            triples = bridge_triples(view, bridge_paths(view.adjacency(flat), keys, cfg.max_path_hops), graph)
            items = []
            for k in triples:
                r = view.rel_rows[k]
                if r["kind"] == "extracted" and repeats(r["description"], sources):
                    continue
                items.append(
                    {
                        "source": r["source_id"],
                        "target": r["target_id"],
                        "kind": r["kind"],
                        "text": f"- {view.statement(r)}" + (f": {r['description']}" if r["description"] else ""),
                    }
                )
            ctx.bridge, ctx.tokens["bridge"] = fill(items, budgets["bridge"])


def repeats(description: str, sources: str) -> bool:
    """Whether every sentence of an (extractive) description is already in the sources text."""
    parts = [p for p in SENTENCE_END.split(description or "") if p.strip()]
    return bool(parts) and all(p.rstrip("…").strip() in sources for p in parts)


def local_entities(
    view: IndexView, scores: np.ndarray, n: int, flat: bool, min_sim: float
) -> tuple[list[int], np.ndarray]:
    """Eq. 12: TopN by similarity ``scores`` over all layers (layer 0 only when ``flat``); those under ``min_sim`` dropped."""
    if len(view.ent_ids) == 0:
        return [], np.zeros(0, dtype=np.float32)
    candidates = np.flatnonzero(view.ent_layer == 0) if flat else None
    return [i for i in top_k(scores, n, candidates) if scores[i] >= min_sim], scores


def global_communities(view: IndexView, local: list[int], limit: int) -> list[int]:
    """Eq. 13: communities that contain any local entity, most hits first, then rating, level, id."""
    hits: dict[int, int] = defaultdict(int)
    for e in local:
        for c in view.ent_communities.get(e, []):
            hits[c] += 1

    def rank(c: int):
        comm = view.communities[c]
        rating = view.reports.get(comm["id"], {}).get("rating", 0.0)
        return (-hits[c], -rating, comm["level"], comm["id"])

    return sorted(hits, key=rank)[:limit]


def key_entities(view: IndexView, comms: list[int], scores: np.ndarray, m: int, flat: bool, limit: int) -> list[int]:
    """Eq. 14: the top-m question-related members of each community, in community order, without repeats."""
    keys: list[int] = []
    seen: set[int] = set()
    for c in comms:
        members = np.asarray(view.communities[c]["members"], dtype=np.int64)
        if flat:
            members = members[view.ent_layer[members] == 0]
        for e in top_k(scores, m, members):
            if e not in seen:
                seen.add(e)
                keys.append(e)
                if len(keys) >= limit:
                    return keys
    return keys


def shortest_path(adj: list[list[int]], a: int, b: int, max_hops: int) -> list[int] | None:
    """A shortest path from ``a`` to ``b`` of at most ``max_hops`` edges (bidirectional BFS over sorted
    adjacency lists, so ties resolve the same way every time), or None."""
    if a == b:
        return [a]
    pred, succ = {a: -1}, {b: -1}
    front_a, front_b = [a], [b]
    for _ in range(max_hops):
        grow_a = len(front_a) <= len(front_b)
        front, seen, other = (front_a, pred, succ) if grow_a else (front_b, succ, pred)
        nxt = []
        for u in front:
            for v in adj[u]:
                if v in seen:
                    continue
                seen[v] = u
                if v in other:
                    half_a, half_b = [], []
                    x = v
                    while x != -1:
                        half_a.append(x)
                        x = pred[x]
                    x = succ[v]
                    while x != -1:
                        half_b.append(x)
                        x = succ[x]
                    return half_a[::-1] + half_b
                nxt.append(v)
        if not nxt:
            return None
        if grow_a:
            front_a = nxt
        else:
            front_b = nxt
    return None


def bridge_paths(adj: list[list[int]], keys: list[int], max_hops: int) -> list[list[int]]:
    """Eq. 15: shortest paths between consecutive key entities; a missing (or longer than ``max_hops``) path is skipped."""
    paths = []
    for a, b in zip(keys, keys[1:]):
        path = shortest_path(adj, a, b, max_hops)
        if path is not None:
            paths.append(path)
    return paths


def bridge_triples(view: IndexView, paths: list[list[int]], graph: Graph) -> list[int]:
    """Eq. 16: relations of G_k whose both ends lie on the paths — path edges first, in path order."""
    on_path = sorted({n for p in paths for n in p})
    ordered: list[int] = []
    seen: set[int] = set()

    def add(a: int, b: int) -> None:
        for k in view.edge_rel.get((a, b) if a < b else (b, a), []):
            if k not in seen:
                seen.add(k)
                ordered.append(k)

    for p in paths:
        for a, b in zip(p, p[1:]):
            add(a, b)
    nodes = set(on_path)
    for a in on_path:
        for b in sorted(graph.adj[a]):
            if b in nodes and a < b:
                add(a, b)
    return ordered
