"""A build's merge as tasks on the cluster: one task per spilled part, reading it from the run's work folder and
writing its merged part back there; the run process only assembles the results.

Extraction spills the mentions in parts split by a hash of their key (``tasks.store.spill``), so every mention of
an entity, and every mention of a relation, is in one part. Merge is two rounds of tasks over those parts:

1. entities: each task merges the entity mentions of one part (``merge.entity_part``) and writes them, with
   their ids, to ``entities-NNNNN.parquet``;
2. relations: each task reads every entity part's (key, id) columns (a relation needs both endpoints) and merges
   the relation mentions of one part (``merge.relation_part``) into ``relations-NNNNN.parquet``.

A task reads only its part and the chunk places (``places.parquet``: each chunk's rank in the corpus), and writes
its output under a temporary name then renames it: a task retried on another worker (its worker was killed)
writes the same file again, whole. The tasks return row counts; nothing large goes through the scheduler. The
result is ``merge.graph_from_mentions``'s, row for row (the golden tables pin it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tasks.index.merge import (
    ChunkOrder,
    corpus_places,
    entity_part,
    graph_from_mentions,
    layer0_rows,
    mention_frame,
    relation_part,
)
from tasks.store.spill import SpilledTable


def merge_spilled(mapper: Any, mentions: SpilledTable, max_tokens: int, order: ChunkOrder, workdir: Path):
    """Layer 0 (entity rows, relations table) of a build's spilled mentions, merged part by part on ``mapper``
    (the run's Dask cluster, or in this process). ``workdir`` must be reachable by every worker."""
    import polars as pl

    if not mentions.files:
        return graph_from_mentions(mentions, max_tokens, order)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    places = str(workdir / "places.parquet")
    corpus_places(order).write_parquet(places)
    parts = [str(f) for f in mentions.files]
    entity_files = [str(workdir / f"entities-{i:05d}.parquet") for i in range(len(parts))]
    relation_files = [str(workdir / f"relations-{i:05d}.parquet") for i in range(len(parts))]
    mapper(merge_entities, list(zip(parts, entity_files)), places=places, max_tokens=max_tokens)
    mapper(
        merge_relations,
        list(zip(parts, relation_files)),
        places=places,
        entity_files=entity_files,
        max_tokens=max_tokens,
    )
    entity = pl.concat([pl.read_parquet(f) for f in entity_files])
    relation = pl.concat([pl.read_parquet(f) for f in relation_files])
    return layer0_rows(entity, relation)


def merge_entities(job: tuple[str, str], places: str, max_tokens: int) -> int:
    """One part's entities (a task): ``job`` = (mention part file, output file). Returns their number."""
    import polars as pl

    part, out = job
    frame = entity_part(_mentions(part, "entity"), pl.read_parquet(places), max_tokens)
    _write(frame, out)
    return frame.height


def merge_relations(job: tuple[str, str], places: str, entity_files: list[str], max_tokens: int) -> int:
    """One part's relations (a task): ``job`` = (mention part file, output file); the (key, id) of every entity
    come from ``entity_files``. Returns their number."""
    import polars as pl

    part, out = job
    ids = pl.concat([pl.read_parquet(f, columns=["key", "id"]) for f in entity_files])
    frame = relation_part(_mentions(part, "relation"), pl.read_parquet(places), ids, max_tokens)
    _write(frame, out)
    return frame.height


def _mentions(part: str, kind: str):
    from tasks.index.merge import MENTION_COLUMNS

    if not os.path.exists(part):
        raise FileNotFoundError(
            f"{part}: not found from this Dask worker ({_host()}). The run's work folder is under the index "
            "location; every worker must reach it at the same path (run the workers where the index is, or "
            "mount it at the same path on theirs)"
        )
    schema = pq.read_schema(part)
    dictionary = [n for n in MENTION_COLUMNS if n != "id" and pa.types.is_string(schema.field(n).type)]
    table = pq.read_table(
        part, columns=list(MENTION_COLUMNS), read_dictionary=dictionary, filters=[("kind", "=", kind)]
    )
    return mention_frame(table)


def _write(frame, out: str) -> None:
    tmp = f"{out}.{os.getpid()}.tmp"
    frame.write_parquet(tmp)
    os.replace(tmp, out)  # whole or not at all: a retried task writes the same file again


def _host() -> str:
    import socket

    return socket.gethostname()


def unreachable_workers(client: Any, folder: Path) -> list[str]:
    """The workers of a Dask ``client`` that do not see ``folder`` (the run's work folder, which the merge tasks
    read and write)."""
    seen = client.run(os.path.isdir, str(folder))
    return sorted(worker for worker, ok in seen.items() if not ok)
