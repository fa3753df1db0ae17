"""A large table kept on disk while a run works on it: Parquet part files split by a hash of one column.

Extraction writes the run's ``mentions`` here batch by batch as they come back (from Dask workers, in any
order), so no stage holds all mentions of a large corpus in memory: merge reads one part at a time (every
row of a key is in the same part), validation reads slices, publish streams the parts into LanceDB. Each
part is read back in a canonical order (``order``), so the result does not depend on arrival order.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

#: rows a part holds in memory before they are appended to its file
FLUSH_ROWS = 20_000


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


def write_whole(table: pa.Table, out: str | Path) -> None:
    """``table`` as the Parquet file ``out``, whole or not at all (written under a temporary name, then renamed):
    a task retried after its worker died writes the same file again."""
    import os

    tmp = f"{out}.{os.getpid()}.tmp"
    pq.write_table(table, tmp)
    os.replace(tmp, out)


def read_part(
    path: str | Path,
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
    schema = pq.read_schema(path)
    names = columns or schema.names
    dictionary = [f.name for f in schema if encoded and f.name != "id" and pa.types.is_string(f.type)]
    # with what the order reads (every column when it does not say)
    read = names if order is None else None if order_by is None else list(dict.fromkeys([*names, *order_by]))
    table = pq.read_table(
        path, columns=read, read_dictionary=dictionary, filters=[(where[0], "=", where[1])] if where else None
    )
    return order(table).select(names) if order is not None else table


class SpillWriter:
    """Appends tables to ``n_parts`` Parquet files under ``directory``, a row going to part
    ``hash(row[by]) % n_parts``; ``close()`` gives the ``SpilledTable``."""

    def __init__(
        self,
        directory: Path,
        schema: pa.Schema,
        by: str,
        n_parts: int,
        order: Callable[[pa.Table], pa.Table] | None = None,
        order_by: tuple[str, ...] | None = None,
    ):
        self.directory, self.schema, self.by, self.order = Path(directory), plain_schema(schema), by, order
        self.order_by = order_by
        self.n_parts = max(1, n_parts)
        shutil.rmtree(self.directory, ignore_errors=True)
        self.directory.mkdir(parents=True)
        self._buffers: list[list[pa.Table]] = [[] for _ in range(self.n_parts)]
        self._buffered = [0] * self.n_parts
        self._writers: dict[int, pq.ParquetWriter] = {}
        self.num_rows = 0

    def add(self, table: pa.Table) -> None:
        if not table.num_rows:
            return
        table = table.cast(self.schema)
        self.num_rows += table.num_rows
        part = key_hash(table.column(self.by)) % np.uint64(self.n_parts)
        rank = np.argsort(part, kind="stable")
        table, part = table.take(pa.array(rank)), part[rank]
        bounds = np.searchsorted(part, np.arange(self.n_parts + 1, dtype=np.uint64))
        for p in range(self.n_parts):
            if bounds[p + 1] > bounds[p]:
                self._buffers[p].append(table.slice(int(bounds[p]), int(bounds[p + 1] - bounds[p])))
                self._buffered[p] += int(bounds[p + 1] - bounds[p])
                if self._buffered[p] >= FLUSH_ROWS:
                    self._flush(p)

    def _flush(self, p: int) -> None:
        if not self._buffers[p]:
            return
        if p not in self._writers:
            self._writers[p] = pq.ParquetWriter(
                self.directory / f"part-{p:05d}.parquet", self.schema, compression="zstd"
            )
        self._writers[p].write_table(pa.concat_tables(self._buffers[p]))
        self._buffers[p], self._buffered[p] = [], 0

    def close(self) -> SpilledTable:
        for p in range(self.n_parts):
            self._flush(p)
        for w in self._writers.values():
            w.close()
        files = [self.directory / f"part-{p:05d}.parquet" for p in sorted(self._writers)]
        return SpilledTable(files, self.schema, self.num_rows, self.order, self.order_by)


class SpilledTable:
    """A table as Parquet part files; read part by part, each part in its canonical ``order`` (a function of the
    columns ``order_by``; None: of all of them)."""

    def __init__(
        self,
        files: list[Path],
        schema: pa.Schema,
        num_rows: int,
        order: Callable[[pa.Table], pa.Table] | None = None,
        order_by: tuple[str, ...] | None = None,
    ):
        self.files, self.schema, self.num_rows, self.order, self.order_by = files, schema, num_rows, order, order_by

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
