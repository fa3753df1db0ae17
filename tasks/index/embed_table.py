"""A table's rows embedded a part at a time into that table's parts (embed, and a build's reports): the run holds
one part and one step of texts, never the table."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

#: texts embedded at a time across a table's parts: a multiple of the embedder's batch (256), so a text's batch,
#: and its vector to the last bit, does not depend on where the table was cut into parts
EMBED_STEP = 256 * 32


def embed_table(ctx: Any, name: str, parts, text: Callable[[Any], list[str]], progress=None):
    """Table ``name``'s rows, a part of ``parts`` (Arrow tables of its columns but vector and version) at a time,
    with the vectors of their ``text(part)`` (``ctx.embed``) and the run's version, written as that table's parts
    under the run's work folder: a ``SpilledTable``. The texts are embedded ``EMBED_STEP`` at a time across the
    parts, so no more than a part and a step are in memory."""
    from schemas.tables import schema_for
    from tasks.store.rows import with_vectors
    from tasks.store.spill import SpilledTable, write_whole

    folder = Path(ctx.spill_dir) / "tables" / name
    folder.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []
    waiting: list[Any] = []  # parts read whose vectors are not all there yet
    texts: list[str] = []
    vectors = np.zeros((0, ctx.embedder.dim), np.float32)
    n = 0

    def embed(count: int) -> None:
        nonlocal vectors
        vectors = np.concatenate([vectors, ctx.embed(texts[:count], progress)])
        del texts[:count]

    def write() -> None:
        nonlocal vectors
        while waiting and len(vectors) >= waiting[0].num_rows:
            part = waiting.pop(0)
            files.append(folder / f"embedded-{len(files):05d}.parquet")
            write_whole(with_vectors(name, part, vectors[: part.num_rows], ctx.version), files[-1])
            vectors = vectors[part.num_rows :]

    for part in parts:
        waiting.append(part)
        texts += text(part)
        n += part.num_rows
        while len(texts) >= EMBED_STEP:
            embed(EMBED_STEP)
        write()
    embed(len(texts))
    write()
    return SpilledTable(files, schema_for(name, ctx.embedder.dim), n)
