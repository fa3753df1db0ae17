"""The pipeline's last steps: the new snapshot's tables assembled from what the run made (``assemble``), checked
(``validate``) and published as one new version (``publish``). ``flows.steps`` has the steps before them."""

from __future__ import annotations

import json
import logging
import threading
from concurrent.futures import Future
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flows.lineage import BuildResult
from flows.run import Delta, PipelineRun
from flows.steps import chunk_part_rows
from schemas.config import StrataConfig
from schemas.tables import QuarantineRow, schema_for
from tasks.index import validate as checks
from tasks.index.plots import layers_png
from tasks.index.validate import REFERENCED, ValidationFailed
from tasks.methods.base import BuildLayer0, Hierarchy, UpdateLayer0
from tasks.methods.graph_parts import with_above
from tasks.methods.registry import relation_kinds
from tasks.retrieval.view import IndexView, remember_view
from tasks.runtime.parallel import LocalMapper, Mapper, ProcessMapper, release_idle_children
from tasks.runtime.stages import release_memory
from tasks.store.catalog import Catalog
from tasks.store.rows import (
    DELTA_MAX_SHARE,
    TableDelta,
    bare_table_of,
    delta_against,
    relation_table,
    spilled_rows,
    stamped,
    to_table,
    with_vectors,
)
from tasks.store.spill import SpilledTable
from tasks.store.workfs import join


def assemble(
    run: PipelineRun, delta: Delta, documents, layer0: BuildLayer0 | UpdateLayer0, hierarchy: Hierarchy, mentions
) -> dict[str, pa.Table]:
    """Every table of the new snapshot (kept rows of the previous one first, then what this run made); a build's
    relations stay spilled. An update's rows go from ``layer0`` and ``hierarchy`` once their tables are made."""

    dim, version = (run.snap or {}).get("dim") or run.embedder.dim, run.version
    quarantine = [
        q
        for q in cast("list[QuarantineRow]", run.previous_rows("quarantine"))
        if not q["item"].startswith((delta.root, run.location)) and q["item"] not in delta.gone_chunks
    ]
    quarantine += run.quarantine + hierarchy.quarantine
    chunks: Any = layer0.chunks if layer0.chunks is not None else SpilledTable([], schema_for("chunks", dim), 0)
    if isinstance(layer0, BuildLayer0):  # a build's chunks and entities as parts: validated and published a
        assert layer0.entity_parts is not None, "a build's layer 0 is in parts (flows.merge_steps.merge)"
        above = spilled_rows(  # part per task
            "entities",
            [(hierarchy.entities, hierarchy.vectors)],
            dim,
            version,
            join(run.spill_dir, "tables", "entities"),
            chunk_part_rows(run.cfg),
        )
        parts = layer0.entity_parts
        all_entities: Any = SpilledTable([*parts.files, *above.files], above.schema, parts.num_rows + above.num_rows)
    else:  # an update's chunks as a change: the kept ones are neither read nor written again
        chunks = TableDelta("id", sorted(delta.gone_chunks), chunks.read_all())
        # the rows go into tables, and go: the method's relations first (at 100k chunks 358k summary links, 254 MB
        # as rows, 45 MB as a table), then the entities a slice at a time (publish reads only the ids added)
        if hierarchy.graph_relations is None:
            hierarchy.relations = relation_table(hierarchy.relations)
        summaries = dict(zip([e["id"] for e in hierarchy.entities], hierarchy.vectors.reshape(-1, dim)))
        mine = [e["id"] for e in layer0.entities] + sorted(layer0.removed)  # layer 0's ids the change can touch
        rows, layer0.entities, hierarchy.entities = [*layer0.entities, *hierarchy.entities], [], []
        bare = bare_table_of("entities", rows, dim, version)
        hierarchy.vectors = np.zeros((0, dim), np.float32)
        release_memory()  # to the system: the tables that follow are Arrow's, in another allocator

        def vectors_of(ids: list[str]) -> np.ndarray:  # the summaries', this run's, or the snapshot's
            if not ids:  # an update that adds no entity (a deletion: only removals and changed values)
                return np.zeros((0, dim), np.float32)
            below = [i for i in ids if i not in summaries]
            own = dict(zip(below, layer0.vectors_of(run, below)))
            return np.stack([summaries[i] if i in summaries else own[i] for i in ids]).reshape(-1, dim)

        all_entities = entity_change(run, bare, vectors_of, version, mine, layer0.kept)
        del bare, summaries, mine
    relations = hierarchy.graph_relations  # the method's own graph table, when it made one
    if relations is None and isinstance(layer0, UpdateLayer0):  # an update's: as a change
        above, hierarchy.relations = relation_table(hierarchy.relations), []  # a table already: not copied
        relations = relation_change(run, layer0.relation_change, above, version)
        del above
    elif relations is None:
        above = relation_table(hierarchy.relations)
        relations = with_above(layer0.relations, above, join(run.spill_dir, "relations-above.parquet"), version)
    tables = {
        "documents": documents,
        "chunks": chunks,
        "entities": all_entities,
        "relations": relations,
        "layers": to_table("layers", hierarchy.layers or [], dim, version),
        # a build's communities and reports are spilled already (made and embedded a part at a time)
        "communities": _table("communities", hierarchy.communities, dim, version),
        "community_reports": _table(
            "community_reports", hierarchy.reports, dim, version, hierarchy.report_vectors.reshape(-1, dim)
        ),
        # a build's mentions stay spilled on disk, stamped with this version when extracted
        "mentions": (
            TableDelta(mentions.column, mentions.values, stamped(mentions.add, version))
            if isinstance(mentions, TableDelta)
            else mentions
        ),
        "quarantine": to_table("quarantine", _dedupe(quarantine), dim, version),
    }
    if layer0.state is not None:  # an update of a snapshot without one keeps computing from the mentions
        tables["merge_state"] = (
            TableDelta("id", layer0.state.values, stamped(layer0.state.add, version))
            if isinstance(layer0.state, TableDelta)
            else layer0.state
        )
    if hierarchy.layers is None:  # the previous snapshot's layer statistics still hold
        del tables["layers"]
    return tables


def entity_change(
    run: PipelineRun, bare: pa.Table, vectors_of: Any, version: int, layer0_ids: list[str], kept: set[str]
) -> Any:
    """An update's entities (``bare``: the layer-0 rows it wrote and every summary, without vectors) as a change of
    the snapshot it updates: against the snapshot's rows of ``layer0_ids`` (those it wrote or removed) and its
    summaries, on every column but the vectors (a function of the text); ``vectors_of(ids)`` gives the rows that
    come theirs. The layer-0 rows it keeps (``kept``) are not read (120k at 100k chunks), unless most rows changed:
    then the table is written whole, as ``Catalog.change`` decides for the other tables."""
    columns = tuple(c for c in bare.column_names if c not in ("vector", "version"))
    mine = run.previous_in("entities", "id", layer0_ids, columns)
    old = pa.concat_tables([mine, run.previous("entities", columns, "layer > 0").cast(mine.schema)])
    change = delta_against(old, bare, max_share=None)
    if change is None:
        raise ValueError("entities: an id repeats among the rows an update made")
    if (
        len(change.values) + change.add.num_rows
        > DELTA_MAX_SHARE * run.catalog.open_table("entities", snap=run.snap).count_rows()
    ):
        bare = bare.drop(["version"])
        layer = pc.equal(bare.column("layer"), 0)
        below = pa.concat_tables(
            [bare.filter(layer), run.previous_in("entities", "id", sorted(kept), columns).cast(bare.schema)]
        )
        whole = pa.concat_tables([below.sort_by("id"), bare.filter(pc.invert(layer))])
        return with_vectors("entities", whole, vectors_of(whole.column("id").to_pylist()), version)
    add = change.add.drop(["version"])
    return TableDelta(
        "id", change.values, with_vectors("entities", add, vectors_of(add.column("id").to_pylist()), version)
    )


def relation_change(run: PipelineRun, extracted: TableDelta, above: pa.Table, version: int) -> Any:
    """An update's relations as a change of the snapshot it updates (the rows that come stamped ``version``):
    layer 0's rows that ``extracted`` recomputed or removed against their previous rows, and the method's rows
    above layer 0 (``above``) against the snapshot's. The relations it keeps are not read (1.9M rows at 100k
    chunks), unless most rows changed: then the table is written whole, as ``Catalog.change`` decides for the
    other tables."""
    mine = delta_against(run.previous_in("relations", "id", extracted.values), extracted.add, max_share=None)
    was = run.previous("relations", where="kind != 'extracted'")
    theirs = delta_against(was, above, max_share=None)
    if mine is None or theirs is None:
        raise ValueError("relations: an id repeats among the rows an update made")
    moved = len(mine.values) + mine.add.num_rows + len(theirs.values) + theirs.add.num_rows
    if moved > DELTA_MAX_SHARE * run.catalog.open_table("relations", snap=run.snap).count_rows():
        kept = run.previous("relations", where="kind = 'extracted'")
        kept = kept.filter(pc.invert(pc.is_in(kept.column("id"), value_set=pa.array(extracted.values, pa.string()))))
        new = extracted.add.select(above.column_names).cast(above.schema)
        return stamped(pa.concat_tables([kept.select(above.column_names).cast(above.schema), new, above]), version)
    add = pa.concat_tables([mine.add.select(above.column_names).cast(above.schema), theirs.add])
    return TableDelta("id", sorted({*mine.values, *theirs.values}), stamped(add, version))


def as_changes(run: PipelineRun, tables: dict[str, Any]) -> dict[str, Any]:
    """An update's whole tables (entities, relations, communities, reports) as changes of the snapshot it updates
    (``Catalog.change``): validation then checks the rows that changed, not the table (at 100k chunks it read
    1.9M relations to check a 1 % update's few thousand), and publish writes the same change it would have found."""
    if not run.snap:
        return tables
    out = dict(tables)
    for name, table in tables.items():
        pinned = run.snap["tables"].get(name)
        if isinstance(table, pa.Table) and (change := run.catalog.change(name, table, pinned)) is not None:
            out[name] = change
    return out


def _rows(run: PipelineRun, name: str, table: Any) -> int:
    """The rows of table ``name`` once written (a change: the snapshot's rows, less those it replaces or deletes,
    plus those it adds; its deleted keys are ids the snapshot holds)."""
    if not isinstance(table, TableDelta):
        return int(table.num_rows)
    return run.catalog.open_table(name, snap=run.snap).count_rows() - len(table.values) + table.add.num_rows


def _table(name: str, rows, dim: int, version: int, vectors=None):
    return rows if isinstance(rows, SpilledTable) else to_table(name, rows, dim, version, vectors)


def _dedupe(rows: list[QuarantineRow]) -> list[QuarantineRow]:
    seen, out = set(), []
    for r in rows:
        if r["id"] not in seen:
            seen.add(r["id"])
            out.append(r)
    return out


def parts_mapper(run: PipelineRun, tables: dict[str, Any]) -> Mapper:
    """Where validation and publish work on a spilled table (a build's mentions) a part per task: on the run's
    Dask workers when it has several parts, else in this process (the cluster is not brought up for one task)."""

    spilled = [t for t in tables.values() if isinstance(t, SpilledTable)]
    return run.mapper if any(len(t.files) > 1 for t in spilled) else LocalMapper()


def validation_mapper(run: PipelineRun, tables: dict[str, Any]) -> Mapper:
    """Where validation checks the tables a part per task: ``parts_mapper``'s, but a large index's (``PipelineRun.
    large``) in a child process rather than this one: great-expectations, pandas and their frames, once loaded,
    stay mapped in the process that loaded them (at 100k chunks an update's run peaked there, +230 MB)."""

    mapper, mentions = parts_mapper(run, tables), tables.get("mentions")
    if isinstance(mapper, LocalMapper) and run.small_child is not None:
        return run.small_child  # a small run's child, great-expectations loaded while the run went on
    new = mentions.add.num_rows if isinstance(mentions, TableDelta) else getattr(mentions, "num_rows", 0)
    if not isinstance(mapper, LocalMapper) or not run.large(new):
        return mapper
    release_idle_children()  # the embedding model's child is done: not beside this one
    return ProcessMapper()


def validate(run: PipelineRun, tables: dict[str, Any]) -> dict[str, Any]:
    """The tables checked, an update's as changes (``as_changes``): what publish writes. Raises
    ``ValidationFailed``."""

    dim = (run.snap or {}).get("dim") or run.embedder.dim
    with run.stage("validate") as st:
        tables = as_changes(run, tables)
        written = {k: t.add if isinstance(t, TableDelta) else t for k, t in tables.items()}  # kept rows passed before
        kept = {  # the ids of a change's kept rows, which other tables' rows may name
            k: set(run.previous(k, ("id",)).column("id").to_pylist()) - set(t.values)
            for k, t in tables.items()
            if isinstance(t, TableDelta) and k in REFERENCED
        }
        mapper = validation_mapper(run, tables)
        try:
            report = st.run(
                checks.validate_tables,
                {"layers": run.previous("layers"), **written},
                dim,
                mapper=mapper,
                workdir=join(run.spill_dir, "validate"),
                kept_ids=kept,
                relation_kinds=relation_kinds(),
            )
        finally:
            if mapper is not run.mapper:
                mapper.release()
        st.done(
            f"{sum(report.checked.values())} expectations passed" if report.success else "FAILED",
            expectations=sum(report.checked.values()),
            failures=len(report.failures),
        )
    if not report.success:
        raise ValidationFailed(report.failures)
    return tables


def draw_layers(run: PipelineRun, hierarchy: Hierarchy) -> Future[bytes | None] | None:
    """The layers' figure (``layers_png``), drawn on a thread of its own from now on: while this process waits on
    validation (a small run's child validates; matplotlib's import and the drawing take ~0.8 s). None for an index
    without a local folder or without layers."""
    rows = hierarchy.layers
    if not rows or run.catalog.root is None:
        return None

    drawn: Future[bytes | None] = Future()

    def draw() -> None:
        try:
            drawn.set_result(layers_png(rows, run.cfg.hierarchy.epsilon))
        except BaseException as exc:  # noqa: BLE001 - shown where publish reads the result
            drawn.set_exception(exc)

    threading.Thread(target=draw, name="strata-layers-plot", daemon=True).start()
    return drawn


def publish(
    run: PipelineRun,
    delta: Delta,
    tables: dict[str, Any],
    added: int,
    hierarchy: Hierarchy,
    drawn: Future[bytes | None] | None = None,
) -> BuildResult:
    cfg, dim = run.cfg, (run.snap or {}).get("dim") or run.embedder.dim
    note: dict[str, Any] = {"method": run.method.name}
    roots = dict(run.note.get("roots", {}), **({run.location: run.root} if run.location != run.root else {}))
    if roots:
        note["roots"] = roots  # locations that are the new place of an indexed root
    if run.snap:
        previous = run.note
        added += previous.get("added_since_full", 0)
        note |= {
            "added_since_full": added,
            "drift": round(added / max(1, _rows(run, "entities", tables["entities"])), 4),
            "diff": delta.counts,
        }
    mapper = parts_mapper(run, tables)
    with run.stage("publish") as st:
        try:
            version = st.run(
                run.catalog.publish,
                tables,
                run.run_id,
                "incremental" if run.snap else "full",
                dim,
                run.version,
                json.dumps(note),
                cfg.retrieval.ann_min_vectors,
                mapper,
            )
        finally:
            run.mapper.release()
        drift = note.get("drift", 0.0)
        hint = (
            f"; drift {drift:.0%} > {cfg.incremental.max_drift:.0%}: consider `strata update --full`"
            if drift > cfg.incremental.max_drift
            else ""
        )
        st.done(f"snapshot v{version}{hint}", tables=len(tables), drift=drift)
    plot, drawn = None, drawn or draw_layers(run, hierarchy)
    png = drawn.result() if drawn is not None else None
    if png is not None and run.catalog.root is not None:
        path = run.catalog.root / "reports" / f"layers-v{version}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(png)
        plot = str(path)
    snap = run.catalog.snapshot(version)
    counts = {
        k: run.catalog.open_table(k, snap=snap).count_rows() if isinstance(t, TableDelta) else t.num_rows
        for k, t in tables.items()
    }
    if counts.get("entities", 0) + counts.get("chunks", 0) <= VIEW_AT_PUBLISH_ROWS:
        leave_view(run.catalog, version, run.cfg)
    return run.result("published", delta, version, counts, hierarchy.layers, plot)


#: a snapshot of at most this many entities and chunks leaves its query view on disk at publish, built in the run's
#: process: a small index's first query is then as fast as a later one. The view holds tens of KB a row (docs/
#: benchmarks.md, "... the query view at publish"), so past this the first query builds it, not the run: a mid-size
#: build's peak would otherwise be the view's
VIEW_AT_PUBLISH_ROWS = 5_000


def leave_view(catalog: Catalog, version: int, cfg: StrataConfig) -> None:
    """The published snapshot's query view, left where the next ``strata query`` reads it (``remember_view``): that
    query then imports no LanceDB and reads no table (the demo's first query after its build: as fast as a later
    one). A failure costs only that: the next query loads the view from the tables."""

    try:
        view = IndexView.load(catalog, version)
        view.warm(cfg.retrieval)
        view.lance_version = catalog.snapshots_head()
        remember_view(view)
    except Exception as exc:  # noqa: BLE001 - the snapshot is published; the view is only a head start
        logging.getLogger(__name__).warning("the query view was not left on disk: %s", exc)
