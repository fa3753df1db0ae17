"""``strata gc``: drop old snapshots and the table versions and files no kept snapshot needs (the caller holds
the writer lock)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from schemas.tables import LOG_TABLES, SNAPSHOT_TABLES, SNAPSHOTS
from tasks.errors import UsageError


def lock_held(cat: Any) -> bool:
    """Whether gc runs under a real writer lock: not on object storage with ``storage.writer_lock = "off"``, where
    a writer may be committing fragments that no version references yet (those wait for Lance's week)."""
    return cat.root is not None or cat.storage.writer_lock != "off"


def collect_garbage(cat: Any, keep: int) -> dict[str, Any]:
    """Keep the newest ``keep`` snapshots; drop the older ones and every table version older than the oldest
    version a kept snapshot pins (a pinned version is never removed; Lance keeps each table's latest). The log
    tables (``_snapshots``, ``runs``) lose their versions older than the oldest kept snapshot. Nothing is
    compacted or rewritten: the index only shrinks."""
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
    return {
        "kept": [s["version"] for s in kept],
        "dropped": [s["version"] for s in dropped],
        "versions_removed": removed,
        "bytes_removed": freed,
    }
