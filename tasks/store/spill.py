"""A large table kept on disk while a run works on it: Parquet part files split by a hash of one column.

Each extraction task writes its ``mentions`` here itself (``write_split``: a file per task, a row group per
part), and a task per part gathers them (``gather``), so neither the run process nor any one worker holds all
mentions of a large corpus: merge reads one part at a time (every row of a key is in the same part),
validation and publish a part per task. Each part is read back in a canonical order (``order``), so the result
does not depend on the order tasks finish in.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tasks.store import workfs
from tasks.store.workfs import Loc


def key_hash(column) -> np.ndarray:
    """A stable hash of every value of a string column, hashing a dictionary column's distinct values once."""
    import polars as pl
    import pyarrow.compute as pc

    def hashed(values):
        return pl.from_arrow(values.cast(pa.string())).hash(seed=0).to_numpy()

    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    out = [
        hashed(c.dictionary)[pc.fill_null(c.indices, 0).to_numpy()] if pa.types.is_dictionary(c.type) else hashed(c)
        for c in chunks
    ]
    return np.concatenate(out) if out else np.zeros(0, dtype=np.uint64)


def plain_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with dictionary-encoded columns as their value type (what goes to disk)."""
    return pa.schema([pa.field(f.name, f.type.value_type) if pa.types.is_dictionary(f.type) else f for f in schema])


def write_whole(table: pa.Table, out: Loc, group_by: str | None = None, row_group_rows: int | None = None) -> None:
    """``table`` as the Parquet file ``out`` (a path or an object-store URI), whole or not at all
    (``workfs``): a task retried after its worker died writes the same file again. ``group_by``: an integer
    column the rows are sorted by, each of whose values gets a row group of its own (a task that reads one value
    skips the others); ``row_group_rows``: row groups of that many rows."""
    if group_by is None:
        workfs.write_table(table, out, row_group_size=row_group_rows)
        return
    at = table.column(group_by).to_numpy()
    with workfs.parquet_writer(out, table.schema) as writer:
        for v in np.unique(at):
            lo, hi = np.searchsorted(at, [v, v + 1])
            writer.write_table(table.slice(int(lo), int(hi - lo)))


class PartWriter:
    """A table written as Parquet parts of ``part_rows`` rows under ``folder`` while its rows come, a few thousand
    at a time (``write``), so that neither the rows nor the table are ever whole in memory; each part's row groups
    hold ``row_group_rows`` rows (the last one of a part fewer), as ``write_whole(part, row_group_rows=...)``
    would write them. A part appears whole when it is complete (``workfs``)."""

    def __init__(self, folder: Loc, schema: pa.Schema, part_rows: int, row_group_rows: int | None = None):
        self.folder, self.schema, self.part_rows = str(folder), schema, part_rows
        workfs.mkdirs(self.folder)
        self.group = min(row_group_rows or 8192, part_rows)
        self.files: list[str] = []
        self.num_rows = 0
        self._pending: list[pa.Table] = []  # rows not written yet
        self._held = self._in_part = 0
        self._writer: contextlib.ExitStack | None = None  # the open part's
        self._part: Any = None

    def write(self, table: pa.Table) -> None:
        self._pending.append(table.select(self.schema.names).cast(self.schema))
        self._held += table.num_rows
        while self._held and self._held >= min(self.group, self.part_rows - self._in_part):
            self._flush(min(self.group, self.part_rows - self._in_part))

    def _flush(self, n: int) -> None:
        table = pa.concat_tables(self._pending)
        self._pending, self._held = [table.slice(n)], table.num_rows - n
        if self._writer is None:
            self.files.append(workfs.join(self.folder, f"part-{len(self.files):05d}.parquet"))
            self._writer = contextlib.ExitStack()
            self._part = self._writer.enter_context(workfs.parquet_writer(self.files[-1], self.schema))
        self._part.write_table(table.slice(0, n))  # one row group
        self._in_part += n
        self.num_rows += n
        if self._in_part == self.part_rows:
            self._end_part()

    def write_group(self, table: pa.Table) -> None:
        """``table`` as one row group of its own, whatever ``row_group_rows`` says: in the open part if it fits in
        ``part_rows``, else at the start of the next (a group larger than ``part_rows`` is a part alone). Not to be
        mixed with ``write``."""
        assert not self._held, "write_group after write"
        if self._writer is not None and self._in_part + table.num_rows > self.part_rows:
            self._end_part()
        self._pending, self._held = [table.select(self.schema.names).cast(self.schema)], table.num_rows
        self._flush(table.num_rows)
        if self._writer is not None and self._in_part >= self.part_rows:
            self._end_part()

    def _end_part(self) -> None:
        assert self._writer is not None
        self._writer.close()
        self._writer, self._in_part = None, 0

    def close(self) -> SpilledTable:
        if self._held:
            self._flush(self._held)
        if self._writer is not None:
            self._end_part()
        return SpilledTable(self.files, self.schema, self.num_rows)


def read_part(
    path: Loc,
    order: Callable[[pa.Table], pa.Table] | None = None,
    order_by: tuple[str, ...] | None = None,
    columns: list[str] | None = None,
    where: tuple[str, str] | None = None,
    encoded: bool = False,
) -> pa.Table:
    """One part file (what a task reads of a spilled table): ``columns`` only (None: all), rows with ``where`` =
    (column, value) only, in the canonical ``order`` (a function of the columns ``order_by``; None: of all of
    them) when one is given; ``encoded``: string columns but ``id`` dictionary encoded (a sentence that
    describes five mentions is held once)."""
    src = workfs.source(path)  # opened once for the schema and the rows
    schema = pq.read_schema(src)
    names = columns or schema.names
    dictionary = [f.name for f in schema if encoded and f.name != "id" and pa.types.is_string(f.type)]
    # with what the order reads (every column when it does not say)
    read = names if order is None else None if order_by is None else list(dict.fromkeys([*names, *order_by]))
    table = pq.read_table(
        src, columns=read, read_dictionary=dictionary, filters=[(where[0], "=", where[1])] if where else None
    )
    return order(table).select(names) if order is not None else table


PART = "_part"  # the column of a unit's file that names each row's part


def write_split(table: pa.Table, by: str, n_parts: int, out: Loc) -> int:
    """One unit of work's rows as the Parquet file ``out``, each row tagged with its part, ``hash(row[by]) %
    n_parts``, a row group per part (what ``gather_part`` reads of it), whole or not at all. Returns the rows."""
    table = table.cast(plain_schema(table.schema))
    return write_parts(table, (key_hash(table.column(by)) % np.uint64(max(1, n_parts))).astype(np.int32), out)


def write_parts(table: pa.Table, part: np.ndarray, out: Loc) -> int:
    """``table`` as the Parquet file ``out``, row ``i`` tagged with its part ``part[i]``, a row group per part
    (what ``read_split`` reads of it), whole or not at all. Returns the rows."""
    rank = np.argsort(part, kind="stable")
    write_whole(table.take(pa.array(rank)).append_column(PART, pa.array(part[rank], pa.int32())), out, group_by=PART)
    return table.num_rows


def read_split(files: list[str], p: int, schema: pa.Schema, columns: list[str] | None = None) -> pa.Table:
    """Part ``p``'s rows of the units' files (``write_parts``), in unit order: ``columns`` only (None: all).
    ``schema``: the files' columns (as ``plain_schema`` writes them), which an empty split reads as: no unit, or
    no unit with a row in part ``p`` (a graph without relations), is a table of no rows, never an error."""
    read = None if columns is None else [*columns, PART]
    empty = plain_schema(schema).empty_table()
    tables = [workfs.read_table(f, columns=read, filters=[(PART, "=", p)]).drop([PART]) for f in files]
    return pa.concat_tables(tables) if tables else empty if columns is None else empty.select(columns)


def gather_part(job: tuple[int, str], files: list[str], schema: pa.Schema) -> int:
    """One part (a task): its row group from every unit's file, in unit order, as the part file ``job[1]``.
    Returns its rows (no file for none)."""
    p, out = job
    table = read_split(files, p, schema)
    if table.num_rows:
        write_whole(table, out)
    return table.num_rows


def gather(
    mapper,
    files: list[str],
    schema: pa.Schema,
    n_parts: int,
    directory: Loc,
    order: Callable[[pa.Table], pa.Table] | None = None,
    order_by: tuple[str, ...] | None = None,
) -> SpilledTable:
    """The units' files (``write_split``) as a ``SpilledTable`` of ``n_parts`` parts, every row of a key in one
    part, a task per part on ``mapper``; each part read back in the canonical ``order``, so the table does not
    depend on which unit finished first."""
    workfs.mkdirs(directory)
    jobs = [(p, workfs.join(directory, f"part-{p:05d}.parquet")) for p in range(max(1, n_parts))]
    rows = mapper(gather_part, jobs, files=files, schema=schema) if files else [0] * len(jobs)
    kept = [out for (_, out), n in zip(jobs, rows) if n]
    return SpilledTable(kept, plain_schema(schema), sum(rows), order, order_by)


class SpilledTable:
    """A table as Parquet part files; read part by part, each part in its canonical ``order`` (a function of the
    columns ``order_by``; None: of all of them)."""

    def __init__(
        self,
        files: list[str],
        schema: pa.Schema,
        num_rows: int,
        order: Callable[[pa.Table], pa.Table] | None = None,
        order_by: tuple[str, ...] | None = None,
    ):
        self.files = [str(f) for f in files]
        self.schema, self.num_rows, self.order, self.order_by = schema, num_rows, order, order_by

    def parts(
        self,
        columns: list[str] | None = None,
        where: tuple[str, str] | None = None,
        ordered: bool = True,
        encoded: bool = False,
    ) -> Iterator[pa.Table]:
        """Each part as one table: ``columns`` only, rows with ``where`` = (column, value) only, in the canonical
        order unless not ``ordered``; ``encoded``: string columns but ``id`` dictionary encoded (a sentence that
        describes five mentions is held once)."""
        for f in self.files:
            yield read_part(f, self.order if ordered else None, self.order_by, columns, where, encoded)
            pa.default_memory_pool().release_unused()  # a part's buffers, before the next part is read

    def reader(self, batch_rows: int = 65_536) -> pa.RecordBatchReader:
        """Every row, part after part, as a stream (what publish writes)."""

        def batches():
            for part in self.parts():
                yield from part.to_batches(max_chunksize=batch_rows)

        return pa.RecordBatchReader.from_batches(self.schema, batches())

    def column(self, name: str) -> pa.ChunkedArray:
        return pa.chunked_array(
            [c for t in self.parts([name]) for c in t.column(name).chunks], self.schema.field(name).type
        )

    def read_all(self) -> pa.Table:
        return pa.concat_tables([self.schema.empty_table(), *self.parts()])

    @property
    def column_names(self) -> list[str]:
        return self.schema.names
