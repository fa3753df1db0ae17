"""Rows and Arrow tables: stages pass rows (dicts) and Arrow tables; these turn one into the other, exactly in
a table's schema, and read a snapshot's note and a table's vector column.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc

from schemas.tables import schema_for
from tasks.store import workfs
from tasks.store.spill import SpilledTable, plain_schema, write_whole


def rows_to_table(
    rows: Sequence[Mapping[str, Any]],
    schema: pa.Schema,
    fixed: dict[str, Any] | None = None,
    defaults: dict[str, Any] | None = None,
) -> pa.Table:
    """Rows (dicts) to an Arrow table of exactly ``schema`` (missing columns null, extra keys ignored); a column in
    ``fixed`` takes that value in every row, one in ``defaults`` takes it where the row has none (no row copied)."""
    fixed, defaults = fixed or {}, defaults or {}

    def column(name: str) -> list[Any]:
        if name in fixed:
            return [fixed[name]] * len(rows)
        if name in defaults:
            return [defaults[name] if r.get(name) is None else r[name] for r in rows]
        return [r.get(name) for r in rows]

    return pa.Table.from_pydict({f.name: column(f.name) for f in schema}, schema=schema)


def to_table(name: str, rows: Sequence[Mapping[str, Any]], dim: int, version: int, vectors: Any = None) -> pa.Table:
    """Rows of table ``name`` as Arrow, stamped with ``version``; ``vectors`` (an n x dim matrix aligned with
    the rows) fills the vector column. A summary or report written now has ``staleness`` 0 unless it says otherwise."""
    import numpy as np

    schema = schema_for(name, dim)
    table = bare_table(name, rows, dim, version)
    if "vector" not in schema.names:
        return table
    vecs = (
        np.zeros((len(rows), dim), np.float32)
        if vectors is None and not rows
        else np.asarray(vectors, dtype=np.float32)
    )
    if vecs.shape != (len(rows), dim):
        raise ValueError(f"{name}: {len(rows)} rows but a {vecs.shape} vector matrix (dimension {dim})")
    column = pa.FixedSizeListArray.from_arrays(pa.array(vecs.reshape(-1), type=pa.float32()), dim)
    return table.append_column(schema.field("vector"), column).select(schema.names)


def bare_table(name: str, rows: Sequence[Mapping[str, Any]], dim: int, version: int) -> pa.Table:
    """``to_table`` without the ``vector`` column."""
    schema = schema_for(name, dim)
    schema = schema.remove(schema.get_field_index("vector")) if "vector" in schema.names else schema
    return rows_to_table(rows, schema, fixed={"version": version}, defaults={"staleness": 0.0})


def bare_table_of(name: str, rows: list[Any], dim: int, version: int, slice_rows: int = 10_000) -> pa.Table:
    """``bare_table`` of ``rows``, a list it empties a slice at a time as the slices go into the table: rows no one
    else holds are freed while the table grows, not after it (an update's 120k layer-0 rows at 100k chunks: the
    table made beside all of them held +280 MB)."""
    parts = [bare_table(name, [], dim, version)]
    while rows:
        parts.append(bare_table(name, rows[:slice_rows], dim, version))
        del rows[:slice_rows]
    return pa.concat_tables(parts)


def with_vectors(name: str, table: pa.Table, vectors: Any, version: int) -> pa.Table:
    """``table`` (table ``name``'s columns but ``vector`` and ``version``) with its ``vectors`` (a matrix aligned
    with its rows) and stamped ``version``: as ``to_table`` makes it from the same rows."""
    import numpy as np

    vectors = np.asarray(vectors, dtype=np.float32)
    schema = schema_for(name, vectors.shape[1])
    column = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1), type=pa.float32()), vectors.shape[1])
    stamp = pa.array(np.full(table.num_rows, version, dtype=np.int64))
    return table.append_column("vector", column).append_column("version", stamp).select(schema.names).cast(schema)


def spilled_rows(
    name: str,
    pieces: Iterable[tuple[Sequence[Mapping[str, Any]], Any]],
    dim: int,
    version: int,
    directory: Any,
    part_rows: int,
) -> SpilledTable:
    """Rows of table ``name`` written as Parquet parts of at most ``part_rows`` rows under ``directory`` (one
    slice in memory as Arrow at a time), ``pieces`` one after another: (rows, their vector matrix or None),
    each taken from the iterable only when the one before is written. The spilled table holds the rows in that
    order: what validation and publish then read part by part."""

    workfs.mkdirs(directory)
    files: list[str] = []
    n = 0
    for rows, vectors in pieces:
        for s in range(0, len(rows), part_rows):
            files.append(workfs.join(directory, f"part-{len(files):05d}.parquet"))
            vecs = None if vectors is None else vectors[s : s + part_rows]
            write_whole(to_table(name, rows[s : s + part_rows], dim, version, vecs), files[-1])
        n += len(rows)
    return SpilledTable(files, schema_for(name, dim), n)


def relation_table(relations: Any) -> pa.Table:
    """Relations as an Arrow table of the ``relations`` schema: a table passes through, a spilled one is read
    whole, rows are converted (the ``version`` stamp is 0 until the run stamps the snapshot's). Relations
    outnumber every other row of a graph by far, so the pipeline holds them in this form, never as a dict per
    relation (and a build keeps layer 0's spilled: only a method that needs them all at once reads them here)."""
    if isinstance(relations, pa.Table):
        return relations
    if isinstance(relations, SpilledTable):
        return relations.read_all()
    return to_table("relations", relations, 0, 0)


def as_declared(table: pa.Table, schema: pa.Schema, columns: list[str] | None = None) -> pa.Table:
    """``table`` (a read of a stored table) with ``columns`` (all of ``schema``'s where None) in that order, a
    column declared since the table was written read as nulls: an index written by an earlier release reads, and
    its next write of the table carries the column."""
    wanted = columns or schema.names
    for c in wanted:
        if c not in table.column_names and c in schema.names:
            table = table.append_column(schema.field(c), pa.nulls(table.num_rows, schema.field(c).type))
    return table if table.column_names == wanted else table.select([c for c in wanted if c in table.column_names])


def declared_batches(
    batches: Iterable[pa.RecordBatch], schema: pa.Schema, columns: list[str]
) -> Iterator[pa.RecordBatch]:
    """Record batches of a stored table's ``columns`` (``as_declared``: a column declared since it was written, as
    nulls)."""
    for batch in batches:
        if batch.schema.names == columns:
            yield batch
        else:
            t = as_declared(pa.Table.from_batches([batch]), schema, columns)
            yield pa.RecordBatch.from_arrays([c.combine_chunks() for c in t.columns], names=t.column_names)


def reading_order(relation: Mapping[str, Any]) -> tuple[str, str]:
    """A relation row's ends in the order its label reads (``label_from`` first), else as stored. A relations table
    written before labels has neither column: its rows read as stored."""
    source, target = relation["source_id"], relation["target_id"]
    return (target, source) if relation.get("label") and relation.get("label_from") == target else (source, target)


def stamped(table: pa.Table, version: int) -> pa.Table:
    """``table`` with every row's ``version`` set to the snapshot's."""
    import numpy as np

    at = table.schema.get_field_index("version")
    return table.set_column(at, "version", pa.array(np.full(table.num_rows, version, dtype=np.int64)))


#: list columns of ids that rows repeat: ``plain_rows`` gives each distinct id one string
SHARED_IDS = ("source_chunk_ids", "entity_ids")


def plain_rows(table: pa.Table, shared: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """A table's rows as dicts, without the ``version`` stamp and the ``vector`` column (vectors travel as matrices).
    The ids in ``SHARED_IDS`` columns are one string per distinct id (an update's 120k layer-0 entities at 100k
    chunks name 3.1M chunk ids, 100k of them distinct: 366 MB as rows with a string each); ``shared``: those
    strings across calls (the batches of one table)."""
    import pyarrow.compute as pc

    table = table.drop([c for c in ("version", "vector") if c in table.column_names])
    lists = {
        c: table.column(c).combine_chunks()
        for c in SHARED_IDS
        if c in table.column_names and pa.types.is_list(table.schema.field(c).type)
    }
    lists = {c: col for c, col in lists.items() if not pc.list_flatten(col).null_count}  # (no id is ever null)
    for c in lists:  # a placeholder keeps the column's place among each row's keys
        table = table.set_column(table.column_names.index(c), c, pa.nulls(table.num_rows, table.schema.field(c).type))
    rows = table.to_pylist()
    for c, col in lists.items():
        encoded = pc.dictionary_encode(pc.list_flatten(col))
        words = encoded.dictionary.to_pylist()
        if shared is not None:
            words = [shared.setdefault(w, w) for w in words]
        flat = list(map(words.__getitem__, encoded.indices.to_numpy()))  # no Python int per id held at once
        ends = pc.list_value_length(col).fill_null(0).to_numpy(zero_copy_only=False).cumsum().tolist()
        valid = col.is_valid().to_pylist()
        for row, end, start, ok in zip(rows, ends, [0, *ends], valid):
            row[c] = flat[start:end] if ok else None
    return rows


def snapshot_note(snap: dict[str, Any] | None) -> dict[str, Any]:
    """A snapshot's note (method, drift, root locations, rollback), empty for snapshots written without one."""
    text = (snap or {}).get("note") or ""
    return json.loads(text) if text.startswith("{") else {}


def vector_matrix(table: pa.Table) -> Any:
    """The ``vector`` column of a table as an n x dim float32 matrix."""
    import numpy as np

    if table.num_rows == 0:
        return np.zeros((0, table.schema.field("vector").type.list_size), dtype=np.float32)
    col = table.column("vector").combine_chunks()
    return np.asarray(col.values.to_numpy(zero_copy_only=False), dtype=np.float32).reshape(table.num_rows, -1)


@dataclass
class TableDelta:
    """A table's change from the previous snapshot: the rows whose ``column`` is one of ``values`` go, the rows
    of ``add`` come (the kept rows are not rewritten: an update's cost follows its delta)."""

    column: str
    values: list[str]
    add: pa.Table


def applied(old: pa.Table, delta: TableDelta) -> pa.Table:
    """``delta`` applied to the whole table ``old`` (a column it lacks read as nulls, ``as_declared``)."""
    old = as_declared(old, delta.add.schema)
    gone = pc.is_in(old.column(delta.column), value_set=pa.array(delta.values, pa.string()))
    return pa.concat_tables([old.filter(pc.invert(gone)).cast(delta.add.schema), delta.add])


#: the columns of the relations a graph is made of: what an update holds of the relations it keeps (their
#: descriptions and chunk lists, most of their bytes, stay on disk; ``PipelineRun.previous_in`` reads the rows a
#: stage needs whole)
GRAPH_COLUMNS = ("id", "source_id", "target_id", "kind", "weight")

#: a Lance scan one batch ahead (``Catalog.batches``, ``PipelineRun.previous_in``): a scan holds one batch more than
#: the one read, however large the table (LanceDB's query stream reads far ahead: docs/benchmarks.md)
ONE_AHEAD = {"batch_readahead": 1, "fragment_readahead": 1}

#: what a community report reads of a relation (``tasks.methods.reports.RelationIndex``)
REPORT_COLUMNS = ["id", "source_id", "target_id", "kind", "description", "weight", "label", "label_from"]


#: rows per batch handed to LanceDB: its writer's memory grows with the batches it is given, so a table is written
#: in batches of this many rows whatever its size (docs/benchmarks.md)
WRITE_BATCH_ROWS = 8192


def plain_batches(data: pa.Table) -> pa.RecordBatchReader:
    """A table as LanceDB writes it: batches of at most ``WRITE_BATCH_ROWS`` rows, dictionary-encoded columns as
    plain strings."""
    plain = plain_schema(data.schema)
    batches = data.to_batches(max_chunksize=WRITE_BATCH_ROWS)
    return pa.RecordBatchReader.from_batches(
        plain, (b.cast(plain) for b in batches) if plain != data.schema else batches
    )


#: a change past this share of a table's rows is written as a whole new version instead (fewer fragments to read)
DELTA_MAX_SHARE = 0.5


def delta_against(
    old: pa.Table | Iterable[pa.RecordBatch], new: pa.Table, key: str = "id", max_share: float | None = DELTA_MAX_SHARE
) -> TableDelta | None:
    """``new`` as a change of ``old`` (both keyed by a unique ``key``; ``old`` a table or its batches, read one at
    a time: only a hash per key is kept): the rows that differ or went, by key, and the rows that differ or came.
    Rows are compared on every column but ``vector`` (a function of the text the other columns hold) and
    ``version`` (when the row was written: a row kept keeps it). None when a key repeats or the change is past
    ``max_share`` of the table (None: never): then ``new`` is written whole."""
    import polars as pl

    columns = [c for c in new.column_names if c not in ("vector", "version")]
    if key not in columns:
        return None
    schema = plain_schema(new.select(columns).schema)

    def hashed(b: pa.RecordBatch | pa.Table) -> tuple[pa.Table, pl.DataFrame] | None:
        """A batch's compared columns, and a hash of each row's key and of the row, as columns (a Python dict of
        2.3M relation ids held ~350 MB at an update's publish)."""
        if not set(columns) <= set(b.schema.names):
            return None
        try:
            t = pa.Table.from_batches([b]) if isinstance(b, pa.RecordBatch) else b
            t = t.select(columns).cast(schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
        frame = cast(pl.DataFrame, pl.from_arrow(t))
        return t, pl.DataFrame({"k": frame.get_column(key).hash(seed=0), "h": frame.hash_rows(seed=0)})

    mine = [pl.DataFrame({"k": pl.Series([], dtype=pl.UInt64), "h": pl.Series([], dtype=pl.UInt64)})]
    for b in new.to_batches(max_chunksize=WRITE_BATCH_ROWS):  # only the hashes kept, a batch at a time
        got = hashed(b)
        if got is None:
            return None
        mine.append(got[1])
    now = pl.concat(mine)
    del mine
    if now.get_column("k").n_unique() != now.height:
        return None
    # the previous rows a batch at a time: of each, the key hashes, the hashes of the rows this run left as they
    # were (a row's hash covers its key), and the keys of the others
    keys, kept, gone = [now.get_column("k").clear()], [now.get_column("h").clear()], []
    for b in old.to_batches(max_chunksize=WRITE_BATCH_ROWS) if isinstance(old, pa.Table) else old:
        got = hashed(b)
        if got is None:
            return None
        t, theirs = got
        same = theirs.get_column("h").is_in(now.get_column("h"))
        keys.append(theirs.get_column("k"))
        kept.append(theirs.get_column("h").filter(same))
        gone.extend(t.column(key).filter(pc.invert(same.to_arrow())).to_pylist())
    was, held = pl.concat(keys), pl.concat(kept)
    if was.n_unique() != len(was):
        return None
    if max_share is not None and now.height - len(held) + len(was) - len(held) > max_share * max(len(was), 1):
        return None
    changed = now.get_column("h").is_in(held).not_()
    return TableDelta(key, sorted(gone), new.filter(changed.to_arrow()))
