"""The pipeline's layer-0 step: the mentions merged into layer 0, whole for a build (a task per spilled part) or
for the keys an update touched (``flows.steps`` has the steps around it; ``flows.pipeline`` composes them)."""

from __future__ import annotations

import tempfile
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flows.run import Delta, PipelineRun, SnapshotReads
from flows.steps import CHUNK_PLACE, chunk_part_rows
from schemas.tables import schema_for
from tasks.index.delta import Grown, recompute_layer0, stored_mention_select
from tasks.index.merge import MENTION_COLUMNS, ChunkOrder, mention_frame
from tasks.index.merge_parts import merge_spilled
from tasks.methods.base import ENTITY_FIELDS, BuildLayer0, UpdateLayer0
from tasks.runtime import parallel
from tasks.runtime.parallel import DaskPool, LocalMapper, Mapper
from tasks.runtime.stages import release_memory
from tasks.store.ids import entity_id
from tasks.store.rows import GRAPH_COLUMNS, TableDelta, plain_rows, relation_table
from tasks.store.spill import SpilledTable
from tasks.store.workfs import join


def merge(
    run: PipelineRun, delta: Delta, places: pa.Table, new: SpilledTable
) -> tuple[BuildLayer0 | UpdateLayer0, Any]:
    """Layer 0 from the mentions: merged whole for a build, recomputed for the keys the delta touched for an
    update. Returns it with the new snapshot's ``mentions``: the whole table for a build, the change (rows of
    the chunks that went, rows of the new ones) for an update."""
    cfg = run.cfg
    with run.stage("merge") as st:
        layer0, mentions = st.run(
            _layer0,
            run.mapper,
            SnapshotReads(run.catalog, run.snap) if run.snap else None,
            delta.gone_chunks,
            new,
            cfg.extract.max_description_tokens,
            chunk_order(run, delta, places),
            join(run.spill_dir, "merge"),
            run.version,
            chunk_part_rows(cfg),
            run.large(new.num_rows),
        )
        run.mapper.release()  # idle workers would slow the CPU-bound stages that follow
        update = layer0 if isinstance(layer0, UpdateLayer0) else None
        relations = update.relation_count if update else layer0.relations.num_rows
        st.done(
            f"{layer0.count()} entities, {relations} relations",
            entities=layer0.count(),
            relations=relations,
            added=len(update.added) if update else layer0.count(),
            removed=len(update.removed) if update else 0,
            changed=len(update.changed) if update else 0,
        )
    return layer0, mentions


STATE_COLUMNS = tuple(n for n in schema_for("merge_state", 0).names if n != "version")


def chunk_order(run: PipelineRun, delta: Delta, places: pa.Table) -> ChunkOrder:
    """Every live chunk's place in the corpus: (its document's source id, its position in the document);
    ``places``: the new chunks' (``CHUNK_PLACE``)."""
    source = {d["id"]: d["source_id"] for d in delta.kept + delta.incoming}
    order: ChunkOrder = {}
    for table in (run.previous("chunks", CHUNK_PLACE), places):
        ids, docs, pos = (table.column(c).to_pylist() for c in CHUNK_PLACE)
        order.update((cid, (source.get(doc, ""), p)) for cid, doc, p in zip(ids, docs, pos))
    return order


def _layer0(
    mapper: Mapper,
    reads: SnapshotReads | None,
    gone: set[str],
    new_mentions: SpilledTable,
    max_tokens: int,
    order: ChunkOrder,
    workdir: str,
    version: int = 0,
    part_rows: int = 20_000,
    in_child: bool = False,
) -> tuple[BuildLayer0 | UpdateLayer0, pa.Table | TableDelta]:
    """Layer 0 merged whole (a build: ``reads`` is None; a task per spilled part on the run's Dask cluster, or in
    this process) or recomputed for the keys the delta touched (an update: ``update_layer0``); either in a child
    process with ``in_child`` (a large index, ``PipelineRun.large``: what the merge's transient frames and rows
    leave mapped in a process would stay in the run's to its end). A build's entities (parts of about ``part_rows``
    rows), relations (stamped ``version``) and ``merge_state`` stay spilled: ``BuildLayer0.entity_parts``,
    ``BuildLayer0.relations``, ``BuildLayer0.state``."""

    if reads is not None:
        if not in_child:
            return update_layer0(reads, gone, new_mentions, max_tokens, order)
        with tempfile.TemporaryDirectory(prefix="strata-merge-") as child:
            return parallel.in_child_process(update_layer0, reads, gone, new_mentions, max_tokens, order, workdir=child)
    args = (new_mentions, max_tokens, order, workdir, version, part_rows)
    if isinstance(mapper, DaskPool):
        parts, relations, states = merge_spilled(mapper, *args)
    elif in_child:
        with tempfile.TemporaryDirectory(prefix="strata-merge-") as child:
            parts, relations, states = parallel.in_child_process(merge_spilled, LocalMapper(), *args, workdir=child)
    else:
        parts, relations, states = merge_spilled(LocalMapper(), *args)
    return BuildLayer0([], np.zeros((0, 0)), relations, entity_parts=parts, state=states), new_mentions


def update_layer0(
    reads: SnapshotReads, gone: set[str], new_mentions: SpilledTable, max_tokens: int, order: ChunkOrder
) -> tuple[UpdateLayer0, TableDelta]:
    """An update's layer 0: the keys the delta touched recomputed from the snapshot's mentions (scanned batch by
    batch), those whose mentions only grow from their ``merge_state`` rows when the snapshot has them; the others'
    rows (``ENTITY_FIELDS``) and relations as they were. Returns it with the change to ``mentions``. Of the entities
    only the rows the update writes (recomputed, or a new degree) are rows, the others' ids ``UpdateLayer0.kept``; of the
    relations only the change (``UpdateLayer0.relation_change``): the rest is the snapshot's (at 100k chunks 120k entity
    rows, ~280 MB as Python rows, and 215 MB of graph columns, not held through the stages after)."""

    def stored(columns: list[str]):
        return reads.batches("mentions", columns)

    new = new_mentions.read_all()  # an update's new mentions: its delta's, held in memory
    leaving = pa.array(sorted(gone), pa.string())
    fresh, went = set(new.column("key").to_pylist()), set()
    for batch in stored(["chunk_id", "key"]) if gone else ():  # the keys of the chunks that go
        went |= set(batch.filter(pc.is_in(batch.column("chunk_id"), value_set=leaving)).column("key").to_pylist())
    # the entities the delta touches as whole rows; the others as their id and degree (a new degree is computed)
    touched = sorted({entity_id(0, k) for k in fresh | went if k and "|" not in k})
    old_entities = plain_rows(reads.rows_in("entities", "id", touched, ENTITY_FIELDS))
    ids, degrees = (
        reads.read("entities", ("id", "degree"), "layer = 0").column(c).to_pylist() for c in ("id", "degree")
    )
    was = dict(zip(ids, degrees))
    whole = set(touched)
    old_entities += [{"id": i, "layer": 0, "degree": d} for i, d in was.items() if i not in whole]
    del ids, degrees
    select = stored_mention_select(lambda: stored(list(MENTION_COLUMNS)), gone, new)
    # keys whose mentions only grow are computed from their description state, when the snapshot has one
    grown = (
        Grown(
            fresh - went - {""},
            mention_frame(new),
            lambda ids: reads.rows_in("merge_state", "id", list(ids), STATE_COLUMNS),
        )
        if reads.has("merge_state")
        else None
    )
    entities, relations, added, removed, changed, state_delta, relation_change = recompute_layer0(
        old_entities,
        # layer 0's, only what a graph is made of, a batch at a time; the rows it replaces whole
        lambda: (
            b.filter(pc.equal(b.column("kind"), "extracted")) for b in reads.batches("relations", list(GRAPH_COLUMNS))
        ),
        select,
        fresh | went,
        max_tokens,
        order,
        grown,
        lambda ids: reads.rows_in("relations", "id", ids),
        keep_graph=False,
    )
    del old_entities
    # written: the rows recomputed and those whose degree moved (read whole); kept: the snapshot's rows as they are
    moved = {e["id"]: e["degree"] for e in entities if e["id"] not in whole and e["degree"] != was[e["id"]]}
    kept = {e["id"] for e in entities if e["id"] not in whole and e["id"] not in moved}
    rows: list[Any] = [e for e in entities if e["id"] in whole]
    rows += [
        dict(e, degree=moved[e["id"]])
        for e in plain_rows(reads.rows_in("entities", "id", sorted(moved), ENTITY_FIELDS))
    ]
    del entities, was
    release_memory()  # the recomputation's frames, before its result is handed on
    return (
        UpdateLayer0(
            sorted(rows, key=lambda e: e["id"]),
            np.zeros((0, 0)),
            relation_table([]),
            relation_change=relation_change,
            relation_count=cast(int, relations),
            added=added,
            removed=removed,
            changed=changed,
            gone_chunks=gone,
            state=state_delta if grown else None,
            kept=kept,
        ),
        TableDelta("chunk_id", sorted(gone), new),
    )
