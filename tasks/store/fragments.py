"""A spilled table published without passing through the run process: each part written as Lance fragments by a
task (on the run's Dask workers, or in this process), then one commit makes them the table's new version.

The commit (``Overwrite`` of every fragment, in part order) is the only step that changes the table: a run killed
before it leaves the table's published versions as they were, and the fragment files it wrote unreferenced
(``strata gc`` removes them). The rows, and their order, are those of ``SpilledTable.reader``: each part in its
canonical order, the parts in file order.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from tasks.runtime.parallel import LocalMapper
from tasks.store.remote import default_storage, is_local, storage_options
from tasks.store.rows import WRITE_BATCH_ROWS
from tasks.store.spill import SpilledTable, read_part


def write_spilled(
    mapper: Any, data: SpilledTable, table_uri: str, index_uri: str, options: dict[str, str] | None, read_version=None
) -> int:
    """``data`` as the new version of the Lance table at ``table_uri`` (created if missing); its version.
    ``options``: how this process reaches the store (its tasks on other processes use their own)."""
    import lance

    parts = [(str(f), data.order) for f in data.files]
    here = options if isinstance(mapper, LocalMapper) else None  # credentials never travel in a task
    written = mapper(write_part, parts, table_uri=table_uri, schema=data.schema, index_uri=index_uri, options=here)
    fragments = [f for part in written for f in part]
    dataset = lance.LanceDataset.commit(
        table_uri,
        lance.LanceOperation.Overwrite(data.schema, fragments),
        read_version=read_version,
        storage_options=options,
    )
    return dataset.version


def write_part(
    part: tuple[str, Any], table_uri: str, schema: pa.Schema, index_uri: str, options: dict[str, str] | None = None
) -> list[Any]:
    """One spilled part, in its canonical order, as Lance fragment files of the table (a task); their metadata.
    A task retried after its worker died writes new files; those of the lost attempt stay unreferenced."""
    from lance.fragment import write_fragments

    path, order = part
    table = read_part(path, order).cast(schema)
    reader = pa.RecordBatchReader.from_batches(schema, table.to_batches(max_chunksize=WRITE_BATCH_ROWS))
    reach = options if options is not None else _options(index_uri)
    return write_fragments(reader, table_uri, schema=schema, storage_options=reach)


def _options(index_uri: str) -> dict[str, str] | None:
    """How this process reaches the index: none for a folder; for object storage, its own environment's settings
    (a worker's credentials are its own: they never travel in a task)."""

    return None if is_local(index_uri) else storage_options(index_uri, default_storage())
