"""Chunk: documents -> token windows with overlap and character offsets back into the document."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from schemas.config import ChunkingConfig
from schemas.tables import schema_for
from tasks.index.aliases import unit_of
from tasks.index.boilerplate import segments
from tasks.runtime.tokens import get_encoding
from tasks.store import workfs
from tasks.store.ids import make_id, quarantine_row
from tasks.store.spill import PartWriter, SpilledTable
from tasks.store.workfs import join

if TYPE_CHECKING:
    from schemas.tables import QuarantineRow

_DISAMBIGUATION = re.compile(r"\s*\([^()]*\)\s*$")


def explicit_title(doc: dict[str, Any]) -> str | None:
    """A document's own title (JSONL/Parquet ``title``, Markdown heading), without a trailing
    disambiguation such as "(band)"; None when the title is only the file or record name."""
    title = (doc.get("title") or "").strip()
    source = doc.get("source_id") or ""
    if not title or title in (source, PurePath(source).stem):
        return None
    return _DISAMBIGUATION.sub("", title).strip() or title


def _byte_to_char(text: str) -> np.ndarray:
    """Map every UTF-8 byte position (and the end) to the index of the character it belongs to."""
    lengths = np.fromiter((len(ch.encode("utf-8")) for ch in text), dtype=np.int64, count=len(text))
    mapping = np.repeat(np.arange(len(text), dtype=np.int64), lengths)
    return np.append(mapping, len(text))


def token_windows(n_tokens: int, size: int, overlap: int) -> list[tuple[int, int]]:
    """[start, end) token windows of ``size`` advancing by ``size - overlap``; the last one ends at ``n_tokens``."""
    if n_tokens == 0:
        return []
    step = size - overlap
    windows = []
    start = 0
    while True:
        end = min(start + size, n_tokens)
        windows.append((start, end))
        if end >= n_tokens:
            return windows
        start += step


def chunk_document(
    doc: dict[str, Any], cfg: ChunkingConfig, max_tokens: int | None = None
) -> tuple[list[dict[str, Any]], int]:
    """Chunks of one document (of its first ``max_tokens`` tokens) and its token count. ``text[start:end]`` of
    the document is the chunk text. The spans of ``doc["boilerplate"]`` (``tasks.index.boilerplate``) are left
    out: what lies between them is chunked a range at a time, and only it is counted."""

    text = doc["text"]
    chunks: list[dict[str, Any]] = []
    n_tokens = 0
    for a, b in segments(len(text), doc.get("boilerplate") or []):
        if not text[a:b].strip():
            continue
        left = None if max_tokens is None else max(0, max_tokens - n_tokens)
        windows, n = _windows(text, a, b, cfg, left)
        n_tokens += n
        for start, end, size in windows:
            chunks.append(
                {
                    "id": make_id("chunk", doc["id"], start, end),
                    "document_id": doc["id"],
                    "chunk_index": len(chunks),
                    "text": text[start:end],
                    "n_tokens": size,
                    "start": start,
                    "end": end,
                }
            )
    return chunks, n_tokens


def _windows(
    text: str, a: int, b: int, cfg: ChunkingConfig, max_tokens: int | None
) -> tuple[list[tuple[int, int, int]], int]:
    """The token windows of ``text[a:b]`` (of its first ``max_tokens`` tokens) as (start, end, tokens), offsets
    into ``text``, and its token count."""
    enc = get_encoding()
    part = text[a:b]
    tokens = enc.encode_ordinary(part)
    n_tokens = len(tokens)
    if max_tokens is not None and n_tokens > max_tokens:
        tokens = tokens[:max_tokens]
    if not tokens:
        return [], n_tokens
    # byte offset where each token starts; map to character offsets
    tok_bytes = enc.decode_tokens_bytes(tokens)
    byte_starts = np.concatenate([[0], np.cumsum([len(t) for t in tok_bytes])])
    b2c = _byte_to_char(part)
    out = []
    for t0, t1 in token_windows(len(tokens), cfg.size, cfg.overlap):
        start = int(b2c[byte_starts[t0]])
        end = int(b2c[byte_starts[t1]]) if t1 < len(tokens) or n_tokens > len(tokens) else len(part)
        out.append((a + start, a + end, t1 - t0))
    return out, n_tokens


def chunk_documents(
    documents: list[dict[str, Any]], cfg: ChunkingConfig, max_tokens: int | None = None
) -> tuple[list[dict[str, Any]], dict[str, int], list[QuarantineRow]]:
    """Chunks of every document, in document order, each document's token count (by id), and a quarantine
    row for every document cut at ``max_tokens`` (what was not indexed is said, never dropped silently)."""

    out: list[dict[str, Any]] = []
    tokens: dict[str, int] = {}
    cut: list[QuarantineRow] = []
    for doc in documents:
        chunks, tokens[doc["id"]] = chunk_document(doc, cfg, max_tokens)
        out.extend(chunks)
        if max_tokens is not None and tokens[doc["id"]] > max_tokens:
            cut.append(
                quarantine_row(
                    doc["uri"],
                    "chunk",
                    f"document has {tokens[doc['id']]} tokens: tokens {max_tokens} "
                    f"to {tokens[doc['id']]} are not indexed (corpus.max_document_tokens {max_tokens})",
                )
            )
    return out, tokens, cut


#: a chunk as the chunk stage writes it: the ``chunks`` columns but status, vector and version, which embed adds
#: (``tasks.store.rows.with_vectors``), and its document's own title, which extraction mentions
CHUNK_PART_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("document_id", pa.string()),
        ("chunk_index", pa.int64()),
        ("text", pa.string()),
        ("n_tokens", pa.int64()),
        ("start", pa.int64()),
        ("end", pa.int64()),
        ("title", pa.string()),
    ]
)


def chunk_parts(
    documents: SpilledTable,
    incoming: set[str] | None,
    cfg: ChunkingConfig,
    max_tokens: int | None,
    folder: str,
    part_rows: int,
    group_rows: Callable[[int], int],
    progress: Callable[[int], None] = lambda _n: None,
) -> tuple[SpilledTable, SpilledTable, pa.Table, list[QuarantineRow]]:
    """The chunk stage over the ingested documents' parts (``incoming``: the ids to chunk; None: all), a few
    thousand documents in memory at a time: (those documents with their token counts, as parts of the
    ``documents`` table; their chunks, as parts of ``part_rows`` rows with their document's own title
    (``CHUNK_PART_SCHEMA``) and row groups of ``group_rows(number of chunks)`` rows, one extraction task each;
    the chunks' ``PLACE`` columns; the documents cut at ``max_tokens``)."""

    docs = PartWriter(join(folder, "documents"), schema_for("documents", 0), part_rows)
    raw = PartWriter(join(folder, "raw"), CHUNK_PART_SCHEMA, part_rows)
    places: list[pa.Table] = []
    cut: list[QuarantineRow] = []
    for part in documents.parts():
        if incoming is not None:
            part = part.filter(pa.array([d in incoming for d in part.column("id").to_pylist()], pa.bool_()))
        for batch in part.to_batches(max_chunksize=STEP):
            rows = batch.to_pylist()
            chunks, tokens, batch_cut = chunk_documents(rows, cfg, max_tokens)
            cut += batch_cut
            titles = {d["id"]: explicit_title(d) for d in rows}
            table = pa.Table.from_pylist([dict(c, title=titles[c["document_id"]]) for c in chunks], CHUNK_PART_SCHEMA)
            raw.write(table)
            places.append(table.select(list(PLACE)))
            n_tokens = pa.array([tokens[d["id"]] for d in rows], pa.int64())
            batch = batch.set_column(batch.schema.get_field_index("n_tokens"), "n_tokens", n_tokens)
            docs.write(pa.Table.from_batches([batch]))
            progress(len(rows))
            del rows, chunks, table
    place = pa.concat_tables([pa.schema([CHUNK_PART_SCHEMA.field(k) for k in PLACE]).empty_table(), *places])
    return docs.close(), regroup(raw.close(), join(folder, "parts"), part_rows, group_rows), place, cut


#: documents chunked at a time (their rows, texts and chunks as Python objects)
STEP = 2048

#: what later stages read of where a chunk is in its document (the run keeps these columns of every new chunk)
PLACE = ("id", "document_id", "chunk_index")


def regroup(raw: SpilledTable, folder: str, part_rows: int, group_rows: Callable[[int], int]) -> SpilledTable:
    """The chunk parts ``raw`` (each document's chunks in order, together) written again (and removed) with row
    groups of about ``group_rows(all their rows)`` rows, one extraction task each: whole alias units each
    (``aliases.unit_of``: a document, or each ``UNIT_CHUNKS`` of a longer one), so that a unit's names resolve
    together whatever else a run holds; a group closes before the unit that would pass the size (a unit alone
    may pass it)."""

    size = group_rows(raw.num_rows)
    out = PartWriter(folder, CHUNK_PART_SCHEMA, part_rows)
    group: list[pa.Table] = []
    unit: list[pa.Table] = []
    held, current = 0, None

    def close_unit() -> None:
        nonlocal group, unit, held
        n = sum(t.num_rows for t in unit)
        if group and held + n > size:
            out.write_group(pa.concat_tables(group))
            group, held = [], 0
        group += unit
        held += n
        unit = []

    for f in raw.files:
        for batch in workfs.parquet_file(f).iter_batches(batch_size=STEP):
            table = pa.Table.from_batches([batch])
            units = [
                unit_of(d, i) for d, i in zip(*(table.column(c).to_pylist() for c in ("document_id", "chunk_index")))
            ]
            start = 0
            for i in range(1, len(units) + 1):
                if i == len(units) or units[i] != units[start]:
                    if units[start] != current:
                        close_unit()
                        current = units[start]
                    unit.append(table.slice(start, i - start))
                    start = i
        workfs.remove(f)
    close_unit()
    if group:
        out.write_group(pa.concat_tables(group))
    return out.close()
