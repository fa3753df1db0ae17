"""The communities and reports of a build whose relations stay spilled (``tasks.index.merge_parts``): each one task
on the run's cluster (a Dask worker, or this process without one) that reads the relation parts from the run's
work folder and writes its rows there, so the run process never holds the relations.

Leiden needs the whole graph at once, so communities are one task over an edge list of (source, target, weight)
read from the parts (``communities.graph_edges``: ~300 bytes an edge with Leiden's own; docs/benchmarks.md, "Past
one machine"). Reports are one task too: a report reads the relations between its community's members, across
every level (bottom-up: a parent's report rolls up its children's).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tasks.store.rows import relation_table, stamped
from tasks.store.spill import SpilledTable, write_whole

#: what the reports read of a relation (``reports.RelationIndex``)
REPORT_COLUMNS = ["id", "source_id", "target_id", "kind", "description", "weight"]
#: what a report reads of an entity
ENTITY_COLUMNS = ("id", "name", "type", "description", "layer")
ENTITY_SCHEMA = pa.schema([(c, pa.int64() if c == "layer" else pa.string()) for c in ENTITY_COLUMNS])


def with_above(
    base: pa.Table | SpilledTable, above: pa.Table | SpilledTable, path: Path, version: int
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
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(stamped(above.cast(base.schema), version), path)
    return SpilledTable([*base.files, path], base.schema, base.num_rows + above.num_rows)


def find_communities(ctx: Any, entity_ids: list[str] | pa.ChunkedArray, relations: pa.Table | SpilledTable):
    """``communities.detect_communities`` with the run's settings: in this process over a table (a list of
    rows), as one task on the run's cluster over spilled relations (the ``communities`` table's rows, spilled).
    ``entity_ids``: a list, or an Arrow column (a build's: its ids never become Python strings in the run)."""
    from tasks.methods.hirag.communities import detect_communities

    if isinstance(relations, SpilledTable):
        return communities_on_cluster(ctx, entity_ids, relations)
    cfg, ids = ctx.cfg.communities, entity_ids if isinstance(entity_ids, list) else entity_ids.to_pylist()
    return detect_communities(ids, relations, cfg.max_cluster_size, ctx.cfg.seed, cfg.resolution)


def communities_on_cluster(ctx: Any, entity_ids: list[str] | pa.ChunkedArray, relations: SpilledTable) -> SpilledTable:
    """``communities.detect_communities`` over spilled ``relations``, as one task on the run's mapper (the
    community settings of ``ctx.cfg``): the ``communities`` table (stamped with the run's version) in a file
    the run never reads."""
    from schemas.tables import schema_for

    cfg, work = ctx.cfg.communities, _work(ctx)
    ids, out = work / "entity-ids.parquet", work / "communities.parquet"
    column = entity_ids if isinstance(entity_ids, pa.ChunkedArray) else pa.chunked_array([entity_ids], pa.string())
    pq.write_table(pa.table({"id": column}), ids)
    [n] = ctx.mapper(
        communities_task,
        [str(out)],
        files=[str(f) for f in relations.files],
        ids=str(ids),
        max_cluster_size=cfg.max_cluster_size,
        seed=ctx.cfg.seed,
        resolution=cfg.resolution,
        version=ctx.version,
    )
    return SpilledTable([out], schema_for("communities", 0), n)


def communities_task(
    out: str, files: list[str], ids: str, max_cluster_size: int, seed: int, resolution: float, version: int = 0
) -> int:
    """The communities of the graph whose relations are ``files`` (a task); written to ``out`` as the
    ``communities`` table's rows (stamped ``version``), their number returned."""
    from tasks.methods.hirag.communities import detect_communities
    from tasks.store.rows import to_table

    edges = _read(files, ["source_id", "target_id", "weight"])
    rows = detect_communities(pq.read_table(ids).column("id").to_pylist(), edges, max_cluster_size, seed, resolution)
    del edges
    write_whole(to_table("communities", rows, 0, version), out)
    return len(rows)


COMMUNITY_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("level", pa.int64()),
        ("parent_id", pa.string()),
        ("entity_ids", pa.list_(pa.string())),
        ("size", pa.int64()),
    ]
)


def hierarchy_on_cluster(
    ctx: Any, layer0: SpilledTable, summarizer: Any, per_cluster: int, on_layer: Any = None
) -> tuple[list[dict[str, Any]], Any, pa.Table | SpilledTable, list[dict[str, Any]]]:
    """``hierarchy.build_hierarchy`` over layer 0's parts (a build's entities with their vectors): layer 1, the
    GMMs over every layer-0 entity and the summaries of their clusters, as one task on the run's mapper that
    reads the parts (``layer_one_task``); the layers above it, over the summary entities, in this process.
    The result is ``build_hierarchy``'s over the same rows, but the ``summary_of`` links spilled, stamped with the
    run's version: layer 1's (one per layer-0 entity and cluster it joins) are never read by the run."""
    import numpy as np

    from schemas.tables import schema_for
    from tasks.index.embed import entity_text
    from tasks.methods.hirag.hierarchy import build_hierarchy
    from tasks.runtime.llm_client import Usage
    from tasks.store.rows import relation_table

    cfg, dim = ctx.cfg, layer0.schema.field("vector").type.list_size
    if not cfg.hierarchy.enabled:
        return [], np.zeros((0, dim), np.float32), relation_table([]), []
    work = _work(ctx)
    [(ents, stats, failures, usage, n_links)] = ctx.mapper(
        layer_one_task,
        [str(work / "layer1-links.parquet")],
        files=[str(f) for f in layer0.files],
        cfg=cfg.hierarchy,
        seed=cfg.seed,
        llm=cfg.llm if ctx.llm is not None else None,
        cache_dir=str(ctx.catalog.cache_dir),
        per_cluster=per_cluster,
        max_tokens=cfg.extract.max_description_tokens,
        version=ctx.version,
    )
    ctx.usage.add(Usage(**usage))
    summarizer.failures.extend(failures)
    rels = SpilledTable([work / "layer1-links.parquet"], schema_for("relations", 0), n_links)
    for row in stats:
        if on_layer and not row["stopped"]:
            on_layer(row)
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
        with_above(rels, relation_table(above_rels), work / "layers-above-links.parquet", ctx.version),
        stats + above_stats,
    )


def layer_one_task(
    out: str,
    files: list[str],
    cfg: Any,
    seed: int,
    llm: Any,
    cache_dir: str,
    per_cluster: int,
    max_tokens: int,
    version: int = 0,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, str]], dict[str, Any], int]:
    """Layer 1 of the hierarchy over layer 0's parts ``files`` (a task): its summary entities (returned: a few
    hundred at 100k chunks), their ``summary_of`` links (written to ``out`` stamped ``version``, their number
    returned: one per member), the statistic of every clustering tried, the LLM summaries that fell back to
    offline ones and the LLM usage."""
    from tasks.index.extract_llm import _client
    from tasks.methods.hirag.hierarchy import build_hierarchy
    from tasks.methods.summarize import LLMSummarizer, OfflineSummarizer
    from tasks.runtime.llm_client import usage_scope
    from tasks.store.rows import vector_matrix

    columns = ["id", "name", "type", "description", "vector"]
    table = pa.concat_tables([pq.read_table(f, columns=columns) for f in files])
    vectors, entities = vector_matrix(table), table.drop(["vector"]).to_pylist()
    del table
    summarizer: Any = (
        LLMSummarizer(_client(llm, cache_dir, 1), cfg.meta_entities, per_cluster, max_tokens)
        if llm is not None
        else OfflineSummarizer(cfg.meta_entities, max_tokens)
    )
    with usage_scope() as usage:
        ents, _, rels, stats = build_hierarchy(entities, vectors, cfg, seed, summarizer, None, until=1)
    del entities, vectors
    write_whole(stamped(relation_table(rels), version), out)
    return ents, [dict(r) for r in stats], list(summarizer.failures), asdict(usage), len(rels)


def reports_on_cluster(
    ctx: Any,
    communities: SpilledTable,
    entities: list[dict[str, Any]],
    relations: SpilledTable,
    layer0: SpilledTable | None = None,
    progress: Any = None,
) -> tuple[SpilledTable, list[dict[str, str]]]:
    """``reports.build_reports`` over spilled ``communities`` and ``relations``, as one task on the run's mapper
    (with an LLM, the task's own client: same settings and response cache; its usage added to the run's); the
    entities are ``layer0``'s parts (read by the task), then ``entities``. The reports are then embedded a part
    at a time into the ``community_reports`` table's parts: the run never holds them whole."""
    from tasks.index.embed import report_text
    from tasks.index.embed_table import embed_table
    from tasks.runtime.llm_client import Usage

    work = _work(ctx)
    ents, out = work / "report-entities.parquet", work / "reports.parquet"
    pq.write_table(pa.table({c: [e[c] for e in entities] for c in ENTITY_COLUMNS}, schema=ENTITY_SCHEMA), ents)
    [(failures, usage)] = ctx.mapper(
        reports_task,
        [str(out)],
        files=[str(f) for f in relations.files],
        communities=[str(f) for f in communities.files],
        entities=[*(str(f) for f in (layer0.files if layer0 is not None else [])), str(ents)],
        budget=ctx.cfg.communities.report_max_tokens,
        llm=ctx.cfg.llm if ctx.llm is not None else None,
        cache_dir=str(ctx.catalog.cache_dir),
    )
    ctx.usage.add(Usage(**usage))
    staleness = pa.field("staleness", pa.float64())
    parts = (
        pa.Table.from_batches([b]).append_column(staleness, pa.array([0.0] * b.num_rows, pa.float64()))
        for b in pq.ParquetFile(out).iter_batches(batch_size=REPORT_STEP)
    )

    def texts(t: pa.Table) -> list[str]:
        return [report_text(a, b) for a, b in zip(t.column("title").to_pylist(), t.column("summary").to_pylist())]

    return embed_table(ctx, "community_reports", parts, texts, progress, REPORT_STEP), failures


def reports_task(
    out: str, files: list[str], communities: list[str], entities: list[str], budget: int, llm: Any, cache_dir: str
) -> tuple[list[dict[str, str]], dict[str, Any]]:
    """A report per community of ``communities`` (a task), from the relations in ``files``; written to ``out``.
    Returns the LLM failures (offline reports kept) and the LLM usage."""
    from tasks.index.extract_llm import _client
    from tasks.methods.reports import build_reports
    from tasks.runtime.llm_client import usage_scope

    relations = _read(files, REPORT_COLUMNS)
    client = _client(llm, cache_dir, 1) if llm is not None else None
    with usage_scope() as usage:
        reports, failures = build_reports(
            pa.concat_tables([pq.read_table(f, columns=list(COMMUNITY_SCHEMA.names)) for f in communities]).to_pylist(),
            pa.concat_tables(
                [pq.read_table(f, columns=list(ENTITY_COLUMNS)).cast(ENTITY_SCHEMA) for f in entities]
            ).to_pylist(),
            relations,
            budget,
            client,
        )
    del relations
    # in row groups of what the run reads at a time
    write_whole(pa.Table.from_pylist(reports, schema=REPORT_SCHEMA), out, row_group_rows=REPORT_STEP)
    return failures, asdict(usage)


#: reports read, embedded and written at a time by the run (a report is ~20 times a chunk's text: 2,048 of them
#: were the run's largest transient at 100k chunks); a multiple of the embedder's batch, as ``EMBED_STEP``
REPORT_STEP = 256 * 2


REPORT_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("community_id", pa.string()),
        ("level", pa.int64()),
        ("title", pa.string()),
        ("summary", pa.string()),
        ("rating", pa.float64()),
        ("findings", pa.list_(pa.string())),
        ("full_text", pa.string()),
    ]
)


def _work(ctx: Any) -> Path:
    work = Path(ctx.spill_dir) / "graph"
    work.mkdir(parents=True, exist_ok=True)
    return work


def _read(files: list[str], columns: list[str]) -> pa.Table:
    from schemas.tables import schema_for

    empty = schema_for("relations", 0).empty_table().select(columns)
    return pa.concat_tables([empty, *(pq.read_table(f, columns=columns) for f in files)])
