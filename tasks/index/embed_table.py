"""A table's rows embedded a slice at a time into that table's parts (embed, and a build's reports): the run
holds a step of rows, their texts and their vectors, never a whole part and never the table."""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pyarrow as pa

from schemas.tables import schema_for
from tasks.store import workfs
from tasks.store.rows import with_vectors
from tasks.store.spill import SpilledTable

#: texts embedded at a time across a table's parts: a multiple of the embedder's batch (256), so a text's batch,
#: and its vector to the last bit, does not depend on where the table was cut into parts or slices
EMBED_STEP = 256 * 8


def embed_table(
    ctx: Any,
    name: str,
    parts: Iterable[pa.Table],
    text: Callable[[Any], list[str]],
    progress=None,
    step: int = EMBED_STEP,
) -> Any:
    """Table ``name``'s rows, a part of ``parts`` (Arrow tables of its columns but vector and version) at a time,
    with the vectors of their ``text(rows)`` (``ctx.embed``) and the run's version, written as that table's parts
    (one file a part, a row group a slice) under the run's work folder: a ``SpilledTable``. The rows go ``step``
    (a multiple of the embedder's batch) at a time, so the run holds at most two steps of rows and one of vectors."""

    schema = schema_for(name, ctx.embedder.dim)
    folder = workfs.join(ctx.spill_dir, "tables", name)
    workfs.mkdirs(folder)
    files: list[str] = []
    writer: contextlib.ExitStack | None = None  # the part being written: slices are written in order
    sink: Any = None  # its Parquet writer
    waiting: deque[tuple[pa.Table, bool]] = deque()  # slices read whose vectors are not all in: (rows, last of part)
    texts: list[str] = []
    vectors = np.zeros((0, ctx.embedder.dim), np.float32)
    n = 0

    def write() -> None:
        nonlocal vectors, writer, sink
        while waiting and len(vectors) >= waiting[0][0].num_rows:
            rows, last = waiting.popleft()
            if writer is None:
                files.append(workfs.join(folder, f"embedded-{len(files):05d}.parquet"))
                writer = contextlib.ExitStack()
                sink = writer.enter_context(workfs.parquet_writer(files[-1], schema))
            sink.write_table(with_vectors(name, rows, vectors[: rows.num_rows], ctx.version))
            vectors = vectors[rows.num_rows :]
            if last:  # a part whole or not at all, as ``spill.write_whole``
                writer.close()
                writer = None

    def embed(count: int) -> None:
        nonlocal vectors
        vectors = np.concatenate([vectors, ctx.embed(texts[:count], progress)])
        del texts[:count]

    for part in parts:
        slices = [part.slice(at, step) for at in range(0, part.num_rows, step)] or [part]
        for i, rows in enumerate(slices):
            waiting.append((rows, i == len(slices) - 1))
            texts += text(rows)
            n += rows.num_rows
            while len(texts) >= step:
                embed(step)
            write()
        del part, slices, rows  # before the next part is read: the slices still waiting keep what they need
    embed(len(texts))
    write()
    return SpilledTable(files, schema, n)
