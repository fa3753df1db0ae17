"""``strata gc``: drop old snapshots and the table versions and files no kept snapshot needs (the caller holds
the writer lock)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from schemas.tables import LOG_TABLES, SNAPSHOT_TABLES, SNAPSHOTS
from tasks.errors import UsageError
from tasks.store import workfs


def lock_held(cat: Any) -> bool:
    """Whether gc runs under a real writer lock: not on object storage with ``storage.writer_lock = "off"``, where
    a writer may be committing fragments that no version references yet (those wait for Lance's week)."""
    return cat.root is not None or cat.storage.writer_lock != "off"


#: the share of a fragment's rows deleted past which ``strata gc`` writes it again. An update deletes the rows it
#: replaces (``Catalog._apply_delta``), which stay in their fragment for as long as a snapshot pins them; a
#: compaction writes a fragment's live rows again, and the old file goes once the snapshots before it are dropped.
#: Each fragment is judged alone: a night's appended fragment (the hub entities, the communities it touched) is
#: mostly replaced within a few nights and costs little to rewrite, the build's large fragment loses rows slowly
#: and is copied only once half of it is gone (each copy is held by the ``--keep`` snapshots after it)
COMPACT_SHARE = 0.5


def collect_garbage(cat: Any, keep: int, compact_share: float | None = COMPACT_SHARE) -> dict[str, Any]:
    """Keep the newest ``keep`` snapshots; drop the older ones and every table version older than the oldest
    version a kept snapshot pins (a pinned version is never removed; Lance keeps each table's latest). The log
    tables (``_snapshots``, ``runs``) lose their versions older than the oldest kept snapshot. Then the latest
    snapshot's fragments more than ``compact_share`` deleted are written again (``compact``; None: none is): what
    an update deleted leaves their files once the snapshots before the compaction are dropped. Under the writer
    lock, the work folders of killed runs (``<index>/_work``, the cache's ``spill``) are removed."""
    snaps = cat.snapshots()
    if keep < 1:
        raise UsageError("gc --keep must be at least 1: the latest snapshot is always kept")
    kept, dropped = snaps[-keep:], snaps[:-keep]
    removed: dict[str, int] = {}
    freed = 0

    def cleanup(name: str, since: datetime, unverified: bool = False) -> None:
        nonlocal freed
        since = since if since.tzinfo else since.replace(tzinfo=UTC)
        # a margin of a second: a version written just before the oldest kept one survives, never the reverse.
        # The age is Lance's, from when it cleans: measured now, not when gc began (each table takes a second
        # on object storage, which would move the cut past the pinned version)
        tbl = cat.db.open_table(name)
        stats = tbl.cleanup_old_versions(
            older_than=datetime.now(UTC) - since + timedelta(seconds=1), delete_unverified=unverified
        )
        removed[name] = int(stats.old_versions)
        freed += int(stats.bytes_removed)

    if dropped:
        cat.db.open_table(SNAPSHOTS).delete(f"version < {kept[0]['version']}")
    for name in SNAPSHOT_TABLES:
        pinned = [s["tables"][name] for s in kept if name in s["tables"]]
        if not pinned or not cat.has_table(name):
            continue
        stamps = {v["version"]: v["timestamp"] for v in cat.db.open_table(name).list_versions()}
        # under the writer lock no write is in progress, so the files no version references (the fragments of a
        # run killed before its commit) go too, not only those a week old (Lance's default)
        cleanup(name, stamps[min(pinned)], unverified=lock_held(cat))
    for name in (SNAPSHOTS, *LOG_TABLES):
        if cat.has_table(name):
            cleanup(name, kept[0]["created_at"])
    compacted = compact(cat, compact_share) if compact_share is not None else {}
    if lock_held(cat):  # no run is working: what a killed run left in its work folder goes too
        for work in (workfs.join(cat.uri, "_work"), cat.cache_dir / "spill"):
            workfs.remove_tree(work)
    return {
        "compacted": compacted,
        "kept": [s["version"] for s in kept],
        "dropped": [s["version"] for s in dropped],
        "versions_removed": removed,
        "bytes_removed": freed,
    }


def compact(cat: Any, share: float) -> dict[str, int]:
    """Write again the fragments of the latest snapshot's tables that are more than ``share`` deleted (Lance's
    ``compact_files`` over those fragments only, their live rows merged into new ones), and pin the compacted
    versions in the latest snapshot: the same rows, so its readers see nothing change (one reading the version
    before keeps it until a later gc drops it). The caller holds the writer lock. Returns the fragments each
    compacted table had removed."""
    import json

    latest = cat.snapshot()
    if latest is None or not lock_held(cat):
        return {}
    pins, removed = dict(latest["tables"]), {}
    for name in SNAPSHOT_TABLES:
        if name not in pins or not cat.has_table(name):
            continue
        tbl = cat.db.open_table(name)
        if tbl.version != pins[name]:  # a version after the pinned one (a run that never committed): not ours
            continue
        dataset = tbl.to_lance()
        fragments = dataset.get_fragments()
        keep = [f.fragment_id for f in fragments if f.num_deletions <= share * f.physical_rows]
        if len(keep) == len(fragments):
            continue
        metrics = dataset.optimize.compact_files(
            materialize_deletions=True, materialize_deletions_threshold=share, excluded_fragment_ids=keep
        )
        if not metrics.fragments_removed:
            continue
        tbl = cat.db.open_table(name)
        if tbl.count_rows() != dataset.checkout_version(pins[name]).count_rows():
            raise RuntimeError(f"compacting {name} changed its row count: snapshot v{latest['version']} kept as it was")
        pins[name], removed[name] = tbl.version, int(metrics.fragments_removed)
    if removed:
        cat.db.open_table(SNAPSHOTS).update(
            where=f"version = {latest['version']}", values={"tables": json.dumps(pins, sort_keys=True)}
        )
    return removed
