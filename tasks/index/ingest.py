"""Ingest: a corpus path -> ``documents`` rows and ``quarantine`` rows.

Reads folders of .txt/.md files, JSONL (``id,title,text``) and Parquet with the same
columns. Hostile input (empty, binary, invalid UTF-8, too large, unreadable, malformed
records, unsupported types) becomes a quarantine row with a reason; nothing raises.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from schemas.config import CorpusConfig
from schemas.tables import schema_for
from tasks.index import boilerplate
from tasks.index.chunk import STEP
from tasks.store import workfs
from tasks.store.ids import content_hash, make_id, quarantine_row
from tasks.store.rows import to_table
from tasks.store.spill import PartWriter

if TYPE_CHECKING:
    from schemas.tables import QuarantineRow

_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


@dataclass
class IngestResult:
    documents: list[dict[str, Any]] = field(default_factory=list)
    quarantine: list[QuarantineRow] = field(default_factory=list)
    files_seen: int = 0
    ignored: int = 0  # files a ``.strataignore`` names


#: a corpus folder's own ignore file: gitignore syntax, paths relative to the folder
IGNORE_FILE = ".strataignore"


def ignored_by(root: Path):
    """Whether a path inside ``root`` is named by ``root/.strataignore`` (gitignore syntax; none: nothing is)."""
    import pathspec

    path = root / IGNORE_FILE
    if not path.is_file():
        return lambda rel: False
    spec = pathspec.PathSpec.from_lines("gitwildmatch", path.read_text(encoding="utf-8").splitlines())
    return lambda rel: spec.match_file(rel)


def _decode(raw: bytes) -> tuple[str | None, str | None]:
    """(text, None) or (None, reason)."""
    if b"\x00" in raw[:65536]:
        return None, "binary content (NUL bytes)"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, f"invalid UTF-8 at byte {exc.start}"
    text = text.lstrip("\ufeff")
    return (None, reason) if (reason := _control(text[:65536])) else (text, None)


def _control(sample: str) -> str | None:
    control = sum(1 for ch in sample if ord(ch) < 32 and ch not in "\n\r\t\f")
    if sample and control / len(sample) > 0.05:
        return f"binary content ({control} control characters in the first {len(sample)})"
    return None


def _screen(path: Path, block: int = 1 << 20) -> str | None:
    """What ``_decode`` would say of the file at ``path`` (None: readable text), read a block at a time."""
    import codecs

    decoder, pos = codecs.getincrementaldecoder("utf-8")(), 0
    with path.open("rb") as f:
        head = f.read(65536)
        if b"\x00" in head:
            return "binary content (NUL bytes)"
        f.seek(0)
        sample = ""
        while True:
            raw = f.read(block)
            start = pos - len(decoder.getstate()[0])  # where the bytes the decoder holds begin
            try:
                text = decoder.decode(raw, final=not raw)
            except UnicodeDecodeError as exc:
                return f"invalid UTF-8 at byte {start + exc.start}"
            if len(sample) < 65536 + 1:
                sample = (sample + text).lstrip("\ufeff")[: 65536 + 1]
            if not raw:
                return _control(sample[:65536])
            pos += len(raw)


def _check_text(text: Any, cfg: CorpusConfig) -> str | None:
    if not isinstance(text, str):
        return f"text is {type(text).__name__}, not a string"
    if "\x00" in text:
        return "binary content (NUL characters)"
    if len(text.strip()) < cfg.min_chars:
        return "empty text"
    if len(text.encode("utf-8")) > cfg.max_file_bytes:
        return f"text larger than corpus.max_file_bytes ({cfg.max_file_bytes})"
    return not_prose(text, cfg)


_WORD = re.compile(r"[^\W\d_][^\W\d_'’\-]*[.,;:!?\"”’)]*")
_SAMPLE_WINDOWS, _WINDOW_CHARS = 4, 16_384


def prose_measures(text: str) -> tuple[float, float, float]:
    """(word share, mean token length, compression ratio) of a sample of ``text``: four 16 KB windows spread
    over it, so a blob anywhere in a large file counts and a 40 MB file costs milliseconds."""
    import zlib

    if len(text) <= _SAMPLE_WINDOWS * _WINDOW_CHARS:
        sample = text
    else:  # windows that do not overlap (an overlap would look compressible)
        step = (len(text) - _WINDOW_CHARS) // (_SAMPLE_WINDOWS - 1)
        sample = "\n".join(text[k * step : k * step + _WINDOW_CHARS] for k in range(_SAMPLE_WINDOWS))
    tokens = sample.split()
    if not tokens:
        return 0.0, 0.0, 1.0
    words = sum(1 for t in tokens if _WORD.fullmatch(t))
    raw = sample.encode("utf-8")
    return words / len(tokens), sum(map(len, tokens)) / len(tokens), len(zlib.compress(raw)) / len(raw)


def not_prose(text: str, cfg: CorpusConfig) -> str | None:
    """Why ``text`` is not prose (with the measured values and the settings they failed), or None."""
    if not cfg.screen_prose:
        return None
    share, mean, ratio = prose_measures(text)
    failed = []
    if share < cfg.min_word_share:
        failed.append(f"{share:.0%} of tokens are words (corpus.min_word_share {cfg.min_word_share:.0%})")
    if mean > cfg.max_mean_word_chars:
        failed.append(f"mean token length {mean:.1f} chars (corpus.max_mean_word_chars {cfg.max_mean_word_chars:g})")
    if ratio < cfg.min_compression_ratio:
        failed.append(
            f"compresses to {ratio:.2f} of its size (corpus.min_compression_ratio {cfg.min_compression_ratio:g})"
        )
    return ("not prose: " + "; ".join(failed)) if failed else None


def _title_of(text: str, fallback: str) -> str:
    m = _HEADING.search(text[:5000])
    return m.group(1).strip() if m else fallback


def _document(uri: str, root: str, source_id: str, title: str, text: str, now: datetime) -> dict[str, Any]:
    digest = content_hash(text)
    return {
        "id": document_id(root, source_id, digest),
        "uri": uri,
        "root": root,
        "source_id": source_id,
        "title": title,
        "text": text,
        "content_hash": digest,
        "n_tokens": 0,
        "ingested_at": now,
    }


def _records_from_jsonl(path: Path, errors: list[tuple[str, str]]) -> Iterator[dict[str, Any]]:
    """The JSON objects of a JSONL file (screened by ``_screen``), a line at a time (a line's error to ``errors``)."""
    with path.open(encoding="utf-8-sig") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                errors.append((f"{path}#L{lineno}", f"line {lineno}: invalid JSON ({exc.msg})"))
                continue
            if not isinstance(rec, dict):
                errors.append((f"{path}#L{lineno}", f"line {lineno}: not a JSON object"))
                continue
            rec.setdefault("_line", lineno)
            yield rec


def _records_from_parquet(path: Path) -> Iterator[dict[str, Any]]:
    import pyarrow.parquet as pq

    file = pq.ParquetFile(path)
    names = file.schema_arrow.names
    if "text" not in names:
        raise ValueError(f"Parquet file has no 'text' column (columns: {', '.join(names)})")
    line = 0
    for batch in file.iter_batches(batch_size=1024, columns=[c for c in ("id", "title", "text") if c in names]):
        for row in batch.to_pylist():
            line += 1
            row["_line"] = line
            yield row


def _ingest_records(path: Path, root: str, records, cfg: CorpusConfig, out: IngestResult, now: datetime):
    """The documents of a file's records, one at a time; a bad record's quarantine row to ``out``."""
    seen: set[str] = set()
    for rec in records:
        line = rec.get("_line")
        rid = rec.get("id")
        source_id = str(rid) if rid not in (None, "") else f"{path.name}:{line}"
        item = f"{path}#{source_id}"
        reason = _check_text(rec.get("text"), cfg)
        if reason is None and source_id in seen:
            reason = f"duplicate id {source_id!r} in {path.name}"
        if reason:
            out.quarantine.append(quarantine_row(item, "ingest", reason))
            continue
        seen.add(source_id)
        title = rec.get("title")
        title = str(title) if title not in (None, "") else source_id
        yield _document(item, root, source_id, title, rec["text"], now)


def corpus_files(folder: Path) -> Iterator[Path]:
    """The files of a corpus folder, recursively, hidden files and folders left out (``.strataignore`` not applied)."""
    return (
        p for p in folder.rglob("*") if p.is_file() and not any(s.startswith(".") for s in p.relative_to(folder).parts)
    )


#: the parts ingest writes: the ``documents`` columns and each document's boilerplate spans (``boilerplate``)
INGESTED_SCHEMA = schema_for("documents", 0).append(pa.field("boilerplate", pa.list_(pa.int64())))


def spill_documents(
    documents: Iterator[dict[str, Any]], version: int, folder: str, part_rows: int, boilerplate_min_documents: int = 0
):
    """``documents`` (``iter_documents``) written as parts (``INGESTED_SCHEMA``) while they are read, a few
    thousand at a time, then, if some paragraphs are boilerplate (found in ``boilerplate_min_documents``
    documents or more), written again with the spans left out and the ids they give (``boilerplate``).
    Returns (the parts, a quarantine row per boilerplate paragraph)."""
    import itertools

    out = PartWriter(workfs.join(folder, "read"), INGESTED_SCHEMA, part_rows)
    keys = []
    while batch := list(itertools.islice(documents, STEP)):
        if boilerplate_min_documents:
            keys += [np.unique([k for *_, k in boilerplate.paragraphs(d["text"])]).astype(np.int64) for d in batch]
        none = pa.array([[]] * len(batch), pa.list_(pa.int64()))
        out.write(to_table("documents", batch, 0, version).append_column("boilerplate", none))
    read = out.close()
    found = boilerplate.repeated(keys, boilerplate_min_documents)
    if not found:
        return read, []
    marked = PartWriter(workfs.join(folder, "marked"), INGESTED_SCHEMA, part_rows)
    first: dict[int, tuple[str, str]] = {}  # a boilerplate paragraph's first document left without it, its text
    for f, part in zip(read.files, read.parts()):
        for batch in part.to_batches(max_chunksize=STEP):
            rows = batch.to_pylist()
            for d in rows:
                d["boilerplate"] = boilerplate.spans(d["text"], found)
                if d["boilerplate"]:
                    d["id"] = document_id(d["root"], d["source_id"], d["content_hash"], d["boilerplate"])
                    for s, e, k in boilerplate.paragraphs(d["text"]):
                        first.setdefault(k, (d["uri"], d["text"][s:e]))
            marked.write(pa.Table.from_pylist(rows, INGESTED_SCHEMA))
        workfs.remove(f)
    quarantine = [
        quarantine_row(
            f"{uri}#boilerplate",
            "ingest",
            f"boilerplate: a paragraph found in {found[k]} documents (corpus.boilerplate_min_documents "
            f"{boilerplate_min_documents}), left out of the index: {text[:80]!r}",
        )
        for k, (uri, text) in sorted(first.items(), key=lambda kv: kv[1][0])
        if k in found
    ]
    return marked.close(), quarantine


def document_id(root: str, source_id: str, digest: str, left_out: list[int] | None = None) -> str:
    """A document's id: its root, its path in the root (or record id), its content hash and the spans of it that
    are boilerplate (none: the id of before boilerplate was detected)."""
    return make_id("doc", root, source_id, digest, *(left_out or []))


def ingest_corpus(
    corpus: str | Path, cfg: CorpusConfig, now: datetime | None = None, root: str | None = None
) -> IngestResult:
    """Every document under ``corpus`` in a list (``iter_documents``), with the quarantine rows."""
    out = IngestResult()
    out.documents = list(iter_documents(corpus, cfg, out, now, root))
    return out


def iter_documents(
    corpus: str | Path, cfg: CorpusConfig, out: IngestResult, now: datetime | None = None, root: str | None = None
) -> Iterator[dict[str, Any]]:
    """Read every document under ``corpus`` (a folder or one file), one at a time, so that a run can write them
    to parts as they come (``out`` gets the quarantine rows and the file counts; its ``documents`` stay empty).
    Never raises for bad content. Hidden files
    and, in a folder, what its ``.strataignore`` names (gitignore syntax) are not read.

    ``root`` is the corpus root the documents belong to (default: the folder's absolute path); a document's
    id hashes it with the document's path inside the root (or record id) and its content hash, so the same
    file under two roots is two documents."""
    now = now or datetime.now(UTC)
    root_path = Path(corpus).expanduser().resolve()
    if not root_path.exists():
        raise FileNotFoundError(f"corpus not found: {corpus}")
    root = root or str(root_path)
    if root_path.is_file():
        files = [root_path]
        base = root_path.parent
    else:
        files = sorted(corpus_files(root_path))
        base = root_path
    ignore = ignored_by(base) if root_path.is_dir() else (lambda rel: False)
    kept = [p for p in files if not ignore(p.relative_to(base).as_posix())]
    out.files_seen, out.ignored = len(kept), len(files) - len(kept)
    files = kept
    allowed = {e.lower() for e in cfg.extensions}
    for path in files:
        rel = str(path.relative_to(base))
        suffix = path.suffix.lower()
        try:
            size = path.stat().st_size
            if suffix not in allowed:
                out.quarantine.append(
                    quarantine_row(str(path), "ingest", f"unsupported file type {suffix or '(none)'}")
                )
                continue
            if size > cfg.max_file_bytes:
                out.quarantine.append(
                    quarantine_row(
                        str(path),
                        "ingest",
                        f"file too large ({size} bytes > corpus.max_file_bytes {cfg.max_file_bytes})",
                    )
                )
                continue
            if size == 0:
                out.quarantine.append(quarantine_row(str(path), "ingest", "empty file"))
                continue
            if suffix == ".parquet":
                yield from _ingest_records(path, root, _records_from_parquet(path), cfg, out, now)
                continue
            if suffix == ".jsonl":  # read a line at a time: a JSONL file may hold a whole corpus
                if reason := _screen(path):
                    out.quarantine.append(quarantine_row(str(path), "ingest", reason))
                    continue
                errors: list[tuple[str, str]] = []
                bad = len(out.quarantine)  # a line's error before the file's record rows, as when read whole
                yield from _ingest_records(path, root, _records_from_jsonl(path, errors), cfg, out, now)
                out.quarantine[bad:bad] = [quarantine_row(item, "ingest", err) for item, err in errors]
                continue
            text, reason = _decode(path.read_bytes())
            if reason:
                out.quarantine.append(quarantine_row(str(path), "ingest", reason))
                continue
            assert text is not None
            reason = _check_text(text, cfg)
            if reason:
                out.quarantine.append(quarantine_row(str(path), "ingest", reason))
                continue
            yield _document(str(path), root, rel, _title_of(text, path.stem), text, now)
        except Exception as exc:  # unreadable file, broken parquet, ...: quarantine, never crash
            out.quarantine.append(quarantine_row(str(path), "ingest", f"{type(exc).__name__}: {exc}"))
