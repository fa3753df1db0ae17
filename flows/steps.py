"""The pipeline's steps, in order: each is one or more named stages of a ``PipelineRun`` (``flows.pipeline``
composes them).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import replace
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flows.lineage import digest_of
from flows.run import Delta, DocumentPlace, PipelineRun
from schemas.config import StrataConfig
from schemas.tables import DocumentRow, schema_for
from tasks.errors import NotFoundError, UsageError
from tasks.index.chunk import PLACE, chunk_parts
from tasks.index.delta import diff_documents
from tasks.index.embed import LocalEmbedder, entity_text
from tasks.index.embed_table import embed_table
from tasks.index.extract import extract_mentions, task_rows
from tasks.index.extract_llm import extract_batch_llm
from tasks.index.ingest import IngestResult, iter_documents, spill_documents
from tasks.index.merge import (
    CHUNK_ORDER,
    MENTIONS_PER_CHUNK,
    in_chunk_order,
)
from tasks.index.merge_parts import unreachable_workers
from tasks.index.query_model import export_query_model, query_model_missing
from tasks.methods.base import BuildLayer0, UpdateLayer0
from tasks.runtime import parallel
from tasks.runtime.llm_client import Usage
from tasks.runtime.parallel import LocalMapper, Mapper, ProcessMapper
from tasks.runtime.progress import reporter
from tasks.store.rows import TableDelta, plain_rows
from tasks.store.spill import SpilledTable, gather
from tasks.store.workfs import is_remote, join, mkdirs


# ---------------------------------------------------------------------------- shared stages
def ingest(run: PipelineRun) -> Delta:
    """The corpus read into parts of the ``documents`` table (``Delta.ingested``, a part in memory at a time) and
    what the run applies: for a build every document, for an update the diff against the snapshot."""

    with run.stage("ingest") as st:
        ingested = IngestResult()
        documents = iter_documents(run.corpus, run.cfg.corpus, ingested, None, run.root)
        folder, size = join(run.spill_dir, "ingested"), chunk_part_rows(run.cfg)
        least = run.cfg.corpus.boilerplate_min_documents
        parts, boilerplate = st.run(spill_documents, documents, run.version, folder, size, least)
        run.quarantine += ingested.quarantine + boilerplate
        st.done(
            f"{parts.num_rows} documents, {len(ingested.quarantine)} quarantined"
            + (f", {len(boilerplate)} boilerplate paragraphs left out" if boilerplate else "")
            + (f", {ingested.ignored} files left out by .strataignore" if ingested.ignored else ""),
            files=ingested.files_seen,
            documents=parts.num_rows,
            quarantined=len(ingested.quarantine),
            ignored=ingested.ignored,
            boilerplate=len(boilerplate),
        )
    root, digest = run.root, digest_of(parts.column("content_hash").to_pylist())
    if run.snap is None:
        if not parts.num_rows:
            raise NotFoundError(
                f"no readable documents under {run.corpus} ({len(ingested.quarantine)} quarantined): nothing to index"
            )
        places = [
            cast("DocumentPlace", r) for t in parts.parts(list(DocumentPlace.__annotations__)) for r in t.to_pylist()
        ]
        return Delta(root, places, digest=digest, n_inputs=parts.num_rows, ingested=parts)
    with run.stage("diff") as st:  # on what the documents are, not their texts
        incoming = [r for t in parts.parts(list(DOCUMENT_META)) for r in t.to_pylist()]
        previous = plain_rows(run.previous("documents", DOCUMENT_META))
        diff = st.run(diff_documents, previous, incoming, root, {q["item"] for q in ingested.quarantine})
        indexed = {d["root"] for d in previous}
        summary = ", ".join(f"{k} {v}" for k, v in diff.counts().items())
        if root not in indexed:
            summary = (
                f"new corpus root: {len(diff.new)} documents added next to roots {', '.join(sorted(indexed))} "
                f"(if {run.location} is the new place of one of them: --replace-root THAT_ROOT)"
            )
        st.done(summary, **diff.counts(), new_root=int(root not in indexed))
    gone = {d["id"] for d in diff.deleted}
    chunks = run.previous("chunks", CHUNK_PLACE)
    gone_chunks = {
        c for c, d in zip(chunks.column("id").to_pylist(), chunks.column("document_id").to_pylist()) if d in gone
    }
    return Delta(
        root,
        [document_place(cast("DocumentRow", d)) for d in diff.new + diff.changed],
        [document_place(cast("DocumentRow", d)) for d in previous if d["id"] not in gone],
        gone,
        gone_chunks,
        diff.counts(),
        digest,
        parts.num_rows,
        parts,
    )


def chunk(run: PipelineRun, delta: Delta) -> tuple[SpilledTable | TableDelta, SpilledTable, pa.Table]:
    """The documents table after the run (a build's in parts; an update's as a change: the incoming ones with
    their token counts, the gone ones' ids) and the chunks of the incoming documents in parts (read from the
    ingested parts one at a time: the run never holds every text), and where each chunk is in its document
    (``CHUNK_PLACE``)."""

    assert delta.ingested is not None, "ingest wrote the documents to parts"
    size = chunk_part_rows(run.cfg)
    with run.stage("chunk", len(delta.incoming)) as st:
        incoming = None if run.snap is None else {d["id"] for d in delta.incoming}
        documents, chunks, places, cut = st.run(
            chunk_parts,
            delta.ingested,
            incoming,
            run.cfg.chunking,
            run.cfg.corpus.max_document_tokens,
            join(run.spill_dir, "chunks"),
            size,
            lambda n: task_rows(n, run.cfg.extract.batch_size),
            st.advance,
        )
        run.quarantine += cut
        st.done(
            f"{chunks.num_rows} chunks" + (f", {len(cut)} documents cut at corpus.max_document_tokens" if cut else ""),
            chunks=chunks.num_rows,
            tokens=int(pc.sum(documents.column("n_tokens")).as_py() or 0),
            cut=len(cut),
        )
    if run.snap:  # an update's documents as a change: the kept ones are neither read nor written again
        return TableDelta("id", sorted(delta.gone), documents.read_all()), chunks, places
    return documents, chunks, places


#: what the diff of an update reads of a document (all but its text)
DOCUMENT_META = tuple(n for n in schema_for("documents", 0).names if n not in ("text", "version"))


def document_place(doc: DocumentRow | DocumentPlace) -> DocumentPlace:
    """What extraction (the title) and merge (the source id) read of a document once it is chunked."""
    return {"id": doc["id"], "source_id": doc["source_id"], "title": doc.get("title")}


def extraction_method(cfg: StrataConfig) -> str:
    """The extractor: "llm" where extraction calls a model (``extract.method`` "auto" and ``llm.extraction``
    resolves to one, or "llm"), else "nlp" (the offline extractor)."""
    method = cfg.extract.method
    model = cfg.llm.stage("extraction")
    if method == "auto":
        method = "llm" if model is not None else "nlp"
    if method == "llm" and model is None:
        raise ValueError(
            "extract.method = 'llm' needs a model for extraction: llm.model (e.g. 'openai/gpt-4o-mini') or "
            "llm.extraction.model, not 'offline'"
        )
    return method


def extract(run: PipelineRun, chunks: SpilledTable) -> tuple[set[str], SpilledTable]:
    """Entities and relations of the new chunks (their parts), on the mapper (Dask), as ``mentions`` rows
    (document titles included); and the ids of the chunks quarantined (the others are extracted)."""

    cfg = run.cfg
    waited = time.perf_counter()
    client = run.mapper.ready()
    run.stages.record("dask-start", time.perf_counter() - waited)
    llm = (
        {
            "batch_fn": extract_batch_llm,
            "llm": cfg.llm.stage("extraction"),
            "cache_dir": str(run.catalog.cache_dir),
            "share": None,
            "cap": run.cap_for("extraction"),
            "pack_tokens": cfg.llm.extraction.pack_tokens,
        }
        if extraction_method(cfg) == "llm"
        else {}
    )
    if client is not None:
        _check_reach(client, run.spill_dir)
    mapper = extraction_mapper(run, chunks.num_rows)
    # each task writes its mentions to the work folder split by key hash; a task per part then gathers them for
    # merge, read back in canonical (chunk id, seq) order, so the table does not depend on the order tasks end in
    parts = -(-chunks.num_rows * MENTIONS_PER_CHUNK // cfg.dask.part_rows)
    written = join(run.spill_dir, "extracted")
    mkdirs(written)
    with run.stage("extract", chunks.num_rows) as st:
        result = st.run(
            extract_mentions,
            chunks,
            cfg.extract,
            mapper,
            run.version,
            (written, parts),
            on_done=lambda _i, r: st.advance(r.extracted + len(r.quarantine)),
            **llm,
        )
        mentions = gather(
            run.mapper,
            sorted(result.files),
            schema_for("mentions", 0),
            parts,
            join(run.spill_dir, "mentions"),
            in_chunk_order,
            CHUNK_ORDER,
        )
        if run.snap:  # idle workers would slow the CPU-bound stages that follow (a build merges on them)
            run.mapper.release()
        if mapper is not run.mapper and mapper is not run.small_child:
            mapper.release()
        run.usage.add(Usage(**result.usage))
        run.quarantine += result.quarantine
        st.done(
            f"{result.entity_mentions} mentions from {result.extracted} chunks",
            chunks=result.extracted,
            mentions=result.entity_mentions,
            raw_relations=result.mention_rows - result.entity_mentions,
            quarantined=len(result.quarantine),
            llm_calls=result.usage.get("calls", 0),
            llm_tokens=result.llm_tokens,
        )
    return {q["item"] for q in result.quarantine if q["stage"] == "extract"}, mentions


def extraction_mapper(run: PipelineRun, chunks: int) -> Mapper:
    """Where extraction runs: on the run's mapper (a Dask cluster's workers); for a run in its own process, in the
    small run's child (``run.small_child``, spaCy loaded there while this process imported the rest) or, for a
    build or update whose index holds ``MERGE_IN_CHILD_ROWS`` mentions or more (the snapshot's, and
    ``MENTIONS_PER_CHUNK`` for each of the ``chunks`` to extract), a child process ended after extraction. The
    extractor's model (spaCy: +290 MB), once loaded, stays mapped in the process that loaded it, beside every
    stage that follows over the whole index."""

    if not isinstance(run.mapper, LocalMapper):
        return run.mapper
    if run.large(chunks * MENTIONS_PER_CHUNK):
        return ProcessMapper()
    return run.small_child if run.small_child is not None and extraction_method(run.cfg) == "nlp" else run.mapper


def _check_reach(client: Any, folder: str) -> None:
    """Extraction tasks write to the run's work folder and a build merges there: every Dask worker must reach
    it (checked before extraction, not an hour later)."""

    missing = unreachable_workers(client, folder)
    if missing:
        reasons = "; ".join(f"{worker}: {why}" for worker, why in missing.items())
        fix = (
            "give the workers the index's endpoint and credentials (the AWS_* variables or [storage] of "
            "$STRATA_CONFIG in their environment)"
            if is_remote(folder)
            else "run them where the index is, mount it at the same path on their machines, or put the index on "
            "object storage"
        )
        raise UsageError(f"Dask worker(s) cannot reach the run's work folder {folder} ({reasons}): {fix}")


CHUNK_PLACE = PLACE  # what an update reads of the previous chunks before assemble


def embed(
    run: PipelineRun, layer0: BuildLayer0 | UpdateLayer0, chunks: SpilledTable, quarantined: set[str]
) -> BuildLayer0 | UpdateLayer0:
    """Vectors of a build's entities (every one is new: in its parts), an update's new and changed ones (unchanged
    ones keep theirs), and of the new chunks, which go to parts with their vectors a part at a time
    (``Layer0.chunks``): from here on the run holds none of their texts."""

    prepare_query_model(run)  # before the stage: where the build embeds on ONNX Runtime, the export it needs too
    entity_parts = layer0.entity_parts if isinstance(layer0, BuildLayer0) else None
    update = layer0 if isinstance(layer0, UpdateLayer0) else None
    fresh = [e for e in layer0.entities if e["id"] in update.added | update.changed] if update else []
    n = (entity_parts.num_rows if entity_parts else len(fresh)) + chunks.num_rows
    if hasattr(run.embedder.inner, "expect"):  # the texts come a step at a time: as large as all of them at once
        run.embedder.inner.expect(n)
    with run.stage("embed", n) as st:
        if entity_parts is not None:
            texts = lambda t: [entity_text(*e) for e in zip(*(t.column(c).to_pylist() for c in ENTITY_TEXT))]  # noqa: E731
            entity_parts = st.run(embed_table, run, "entities", entity_parts.parts(), texts, st.advance)
        # an update's: those it embeds, by id (the others keep the snapshot's: ``UpdateLayer0.vectors_of``)
        vectors = st.run(run.embed, [entity_text(e["name"], e["type"], e["description"]) for e in fresh], st.advance)
        parts = (with_status(part, quarantined) for part in chunks.parts())
        text = lambda t: t.column("text").to_pylist()  # noqa: E731
        new_chunks = st.run(embed_table, run, "chunks", parts, text, st.advance)
        st.done(
            f"{run.embedder.misses} embedded, {run.embedder.hits} from cache",
            vectors=n,
            cache_hits=run.embedder.hits,
        )
    if isinstance(layer0, BuildLayer0):
        return replace(layer0, chunks=new_chunks, entity_parts=entity_parts)
    empty = np.zeros((0, run.embedder.dim), np.float32)
    return replace(layer0, vectors=empty, fresh=dict(zip([e["id"] for e in fresh], vectors)), chunks=new_chunks)


def prepare_query_model(run: PipelineRun) -> None:
    """The ONNX export of the packaged model that questions (and a build on ONNX Runtime) are embedded with, made by
    the build that first needs it on this machine, with a line on screen: from the PyTorch model the run holds when
    it holds one, else in a child process (the model's memory goes with it)."""

    if not query_model_missing(run.cfg.embedding):
        return
    name = "query model"
    reporter().start(name, None)
    inner = getattr(run.embedder, "inner", None)
    if isinstance(inner, LocalEmbedder) and inner._model is not None:
        path = export_query_model(inner)
    else:
        with tempfile.TemporaryDirectory(prefix="strata-export-") as child:
            path = parallel.in_child_process(export_query_model, workdir=child)
    reporter().finish(name, f"the embedding model exported to ONNX for questions, once per machine: {path}")


def chunk_part_rows(cfg: StrataConfig) -> int:
    """Rows in a part of chunks or entities: a chunk or entity row (text, sources, vector) weighs about as much as
    ten mention rows, whose parts hold ``dask.part_rows``."""
    return max(1, cfg.dask.part_rows // 10)


ENTITY_TEXT = ("name", "type", "description")  # what an entity's vector embeds (``embed.entity_text``)


def with_status(chunks: pa.Table, quarantined: set[str]) -> pa.Table:
    """Chunk parts' rows (``chunk.CHUNK_PART_SCHEMA``) as the ``chunks`` table's: each marked extracted or
    quarantined, without the title extraction read."""
    status = ["quarantined" if c in quarantined else "extracted" for c in chunks.column("id").to_pylist()]
    return chunks.drop(["title"]).append_column("status", pa.array(status, pa.string()))
