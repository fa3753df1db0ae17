"""One published snapshot in memory, for answering questions: ``IndexView`` (vectors as matrices, G_k as a
graph, the BM25 index and the passage graph built on first use), loaded once per (index, version) and kept;
the latest one also from the copy a previous process left on disk (``remember_view``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import threading
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast, overload

import numpy as np
import pyarrow as pa

from schemas.tables import SNAPSHOT_TABLES, schema_for
from tasks.errors import DamagedError, NotFoundError, SnapshotGone, StrataError
from tasks.index.chunk import explicit_title
from tasks.retrieval.graph_rank import PassageGraph, RankParams, build_passage_graph
from tasks.retrieval.lexical import BM25Index, bm25s
from tasks.runtime.tokens import count_tokens
from tasks.store.catalog import Catalog
from tasks.store.rows import reading_order, snapshot_note, vector_matrix
from tasks.store.vectors import ann_search, has_vector_index


class Graph:
    """An undirected graph over entity indices, as much of networkx's ``Graph`` as retrieval and the explorer use
    (``adj``, ``degree(n)``, ``in``, ``add_edge``): a query does not import networkx (~0.3 s of a cold query). Each
    node's neighbours keep the order their edges were added in, as networkx keeps them."""

    def __init__(self, nodes: Iterable[int] = ()) -> None:
        self.adj: dict[int, dict[int, None]] = {int(n): {} for n in nodes}

    def add_edge(self, a: int, b: int) -> None:
        self.adj.setdefault(a, {})[b] = None
        self.adj.setdefault(b, {})[a] = None

    def degree(self, n: int) -> int:
        return len(self.adj[n])

    def number_of_edges(self) -> int:
        return sum(len(v) for v in self.adj.values()) // 2  # no self-loops: the view never adds one

    def __contains__(self, n: object) -> bool:
        return n in self.adj


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
    ent_aliases: list[list[str] | None]  # layer 0: names merged into the entity (``entities.aliases``)
    ent_vecs: np.ndarray | None  # None: searched through the table's vector index (``ann``)
    graph: Graph
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
    #: the reports' vectors (title and summary embedded), a row per ``report_row`` community id; None: not loaded
    report_vecs: np.ndarray | None = None
    report_row: dict[str, int] = field(default_factory=dict)
    flat_graph: Graph = field(default=None)  # type: ignore[assignment]
    catalog: Catalog | None = None
    snap: dict[str, Any] | None = None
    method: str = "hirag"
    ann: dict[str, Any] = field(default_factory=dict)  # table name -> its LanceDB table at the snapshot's version
    _lazy: dict[str, Any] = field(default_factory=dict)
    _ntok: dict[int, int] = field(default_factory=dict)
    _lazy_lock: threading.Lock = field(default_factory=threading.Lock)

    lance_version: int | None = (
        None  # the ``_snapshots`` table's Lance version seen before this (latest) view was resolved
    )
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
        self.__dict__.setdefault("report_row", {})  # a view left by a build before report vectors were kept
        self.catalog = Catalog(uri, create=False) if uri is not None else None  # LanceDB only if a table is read
        self.ann, self._lazy_lock = {}, threading.Lock()

    def _once(self, name: Any, build):
        with self._lazy_lock:
            if name not in self._lazy:
                self._lazy[name] = build()
            return self._lazy[name]

    def similarity(self, name: str, q: np.ndarray, k: int) -> np.ndarray:
        """Cosine of ``q`` to every row of ``name`` (entities or chunks): a product with the vectors in memory,
        or, for a table past ``retrieval.ann_min_vectors``, its ``k`` nearest through the vector index (-1 elsewhere)."""
        ids, index, vecs = (
            (self.chunk_ids, self.chunk_index, self.chunk_vecs)
            if name == "chunks"
            else (self.ent_ids, self.ent_index, self.ent_vecs)
        )
        if not ids:
            return np.zeros(0, dtype=np.float32)
        if vecs is not None:
            return vecs @ q
        out = np.full(len(ids), -1.0, dtype=np.float32)
        found, sims = ann_search(self.ann[name], q, k)
        out[[index[i] for i in found]] = sims
        return out

    def name_of(self, entity_id: str) -> str:
        """An entity's name (its id where the view does not hold it)."""
        i = self.ent_index.get(entity_id)
        return self.ent_name[i] if i is not None else entity_id

    def statement(self, relation: dict[str, Any], kind: bool = True) -> str:
        """A relation as a reader reads it: "Scrooge —employs→ Bob Cratchit", from the end its label reads from;
        where it has no label "A —[kind]→ B", or "A — B" without ``kind``."""
        first, second = reading_order(relation)
        if relation.get("label"):
            return f"{self.name_of(first)} —{relation['label']}→ {self.name_of(second)}"
        link = f" —[{relation['kind']}]→ " if kind else " — "
        return self.name_of(first) + link + self.name_of(second)

    def report_similarity(self, community_id: str, q: np.ndarray) -> float | None:
        """Cosine of ``q`` to a community's report vector; None when the view holds none for it."""
        row = self.report_row.get(community_id)
        if row is None or self.report_vecs is None or row >= len(self.report_vecs):
            return None
        return float(self.report_vecs[row] @ q)

    def adjacency(self, flat: bool) -> list[list[int]]:
        """Sorted neighbour lists of G_k (or of its layer-0 part), for bridge-path search."""
        graph = self.flat_graph if flat else self.graph
        return self._once(
            ("adj", flat), lambda: [sorted(graph.adj[n]) if n in graph else [] for n in range(len(self.ent_ids))]
        )

    def tokens(self, j: int, text: str) -> int:
        """Token count of chunk ``j``'s source text, counted once per view."""
        n = self._ntok.get(j)
        if n is None:
            n = self._ntok[j] = count_tokens(text)
        return n

    def lexical(self) -> BM25Index:
        """BM25 over the chunk texts (each led by its document's own title, if it has one), built on first use."""

        def build() -> BM25Index:
            titles = {
                d: explicit_title({"title": self.doc_title[d], "source_id": self.doc_source[d]}) for d in self.doc_title
            }
            return BM25Index([f"{titles.get(d) or ''} {t}" for d, t in zip(self.chunk_doc, self.chunk_text)])

        return self._once("bm25", build)

    def warm(self, cfg: Any) -> None:
        """Build now what a query with retrieval settings ``cfg`` builds on first use (the BM25 index, the passage
        graph), so that a copy left on disk (``remember_view``) spares the next process reading any table."""
        self.lexical()
        self.passage_graph(RankParams.from_config(cfg))

    def passage_graph(self, params: RankParams) -> PassageGraph:
        """The entity–chunk graph for Personalized PageRank, built on first use from ``mentions`` and ``relations``."""
        key = ("graph", params.relation_share, params.damping, params.max_df)
        return self._once(key, lambda: self._build_graph(params))

    def _build_graph(self, params: RankParams) -> PassageGraph:
        import polars as pl

        if self.catalog is not None and self.snap is not None:
            table = self.catalog.read("mentions", snap=self.snap, columns=["kind", "chunk_id", "key", "description"])
        else:
            table = schema_for("mentions", 0).empty_table().select(["kind", "chunk_id", "key", "description"])
        mentions = cast(pl.DataFrame, pl.from_arrow(table)).filter(pl.col("kind") == "entity").drop("kind")
        relations = [
            (self.ent_index.get(r["source_id"]), self.ent_index.get(r["target_id"]), float(r["weight"]))
            for r in self.rel_rows
            if r["kind"] == "extracted"
        ]
        return build_passage_graph(
            self.chunk_index,
            self.ent_name,
            self.ent_type,
            self.ent_layer,
            mentions,
            [(a, b, w) for a, b, w in relations if a is not None and b is not None],
            params,
            self.ent_aliases,
        )

    @classmethod
    def load(cls, catalog: Catalog, as_of: int | None = None) -> IndexView:
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
        report_table = catalog.read("community_reports", snap=snap)
        reports = {r["community_id"]: r for r in report_table.drop(["vector"]).to_pylist()}
        chunks = table("chunks")
        docs = catalog.read("documents", snap=snap, columns=["id", "source_id", "title"]).to_pylist()
        ids = ents.column("id").to_pylist()
        index = {e: i for i, e in enumerate(ids)}
        layer = np.asarray(ents.column("layer").to_pylist(), dtype=np.int64)
        graph, flat = Graph(range(len(ids))), Graph(np.flatnonzero(layer == 0))
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
            version=snap["version"],
            dim=snap["dim"],
            ent_ids=ids,
            ent_name=ents.column("name").to_pylist(),
            ent_type=ents.column("type").to_pylist(),
            ent_desc=ents.column("description").to_pylist(),
            ent_layer=layer,
            ent_chunks=ents.column("source_chunk_ids").to_pylist(),
            ent_aliases=ents.column("aliases").to_pylist(),
            ent_vecs=None if "entities" in ann else vector_matrix(ents),
            graph=graph,
            edge_rel=dict(edge_rel),
            rel_rows=rels,
            communities=comms,
            ent_communities=dict(ent_comms),
            reports=reports,
            chunk_ids=chunk_ids,
            chunk_text=chunks.column("text").to_pylist(),
            chunk_doc=chunks.column("document_id").to_pylist(),
            chunk_vecs=None if "chunks" in ann else vector_matrix(chunks),
            chunk_index={c: i for i, c in enumerate(chunk_ids)},
            doc_source={d["id"]: d["source_id"] for d in docs},
            doc_title={d["id"]: d["title"] for d in docs},
        )
        view.flat_graph = flat
        view.ent_index = index
        view.report_vecs = vector_matrix(report_table)
        view.report_row = {c: i for i, c in enumerate(report_table.column("community_id").to_pylist())}
        view.catalog, view.snap, view.ann = catalog, snap, ann
        view.method = snapshot_note(snap).get("method", "hirag")  # snapshots before index methods existed are hirag
        return view


_VIEWS: OrderedDict[tuple[str, int], IndexView] = OrderedDict()


_VIEWS_LOCK = threading.Lock()


@contextlib.contextmanager
def removed_meanwhile(catalog: Catalog, version: int, tables: dict[str, int] | None = None):
    """Reads of snapshot ``version`` (its table versions ``tables``, where known): a failure (a table version's
    files missing, say) while that snapshot is no longer published, or pins other table versions — ``strata gc``
    removed it, or wrote its tables' history again, under the reader — is ``SnapshotGone``, a clear and retryable
    error, not an internal one; the view of it is dropped, so the next read resolves the snapshot again."""

    try:
        yield
    except Exception as exc:
        if isinstance(exc, StrataError) and not isinstance(exc, DamagedError):
            raise  # a usage error, say: nothing to do with the snapshot
        try:  # a fresh handle: the reader's own may still see the snapshots table as it was when opened
            now = Catalog(catalog.uri, create=False, storage=catalog._storage).snapshot(version)
            gone = now is None or (tables is not None and now["tables"] != tables)
        except NotFoundError:
            gone = True
        except Exception:  # noqa: BLE001 - the index itself unreadable: the first error tells more
            gone = False
        if not gone:
            raise
        with _VIEWS_LOCK:
            _VIEWS.pop((catalog.uri, version), None)
        raise SnapshotGone(
            f"snapshot v{version} was removed or rewritten by `strata gc` while it was being read: ask again, "
            "the newest snapshot answers"
        ) from exc


def load_view(catalog: Catalog, as_of: int | None = None) -> IndexView:
    """The in-memory view of a snapshot, loaded once per (index, version) and reused (2 kept); the latest one
    from the copy a previous process left on disk (``remember_view``) while it is still the latest."""
    head = _disk_head(catalog)
    if head is not None and as_of in (None, head["version"]):
        view = _cached(catalog.uri, head["version"], lambda: _read_disk_view(catalog, head))
        if view is not None:
            return view
    seen = _snapshots_lance_version(catalog)  # before the snapshot is resolved: a publish after it only makes
    snap = catalog.require_snapshot(as_of)  # the copy on disk look older than it is
    version = snap["version"]
    with removed_meanwhile(catalog, version, snap["tables"]):
        view = _cached(catalog.uri, version, lambda: IndexView.load(catalog, version), snap["tables"])
    if as_of is None and view.lance_version is None:
        view.lance_version = seen
    return view


@overload
def _cached(
    uri: str, version: int, load: Callable[[], IndexView], tables: dict[str, int] | None = None
) -> IndexView: ...
@overload
def _cached(
    uri: str, version: int, load: Callable[[], IndexView | None], tables: dict[str, int] | None = None
) -> IndexView | None: ...
def _cached(
    uri: str, version: int, load: Callable[[], IndexView | None], tables: dict[str, int] | None = None
) -> IndexView | None:
    """The view of (index, version) held in memory, or ``load``'s; with ``tables`` (the snapshot's pins) one of
    other pins is loaded again: ``strata gc`` wrote the snapshot's tables again and removed those it read."""
    key = (uri, version)
    with _VIEWS_LOCK:
        held = _VIEWS.get(key)
        if held is not None and (tables is None or held.snap is None or held.snap.get("tables") == tables):
            _VIEWS.move_to_end(key)
            return held
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
VIEW_FORMAT = 3


def _views_dir(catalog: Catalog) -> Path:
    """Where views are left: under the index for a local one, the local cache folder for a remote one."""
    return catalog.cache_dir / "views"


def _snapshots_lance_version(catalog: Catalog) -> int | None:
    """The newest Lance version of the ``_snapshots`` table (``Catalog.snapshots_head``: a folder listing, one
    LIST request on object storage): while it stands the latest snapshot does too."""
    return catalog.snapshots_head()


@functools.lru_cache(maxsize=1)
def _code_stamp() -> str:
    """The retrieval code the copy was made by: a copy made by other code, or pickled with other versions of the
    libraries whose objects it holds, is not read."""
    import hashlib
    import importlib

    import scipy

    digest = hashlib.sha256(str(VIEW_FORMAT).encode())
    for module in ("tasks.query.retrieve", "tasks.retrieval.graph_rank", "tasks.retrieval.lexical", "schemas.tables"):
        digest.update(Path(cast(str, importlib.import_module(module).__file__)).read_bytes())  # modules of files
    for library in (np, pa, scipy, bm25s()):  # all imported by now or right after (bm25s: to read the copy)
        digest.update(f"{library.__name__}={library.__version__}".encode())
    return digest.hexdigest()[:16]


def _disk_head(catalog: Catalog) -> dict[str, Any] | None:
    """The copy on disk's record, when it was made of the snapshot that is still the latest, by this code."""
    folder = _views_dir(catalog)
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
    if catalog.root is None:  # object storage: the snapshot's manifests are checked (snapshots_head), not its files
        return files
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
    process asking a question skips loading the tables and importing LanceDB, most of a cold query's time. Written
    aside and moved into place: under a local index, or in the local cache folder for one on object storage
    (``storage.cache_dir``); only for a view whose vectors it holds (not past ``ann_min_vectors``)."""
    import pickle

    catalog = view.catalog
    folder = _views_dir(catalog) if catalog is not None else None
    if catalog is None or folder is None or view.from_disk or view.lance_version is None or view.ann:
        return
    folder.mkdir(parents=True, exist_ok=True)
    name = f"view-v{view.version}.pkl"
    head = {
        "version": view.version,
        "lance_version": view.lance_version,
        "code": _code_stamp(),
        "file": name,
        "files": _data_files(catalog),
    }
    try:
        write_aside(folder / name, lambda fh: pickle.dump(view, fh, protocol=pickle.HIGHEST_PROTOCOL))
        write_aside(folder / "head.json", lambda fh: fh.write(json.dumps(head).encode("utf-8")))
        for old in folder.glob("view-v*.pkl"):
            if old.name != name:
                old.unlink(missing_ok=True)
    except OSError:  # a read-only or full disk: the next query loads from the tables, as this one did
        pass


def write_aside(path: Path, write: Callable[[Any], None]) -> None:
    """``write(binary file)`` to a file beside ``path``, then moved into place, so a reader never sees half of it; on
    a failure (a read-only or full disk: ``OSError``) that file is removed and the error raised."""
    import tempfile

    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
