"""The hierarchy and the communities of a build whose relations stay spilled (``tasks.index.merge_parts``): tasks
on the run's cluster (Dask workers, or this process without one) that read the parts from the run's work folder
and write their rows there, so the run process never holds the relations. Layer 1 is tasks over layer 0's parts
(``layer_parts``).

Leiden needs the whole graph at once, so communities are one task over the graph read from the parts as integer
arrays (``communities.graph_arrays``; its memory per edge: docs/benchmarks.md, "Leiden on arrays"), refused before
it starts where that cannot fit a worker (``check_task_memory``), unless ``communities.engine`` lets the
``community_parts`` engine take it: tasks over parts of the graph, each of a bounded size. The reports are tasks
over parts of the community trees (``report_parts``).
"""

from __future__ import annotations

from typing import Any, cast

import pyarrow as pa

from schemas.tables import schema_for
from tasks.index.embed import entity_text
from tasks.methods.base import check_memory, fits_memory
from tasks.methods.community_parts import communities_in_parts
from tasks.methods.hirag.communities import detect_communities, graph_arrays
from tasks.methods.hirag.hierarchy import build_hierarchy, build_layers, converged
from tasks.methods.layer_parts import LayerOne
from tasks.store import workfs
from tasks.store.rows import relation_table, stamped, to_table
from tasks.store.spill import SpilledTable, write_whole


def with_above(
    base: pa.Table | SpilledTable, above: pa.Table | SpilledTable, path: str, version: int
) -> pa.Table | SpilledTable:
    """Layer 0's relations, then those a method added above it, stamped ``version``: a table as one table; a
    build's spilled relations with the method's as its last parts (a table written to ``path``; spilled ones, which
    their task stamped, as they are: ``hierarchy_on_cluster``)."""
    if not isinstance(base, SpilledTable):
        return stamped(pa.concat_tables([base, relation_table(above)]), version)
    if not above.num_rows:
        return base
    if isinstance(above, SpilledTable):
        return SpilledTable([*base.files, *above.files], base.schema, base.num_rows + above.num_rows)
    write_whole(stamped(above.cast(base.schema), version), path)
    return SpilledTable([*base.files, path], base.schema, base.num_rows + above.num_rows)


def find_communities(ctx: Any, entity_ids: list[str] | pa.ChunkedArray, relations: pa.Table | SpilledTable):
    """``communities.detect_communities`` with the run's settings: in this process over a table (a list of
    rows), as one task on the run's cluster over spilled relations (the ``communities`` table's rows, spilled).
    ``entity_ids``: a list, or an Arrow column (a build's: its ids never become Python strings in the run)."""

    if isinstance(relations, SpilledTable):
        return communities_on_cluster(ctx, entity_ids, relations)
    cfg, ids = ctx.cfg.communities, entity_ids if isinstance(entity_ids, list) else entity_ids.to_pylist()
    return detect_communities(ids, relations, cfg.max_cluster_size, ctx.cfg.seed, cfg.resolution)


def communities_on_cluster(ctx: Any, entity_ids: list[str] | pa.ChunkedArray, relations: SpilledTable) -> SpilledTable:
    """``communities.detect_communities`` over spilled ``relations``, as one task on the run's mapper (the
    community settings of ``ctx.cfg``), or over parts of the graph (``community_parts``) where
    ``communities.engine`` says so: the ``communities`` table (stamped with the run's version) in files the run
    never reads. Refused before anything is written where its tasks cannot fit a worker."""

    cfg, room = ctx.cfg.communities, ctx.mapper.task_memory()
    column = entity_ids if isinstance(entity_ids, pa.ChunkedArray) else pa.chunked_array([entity_ids], pa.string())
    fits = fits_memory(relations.num_rows * LEIDEN_BYTES_PER_RELATION, room)
    if cfg.engine == "parts" or (cfg.engine == "auto" and not fits):
        return communities_in_parts(ctx, column, relations, workfs.join(ctx.spill_dir, "graph", "parts"))
    check_task_memory(relations.num_rows, room)
    work = graph_work(ctx)
    ids, out = workfs.join(work, "entity-ids.parquet"), workfs.join(work, "communities.parquet")
    write_whole(pa.table({"id": column}), ids)
    [n] = ctx.mapper(
        communities_task,
        [out],
        files=relations.files,
        ids=ids,
        max_cluster_size=cfg.max_cluster_size,
        seed=ctx.cfg.seed,
        resolution=cfg.resolution,
        version=ctx.version,
    )
    return SpilledTable([out], schema_for("communities", 0), n)


#: the memory the communities task needs per relation, at most: its reading of them into ``graph_arrays``, then
#: Leiden over the arrays (``benchmarks/bench_leiden.py``, docs/benchmarks.md "Leiden on arrays"), with room to spare
LEIDEN_BYTES_PER_RELATION = 300


def check_task_memory(relations: int, room: int) -> None:
    """Refuse, before the communities stage starts, a graph whose one Leiden task would not fit in a worker
    (``room`` bytes, ``check_memory``)."""
    check_memory(
        relations * LEIDEN_BYTES_PER_RELATION,
        room,
        f"the communities stage runs Leiden over the whole graph as one task: its {relations:,} relations",
        "a worker has",
        'Run it over parts of the graph (communities.engine = "parts" or "auto"), on workers with more memory '
        "(`dask worker --memory-limit`, dask.address), or make the graph smaller (extract.relation_window).",
    )


def communities_task(
    out: str, files: list[str], ids: str, max_cluster_size: int, seed: int, resolution: float, version: int = 0
) -> int:
    """The communities of the graph whose relations are ``files`` (a task); written to ``out`` as the
    ``communities`` table's rows (stamped ``version``), their number returned."""

    graph = graph_arrays(_read(files, ["source_id", "target_id", "weight"]))  # the relations not held past this
    rows = detect_communities(
        workfs.read_table(ids).column("id").to_pylist(), graph, max_cluster_size, seed, resolution
    )
    del graph
    write_whole(to_table("communities", rows, 0, version), out)
    return len(rows)


def hierarchy_on_cluster(
    ctx: Any, layer0: SpilledTable, summarizer: Any, per_cluster: int, on_layer: Any = None, detail: Any = None
) -> tuple[list[dict[str, Any]], Any, pa.Table | SpilledTable, list[dict[str, Any]]]:
    """``hierarchy.build_hierarchy`` over layer 0's parts (a build's entities with their vectors): layer 1, the
    GMMs over every layer-0 entity and the summaries of their clusters, as tasks on the run's mapper over the
    parts (``layer_parts``); the layers above it, over the summary entities, in this process. The result is
    ``build_hierarchy``'s over the same rows (up to the PCA's rounding), but the ``summary_of`` links spilled,
    stamped with the run's version: layer 1's (one per layer-0 entity and cluster it joins) are never read by
    the run. ``detail`` (a dict) gets layer 1's number of global clusters and the largest one's entities."""
    import numpy as np

    cfg, dim = ctx.cfg, layer0.schema.field("vector").type.list_size
    if not cfg.hierarchy.enabled:
        return [], np.zeros((0, dim), np.float32), relation_table([]), []
    h, work = cfg.hierarchy, graph_work(ctx)
    one = LayerOne(ctx, layer0, work, per_cluster)
    layers, rows = build_layers(
        cast(Any, range(layer0.num_rows)), cast(Any, None), h.max_layers, h.min_entities, cfg.seed, one.build,
        cast(Any, one.cluster), converged(h.epsilon), on_layer=on_layer, until=1,
    )  # fmt: skip
    ents, stats = (layers[0].entities if layers else []), [cast(Any, dict(r)) for r in rows]
    summarizer.failures.extend(one.failures)
    if detail is not None:  # what layer 1's tasks held: its global clusters, the largest's entities
        detail.update(global_clusters=len(one.globals), largest_global_cluster=one.largest)
    rels = SpilledTable(one.links, schema_for("relations", 0), one.n_links)
    vecs = ctx.embed([entity_text(e["name"], e["type"], e["description"]) for e in ents]).reshape(-1, dim)
    if not ents or stats[-1]["stopped"]:
        return ents, vecs, rels, stats
    above, above_vecs, above_rels, above_stats = build_hierarchy(
        ents,
        vecs,
        cfg.hierarchy,
        cfg.seed,
        summarizer,
        ctx.embed,
        on_layer,
        first=2,
        previous_cs=stats[-1]["cluster_sparsity"],
    )
    return (
        ents + above,
        np.concatenate([vecs, above_vecs.reshape(-1, dim)]),
        with_above(rels, relation_table(above_rels), workfs.join(work, "layers-above-links.parquet"), ctx.version),
        stats + above_stats,
    )


def graph_work(ctx: Any) -> str:
    """The run's work folder of the graph stages (communities, reports), made if missing."""
    work = workfs.join(ctx.spill_dir, "graph")
    workfs.mkdirs(work)
    return work


def _read(files: list[str], columns: list[str]) -> pa.Table:

    empty = schema_for("relations", 0).empty_table().select(columns)
    return pa.concat_tables([empty, *(workfs.read_table(f, columns=columns) for f in files)])
