"""The index pipeline: one list of stages for full builds, updates and backfills.

    ingest → [diff] → chunk → extract → merge → embed → <index method: hierarchy or attach,
    communities, reports> → validate → publish

A build is an update of an empty index: every stage below serves both, and the update-only step
(``diff``) and the method's own steps are named stages too. Each stage runs through the one stage
runner (``tasks.stages``): timing, progress bar, its entry in the run record and its wrapping as a
Prefect task in the flows (``flows.index_flow``); benchmarks and tests call it directly. The index
method (``index.method``) builds everything above layer 0; no stage here knows which one runs.
"""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flows.lineage import BuildResult, code_version, deployment_name, digest_of
from schemas.config import StrataConfig
from schemas.tables import ChunkRow, DocumentRow, QuarantineRow, schema_for
from tasks.catalog import Catalog, TableDelta, plain_rows, relation_table, snapshot_note, to_table, vector_matrix
from tasks.errors import NotFoundError
from tasks.llm_client import LiteLLMClient, Usage
from tasks.merge import ChunkOrder
from tasks.methods.base import Hierarchy, Layer0
from tasks.methods.registry import get_method
from tasks.parallel import DaskPool, LocalMapper, Mapper
from tasks.progress import reporter
from tasks.spill import SpilledTable
from tasks.stages import Stages, TaskRunner, direct_task, limit_malloc_arenas, release_memory


def build_index(corpus: str, catalog: Catalog, cfg: StrataConfig, task: TaskRunner = direct_task,
                mapper: Mapper | None = None, run_id: str | None = None, flow_name: str = "index") -> BuildResult:
    """Full build: every document of ``corpus`` through every stage, one new snapshot."""
    return _execute(corpus, catalog, cfg, task, mapper or LocalMapper(), run_id, flow_name, None, None)


def update_index(corpus: str, catalog: Catalog, cfg: StrataConfig, task: TaskRunner = direct_task,
                 mapper: Mapper | None = None, run_id: str | None = None, flow_name: str = "refresh",
                 full: bool = False, replace_root: str | None = None) -> BuildResult:
    """Apply the corpus delta to the published index (a full build when the index is empty or ``full``).

    ``replace_root``: an indexed corpus root that ``corpus`` is the new location of (a moved mount, a new
    export folder): its documents are diffed against that root's instead of being added as a new root."""
    snap = catalog.snapshot()
    return _execute(corpus, catalog, cfg, task, mapper or LocalMapper(), run_id, flow_name, None if full else snap,
                    replace_root)


def run_stages(run: "PipelineRun") -> BuildResult:
    """The stages, top to bottom."""
    delta = ingest(run)
    if delta.empty:
        return run.result("nothing-to-do", delta)
    run.open_embedder()  # an update with an embedding model of another dimension stops here, before extraction
    run.mapper.start()  # the Dask cluster comes up while the run chunks
    documents, chunks = chunk(run, delta)
    # the documents' texts are in their table now: what later stages read of them is where they come from
    delta = replace(delta, incoming=[document_place(d) for d in delta.incoming], kept=[document_place(d) for d in delta.kept])
    chunks, new_mentions = extract(run, delta, chunks)
    layer0, mentions = merge(run, delta, chunks, new_mentions)
    layer0, chunk_vectors = embed(run, layer0, chunks)
    hierarchy = run.method.update(run, layer0) if run.snap else run.method.build(run, layer0)
    tables = assemble(run, delta, documents, chunks, chunk_vectors, layer0, hierarchy, mentions)
    # from here on the tables hold every row: the Python rows and vector matrices they were made from go
    del documents, chunks, chunk_vectors, mentions
    delta = replace(delta, incoming=[], kept=[])
    layer0, hierarchy = what_publish_reads(layer0, hierarchy)
    run.forget_previous()
    release_memory()  # before validation reads the spilled mentions part by part
    validate(run, tables)
    return publish(run, delta, tables, layer0, hierarchy)


def what_publish_reads(layer0: Layer0, hierarchy: Hierarchy) -> tuple[Layer0, Hierarchy]:
    """What publish still reads of a run's layer 0 and hierarchy (the ids added, the layer statistics), without
    their rows and vectors: at 100k chunks those are a gigabyte beside the assembled tables."""
    empty = np.zeros((0, 0), np.float32)
    return (Layer0([], empty, layer0.relations.slice(0, 0), added=layer0.added),
            Hierarchy([], empty, [], [], [], empty, hierarchy.layers))


# ---------------------------------------------------------------------------- the run
@dataclass
class Delta:
    """What a run applies: for a build every document is incoming; for an update, the diff."""

    root: str
    incoming: list[DocumentRow]  # documents to chunk and extract (new and changed)
    kept: list[DocumentRow] = field(default_factory=list)  # previous documents that stay
    gone: set[str] = field(default_factory=set)  # previous document ids deleted or replaced
    gone_chunks: set[str] = field(default_factory=set)  # their chunk ids
    counts: dict[str, int] = field(default_factory=dict)
    digest: str = ""
    n_inputs: int = 0

    @property
    def empty(self) -> bool:
        return not self.incoming and not self.gone


#: the stages that embed; a stage not among them ends the embedding model's child process, if one runs
EMBEDDING_STAGES = frozenset({"embed", "hierarchy", "attach", "reports"})


class PipelineRun:
    """One run's state and services; it is also the ``MethodContext`` an index method receives."""

    def __init__(self, corpus: str, catalog: Catalog, cfg: StrataConfig, stages: Stages, mapper: Mapper,
                 run_id: str, version: int, snap: dict[str, Any] | None, usage: Usage):
        self.corpus, self.catalog, self.cfg, self.stages, self.mapper = corpus, catalog, cfg, stages, mapper
        self.run_id, self.version, self.snap, self.usage = run_id, version, snap, usage
        self.method = get_method(cfg.index.method)
        self.llm = LiteLLMClient(cfg.llm, catalog.cache_dir) if cfg.llm.model else None
        self.quarantine: list[QuarantineRow] = []
        self.location = str(Path(corpus).expanduser().resolve())
        self.root = self.location  # the corpus root the documents belong to (see corpus_root)
        self._embedder = None
        self._previous: dict[tuple[str, tuple[str, ...] | None, str | None], pa.Table] = {}

    @property
    def spill_dir(self) -> Path:
        """Where the run keeps tables too large for memory until publish (removed when the run ends)."""
        return self.catalog.cache_dir / "spill" / self.run_id

    def stage(self, name: str, total: int | None = None):
        if name not in EMBEDDING_STAGES:  # Leiden, validation, publish: not beside the embedding model's process
            self.release_embedder()
        return self.stages(name, total)

    @property
    def note(self) -> dict[str, Any]:
        """The previous snapshot's note (drift, root locations, method), empty for a build."""
        return snapshot_note(self.snap)

    def open_embedder(self):
        """The run's embedder, cached by text hash; an update checks it gives the index's vector dimension."""
        from tasks.embed import (LOCAL_MODEL, CachedEmbedder, ChildEmbedder, EmbeddingCache, LocalEmbedder,
                                 MappedEmbedder, check_dimension, get_embedder)

        if self._embedder is None:
            inner = get_embedder(self.cfg.embedding, self.cfg.llm)
            if self.cfg.dask.address and self.cfg.embedding.model == LOCAL_MODEL and isinstance(self.mapper, DaskPool):
                inner = MappedEmbedder(inner, self.cfg.embedding, self.mapper)  # on the cluster's workers
            elif isinstance(inner, LocalEmbedder):
                inner = ChildEmbedder(inner, self.cfg.embedding)  # a large run's model in a child process
            self._embedder = CachedEmbedder(inner, EmbeddingCache(self.catalog.cache_dir / "embeddings.sqlite"))
            if self.snap:
                check_dimension(self._embedder, self.snap["dim"])
        return self._embedder

    @property
    def embedder(self):
        return self.open_embedder()

    def embed(self, texts: list[str], progress=None) -> np.ndarray:
        return self.embedder.embed(texts, progress)

    def release_embedder(self) -> None:
        """End the embedding model's child process, if one runs (a later embed starts it again)."""
        if self._embedder is not None and hasattr(self._embedder.inner, "release"):
            self._embedder.inner.release()

    def previous(self, name: str, columns: tuple[str, ...] | None = None, where: str | None = None) -> pa.Table:
        """A table of the snapshot this run updates (empty for a build), whole or only ``columns``, all rows or
        those matching the SQL filter ``where``; read once."""
        key = (name, columns, where)
        if key not in self._previous:
            if self.snap:
                table = self.catalog.read(name, snap=self.snap, columns=list(columns) if columns else None, where=where)
            else:
                table = schema_for(name, 0).empty_table()
                table = table.select(list(columns)) if columns else table
            self._previous[key] = table
        return self._previous[key]

    def forget_previous(self, name: str | None = None) -> None:
        """Drop the previous snapshot's tables read so far, or those of table ``name`` (read again if asked for)."""
        for key in [k for k in self._previous if name in (None, k[0])]:
            del self._previous[key]

    def previous_rows(self, name: str) -> list[dict[str, Any]]:
        return plain_rows(self.previous(name))

    def result(self, status: str, delta: Delta, version: int | None = None, counts: dict[str, int] | None = None,
               layers: list[dict[str, Any]] | None = None, plot: str | None = None) -> BuildResult:
        return BuildResult(run_id=self.run_id, version=version if version is not None else (self.snap or {}).get("version"),
                           counts=counts or {}, stages=self.stages.log, status=status, layers=layers or [],
                           layers_plot=plot, input_digest=delta.digest, n_inputs=delta.n_inputs)


def _execute(corpus, catalog, cfg, task, mapper, run_id, flow_name, snap, replace_root) -> BuildResult:
    limit_malloc_arenas()
    latest = catalog.snapshot()
    version = latest["version"] + 1 if latest else 1
    with recorded_run(catalog, run_id, flow_name, corpus, cfg, version, task) as (run_id, stages, usage, done):
        run = PipelineRun(corpus, catalog, cfg, stages, mapper, run_id, version, snap, usage)
        run.root = corpus_root(run, replace_root)
        shutil.rmtree(run.spill_dir.parent, ignore_errors=True)  # what a killed run left (one writer at a time)
        try:
            result = run_stages(run)
        finally:
            run.release_embedder()
            shutil.rmtree(run.spill_dir.parent, ignore_errors=True)
            # the run's calls and tokens: the LLM client's and, for a litellm embedding model, the embedder's
            for client in (run.llm, run._embedder.inner.client if run._embedder else None):
                if client is not None:
                    usage.add(client.usage)
        return done(result)


def corpus_root(run: PipelineRun, replace_root: str | None) -> str:
    """The root this run's documents belong to: where they are, unless that location was recorded as (or is now
    declared with ``replace_root``) the new place of an indexed root."""
    if replace_root is None:
        return run.note.get("roots", {}).get(run.location, run.location)
    target = str(Path(replace_root).expanduser().resolve())
    indexed = set(run.previous("documents").column("root").to_pylist()) if run.snap else set()
    if target not in indexed:
        raise ValueError(f"--replace-root {replace_root}: no indexed documents come from {target}; indexed roots: "
                         f"{', '.join(sorted(indexed)) or '(none)'}")
    return target


# ---------------------------------------------------------------------------- shared stages
def ingest(run: PipelineRun) -> Delta:
    from tasks.incremental import diff_documents
    from tasks.ingest import ingest_corpus

    with run.stage("ingest") as st:
        ingested = st.run(ingest_corpus, run.corpus, run.cfg.corpus, None, run.root)
        run.quarantine += ingested.quarantine
        st.done(f"{len(ingested.documents)} documents, {len(ingested.quarantine)} quarantined"
                + (f", {ingested.ignored} files left out by .strataignore" if ingested.ignored else ""),
                files=ingested.files_seen, documents=len(ingested.documents), quarantined=len(ingested.quarantine),
                ignored=ingested.ignored)
    root, digest = run.root, digest_of(ingested.documents)
    if run.snap is None:
        if not ingested.documents:
            raise NotFoundError(f"no readable documents under {run.corpus} ({len(ingested.quarantine)} quarantined): "
                               "nothing to index")
        return Delta(root, ingested.documents, digest=digest, n_inputs=len(ingested.documents))
    with run.stage("diff") as st:
        diff = st.run(diff_documents, run.previous_rows("documents"), ingested.documents, root)
        indexed = set(run.previous("documents").column("root").to_pylist())
        summary = ", ".join(f"{k} {v}" for k, v in diff.counts().items())
        if root not in indexed:
            summary = (f"new corpus root: {len(diff.new)} documents added next to roots {', '.join(sorted(indexed))} "
                       f"(if {run.location} is the new place of one of them: --replace-root THAT_ROOT)")
        st.done(summary, **diff.counts(), new_root=int(root not in indexed))
    gone = {d["id"] for d in diff.deleted}
    chunks = run.previous("chunks", CHUNK_PLACE)
    gone_chunks = {c for c, d in zip(chunks.column("id").to_pylist(), chunks.column("document_id").to_pylist()) if d in gone}
    return Delta(root, diff.new + diff.changed, [d for d in run.previous_rows("documents") if d["id"] not in gone],
                 gone, gone_chunks, diff.counts(), digest, len(ingested.documents))


def chunk(run: PipelineRun, delta: Delta) -> tuple[pa.Table, list[ChunkRow]]:
    """Chunks of the incoming documents; the documents table after the run (kept + incoming with token counts)."""
    from tasks.chunk import chunk_documents

    with run.stage("chunk", len(delta.incoming)) as st:
        chunks, tokens, cut = st.run(chunk_documents, delta.incoming, run.cfg.chunking, run.cfg.corpus.max_document_tokens)
        run.quarantine += cut
        st.advance(len(delta.incoming))
        st.done(f"{len(chunks)} chunks" + (f", {len(cut)} documents cut at corpus.max_document_tokens" if cut else ""),
                chunks=len(chunks), tokens=sum(tokens.values()), cut=len(cut))
    documents = delta.kept + [dict(d, n_tokens=tokens[d["id"]]) for d in delta.incoming]
    return to_table("documents", documents, 0, run.version), chunks


def document_place(doc: DocumentRow) -> dict[str, Any]:
    """What extraction (the title) and merge (the source id) read of a document once it is chunked."""
    return {"id": doc["id"], "source_id": doc["source_id"], "title": doc.get("title")}


def extraction_method(cfg: StrataConfig) -> str:
    method = cfg.extract.method
    if method == "auto":
        method = "llm" if cfg.llm.model else "nlp"
    if method == "llm" and not cfg.llm.model:
        raise ValueError("extract.method = 'llm' needs llm.model (e.g. 'openai/gpt-4o-mini')")
    return method


def extract(run: PipelineRun, delta: Delta, chunks: list[ChunkRow]):
    """Entities and relations of the new chunks, on the mapper (Dask), as ``mentions`` rows (document titles
    included); each chunk marked extracted or quarantined."""
    from tasks.extract import extract_mentions
    from tasks.extract_llm import extract_batch_llm
    from tasks.merge import CHUNK_ORDER, MERGE_PART_ROWS, MENTIONS_PER_CHUNK, explicit_title, in_chunk_order
    from tasks.spill import SpillWriter

    cfg = run.cfg
    waited = time.perf_counter()
    run.mapper.ready()
    run.stages.record("dask-start", time.perf_counter() - waited)
    llm = ({"batch_fn": extract_batch_llm, "llm": cfg.llm, "cache_dir": str(run.catalog.cache_dir), "share": None}
           if extraction_method(cfg) == "llm" else {})
    titles = {d["id"]: explicit_title(d) for d in delta.incoming}
    # mentions go to disk as each batch comes back, split by key hash for merge; read back per part in canonical
    # (chunk id, seq) order, so the table does not depend on the order batches finish in
    spill = SpillWriter(run.spill_dir / "mentions", schema_for("mentions", 0), "key",
                        -(-len(chunks) * MENTIONS_PER_CHUNK // MERGE_PART_ROWS), in_chunk_order, CHUNK_ORDER)
    n_entities = 0

    def done(_i, r):
        nonlocal n_entities
        st.advance(len(r.ok) + len(r.quarantine))
        if r.mentions is not None:
            n_entities += pc.sum(pc.equal(r.mentions.column("kind").cast(pa.string()), "entity")).as_py() or 0
            spill.add(r.mentions)
            r.mentions = None

    with run.stage("extract", len(chunks)) as st:
        result = st.run(extract_mentions, chunks, titles, cfg.extract, run.mapper, run.version, on_done=done, **llm)
        run.mapper.release()  # idle workers would slow the CPU-bound stages that follow
        run.usage.add(Usage(**result.usage))
        run.quarantine += result.quarantine
        mentions = spill.close()
        st.done(f"{n_entities} mentions from {len(result.ok)} chunks", chunks=len(result.ok), mentions=n_entities,
                raw_relations=mentions.num_rows - n_entities, quarantined=len(result.quarantine),
                llm_calls=result.usage.get("calls", 0), llm_tokens=result.llm_tokens)
    ok = set(result.ok)
    return [dict(c, status="extracted" if c["id"] in ok else "quarantined") for c in chunks], mentions


def merge(run: PipelineRun, delta: Delta, chunks: list[ChunkRow], new: SpilledTable) -> tuple[Layer0, Any]:
    """Layer 0 from the mentions: merged whole for a build, recomputed for the keys the delta touched for an
    update. Returns it with the new snapshot's ``mentions``: the whole table for a build, the change (rows of
    the chunks that went, rows of the new ones) for an update."""
    cfg = run.cfg
    with run.stage("merge") as st:
        stored = (lambda columns: run.catalog.batches("mentions", run.snap, columns)) if run.snap else None
        old_entities = run.previous("entities", ENTITY_FIELDS, "layer = 0")
        layer0, mentions = st.run(_layer0, stored, plain_rows(old_entities),
                                  run.previous("relations"), delta.gone_chunks, new,
                                  cfg.extract.max_description_tokens, chunk_order(run, delta, chunks), run.spill_dir / "merge")
        for name in ("entities", "relations"):  # layer 0's rows replace them; embed and the attachment read
            run.forget_previous(name)  # the parts they need (kept vectors, summaries, summary_of links) themselves
        st.done(f"{len(layer0.entities)} entities, {layer0.relations.num_rows} relations", entities=len(layer0.entities),
                relations=layer0.relations.num_rows, added=len(layer0.added), removed=len(layer0.removed),
                changed=len(layer0.changed))
    return layer0, mentions


ENTITY_FIELDS = tuple(n for n in schema_for("entities", 0).names if n not in ("vector", "version"))
CHUNK_PLACE = ("id", "document_id", "chunk_index")  # what an update reads of the previous chunks before assemble


def chunk_order(run: PipelineRun, delta: Delta, chunks: list[ChunkRow]) -> ChunkOrder:
    """Every live chunk's place in the corpus: (its document's source id, its position in the document)."""
    source = {d["id"]: d["source_id"] for d in delta.kept + delta.incoming}
    old = run.previous("chunks", CHUNK_PLACE)
    pairs = zip(old.column("id").to_pylist(), old.column("document_id").to_pylist(), old.column("chunk_index").to_pylist())
    return {cid: (source.get(doc, ""), pos) for cid, doc, pos in
            [*pairs, *((c["id"], c["document_id"], c["chunk_index"]) for c in chunks)]}


def _layer0(stored, old_entities, old_relations, gone: set[str], new_mentions: pa.Table, max_tokens: int,
            order: ChunkOrder, workdir: Path) -> tuple[Layer0, pa.Table | TableDelta]:
    """Layer 0 merged whole (a build: ``stored`` is None; in a child process when the mentions are many, see
    ``MERGE_IN_CHILD_ROWS``) or recomputed for the keys the delta touched (an update: ``stored(columns)`` scans
    the previous snapshot's mentions batch by batch)."""
    from tasks.incremental import recompute_layer0, stored_mention_select
    from tasks.merge import MENTION_COLUMNS, MERGE_IN_CHILD_ROWS, graph_from_mentions
    from tasks.parallel import in_child_process

    if stored is None:
        if new_mentions.num_rows >= MERGE_IN_CHILD_ROWS:
            entities, relations = in_child_process(graph_from_mentions, new_mentions, max_tokens, order, workdir=workdir)
        else:
            entities, relations = graph_from_mentions(new_mentions, max_tokens, order=order)
        return Layer0(entities, np.zeros((0, 0)), relations, added={e["id"] for e in entities}), new_mentions
    new_mentions = new_mentions.read_all()  # an update's new mentions: its delta's, held in memory
    leaving = pa.array(sorted(gone), pa.string())
    touched = set(new_mentions.column("key").to_pylist())
    for batch in stored(["chunk_id", "key"]) if gone else ():  # the keys of the chunks that go
        touched |= set(batch.filter(pc.is_in(batch.column("chunk_id"), value_set=leaving)).column("key").to_pylist())
    select = stored_mention_select(lambda: stored(list(MENTION_COLUMNS)), gone, new_mentions)
    entities, relations, added, removed, changed = recompute_layer0(
        [e for e in old_entities if e["layer"] == 0], old_relations, select, touched, max_tokens, order)
    return (Layer0(entities, np.zeros((0, 0)), relations, added, removed, changed, gone),
            TableDelta("chunk_id", sorted(gone), new_mentions))


def embed(run: PipelineRun, layer0: Layer0, chunks: list[ChunkRow]) -> tuple[Layer0, np.ndarray]:
    """Vectors of new and changed entities and of the new chunks; unchanged entities keep theirs."""
    from tasks.embed import entity_text

    fresh = [e for e in layer0.entities if e["id"] in layer0.added | layer0.changed]
    with run.stage("embed", len(fresh) + len(chunks)) as st:
        vectors = st.run(_embed_layer0, run, layer0, [entity_text(e["name"], e["type"], e["description"]) for e in fresh],
                         [c["text"] for c in chunks], st.advance)
        layer0 = replace(layer0, vectors=vectors[0], chunks=chunks, chunk_vectors=vectors[1])
        st.done(f"{run.embedder.misses} embedded, {run.embedder.hits} from cache",
                vectors=len(fresh) + len(chunks), cache_hits=run.embedder.hits)
    return layer0, vectors[1]


def _embed_layer0(run: PipelineRun, layer0: Layer0, entity_texts: list[str], chunk_texts: list[str], progress):
    dim = run.embedder.dim
    fresh = iter(run.embed(entity_texts, progress))
    chunk_vectors = run.embed(chunk_texts, progress)
    old = run.previous("entities", ("id", "vector"), "layer = 0")
    kept = dict(zip(old.column("id").to_pylist(), vector_matrix(old))) if old.num_rows else {}
    redo = layer0.added | layer0.changed
    rows = [next(fresh) if e["id"] in redo else kept[e["id"]] for e in layer0.entities]
    return (np.stack(rows) if rows else np.zeros((0, dim), np.float32)), chunk_vectors


def assemble(run: PipelineRun, delta: Delta, documents, chunks, chunk_vectors, layer0: Layer0,
             hierarchy: Hierarchy, mentions) -> dict[str, pa.Table]:
    """Every table of the new snapshot (kept rows of the previous one first, then what this run made)."""
    dim, version = (run.snap or {}).get("dim") or run.embedder.dim, run.version
    old_chunks = run.previous("chunks")
    keep = [c not in delta.gone_chunks for c in old_chunks.column("id").to_pylist()]
    kept_chunks = old_chunks.filter(pa.array(keep, type=pa.bool_())) if old_chunks.num_rows else old_chunks
    quarantine = [q for q in run.previous_rows("quarantine")
                  if not q["item"].startswith((delta.root, run.location)) and q["item"] not in delta.gone_chunks]
    quarantine += run.quarantine + hierarchy.quarantine
    tables = {
        "documents": documents,
        "chunks": _stamped(pa.concat_tables([kept_chunks.cast(schema_for("chunks", dim))] * bool(kept_chunks.num_rows)
                                            + [to_table("chunks", chunks, dim, version, chunk_vectors)]), version),
        "entities": to_table("entities", layer0.entities + hierarchy.entities, dim, version,
                             np.concatenate([layer0.vectors.reshape(-1, dim), hierarchy.vectors.reshape(-1, dim)])),
        "relations": _stamped(pa.concat_tables([layer0.relations, relation_table(hierarchy.relations)]), version),
        "layers": to_table("layers", hierarchy.layers or [], dim, version),
        "communities": to_table("communities", hierarchy.communities, dim, version),
        "community_reports": to_table("community_reports", hierarchy.reports, dim, version,
                                      hierarchy.report_vectors.reshape(-1, dim)),
        # a build's mentions stay spilled on disk, stamped with this version when extracted
        "mentions": (TableDelta(mentions.column, mentions.values, _stamped(mentions.add, version))
                     if isinstance(mentions, TableDelta) else mentions),
        "quarantine": to_table("quarantine", _dedupe(quarantine), dim, version),
    }
    if hierarchy.layers is None:  # the previous snapshot's layer statistics still hold
        del tables["layers"]
    return tables


def _stamped(table: pa.Table, version: int) -> pa.Table:
    return table.set_column(table.schema.get_field_index("version"), "version",
                            pa.array(np.full(table.num_rows, version, dtype=np.int64)))


def _dedupe(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen, out = set(), []
    for r in rows:
        if r["id"] not in seen:
            seen.add(r["id"])
            out.append(r)
    return out


def validate(run: PipelineRun, tables: dict[str, pa.Table]) -> None:
    from tasks.validate import ValidationFailed, validate_tables

    dim = (run.snap or {}).get("dim") or run.embedder.dim
    with run.stage("validate") as st:
        written = {k: t.add if isinstance(t, TableDelta) else t for k, t in tables.items()}  # kept rows passed before
        report = st.run(validate_tables, {"layers": run.previous("layers"), **written}, dim)
        st.done(f"{sum(report.checked.values())} expectations passed" if report.success else "FAILED",
                expectations=sum(report.checked.values()), failures=len(report.failures))
    if not report.success:
        raise ValidationFailed(report.failures)


def publish(run: PipelineRun, delta: Delta, tables: dict[str, pa.Table], layer0: Layer0, hierarchy: Hierarchy) -> BuildResult:
    from tasks.plots import plot_layers

    cfg, dim = run.cfg, (run.snap or {}).get("dim") or run.embedder.dim
    note: dict[str, Any] = {"method": run.method.name}
    roots = dict(run.note.get("roots", {}), **({run.location: run.root} if run.location != run.root else {}))
    if roots:
        note["roots"] = roots  # locations that are the new place of an indexed root
    if run.snap:
        previous = run.note
        added = previous.get("added_since_full", 0) + len(layer0.added)
        note |= {"added_since_full": added, "drift": round(added / max(1, tables["entities"].num_rows), 4),
                 "diff": delta.counts}
    with run.stage("publish") as st:
        version = st.run(run.catalog.publish, tables, run.run_id, "incremental" if run.snap else "full", dim,
                         run.version, json.dumps(note), cfg.retrieval.ann_min_vectors)
        drift = note.get("drift", 0.0)
        hint = (f"; drift {drift:.0%} > {cfg.incremental.max_drift:.0%}: consider `strata update --full`"
                if drift > cfg.incremental.max_drift else "")
        st.done(f"snapshot v{version}{hint}", tables=len(tables), drift=drift)
    plot = None
    if hierarchy.layers and run.catalog.root is not None:
        plot = str(plot_layers(hierarchy.layers, run.catalog.root / "reports" / f"layers-v{version}.png", cfg.hierarchy.epsilon))
    snap = run.catalog.snapshot(version)
    counts = {k: run.catalog.open_table(k, snap=snap).count_rows() if isinstance(t, TableDelta) else t.num_rows
              for k, t in tables.items()}
    return run.result("published", delta, version, counts, hierarchy.layers, plot)


# ---------------------------------------------------------------------------- the run record
@contextlib.contextmanager
def recorded_run(catalog: Catalog, run_id: str | None, flow_name: str, corpus: str, cfg: StrataConfig, version: int,
                 task: TaskRunner = direct_task):
    """A ``runs`` row for the whole run: 'running' at the start, then its outcome, stage log, usage and lineage.

    Yields (run_id, stages, usage, done); ``done(result)`` records the result and returns it."""
    from tasks.ids import make_id

    started = datetime.now(timezone.utc)
    run_id = run_id or make_id("run", started.isoformat(), corpus)
    stages, usage = Stages(reporter(), task), Usage()
    catalog.log_run({"id": run_id, "flow": flow_name, "started_at": started, "status": "running",
                     "parameters": json.dumps({"corpus": str(corpus), "index": catalog.uri, "config": cfg.fingerprint()}),
                     "llm_calls": 0, "llm_tokens": 0, "llm_cost_usd": 0.0, "code_version": code_version(),
                     "deployment": deployment_name(), "version": version})

    def done(result: BuildResult) -> BuildResult:
        catalog.finish_run(run_id, {
            "status": result.status, "ended_at": datetime.now(timezone.utc), "stage_counts": json.dumps(stages.log),
            "snapshot_version": result.version if result.status == "published" else None,
            "input_digest": result.input_digest, "n_inputs": result.n_inputs, **_usage_columns(usage)})
        result.llm = asdict(usage)
        return result

    try:
        yield run_id, stages, usage, done
    except BaseException as exc:
        catalog.finish_run(run_id, {"status": "failed", "ended_at": datetime.now(timezone.utc),
                                    "error": f"{type(exc).__name__}: {exc}"[:4000], "stage_counts": json.dumps(stages.log),
                                    **_usage_columns(usage)})
        raise


def _usage_columns(usage: Usage) -> dict[str, Any]:
    return {"llm_calls": usage.calls, "llm_tokens": usage.tokens, "llm_cost_usd": round(usage.cost_usd, 6)}


def dask_pool(cfg: StrataConfig) -> DaskPool:
    """The run's Dask cluster, warmed for its extraction method: spaCy loaded, or litellm imported with
    ``dask.llm_batches_per_worker`` batches in flight per worker (LLM extraction is I/O bound)."""
    from tasks import extract, extract_llm

    if extraction_method(cfg) == "llm":
        return DaskPool(cfg.dask, cfg.dask.llm_batches_per_worker, extract_llm.warm)
    return DaskPool(cfg.dask, 1, functools.partial(extract.warm, cfg.extract.spacy_model))
