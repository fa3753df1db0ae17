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

import contextlib
import functools
import json
import os
import re
import threading
from collections import OrderedDict, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np
import pyarrow as pa

from schemas.config import RetrievalConfig
from schemas.tables import SNAPSHOT_TABLES, schema_for
from tasks.catalog import Catalog, ann_search, has_vector_index, snapshot_note, vector_matrix
from tasks.chunk import count_tokens, truncate_tokens
from tasks.graph_rank import PassageGraph, RankParams, build_passage_graph, rank_chunks
from tasks.lexical import BM25Index, bm25s, rrf
from tasks.merge import explicit_title
from tasks.methods.registry import SHARED_MODES, all_modes, get_method, index_modes

MAX_SOURCES = 200  # candidates considered for the sources section




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
    ent_vecs: np.ndarray | None  # None: searched through the table's vector index (``ann``)
    graph: nx.Graph
    edge_rel: dict[tuple[int, int], list[int]]
    rel_rows: list[dict[str, Any]]
    communities: list[dict[str, Any]]
    ent_communities: dict[int, list[int]]
    reports: dict[str, dict[str, Any]]
    chunk_ids: list[str]
    chunk_text: list[str]
    chunk_doc: list[str]
    chunk_vecs: np.ndarray | None
    chunk_index: dict[str, int]
    doc_source: dict[str, str]
    doc_title: dict[str, str]
    ent_index: dict[str, int] = field(default_factory=dict)
    flat_graph: nx.Graph = field(default=None)  # type: ignore[assignment]
    catalog: Catalog | None = None
    snap: dict[str, Any] | None = None
    method: str = "hirag"
    ann: dict[str, Any] = field(default_factory=dict)  # table name -> its LanceDB table at the snapshot's version
    _lazy: dict[str, Any] = field(default_factory=dict)
    _ntok: dict[int, int] = field(default_factory=dict)
    _lazy_lock: threading.Lock = field(default_factory=threading.Lock)

    lance_version: int | None = None  # the ``_snapshots`` table's Lance version seen before this (latest) view was resolved
    from_disk: bool = False

    def __getstate__(self) -> dict[str, Any]:
        """What ``remember_view`` writes: everything but the open LanceDB handles and the lock."""
        state = dict(self.__dict__)
        state["catalog_uri"] = self.catalog.uri if self.catalog is not None else None
        for k in ("catalog", "ann", "_lazy_lock"):
            state.pop(k)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        uri = state.pop("catalog_uri")
        self.__dict__.update(state)
        self.catalog = Catalog(uri) if uri is not None else None  # connects to LanceDB only if a table is read
        self.ann, self._lazy_lock = {}, threading.Lock()

    def _once(self, name: Any, build):
        with self._lazy_lock:
            if name not in self._lazy:
                self._lazy[name] = build()
            return self._lazy[name]

    def similarity(self, name: str, q: np.ndarray, k: int) -> np.ndarray:
        """Cosine of ``q`` to every row of ``name`` (entities or chunks): a product with the vectors in memory,
        or, for a table past ``retrieval.ann_min_vectors``, its ``k`` nearest through the vector index (-1 elsewhere)."""
        ids, index, vecs = ((self.chunk_ids, self.chunk_index, self.chunk_vecs) if name == "chunks"
                            else (self.ent_ids, self.ent_index, self.ent_vecs))
        if not ids:
            return np.zeros(0, dtype=np.float32)
        if vecs is not None:
            return vecs @ q
        out = np.full(len(ids), -1.0, dtype=np.float32)
        found, sims = ann_search(self.ann[name], q, k)
        out[[index[i] for i in found]] = sims
        return out

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
        ann = {}  # vector tables searched through their LanceDB index: their vectors stay on disk
        for name in ("entities", "chunks"):
            tbl = catalog.open_table(name, snap=snap)
            if tbl is not None and has_vector_index(tbl):
                ann[name] = tbl

        def table(name: str) -> pa.Table:
            names = schema_for(name, snap["dim"]).names
            return catalog.read(name, snap=snap, columns=[c for c in names if c != "vector"] if name in ann else None)

        ents = table("entities")
        rels = catalog.read("relations", snap=snap).drop(["version"]).to_pylist()
        comms = catalog.read("communities", snap=snap).to_pylist()
        reports = {r["community_id"]: r for r in catalog.read("community_reports", snap=snap).drop(["vector"]).to_pylist()}
        chunks = table("chunks")
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
            ent_chunks=ents.column("source_chunk_ids").to_pylist(), ent_vecs=None if "entities" in ann else vector_matrix(ents),
            graph=graph, edge_rel=dict(edge_rel), rel_rows=rels, communities=comms, ent_communities=dict(ent_comms),
            reports=reports, chunk_ids=chunk_ids, chunk_text=chunks.column("text").to_pylist(),
            chunk_doc=chunks.column("document_id").to_pylist(), chunk_vecs=None if "chunks" in ann else vector_matrix(chunks),
            chunk_index={c: i for i, c in enumerate(chunk_ids)},
            doc_source={d["id"]: d["source_id"] for d in docs}, doc_title={d["id"]: d["title"] for d in docs},
        )
        view.flat_graph = flat
        view.ent_index = index
        view.catalog, view.snap, view.ann = catalog, snap, ann
        view.method = snapshot_note(snap).get("method", "hirag")  # snapshots before index methods existed are hirag
        return view


_VIEWS: OrderedDict[tuple[str, int], IndexView] = OrderedDict()
_VIEWS_LOCK = threading.Lock()


def load_view(catalog: Catalog, as_of: int | None = None) -> IndexView:
    """The in-memory view of a snapshot, loaded once per (index, version) and reused (2 kept); the latest one
    from the copy a previous process left on disk (``remember_view``) while it is still the latest."""
    head = _disk_head(catalog)
    if head is not None and as_of in (None, head["version"]):
        view = _cached(catalog.uri, head["version"], lambda: _read_disk_view(catalog, head))
        if view is not None:
            return view
    seen = _snapshots_lance_version(catalog)  # before the snapshot is resolved: a publish after it only makes
    version = catalog.require_snapshot(as_of)["version"]  # the copy on disk look older than it is
    view = _cached(catalog.uri, version, lambda: IndexView.load(catalog, version))
    if as_of is None and view.lance_version is None:
        view.lance_version = seen
    return view


def _cached(uri: str, version: int, load: Callable[[], IndexView | None]) -> IndexView | None:
    key = (uri, version)
    with _VIEWS_LOCK:
        if key in _VIEWS:
            _VIEWS.move_to_end(key)
            return _VIEWS[key]
    view = load()
    if view is None:
        return None
    with _VIEWS_LOCK:
        _VIEWS[key] = view
        while len(_VIEWS) > 2:
            _VIEWS.popitem(last=False)
    return view


# ---------------------------------------------------------------------------- the view on disk
#: bump when what a view holds changes shape (a copy of another format is ignored and rewritten)
VIEW_FORMAT = 1


def _views_dir(catalog: Catalog) -> Path | None:
    return catalog.cache_dir / "views" if catalog.root is not None else None


def _snapshots_lance_version(catalog: Catalog) -> int | None:
    """The newest Lance version of the ``_snapshots`` table, read off its manifest file names without opening
    LanceDB: every publish, rollback and gc appends a version, so while this number stands the latest snapshot
    does too. None for a remote index or a layout this code does not know (then nothing is cached)."""
    if catalog.root is None:
        return None
    try:
        names = [p.name for p in (catalog.root / "lance" / "_snapshots.lance" / "_versions").iterdir()
                 if p.name.endswith(".manifest")]
    except OSError:
        return None
    versions = []
    for name in names:
        stem = name.removesuffix(".manifest")
        if not stem.isdigit():
            return None
        n = int(stem)
        versions.append(2**64 - 1 - n if n >= 2**63 else n)  # Lance names manifests u64::MAX - version (newest first)
    return max(versions) if versions else None


@functools.lru_cache(maxsize=1)
def _code_stamp() -> str:
    """The retrieval code the copy was made by: a copy made by other code, or pickled with other versions of the
    libraries whose objects it holds, is not read."""
    import hashlib
    import importlib

    import scipy

    digest = hashlib.sha256(str(VIEW_FORMAT).encode())
    for module in ("tasks.retrieve", "tasks.graph_rank", "tasks.lexical", "schemas.tables"):
        digest.update(Path(importlib.import_module(module).__file__).read_bytes())
    for library in (np, pa, nx, scipy, bm25s()):  # all imported by now or right after (bm25s: to read the copy)
        digest.update(f"{library.__name__}={library.__version__}".encode())
    return digest.hexdigest()[:16]


def _disk_head(catalog: Catalog) -> dict[str, Any] | None:
    """The copy on disk's record, when it was made of the snapshot that is still the latest, by this code."""
    folder = _views_dir(catalog)
    if folder is None:
        return None
    try:
        head = json.loads((folder / "head.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if head.get("lance_version") is None or head.get("lance_version") != _snapshots_lance_version(catalog):
        return None
    if head.get("code") != _code_stamp() or head.get("files") != _data_files(catalog):
        return None  # other code, or a table's data files changed (a deleted file must fail as the tables do)
    return head


def _data_files(catalog: Catalog) -> dict[str, int]:
    """Every data file of the snapshot tables, with its size: a copy is read only while these are as they were
    when it was made (a listing of a few folders; a damaged index then fails as a load from the tables does)."""
    files: dict[str, int] = {}
    for name in SNAPSHOT_TABLES:
        folder = catalog.root / "lance" / f"{name}.lance" / "data"
        with contextlib.suppress(OSError):
            for entry in os.scandir(folder):
                files[f"{name}/{entry.name}"] = entry.stat().st_size
    return files


def _read_disk_view(catalog: Catalog, head: dict[str, Any]) -> IndexView | None:
    import pickle

    bm25s()  # the pickled BM25 index names bm25s: imported first, without numba
    try:
        with open(_views_dir(catalog) / head["file"], "rb") as fh:
            view = pickle.load(fh)
    except Exception:  # noqa: BLE001 - a damaged or partial copy: load from the tables instead
        return None
    if not isinstance(view, IndexView) or view.version != head["version"]:
        return None
    view.catalog, view.from_disk = catalog, True
    return view


def remember_view(view: IndexView) -> None:
    """Leave the latest snapshot's view (with the BM25 index and passage graph it built) on disk, so that the next
    process asking a question skips loading the tables and importing LanceDB (``strata query``: 3.4 s -> 1.6 s on
    the demo index). Written aside and moved into place; only for a local index whose vectors are in the view."""
    import os
    import pickle
    import tempfile

    catalog = view.catalog
    folder = _views_dir(catalog) if catalog is not None else None
    if folder is None or view.from_disk or view.lance_version is None or view.ann:
        return
    folder.mkdir(parents=True, exist_ok=True)
    name = f"view-v{view.version}.pkl"
    head = {"version": view.version, "lance_version": view.lance_version, "code": _code_stamp(), "file": name,
            "files": _data_files(catalog)}
    try:
        with tempfile.NamedTemporaryFile("wb", dir=folder, delete=False, suffix=".tmp") as fh:
            pickle.dump(view, fh, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(fh.name, folder / name)
        with tempfile.NamedTemporaryFile("w", dir=folder, delete=False, suffix=".tmp", encoding="utf-8") as fh:
            json.dump(head, fh)
        os.replace(fh.name, folder / "head.json")
        for old in folder.glob("view-v*.pkl"):
            if old.name != name:
                old.unlink(missing_ok=True)
    except OSError:  # a read-only or full disk: the next query loads from the tables, as this one did
        for tmp in folder.glob("*.tmp"):
            tmp.unlink(missing_ok=True)


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


# ---------------------------------------------------------------------------- sources
def rank_params(cfg: RetrievalConfig) -> RankParams:
    return RankParams.from_config(cfg)


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
    query_vector: Any = None  # the question's vector (for a method's own search)

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
        """The context as plain data (``strata query --json``, the service): texts with Unix line ends."""
        def plain(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [it | {"text": it["text"].replace("\r\n", "\n")} if "\r" in it.get("text", "") else it for it in items]

        return {
            "question": self.question, "mode": self.mode, "version": self.version, "message": self.message,
            "tokens": self.tokens, "entities": plain(self.entities), "communities": plain(self.communities),
            "bridge": plain(self.bridge), "chunks": plain(self.chunks), "seeds": self.seeds,
        }


def _budgets(cfg: RetrievalConfig, sections: tuple[str, ...]) -> dict[str, int]:
    shares = {s: getattr(cfg, f"share_{s}") for s in (*sections, "chunks")}
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
    method = get_method(view.method)
    if mode not in method.modes and mode not in SHARED_MODES:
        raise ValueError(f"unknown mode {mode!r}; this {view.method} index offers {', '.join(index_modes(view.method))}")
    q = np.asarray(q, dtype=np.float32)  # a float64 query would upcast the whole vector matrix on every search
    ctx = Context(question=question, mode=mode, version=view.version, query_vector=q)
    budgets = _budgets(cfg, method.modes.get(mode, ()))
    ranking = SHARED_MODES.get(mode, "ppr")
    chunk_scores = view.similarity("chunks", q, cfg.ann_candidates)
    needs_entities = mode in method.modes or (ranking == "ppr" and cfg.ppr_vector_seeds)
    ent_scores = (view.similarity("entities", q, cfg.ann_candidates) if needs_entities
                  else np.zeros(len(view.ent_ids), np.float32))
    chunk_order, seeds = source_ranking(view, question, chunk_scores, ent_scores, ranking, cfg)

    # sources first, in their share; then the method's levels, which skip what only repeats a source;
    # then the sources take whatever budget the levels left
    ctx.chunks, ctx.tokens["chunks"] = _pack_sources(view, chunk_order, chunk_scores, budgets["chunks"])
    if mode in method.modes:
        method.levels(view, ctx, ent_scores, budgets, cfg)
        packed = {c["id"] for c in ctx.chunks}
        rest = [j for j in chunk_order if view.chunk_ids[j] not in packed]
        more, used = _pack_sources(view, rest, chunk_scores, cfg.token_budget - sum(ctx.tokens.values()))
        ctx.chunks += more
        ctx.tokens["chunks"] += used
    ctx.ranked_chunk_ids = [view.chunk_ids[j] for j in chunk_order]
    if seeds:
        graph = view.passage_graph(rank_params(cfg))
        ctx.seeds = {k: [view.ent_name[graph.ent_view[e]] for e in v] for k, v in seeds.items()}
    if ctx.empty:
        best = float(max(view.similarity("entities", q, 1), default=-1.0)) if len(view.ent_ids) else None
        ctx.message = (
            "the index is empty: nothing to retrieve" if not view.ent_ids and not view.chunk_ids
            else f"nothing in the index is related to the question (best similarity {best:.2f} < "
                 f"retrieval.min_similarity {cfg.min_similarity})"
        )
    return ctx


# ---------------------------------------------------------------------------- extractive answer
_SENT = re.compile(r"(?<=[.!?])\s+")
_WORD = re.compile(r"[a-z0-9]+")
_STOP = set("the a an of in on at to for and or is was were are be by with from as that this which who what when where how why did does do".split())


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


def best_sentences(ctx: Context, embed: Callable[[list[str]], np.ndarray] | None = None,
                   k: int = 2) -> list[tuple[str, str]]:
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
    order = [first] + [int(i) for i in np.lexsort((np.arange(len(cands)), -rest))[:k - 1] if rest[i] > 0]
    return [cands[i] for i in order]


def extractive_answer(ctx: Context, embed: Callable[[list[str]], np.ndarray] | None = None, k: int = 2) -> str:
    """Without an LLM: the best one or two sentences of the sources (``best_sentences``), each with its source."""
    return " ".join(f"{s} ({label})" if label else s for s, label in best_sentences(ctx, embed, k))