"""A build's merge as tasks on the cluster: one task per spilled part, reading it from the run's work folder and
writing its merged part back there; the run process holds the entity rows, never the relations.

Extraction spills the mentions in parts split by a hash of their key (``tasks.store.spill``), so every mention of
an entity, and every mention of a relation, is in one part. Merge is two rounds of tasks over those parts:

1. entities: each task merges the entity mentions of one part (``merge.entity_part``) and writes them, with
   their ids, to ``entities-NNNNN.parquet``;
2. relations: each task reads every entity part's (key, id) columns (a relation needs both endpoints) and merges
   the relation mentions of one part (``merge.relation_part``) into ``relations-NNNNN.parquet``, its rows
   grouped by the range of their source id (ranges of equal entity counts, a Parquet row group each);
3. ranges: each task reads its range from every part's file and sorts it by endpoints into
   ``layer0-relations-NNNNN.parquet``: the ranges in order are the relations table, which stays a spilled table
   (the communities, reports, validation and publish read it part by part, on the workers).

A task reads only its part and the chunk places (``places.parquet``: each chunk's rank in the corpus), and writes
its output under a temporary name then renames it: a task retried on another worker (its worker was killed)
writes the same file again, whole. The tasks return row counts; nothing large goes through the scheduler. The
result is ``merge.graph_from_mentions``'s, row for row (the golden tables pin it).
"""

from __future__ import annotations

from typing import Any, cast

import pyarrow as pa

from schemas.tables import schema_for
from tasks.index.merge import (
    MENTION_COLUMNS,
    ChunkOrder,
    corpus_places,
    entity_part,
    graph_from_mentions,
    mention_frame,
    relation_frame,
    relation_part,
)
from tasks.index.merge_state import STATE, state_table
from tasks.store import workfs
from tasks.store.rows import stamped
from tasks.store.spill import SpilledTable, read_part, write_whole


def merge_spilled(
    mapper: Any,
    mentions: SpilledTable,
    max_tokens: int,
    order: ChunkOrder,
    workdir: str,
    version: int = 0,
    entity_rows_per_part: int = 20_000,
) -> tuple[SpilledTable, SpilledTable, SpilledTable]:
    """Layer 0 of a build's spilled mentions, merged part by part on ``mapper`` (the run's Dask cluster, or in
    this process), as two ``SpilledTable``s this process never reads whole: the entity rows (``LAYER0_SCHEMA``:
    the ``entities`` columns but vector and version) in key order, parts of about ``entity_rows_per_part`` rows;
    the relations in endpoint order, stamped ``version``; and their ``merge_state`` rows, a file per task.
    ``workdir`` (a folder or an object-store URI) must be reachable by every worker."""
    import polars as pl

    workfs.mkdirs(workdir)

    def at(name: str) -> str:
        return workfs.join(workdir, name)

    if not mentions.files:
        rows, relations, state = graph_from_mentions(mentions, max_tokens, order, state=True)
        one = at("layer0-entities-00000.parquet")
        write_whole(pa.Table.from_pylist([dict(r, staleness=0.0) for r in rows], schema=LAYER0_SCHEMA), one)
        whole = at("layer0-relations-00000.parquet")
        write_whole(stamped(relations, version), whole)
        states = at("state-00000.parquet")
        write_whole(stamped(state, version), states)
        return (
            SpilledTable([one], LAYER0_SCHEMA, len(rows)),
            SpilledTable([whole], schema_for("relations", 0), relations.num_rows),
            SpilledTable([states], schema_for("merge_state", 0), state.num_rows),
        )
    places = at("places.parquet")
    _write(corpus_places(order), places)
    parts = mentions.files
    entity_files = [at(f"entities-{i:05d}.parquet") for i in range(len(parts))]
    relation_files = [at(f"relations-{i:05d}.parquet") for i in range(len(parts))]
    state_files = [at(f"state-{i:05d}.parquet") for i in range(2 * len(parts))]
    entity_states = mapper(
        merge_entities,
        list(zip(parts, entity_files, state_files)),
        places=places,
        max_tokens=max_tokens,
        version=version,
    )
    keys = pl.concat([_read(f, columns=["key", "id"]) for f in entity_files])
    bounds = range_bounds(keys.get_column("id"), len(parts))
    key_bounds = range_bounds(keys.get_column("key"), max(1, -(-keys.height // entity_rows_per_part)))
    del keys
    relation_states = mapper(
        merge_relations,
        list(zip(parts, relation_files, state_files[len(parts) :])),
        places=places,
        entity_files=entity_files,
        max_tokens=max_tokens,
        bounds=bounds,
        version=version,
    )
    state = SpilledTable(state_files, schema_for("merge_state", 0), sum(entity_states) + sum(relation_states))
    ranges = [
        (b, at(f"layer0-relations-{b:05d}.parquet"), at(f"degrees-{b:05d}.parquet")) for b in range(len(bounds) + 1)
    ]
    counts = mapper(sort_relations, ranges, files=relation_files, version=version)
    files = [f for (_, f, _), n in zip(ranges, counts) if n]  # a range may hold no relation
    relations = SpilledTable(files, schema_for("relations", 0), sum(counts))
    key_ranges = [
        (lo, hi, at(f"layer0-entities-{i:05d}.parquet"))
        for i, (lo, hi) in enumerate(zip([None, *key_bounds], [*key_bounds, None]))
    ]
    sizes = mapper(sort_entities, key_ranges, files=entity_files, degrees=[d for _, _, d in ranges])
    entities = [f for (_, _, f), n in zip(key_ranges, sizes) if n]
    return SpilledTable(entities, LAYER0_SCHEMA, sum(sizes)), relations, state


#: layer 0's entity rows as merge writes them: the ``entities`` columns but ``vector`` and ``version``, which
#: embed adds (``tasks.store.rows.with_vectors``)
LAYER0_SCHEMA = pa.schema([f for f in schema_for("entities", 0) if f.name not in ("vector", "version")])


def sort_entities(job: tuple[str | None, str | None, str], files: list[str], degrees: list[str]) -> int:
    """One range of entity keys, ``job`` = (lowest key or None, key bound or None, output file) (a task): its
    entities from every part's file in key order, with their degree (relations they are an end of, summed
    over ``degrees`` files), as layer 0's rows (``LAYER0_SCHEMA``). Returns their number."""
    import polars as pl

    lo, hi, out = job
    where = [("key", ">=", lo)] * (lo is not None) + [("key", "<", hi)] * (hi is not None)
    frame = cast(
        pl.DataFrame, pl.from_arrow(pa.concat_tables([workfs.read_table(f, filters=where or None) for f in files]))
    ).sort("key")
    ids = frame.get_column("id")
    degree = (
        pl.concat([_read(d).filter(pl.col("id").is_in(ids)) for d in degrees])
        .group_by("id")
        .agg(pl.col("n").sum().alias("degree"))
    )
    rows = frame.join(degree, on="id", how="left", maintain_order="left").select(
        "id",
        "name",
        "type",
        "description",
        layer=pl.lit(0, pl.Int64),
        source_chunk_ids="source_chunk_ids",
        degree=pl.col("degree").fill_null(0).cast(pl.Int64),
        aliases="aliases",
        staleness=pl.lit(0.0, pl.Float64),
    )
    write_whole(rows.to_arrow().cast(LAYER0_SCHEMA), out)
    return rows.height


def range_bounds(ids: Any, n: int) -> list[str]:
    """At most ``n - 1`` ids cutting the sorted ``ids`` into ``n`` ranges of about equal size."""
    ordered = ids.sort()
    return sorted({ordered[i * len(ordered) // n] for i in range(1, n)} if len(ordered) else set())


def merge_entities(job: tuple[str, str, str], places: str, max_tokens: int, version: int) -> int:
    """One part's entities (a task): ``job`` = (mention part file, output file, state file: their
    ``merge_state`` rows, stamped ``version``). Returns their number."""

    part, out, state = job
    frame = entity_part(_mentions(part, "entity"), _read(places), max_tokens, state=True)
    write_whole(stamped(state_table(frame, "entity"), version), state)
    _write(frame.select("key", "id", "name", "aliases", "type", "description", "source_chunk_ids"), out)
    return frame.height


def merge_relations(
    job: tuple[str, str, str], places: str, entity_files: list[str], max_tokens: int, bounds: list[str], version: int
) -> int:
    """One part's relations (a task): ``job`` = (mention part file, output file, state file: their
    ``merge_state`` rows, stamped ``version``); the (key, id) of every entity come from ``entity_files``. Written
    with their range of source ids (``bounds``), a row group per range. Returns their number."""
    import polars as pl

    part, out, state = job
    ids = pl.concat([_read(f, columns=["key", "id"]) for f in entity_files])
    frame = relation_part(_mentions(part, "relation"), _read(places), ids, max_tokens, state=True)
    write_whole(stamped(state_table(frame, "relation"), version), state)
    frame = frame.drop(STATE)
    ranged = frame.with_columns(
        range=pl.Series(bounds, dtype=pl.Utf8).search_sorted(frame.get_column("source_id"), side="right")
    ).sort("range", maintain_order=True)
    write_whole(ranged.to_arrow(), out, group_by="range")  # a range's task reads its row group, skips the others
    return frame.height


def sort_relations(job: tuple[int, str, str], files: list[str], version: int) -> int:
    """One range of source ids (a task): its relations from every part's file, in endpoint order, as the
    ``relations`` table's rows (``job`` = (range, output file, degrees file)); each entity's number of
    relations in the range written beside them. Returns their number."""
    import polars as pl

    r, out, degrees_out = job
    ranged = [workfs.read_table(f, filters=[("range", "=", r)]) for f in files]
    frame = cast(pl.DataFrame, pl.from_arrow(pa.concat_tables(ranged))).drop("range").sort("source_id", "target_id")
    relations = relation_frame(frame, version)
    ends = frame.select("source_id", "target_id").unpivot().group_by("value").len()
    _write(ends.select(id=pl.col("value"), n=pl.col("len").cast(pl.Int64)), degrees_out)
    write_whole(relations, out)
    return relations.num_rows


def _mentions(part: str, kind: str):

    if not workfs.exists(part):
        raise FileNotFoundError(
            f"{part}: not found from this Dask worker ({_host()}). The run's work folder is under the index "
            "location; every worker must reach it at the same path (run the workers where the index is, or "
            "mount it at the same path on theirs)"
        )
    table = read_part(part, columns=list(MENTION_COLUMNS), where=("kind", kind), encoded=True)
    return mention_frame(table)


def _write(frame, out: str) -> None:
    write_whole(frame.to_arrow(), out)


def _read(path: str, columns: list[str] | None = None):
    """A part file as a polars frame (a path or an object-store URI)."""
    import polars as pl

    return cast(pl.DataFrame, pl.from_arrow(workfs.read_table(path, columns=columns)))


def _host() -> str:
    import socket

    return socket.gethostname()


def unreachable_workers(client: Any, folder: str) -> dict[str, str]:
    """The workers of a Dask ``client`` that cannot read the run's work folder ``folder`` (which the tasks read
    and write; a folder, or an object-store URI), each with the reason: a probe file written there by this
    process, read back by each worker."""
    probe = workfs.join(folder, "reach.probe")
    workfs.save_bytes(b"strata", probe)
    seen = client.run(_cannot_read, probe)
    return {worker: why for worker, why in sorted(seen.items()) if why}


def _cannot_read(probe: str) -> str:
    """Why this process cannot read ``probe`` ("" when it can)."""
    try:
        workfs.load_bytes(probe)
    except Exception as exc:  # noqa: BLE001 - any failure is the answer (not found, no credentials, no route)
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    return ""
