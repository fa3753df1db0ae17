"""``strata gc``: drop old snapshots and the table versions and files no kept snapshot needs (the caller holds
the writer lock)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from schemas.tables import LOG_TABLES, SNAPSHOT_TABLES, SNAPSHOTS
from tasks.errors import UsageError
from tasks.store import workfs


def lock_held(cat: Any) -> bool:
    """Whether gc runs under a real writer lock: not on object storage with ``storage.writer_lock = "off"``, where
    a writer may be committing fragments that no version references yet (those wait for Lance's week)."""
    return cat.root is not None or cat.storage.writer_lock != "off"


#: the share of a table's stored rows that no kept snapshot reads past which ``strata gc`` writes the table's history
#: again. An update deletes the rows it replaces (``Catalog._apply_delta``); they stay in their files while a kept
#: snapshot reads them, and after that for as long as a live row shares their file. Written again, the table holds
#: exactly the rows its kept snapshots read (each once), so the index is its live rows plus the ``--keep``
#: snapshots' history. 30 MuSiQue nights at 1 % churn: night 30 at 1.30x night 1 (2.16x compacting fragments)
COMPACT_SHARE = 0.05


def collect_garbage(cat: Any, keep: int, compact_share: float | None = COMPACT_SHARE) -> dict[str, Any]:
    """Keep the newest ``keep`` snapshots; drop the older ones. Then the history of each table whose files hold
    more than ``compact_share`` rows no kept snapshot reads is written again (``compact``; None: never), and the
    table versions no kept snapshot pins go, with the files only those use: under a real writer lock every one
    (``_keep_only_pinned``), else those older than the oldest pinned one (a pinned version is never removed;
    Lance keeps each table's latest). The log tables (``_snapshots``, ``runs``) lose their versions older than
    the oldest kept snapshot. Under the writer lock, the work folders of killed runs (``<index>/_work``, the
    cache's ``spill``) are removed. ``bytes_removed`` is what the index's files lost (listed before and after:
    a rewrite's new files and the tags written are counted against what was deleted), ``files_removed`` the
    deleted files by kind."""
    if keep < 1:
        raise UsageError("gc --keep must be at least 1: the latest snapshot is always kept")
    before = index_files(cat.uri)
    done = _collect(cat, keep, compact_share)
    after = index_files(cat.uri)
    gone = [path for path in before if path not in after]
    done["files_removed"] = file_kinds(gone)
    done["bytes_before"], done["bytes_after"] = sum(before.values()), sum(after.values())
    done["bytes_removed"] = done["bytes_before"] - done["bytes_after"]
    return done


def _collect(cat: Any, keep: int, compact_share: float | None) -> dict[str, Any]:
    snaps = cat.snapshots()
    kept, dropped = snaps[-keep:], snaps[:-keep]
    removed: dict[str, int] = {}
    freed = 0

    def cleanup(name: str, since: datetime) -> None:
        nonlocal freed
        since = since if since.tzinfo else since.replace(tzinfo=UTC)
        # a margin of a second: a version written just before the oldest kept one survives, never the reverse.
        # The age is Lance's, from when it cleans: measured now, not when gc began (each table takes a second
        # on object storage, which would move the cut past the pinned version)
        tbl = cat.db.open_table(name)
        stats = tbl.cleanup_old_versions(older_than=datetime.now(UTC) - since + timedelta(seconds=1))
        removed[name] = int(stats.old_versions)
        freed += int(stats.bytes_removed)

    if dropped:
        cat.db.open_table(SNAPSHOTS).delete(f"version < {kept[0]['version']}")
    compacted = compact(cat, compact_share) if compact_share is not None else {}
    kept = cat.snapshots() if compacted else kept  # pinned to the rewritten versions
    for name in SNAPSHOT_TABLES:
        pinned = [s["tables"][name] for s in kept if name in s["tables"]]
        if not pinned or not cat.has_table(name):
            continue
        if lock_held(cat):  # no write is in progress: every version no kept snapshot pins goes
            freed += _keep_only_pinned(cat, name, set(pinned), removed)
            continue
        stamps = {v["version"]: v["timestamp"] for v in cat.db.open_table(name).list_versions()}
        cleanup(name, stamps[min(pinned)])
    for name in (SNAPSHOTS, *LOG_TABLES):
        if cat.has_table(name):
            cleanup(name, kept[0]["created_at"])
    if lock_held(cat):  # no run is working: what a killed run left in its work folder goes too
        for work in (workfs.join(cat.uri, "_work"), cat.cache_dir / "spill"):
            workfs.remove_tree(work)
    return {
        "compacted": compacted,
        "kept": [s["version"] for s in kept],
        "dropped": [s["version"] for s in dropped],
        "versions_removed": removed,
        "lance_bytes_removed": freed,
    }


def index_files(uri: str) -> dict[str, int]:
    """Every file under the index at ``uri`` (a folder or an object-store prefix), by its path under it, with its
    size in bytes: what gc freed is what these lost, measured, not a figure the table format reports."""
    fs, path = workfs.resolve(uri)
    fs = fs or pafs.LocalFileSystem()
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    base = len(path.rstrip("/")) + 1
    return {info.path[base:]: int(info.size or 0) for info in infos if info.type == pafs.FileType.File}


#: what a file of a Lance table is, by the folder it lies in (anything else: a run's work files)
FILE_KINDS = {
    "_versions": "manifests",
    "_transactions": "transaction files",
    "data": "data files",
    "_deletions": "deletion files",
    "_indices": "vector index files",
    "_refs": "tags",
}


def file_kinds(paths: list[str]) -> dict[str, int]:
    """How many of ``paths`` are of each kind (``FILE_KINDS``), in that order; work files last."""
    counts = dict.fromkeys([*FILE_KINDS.values(), "work files"], 0)
    for path in paths:
        parts = path.split("/")
        kind = next((FILE_KINDS[p] for p in reversed(parts[:-1]) if p in FILE_KINDS), "work files")
        counts[kind] += 1
    return {kind: n for kind, n in counts.items() if n}


def _keep_only_pinned(cat: Any, name: str, pinned: set[int], removed: dict[str, int]) -> int:
    """Remove every version of table ``name`` but those in ``pinned`` (tagged ``pin-N``, the tags of versions no
    longer pinned deleted) and its latest, with the files only they use, and the files no version references
    (the fragments of a run killed before its commit; the caller holds the writer lock, so none is being
    written). By tag, not by age: the versions a history rewrite made for snapshots gc later drops were written
    within milliseconds of those still pinned. Returns the bytes freed."""
    dataset = cat.db.open_table(name).to_lance()
    tags = {t: info["version"] for t, info in dataset.tags.list().items() if t.startswith("pin-")}
    for tag, version in tags.items():
        if version not in pinned:
            dataset.tags.delete(tag)
    for version in sorted(pinned - set(tags.values())):
        dataset.tags.create(f"pin-{version}", version)
    stats = dataset.cleanup_old_versions(
        older_than=timedelta(0), delete_unverified=True, error_if_tagged_old_versions=False
    )
    removed[name] = int(stats.old_versions)
    return int(stats.bytes_removed)


def compact(cat: Any, share: float) -> dict[str, int]:
    """Write again the history of each snapshot table whose files hold more than ``share`` (of the rows its kept
    snapshots read) rows that none reads: the rows of the kept snapshots' versions, each once, in new files
    grouped by the set of those versions that read them, and for each kept version a new one reading the same
    rows from them (the groups it reads; ``rewrite_history``). Then each kept snapshot is pinned to its new
    versions: the same rows, so its readers see nothing change (one reading a table in the middle of it gets a
    retryable ``SnapshotGone``), and the old files go in the cleanup that follows. A crash before the pins move
    leaves the new versions unpinned and the snapshots as they were. The caller holds the writer lock. Returns
    the rows each rewritten table dropped."""
    import json

    if not lock_held(cat):
        return {}
    snaps = cat.snapshots()
    pins = {s["version"]: dict(s["tables"]) for s in snaps}
    removed: dict[str, int] = {}
    for name in SNAPSHOT_TABLES:
        versions = sorted({t[name] for t in pins.values() if name in t})
        if not versions or not cat.has_table(name):
            continue
        done = rewrite_history(cat, name, versions, share)
        if done is None:
            continue
        moved, removed[name] = done
        for tables in pins.values():
            if name in tables:
                tables[name] = moved[tables[name]]
    if removed:
        log = cat.db.open_table(SNAPSHOTS)
        for s in snaps:
            if pins[s["version"]] != s["tables"]:
                log.update(
                    where=f"version = {s['version']}", values={"tables": json.dumps(pins[s["version"]], sort_keys=True)}
                )
    return removed


#: rows read at a time while a table's history is written again (16k entity rows with their vectors: ~32 MB)
TAKE_ROWS = 16_384
#: rows a file holds at most when a table's history is written again: Lance encodes a file's columns over all its
#: rows, and past ~100k rows its string columns take more room (the 100k index's mentions in files of 1M rows:
#: +17 %; of 131k rows: +1.3 %, against the build's files)
FILE_ROWS = 131_072


def _live_offsets(fragment: Any) -> Any:
    """The offsets of the rows a fragment reads in its table version."""
    return fragment.to_table(columns=[], with_row_address=True).column("_rowaddr").to_numpy() & 0xFFFFFFFF


def rewrite_history(cat: Any, name: str, versions: list[int], share: float) -> tuple[dict[int, int], int] | None:
    """Table ``name``'s ``versions`` (those kept snapshots pin) as new versions over new files holding once each
    row any of them reads, when the files they use hold more than ``share`` of that in rows none reads; else
    None. Returns (the new version of each, rows dropped). The rows are written in groups, one per set of
    versions reading them (a row is taken from a version that reads it: a deleted row cannot be), and committed
    as one version, the union; each new version is the union restored, less the groups it does not read. A
    vector index the newest version has is built on the union first, so that every new version keeps it."""
    import lance
    import numpy as np
    from lance.fragment import write_fragments

    from tasks.store.remote import storage_options
    from tasks.store.vectors import build_vector_index, has_vector_index

    if len(versions) > 63:  # a bit per version
        return None
    table = cat.db.open_table(name)
    dataset = table.to_lance()
    olds = [dataset.checkout_version(v) for v in versions]
    masks: dict[int, Any] = {}  # fragment id -> for each of its rows, the versions reading it (a bit each)
    for bit, old in enumerate(olds):
        for fragment in old.get_fragments():
            mask = masks.setdefault(fragment.fragment_id, np.zeros(fragment.physical_rows, np.uint64))
            mask[_live_offsets(fragment)] |= np.uint64(1 << bit)
    union = sum(int(np.count_nonzero(m)) for m in masks.values())
    dropped = sum(len(m) for m in masks.values()) - union
    if union == 0 or dropped <= share * union:
        return None
    uri, options = dataset.uri, None if cat.root is not None else storage_options(cat.uri, cat.storage)
    groups = sorted({int(g) for m in masks.values() for g in np.unique(m) if g}, reverse=True)  # the newest first
    written: dict[str, int] = {}  # data file -> its group
    fragments = []
    for group in groups:
        source = olds[(group & -group).bit_length() - 1]  # a version that reads the group's rows

        def batches(group: int = group, source: Any = source) -> Iterator[pa.RecordBatch]:
            for fid in sorted(masks):
                offsets = np.flatnonzero(masks[fid] == group).astype(np.uint64)
                for start in range(0, len(offsets), TAKE_ROWS):
                    addresses = (np.uint64(fid) << np.uint64(32)) | offsets[start : start + TAKE_ROWS]
                    yield from source._take_rows(addresses.tolist()).to_batches()

        reader = pa.RecordBatchReader.from_batches(dataset.schema, batches())
        for fragment in write_fragments(
            reader, uri, schema=dataset.schema, max_rows_per_file=FILE_ROWS, storage_options=options
        ):
            written.update((f.path, group) for f in fragment.data_files())
            fragments.append(fragment)
    union_version = lance.LanceDataset.commit(
        uri,
        lance.LanceOperation.Overwrite(dataset.schema, fragments),
        read_version=table.version,
        storage_options=options,
    ).version
    newest = cat.db.open_table(name)
    newest.checkout(versions[-1])
    if has_vector_index(newest):
        build_vector_index(latest := cat.db.open_table(name))
        union_version = latest.version
    moved: dict[int, int] = {}
    for bit, old in enumerate(versions):
        new = lance.dataset(uri, version=union_version, storage_options=options)
        new.restore()
        new = lance.dataset(uri, storage_options=options)
        unread = [f.fragment_id for f in new.get_fragments() if not written[f.data_files()[0].path] & (1 << bit)]
        if unread:
            new.delete(" OR ".join(f"(_rowaddr >= {f << 32} AND _rowaddr < {(f + 1) << 32})" for f in unread))
        new = lance.dataset(uri, storage_options=options)
        if new.count_rows() != olds[bit].count_rows():
            raise RuntimeError(f"rewriting {name}'s history changed v{old}'s rows: the snapshots kept as they were")
        moved[old] = new.version
    return moved, dropped
