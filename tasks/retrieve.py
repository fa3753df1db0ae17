"""HiRetrieval (HiRAG §4.2, eq. 12-16, Algorithm 2) over one published snapshot.

* local  (eq. 12): the top-n entities by cosine similarity to the question, over all layers;
* global (eq. 13): the communities that contain any of them, with their reports;
* bridge (eq. 14-16): from each retrieved community its top-m question-related entities, in a
  deterministic order; shortest paths in G_k between consecutive key entities; the triples of
  G_k whose two ends lie on those paths;
* sources: whole chunks, ranked by Personalized PageRank over the entity–chunk graph
  (``tasks.graph_rank``) with BM25 + dense as its prior, the dense top-3 always included. They
  get the largest share of the budget: they are what a multi-hop answer needs, and the graph's
  job is to find the passages dense search misses (the second hop).

Modes, all at the same token budget: ``hi`` (all of the above), ``hi-nobridge``, ``flat``
(layer-0 KG only: no summary entities in the local level or on paths), ``ppr`` (graph-ranked
sources only), ``hybrid`` (BM25 fused with dense by reciprocal rank, no graph) and ``naive``
(dense chunk search only). Sources are packed whole: a chunk that does not fit the budget left
is skipped, never cut. The snapshot is loaded once (vectors as in-memory matrices, G_k as a
graph, the BM25 index and the passage graph on first use) and reused across questions.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import numpy as np

from schemas.config import RetrievalConfig
from schemas.tables import schema_for
from tasks.catalog import Catalog
from tasks.chunk import count_tokens, truncate_tokens
from tasks.graph_rank import PassageGraph, RankParams, build_passage_graph, rank_chunks
from tasks.lexical import BM25Index, rrf
from tasks.merge import explicit_title

MODES = ("hi", "hi-nobridge", "flat", "ppr", "hybrid", "naive")
SECTIONS = ("entities", "communities", "bridge", "chunks")
MODE_SECTIONS = {
    "hi": ("entities", "communities", "bridge", "chunks"),
    "hi-nobridge": ("entities", "communities", "chunks"),
    "flat": ("entities", "communities", "bridge", "chunks"),
    "ppr": ("chunks",),
    "hybrid": ("chunks",),
    "naive": ("chunks",),
}
#: how each mode orders its sources
SOURCE_RANKING = {"hi": "ppr", "hi-nobridge": "ppr", "flat": "ppr", "ppr": "ppr", "hybrid": "hybrid", "naive": "dense"}
MAX_SOURCES = 200  # candidates considered for the sources section


def _matrix(table) -> np.ndarray:
    if table.num_rows == 0:
        return np.zeros((0, 0), dtype=np.float32)
    col = table.column("vector").combine_chunks()
    return np.asarray(col.values.to_numpy(zero_copy_only=False), dtype=np.float32).reshape(table.num_rows, -1)


@dataclass
class IndexView:
    """Everything retrieval needs from one snapshot, in memory."""

    version: int
    dim: int
    ent_ids: list[str]
    ent_name: list[str]
    ent_type: list[str]
    ent_desc: list[str]
    ent_layer: np.ndarray
    ent_chunks: list[list[str]]
    ent_vecs: np.ndarray
    graph: nx.Graph
    edge_rel: dict[tuple[int, int], list[int]]
    rel_rows: list[dict[str, Any]]
    communities: list[dict[str, Any]]
    ent_communities: dict[int, list[int]]
    reports: dict[str, dict[str, Any]]
    chunk_ids: list[str]
    chunk_text: list[str]
    chunk_doc: list[str]
    chunk_vecs: np.ndarray
    chunk_index: dict[str, int]
    doc_source: dict[str, str]
    doc_title: dict[str, str]
    ent_index: dict[str, int] = field(default_factory=dict)
    flat_graph: nx.Graph = field(default=None)  # type: ignore[assignment]
    catalog: Catalog | None = None
    snap: dict[str, Any] | None = None
    _lazy: dict[str, Any] = field(default_factory=dict)
    _ntok: dict[int, int] = field(default_factory=dict)
    _lazy_lock: threading.Lock = field(default_factory=threading.Lock)

    def _once(self, name: Any, build):
        with self._lazy_lock:
            if name not in self._lazy:
                self._lazy[name] = build()
            return self._lazy[name]

    def adjacency(self, flat: bool) -> list[list[int]]:
        """Sorted neighbour lists of G_k (or of its layer-0 part), for bridge-path search."""
        graph = self.flat_graph if flat else self.graph
        return self._once(("adj", flat), lambda: [sorted(graph.adj[n]) if n in graph else [] for n in range(len(self.ent_ids))])

    def tokens(self, j: int, text: str) -> int:
        """Token count of chunk ``j``'s source text, counted once per view."""
        n = self._ntok.get(j)
        if n is None:
            n = self._ntok[j] = count_tokens(text)
        return n

    def lexical(self) -> BM25Index:
        """BM25 over the chunk texts (each led by its document's own title, if it has one), built on first use."""
        def build() -> BM25Index:
            titles = {d: explicit_title({"title": self.doc_title[d], "source_id": self.doc_source[d]}) for d in self.doc_title}
            return BM25Index([f"{titles.get(d) or ''} {t}" for d, t in zip(self.chunk_doc, self.chunk_text)])

        return self._once("bm25", build)

    def passage_graph(self, params: RankParams) -> PassageGraph:
        """The entity–chunk graph for Personalized PageRank, built on first use from ``mentions`` and ``relations``."""
        key = ("graph", params.relation_share, params.damping, params.max_df)
        return self._once(key, lambda: self._build_graph(params))

    def _build_graph(self, params: RankParams) -> PassageGraph:
        import polars as pl

        if self.catalog is not None and self.snap is not None:
            table = self.catalog.read("mentions", snap=self.snap).select(["kind", "chunk_id", "key", "description"])
        else:
            table = schema_for("mentions", 0).empty_table().select(["kind", "chunk_id", "key", "description"])
        mentions = pl.from_arrow(table).filter(pl.col("kind") == "entity").drop("kind")
        relations = [(self.ent_index.get(r["source_id"]), self.ent_index.get(r["target_id"]), float(r["weight"]))
                     for r in self.rel_rows if r["kind"] == "extracted"]
        return build_passage_graph(self.chunk_index, self.ent_name, self.ent_type, self.ent_layer, mentions,
                                   [r for r in relations if r[0] is not None and r[1] is not None], params)

    @classmethod
    def load(cls, catalog: Catalog, as_of: int | None = None) -> "IndexView":
        snap = catalog.require_snapshot(as_of)
        ents = catalog.read("entities", snap=snap)
        rels = catalog.read("relations", snap=snap).drop(["version"]).to_pylist()
        comms = catalog.read("communities", snap=snap).to_pylist()
        reports = {r["community_id"]: r for r in catalog.read("community_reports", snap=snap).drop(["vector"]).to_pylist()}
        chunks = catalog.read("chunks", snap=snap)
        docs = catalog.read("documents", snap=snap).select(["id", "source_id", "title"]).to_pylist()
        ids = ents.column("id").to_pylist()
        index = {e: i for i, e in enumerate(ids)}
        layer = np.asarray(ents.column("layer").to_pylist(), dtype=np.int64)
        graph, flat = nx.Graph(), nx.Graph()
        graph.add_nodes_from(range(len(ids)))
        flat.add_nodes_from(int(i) for i in np.flatnonzero(layer == 0))
        edge_rel: dict[tuple[int, int], list[int]] = defaultdict(list)
        for k, r in enumerate(rels):
            a, b = index.get(r["source_id"]), index.get(r["target_id"])
            if a is None or b is None or a == b:
                continue
            key = (a, b) if a < b else (b, a)
            edge_rel[key].append(k)
            graph.add_edge(*key)
            if layer[a] == 0 and layer[b] == 0:
                flat.add_edge(*key)
        ent_comms: dict[int, list[int]] = defaultdict(list)
        comms = sorted(comms, key=lambda c: (c["level"], c["id"]))
        for ci, c in enumerate(comms):
            c["members"] = [index[e] for e in c["entity_ids"] if e in index]
            for m in c["members"]:
                ent_comms[m].append(ci)
        chunk_ids = chunks.column("id").to_pylist()
        view = cls(
            version=snap["version"], dim=snap["dim"], ent_ids=ids,
            ent_name=ents.column("name").to_pylist(), ent_type=ents.column("type").to_pylist(),
            ent_desc=ents.column("description").to_pylist(), ent_layer=layer,
            ent_chunks=ents.column("source_chunk_ids").to_pylist(), ent_vecs=_matrix(ents),
            graph=graph, edge_rel=dict(edge_rel), rel_rows=rels, communities=comms, ent_communities=dict(ent_comms),
            reports=reports, chunk_ids=chunk_ids, chunk_text=chunks.column("text").to_pylist(),
            chunk_doc=chunks.column("document_id").to_pylist(), chunk_vecs=_matrix(chunks),
            chunk_index={c: i for i, c in enumerate(chunk_ids)},
            doc_source={d["id"]: d["source_id"] for d in docs}, doc_title={d["id"]: d["title"] for d in docs},
        )
        view.flat_graph = flat
        view.ent_index = index
        view.catalog, view.snap = catalog, snap
        return view


_VIEWS: OrderedDict[tuple[str, int], IndexView] = OrderedDict()
_VIEWS_LOCK = threading.Lock()


def load_view(catalog: Catalog, as_of: int | None = None) -> IndexView:
    """The in-memory view of a snapshot, loaded once per (index, version) and reused (2 kept)."""
    version = catalog.require_snapshot(as_of)["version"]
    key = (catalog.uri, version)
    with _VIEWS_LOCK:
        if key in _VIEWS:
            _VIEWS.move_to_end(key)
            return _VIEWS[key]
    view = IndexView.load(catalog, version)
    with _VIEWS_LOCK:
        _VIEWS[key] = view
        while len(_VIEWS) > 2:
            _VIEWS.popitem(last=False)
    return view


# ---------------------------------------------------------------------------- the three levels
def top_k(scores: np.ndarray, k: int, candidates: np.ndarray | None = None) -> list[int]:
    """Indices of the k best scores, best first, ties broken by index (deterministic)."""
    idx = np.arange(len(scores)) if candidates is None else candidates
    if len(idx) == 0:
        return []
    s = scores[idx]
    if len(idx) > k:
        part = np.argpartition(-s, k - 1)[:k]
        idx, s = idx[part], s[part]
    order = np.lexsort((idx, -s))
    return [int(i) for i in idx[order]]


def local_entities(view: IndexView, scores: np.ndarray, n: int, flat: bool, min_sim: float) -> tuple[list[int], np.ndarray]:
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


def bridge_triples(view: IndexView, paths: list[list[int]], graph: nx.Graph) -> list[int]:
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


# ---------------------------------------------------------------------------- sources
def rank_params(cfg: RetrievalConfig) -> RankParams:
    return RankParams(damping=cfg.ppr_damping, relation_share=cfg.ppr_relation_share, prior_weight=cfg.ppr_prior_weight,
                      chain_chunks=cfg.ppr_chain_chunks, chain_weight=cfg.ppr_chain_weight, max_df=cfg.ppr_max_df,
                      vector_seeds=cfg.ppr_vector_seeds, vector_threshold=cfg.ppr_vector_threshold)


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
    params = rank_params(cfg)
    graph = view.passage_graph(params)
    scores, seeds = rank_chunks(graph, question, fused, params, ent_scores[graph.ent_view])
    ranked = [j for j in top_k(scores, MAX_SOURCES) if scores[j] > 0]
    # safety net: the dense top-N right after the graph's own top-N, wherever the walk put them
    safety = [i for i in top_k(dense, cfg.safety_top) if related[i]] if cfg.safety_top else []
    head = ranked[: cfg.safety_top]
    head += [i for i in safety if i not in head]
    return head + [j for j in ranked[cfg.safety_top :] if j not in head], seeds


# ---------------------------------------------------------------------------- context assembly
@dataclass
class Context:
    question: str
    mode: str
    version: int
    entities: list[dict[str, Any]] = field(default_factory=list)
    communities: list[dict[str, Any]] = field(default_factory=list)
    bridge: list[dict[str, Any]] = field(default_factory=list)
    chunks: list[dict[str, Any]] = field(default_factory=list)
    tokens: dict[str, int] = field(default_factory=dict)
    message: str = ""
    ranked_chunk_ids: list[str] = field(default_factory=list)  # the source ranking before the budget
    seeds: dict[str, list[str]] = field(default_factory=dict)  # graph-ranked sources: entities that seeded the walk

    @property
    def empty(self) -> bool:
        return not (self.entities or self.communities or self.bridge or self.chunks)

    def text(self) -> str:
        """The context as an LLM prompt section (also what evaluation searches for the answer)."""
        parts = []
        if self.entities:
            parts.append("## Entities\n" + "\n".join(e["text"] for e in self.entities))
        if self.communities:
            parts.append("## Community reports\n" + "\n".join(c["text"] for c in self.communities))
        if self.bridge:
            parts.append("## Reasoning paths\n" + "\n".join(b["text"] for b in self.bridge))
        if self.chunks:
            parts.append("## Sources\n" + "\n".join(c["text"] for c in self.chunks))
        return "\n\n".join(parts)

    def as_dict(self) -> dict[str, Any]:
        return {
            "question": self.question, "mode": self.mode, "version": self.version, "message": self.message,
            "tokens": self.tokens, "entities": self.entities, "communities": self.communities,
            "bridge": self.bridge, "chunks": self.chunks, "seeds": self.seeds,
        }


def _budgets(cfg: RetrievalConfig, mode: str) -> dict[str, int]:
    shares = {s: getattr(cfg, f"share_{s}") for s in MODE_SECTIONS[mode]}
    total = sum(shares.values()) or 1.0
    return {s: int(cfg.token_budget * v / total) for s, v in shares.items()}


def _fill(items: list[dict[str, Any]], budget: int) -> tuple[list[dict[str, Any]], int]:
    """Items in order while they fit; the first item that does not fit is cut to the remaining budget."""
    out, used = [], 0
    for it in items:
        n = count_tokens(it["text"])
        if used + n > budget:
            left = budget - used
            if left > 20:
                it = dict(it, text=truncate_tokens(it["text"], left), truncated=True)
                out.append(it)
                used += count_tokens(it["text"])
            break
        out.append(it)
        used += n
    return out, used


def _pack_sources(view: IndexView, order: list[int], scores: np.ndarray, budget: int,
                  min_tokens: int = 20) -> tuple[list[dict[str, Any]], int]:
    """Whole chunks in rank order; one that does not fit the budget left is skipped, never cut."""
    out, used = [], 0
    for j in order:
        if budget - used < min_tokens:
            break
        doc = view.chunk_doc[j]
        text = f"[{view.doc_title.get(doc)}] {view.chunk_text[j]}"
        n = view.tokens(j, text)
        if used + n <= budget:
            out.append({"id": view.chunk_ids[j], "document_id": doc, "source_id": view.doc_source.get(doc),
                        "title": view.doc_title.get(doc), "score": round(float(scores[j]), 4), "text": text})
            used += n
    return out, used


def retrieve(view: IndexView, question: str, q: np.ndarray, mode: str, cfg: RetrievalConfig) -> Context:
    """The three-level context (or a sources-only one) for one question, within ``cfg.token_budget``."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    ctx = Context(question=question, mode=mode, version=view.version)
    q = np.asarray(q, dtype=np.float32)  # a float64 query would upcast the whole vector matrix on every search
    budgets = _budgets(cfg, mode)
    flat = mode == "flat"
    chunk_scores = view.chunk_vecs @ q if len(view.chunk_ids) else np.zeros(0, dtype=np.float32)
    needs_entities = "entities" in budgets or (SOURCE_RANKING[mode] == "ppr" and cfg.ppr_vector_seeds)
    ent_scores = view.ent_vecs @ q if needs_entities and len(view.ent_ids) else np.zeros(len(view.ent_ids), np.float32)
    chunk_order, seeds = source_ranking(view, question, chunk_scores, ent_scores, SOURCE_RANKING[mode], cfg)

    if "entities" in budgets:
        local, scores = local_entities(view, ent_scores, cfg.top_n, flat, cfg.min_similarity)
        ent_items = [
            {"id": view.ent_ids[i], "name": view.ent_name[i], "type": view.ent_type[i], "layer": int(view.ent_layer[i]),
             "score": round(float(scores[i]), 4),
             "text": f"- {view.ent_name[i]} ({view.ent_type[i]}, layer {int(view.ent_layer[i])}): {view.ent_desc[i]}"}
            for i in local
        ]
        ctx.entities, ctx.tokens["entities"] = _fill(ent_items, budgets["entities"])

        comms = global_communities(view, local, cfg.max_communities)
        comm_items = []
        for c in comms:
            comm = view.communities[c]
            rep = view.reports.get(comm["id"])
            if rep is None:
                continue
            findings = " ".join(f"• {f}" for f in (rep["findings"] or [])[:3])
            comm_items.append(
                {"id": comm["id"], "level": comm["level"], "title": rep["title"], "rating": rep["rating"],
                 "summary": rep["summary"], "findings": rep["findings"],
                 "text": f"- [{rep['title']}] {rep['summary']} {findings}".strip()}
            )
        ctx.communities, ctx.tokens["communities"] = _fill(comm_items, budgets["communities"])

        if "bridge" in budgets:
            graph = view.flat_graph if flat else view.graph
            keys = key_entities(view, comms, scores, cfg.top_m, flat, cfg.max_key_entities)
            triples = bridge_triples(view, bridge_paths(view.adjacency(flat), keys, cfg.max_path_hops), graph)
            items = []
            for k in triples:
                r = view.rel_rows[k]
                items.append(
                    {"source": r["source_id"], "target": r["target_id"], "kind": r["kind"],
                     "text": f"- {_name(view, r['source_id'])} —[{r['kind']}]→ {_name(view, r['target_id'])}: {r['description']}"}
                )
            ctx.bridge, ctx.tokens["bridge"] = _fill(items, budgets["bridge"])

    left = cfg.token_budget - sum(ctx.tokens.values())  # sources take their share and whatever the others left
    ctx.chunks, ctx.tokens["chunks"] = _pack_sources(view, chunk_order, chunk_scores, max(left, 0))
    ctx.ranked_chunk_ids = [view.chunk_ids[j] for j in chunk_order]
    if seeds:
        graph = view.passage_graph(rank_params(cfg))
        ctx.seeds = {k: [view.ent_name[graph.ent_view[e]] for e in v] for k, v in seeds.items()}
    if ctx.empty:
        best = float(max(view.ent_vecs @ q, default=-1.0)) if len(view.ent_ids) else None
        ctx.message = (
            "the index is empty: nothing to retrieve" if not view.ent_ids and not view.chunk_ids
            else f"nothing in the index is related to the question (best similarity {best:.2f} < "
                 f"retrieval.min_similarity {cfg.min_similarity})"
        )
    return ctx


def _name(view: IndexView, eid: str) -> str:
    i = view.ent_index.get(eid)
    return view.ent_name[i] if i is not None else eid


# ---------------------------------------------------------------------------- extractive answer
_SENT = re.compile(r"(?<=[.!?])\s+")
_WORD = re.compile(r"[a-z0-9]+")
_STOP = set("the a an of in on at to for and or is was were are be by with from as that this which who what when where how why did does do".split())


def extractive_answer(ctx: Context, max_sentences: int = 3) -> str:
    """Without an LLM: the context sentences that share the most question words (ties: earlier first)."""
    qwords = {w for w in _WORD.findall(ctx.question.lower()) if w not in _STOP}
    if not qwords or ctx.empty:
        return ""
    sentences: list[str] = []
    for line in ctx.text().splitlines():
        line = line.strip("-• ").strip()
        if line and not line.startswith("##"):
            sentences.extend(s.strip() for s in _SENT.split(line) if len(s.strip()) > 20)
    scored = []
    for i, s in enumerate(dict.fromkeys(sentences)):
        words = set(_WORD.findall(s.lower()))
        overlap = len(qwords & words)
        if overlap:
            scored.append((-overlap / len(qwords), i, s))
    return " ".join(s for _, _, s in sorted(scored)[:max_sentences])
