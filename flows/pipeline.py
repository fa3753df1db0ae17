"""The index pipeline: one list of stages for full builds, updates and backfills.

    ingest → [diff] → chunk → extract → merge → embed → <index method: hierarchy or attach,
    communities, reports> → validate → publish

A build is an update of an empty index: every stage below serves both, and the update-only step
(``diff``) and the method's own steps are named stages too. Each stage runs through the one stage
runner (``tasks.runtime.stages``): timing, progress bar, its entry in the run record and its wrapping as a
Prefect task in the flows (``flows.index_flow``); benchmarks and tests call it directly. The index
method (``index.method``) builds everything above layer 0; no stage here knows which one runs.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path

import numpy as np

from flows.lineage import BuildResult
from flows.merge_steps import merge
from flows.publish_steps import assemble, draw_layers, publish, validate
from flows.run import PipelineRun, recorded_run
from flows.steps import (
    chunk,
    document_place,
    embed,
    extract,
    extraction_method,
    ingest,
)
from schemas.config import StrataConfig
from schemas.tables import QuarantineRow
from tasks.errors import CostCapReached
from tasks.index import extract_llm
from tasks.index.extract import warm as warm_extraction
from tasks.index.validate import warm as warm_validation
from tasks.methods.base import BuildLayer0, Hierarchy, UpdateLayer0, check_whole_memory
from tasks.runtime import process
from tasks.runtime.parallel import DaskPool, LocalMapper, Mapper, ProcessMapper
from tasks.runtime.process import blas_on_one_thread
from tasks.runtime.stages import TaskRunner, direct_task, limit_malloc_arenas, release_memory
from tasks.store.catalog import Catalog
from tasks.store.workfs import remove_tree


def build_index(
    corpus: str,
    catalog: Catalog,
    cfg: StrataConfig,
    task: TaskRunner = direct_task,
    mapper: Mapper | None = None,
    run_id: str | None = None,
    flow_name: str = "index",
) -> BuildResult:
    """Full build: every document of ``corpus`` through every stage, one new snapshot."""
    return _execute(corpus, catalog, cfg, task, mapper or LocalMapper(), run_id, flow_name, None, None)


def update_index(
    corpus: str,
    catalog: Catalog,
    cfg: StrataConfig,
    task: TaskRunner = direct_task,
    mapper: Mapper | None = None,
    run_id: str | None = None,
    flow_name: str = "refresh",
    full: bool = False,
    replace_root: str | None = None,
) -> BuildResult:
    """Apply the corpus delta to the published index (a full build when the index is empty or ``full``), at the
    CPU priority ``incremental.nice`` (a service beside it keeps its cores).

    ``replace_root``: an indexed corpus root that ``corpus`` is the new location of (a moved mount, a new
    export folder): its documents are diffed against that root's instead of being added as a new root."""

    process.lower_priority(cfg.incremental.nice)
    snap = catalog.snapshot()
    return _execute(
        corpus, catalog, cfg, task, mapper or LocalMapper(), run_id, flow_name, None if full else snap, replace_root
    )


def run_stages(run: PipelineRun) -> BuildResult:
    """The stages, top to bottom."""
    delta = ingest(run)
    if delta.empty:
        return run.result("nothing-to-do", delta)
    run.open_embedder()  # an update with an embedding model of another dimension stops here, before extraction
    choose_mapper(run, len(delta.incoming), final=False)  # a large run's Dask cluster comes up while the run chunks
    documents, chunks, places = chunk(run, delta)
    choose_mapper(run, chunks.num_rows, final=True)
    # the documents' and chunks' texts are in parts now: what later stages read of a document is where it comes from
    delta = replace(
        delta, incoming=[document_place(d) for d in delta.incoming], kept=[document_place(d) for d in delta.kept]
    )
    quarantined, new_mentions = extract(run, chunks)
    stop_at_cap(run, run.quarantine, chunks.num_rows)
    layer0, mentions = merge(run, delta, places, new_mentions)
    # merge placed the chunks in the corpus: nothing later reads a document's place (100k documents: ~45 MB of them)
    delta = replace(delta, incoming=[], kept=[])
    del places
    layer0 = embed(run, layer0, chunks, quarantined)  # the chunks with their vectors: ``Layer0.chunks``
    del quarantined
    if isinstance(layer0, UpdateLayer0):
        hierarchy = run.method.update(run, layer0 if run.method.vectors_by_id else layer0.whole(run))
        # what the method read of the snapshot (its summaries, links, communities, reports: 120 MB at 100k chunks)
        for name in ("entities", "relations", "communities", "community_reports", "layers"):
            run.forget_previous(name)
    else:  # layer 0 in parts, read whole for a method that clusters it in this process (if it fits)
        if not run.method.reads_parts:
            check_whole_memory(run.method, layer0.count(), process.machine_memory())
        hierarchy = run.method.build(run, layer0 if run.method.reads_parts else layer0.whole())
    stop_at_cap(run, hierarchy.quarantine)
    tables = assemble(run, delta, documents, layer0, hierarchy, mentions)
    # from here on the tables hold every row: the Python rows and vector matrices they were made from go
    del documents, mentions
    added, hierarchy = what_publish_reads(layer0, hierarchy)
    del layer0
    run.forget_previous()
    release_memory()  # before validation reads the spilled mentions part by part
    drawn = draw_layers(run, hierarchy)  # the layers' figure, drawn while the run validates
    tables = validate(run, tables)
    return publish(run, delta, tables, added, hierarchy, drawn)


#: what an item the cost cap left undone is, by the stage of its quarantine row
_UNDONE = {"extract": "chunks not extracted", "hierarchy": "summary entities not made", "reports": "reports not made"}


def stop_at_cap(run: PipelineRun, quarantine: list[QuarantineRow], chunks: int | None = None) -> None:
    """After a stage: items the cost cap left undone (quarantine rows of ``CostCapReached``; each task finished the
    rest and reported what it spent) stop the run before anything is published, with how far it got and what it
    spent. Every answer paid for is in the response cache: the same command with a higher cap goes on from there."""
    undone: dict[str, int] = {}
    for q in quarantine:
        if CostCapReached.__name__ in q["error"]:
            undone[q["stage"]] = undone.get(q["stage"], 0) + 1
    if not undone:
        return
    spent = run.spent()
    done = f"{chunks - undone['extract']} of {chunks} chunks extracted, " if chunks and "extract" in undone else ""
    left = ", ".join(f"{n} {_UNDONE.get(stage, stage)}" for stage, n in undone.items())
    limit = run.cap.limit if run.cap is not None else float("nan")
    raise CostCapReached(
        f"stopped at the LLM cost cap of ${limit:.4f} (llm.max_cost_usd, --max-cost): ${spent.cost_usd:.4f} spent in "
        f"{spent.calls} calls; {done}{left}; nothing was published (the previous snapshot is still the published "
        "one). Every answer paid for is in the response cache: the same command with a higher cap goes on without "
        "paying for it again"
    )


def choose_mapper(run: PipelineRun, least_chunks: int, final: bool) -> None:
    """Start the run's local Dask cluster once the run extracts at least ``dask.min_chunks`` chunks (``least_chunks``:
    as many as it surely extracts: its documents before chunking, a chunk or more each; ``final``: its chunks), or,
    once they are counted and fewer, run its tasks in this process (``LocalMapper``): a cluster's start costs a small
    run more than its workers win back. Either mapper publishes the same tables. An external cluster
    (``dask.address``) is used whatever the size."""
    pool = run.mapper
    if not isinstance(pool, DaskPool) or pool.started:
        return
    if not pool.local or least_chunks >= run.cfg.dask.min_chunks:
        pool.start()
        release_prewarmed()  # the cluster's workers validate
    elif final:
        run.mapper = LocalMapper()
        run.small_child = _PREWARMED.pop() if _PREWARMED else start_child(run.cfg)


#: a small run's child started ahead of the run (``prewarm_child``), for the run to take if it is small
_PREWARMED: list[ProcessMapper] = []


def start_child(cfg: StrataConfig) -> ProcessMapper:
    """A small run's child, started now. Where extraction is NLP it extracts there: the spaCy pipeline loads
    first, great-expectations (it validates there) once the extraction's tasks are queued."""
    if extraction_method(cfg) == "nlp":
        spacy = functools.partial(warm_extraction, cfg.extract.spacy_model)
        return ProcessMapper().start(warm=spacy, then=warm_validation)
    return ProcessMapper().start(warm=warm_validation)


def prewarm_child(cfg: StrataConfig) -> None:
    """Start a small run's child now: spaCy (~1 s) and great-expectations (~2 s of imports) load in it while this
    process imports the rest and runs the first stages (``strata index``/``update``/``backfill`` call it first). A
    small run takes it as its ``validator``, and extracts in it too; a large one's cluster extracts and validates,
    and it is released (``release_prewarmed``)."""
    if not _PREWARMED:
        _PREWARMED.append(start_child(cfg))


def release_prewarmed() -> None:
    while _PREWARMED:
        _PREWARMED.pop().release()


def what_publish_reads(layer0: BuildLayer0 | UpdateLayer0, hierarchy: Hierarchy) -> tuple[int, Hierarchy]:
    """What publish still reads of a run's layer 0 and hierarchy (how many entities an update added, the layer
    statistics), without their rows and vectors: at 100k chunks those are a gigabyte beside the assembled tables."""
    empty = np.zeros((0, 0), np.float32)
    added = len(layer0.added) if isinstance(layer0, UpdateLayer0) else 0
    return added, Hierarchy([], empty, [], [], [], empty, hierarchy.layers)


def _execute(corpus, catalog, cfg, task, mapper, run_id, flow_name, snap, replace_root) -> BuildResult:
    with blas_on_one_thread():  # the tables' bits whatever the thread setting (``one_blas_thread``)
        return _execute_run(corpus, catalog, cfg, task, mapper, run_id, flow_name, snap, replace_root)


def _execute_run(corpus, catalog, cfg, task, mapper, run_id, flow_name, snap, replace_root) -> BuildResult:
    limit_malloc_arenas()
    latest = catalog.snapshot()
    version = latest["version"] + 1 if latest else 1
    with recorded_run(catalog, run_id, flow_name, corpus, cfg, version, task) as (run_id, stages, usage, done):
        run = PipelineRun(corpus, catalog, cfg, stages, mapper, run_id, version, snap, usage)
        run.root = corpus_root(run, replace_root)
        remove_tree(run.work_root)  # what a killed run left (one writer at a time)
        try:
            result = run_stages(run)
        finally:
            run.release_embedder()
            if run.small_child is not None:
                run.small_child.release()
            remove_tree(run.work_root)
            # the run's calls and tokens: its stages' LLM clients' and, for a litellm embedding model, the embedder's
            for client in run.llm_clients():
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
        raise ValueError(
            f"--replace-root {replace_root}: no indexed documents come from {target}; indexed roots: "
            f"{', '.join(sorted(indexed)) or '(none)'}"
        )
    return target


def dask_pool(cfg: StrataConfig) -> DaskPool:
    """The run's Dask cluster, warmed for its extraction method: spaCy loaded, or litellm imported with
    ``dask.llm_batches_per_worker`` batches in flight per worker (LLM extraction is I/O bound)."""

    if extraction_method(cfg) == "llm":
        return DaskPool(cfg.dask, cfg.dask.llm_batches_per_worker, extract_llm.warm)
    return DaskPool(cfg.dask, 1, functools.partial(warm_extraction, cfg.extract.spacy_model))
