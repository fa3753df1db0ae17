"""The one catalog of tables: LanceDB at the index URI, read and written through snapshots.

Publishing writes every changed table (each write is a new Lance version of that table),
then appends one row to ``_snapshots`` that pins the version of every table. That append is
the single atomic commit point: readers resolve the newest ``_snapshots`` row and check
each table out at its pinned version, so a failed or killed run (which never reaches the
append) leaves the previous snapshot exactly as it was. ``runs`` is an append-only log,
readable whether or not a run published.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from schemas.tables import LOG_TABLES, SNAPSHOT_SCHEMA, SNAPSHOT_TABLES, SNAPSHOTS, schema_for
from tasks.errors import DiskFull, IndexDamaged, IndexError_, IndexNotFound, StoreUnavailable, UsageError
from tasks.runtime.parallel import LocalMapper
from tasks.store.fragments import write_spilled
from tasks.store.gc import collect_garbage
from tasks.store.leases import Lease
from tasks.store.locks import writer_lock
from tasks.store.remote import (
    STORE_ATTEMPTS,
    _disk_full,
    _transient,
    default_storage,
    is_local,
    s3_client,
    storage_options,
)
from tasks.store.rows import (
    ONE_AHEAD,
    WRITE_BATCH_ROWS,
    TableDelta,
    applied,
    as_declared,
    declared_batches,
    delta_against,
    plain_batches,
    rows_to_table,
    snapshot_note,
)
from tasks.store.spill import SpilledTable
from tasks.store.vectors import build_vector_index

if TYPE_CHECKING:
    from schemas.config import StorageConfig


class Catalog:
    def __init__(self, uri: str | Path, create: bool = True, storage: StorageConfig | None = None):
        """The catalog at ``uri``; a local folder is created if missing unless ``create`` is false (then a missing
        folder, or a file, is a clear error instead): see ``open_index`` for commands that only read.

        ``storage``: how a remote index is reached, and where its caches go (default: the ``storage`` settings of
        ``$STRATA_CONFIG`` and the environment, read only for a remote index)."""
        self.uri = str(uri)
        self._storage = storage
        self._lease: Lease | None = None
        if is_local(self.uri):
            self.root: Path | None = Path(self.uri.removeprefix("file://")).expanduser().resolve()
            if self.root.exists() and not self.root.is_dir():
                raise UsageError(f"--index {self.uri} is a file, not an index folder")
            if create:
                self.root.mkdir(parents=True, exist_ok=True)
            elif not (self.root / "lance").is_dir():
                what = "no such folder" if not self.root.exists() else "the folder holds no Strata index"
                raise IndexNotFound(
                    f"no index at {self.uri} ({what}): check --index, or build one with "
                    f"`strata index CORPUS --index {self.uri}`"
                )
            self._db_uri = str(self.root / "lance")
        else:
            self.root = None
            self._db_uri = self.uri.rstrip("/") + "/lance"

    @functools.cached_property
    def db(self):
        """The LanceDB connection, opened on first use (importing LanceDB takes about a second: a query answered
        from a cached view never needs it)."""
        import lancedb

        if self.root is not None:
            return lancedb.connect(self._db_uri)
        return lancedb.connect(self._db_uri, storage_options=storage_options(self.uri, self.storage))

    @property
    def storage(self) -> StorageConfig:
        if self._storage is None:
            self._storage = default_storage()
        return self._storage

    # ------------------------------------------------------------------ locations
    @property
    def cache_dir(self) -> Path:
        """Local caches (embeddings, LLM answers, query views, spill files): ``<index>/_cache`` for a folder; for a
        remote index ``storage.cache_dir`` (default ``$STRATA_HOME/cache``), one subfolder per index URI."""
        if self.root is not None:
            return self.root / "_cache"
        home = Path(os.environ.get("STRATA_HOME", Path.home() / ".cache" / "strata"))
        base = Path(self.storage.cache_dir).expanduser() if self.storage.cache_dir else home / "cache"
        return base / self.uri.rstrip("/").replace("://", "_").replace("/", "_")

    # ------------------------------------------------------------------ snapshots
    def _table_names(self) -> set[str]:
        res = self.db.list_tables()
        names = getattr(res, "tables", res)
        return set(names)

    def snapshots_head(self) -> int | None:
        """The newest Lance version of ``_snapshots``, read off its manifest names without LanceDB (a folder listing;
        one LIST request on s3://): every publish, rollback and gc adds one, so while it stands the latest snapshot
        does too. None when there is none, or for a store or layout this code does not know."""
        if self.root is not None:
            try:
                names = [p.name for p in (self.root / "lance" / f"{SNAPSHOTS}.lance" / "_versions").iterdir()]
            except OSError:
                return None
        elif self.uri.startswith(("s3://", "s3a://")):
            bucket, _, prefix = self._db_uri.split("://", 1)[1].partition("/")
            try:
                pages = (
                    s3_client(self.storage)
                    .get_paginator("list_objects_v2")
                    .paginate(Bucket=bucket, Prefix=f"{prefix.strip('/')}/{SNAPSHOTS}.lance/_versions/")
                )
                names = [o["Key"].rsplit("/", 1)[-1] for page in pages for o in page.get("Contents", [])]
            except Exception:  # noqa: BLE001 - unreachable or not allowed to list: nothing is cached
                return None
        else:
            return None
        versions = []
        for name in (n for n in names if n.endswith(".manifest")):
            stem = name.removesuffix(".manifest")
            if not stem.isdigit():
                return None
            n = int(stem)
            versions.append(
                2**64 - 1 - n if n >= 2**63 else n
            )  # Lance names manifests u64::MAX - version (newest first)
        return max(versions) if versions else None

    def has_table(self, name: str) -> bool:
        return name in self._table_names()

    def snapshots(self) -> list[dict[str, Any]]:
        """Every published snapshot, oldest first."""
        if not self.has_table(SNAPSHOTS):
            return []
        rows = self.db.open_table(SNAPSHOTS).to_arrow().to_pylist()
        for r in rows:
            r["tables"] = json.loads(r["tables"])
        return sorted(rows, key=lambda r: r["version"])

    def snapshot(self, as_of: int | None = None) -> dict[str, Any] | None:
        snaps = self.snapshots()
        if not snaps:
            return None
        if as_of is None:
            return snaps[-1]
        for s in snaps:
            if s["version"] == as_of:
                return s
        raise IndexNotFound(f"snapshot version {as_of} not found in {self.uri}; known: {[s['version'] for s in snaps]}")

    def require_snapshot(self, as_of: int | None = None) -> dict[str, Any]:
        snap = self.snapshot(as_of)
        if snap is None:
            raise IndexNotFound(f"no published index at {self.uri}: run `strata index CORPUS --index {self.uri}` first")
        return snap

    # ------------------------------------------------------------------ reads
    def open_table(self, name: str, as_of: int | None = None, snap: dict[str, Any] | None = None):
        """A table checked out at the version pinned by the snapshot (latest log tables)."""
        if name in LOG_TABLES:
            return self.db.open_table(name) if self.has_table(name) else None
        snap = snap or self.require_snapshot(as_of)
        pinned = snap["tables"].get(name)
        if pinned is None:
            return None
        tbl = self.db.open_table(name)
        tbl.checkout(pinned)
        return tbl

    def read(
        self,
        name: str,
        as_of: int | None = None,
        snap: dict[str, Any] | None = None,
        columns: list[str] | None = None,
        where: str | None = None,
    ) -> pa.Table:
        """A table (of the snapshot), whole or only ``columns`` (the others are never read), all rows or those
        matching the SQL filter ``where`` (read with the filter pushed down)."""
        snap = snap if snap is not None else (self.snapshot(as_of) if name not in LOG_TABLES else None)
        dim = (snap or {}).get("dim") or 384
        try:
            tbl = self.open_table(name, snap=snap) if (snap or name in LOG_TABLES) else None
            if tbl is None:
                empty = schema_for(name, dim).empty_table()
                return empty.select(columns) if columns else empty
            stored = tbl.schema.names
            if columns is None and where is None:
                return as_declared(tbl.to_arrow(), schema_for(name, dim))
            query = tbl.search().where(where) if where else tbl.search()
            got = query.select([c for c in columns or stored if c in stored]).limit(None).to_arrow()
            return as_declared(got, schema_for(name, dim), columns)
        except IndexError_:
            raise
        except Exception as exc:  # noqa: BLE001 - a damaged or missing file: say which table and version
            raise self._damaged(name, snap, exc) from None

    def batches(
        self, name: str, snap: dict[str, Any], columns: list[str], batch_rows: int = 65_536
    ) -> Iterator[pa.RecordBatch]:
        """A table of the snapshot read ``batch_rows`` rows at a time, only ``columns``, one batch ahead
        (``ONE_AHEAD``): for scans that keep a few rows of a table too large to hold."""
        try:
            if (tbl := self.open_table(name, snap=snap)) is None:
                return
            stored = [c for c in columns if c in tbl.schema.names]
            scanner = tbl.to_lance().scanner(columns=stored, batch_size=batch_rows, **ONE_AHEAD)
            yield from declared_batches(scanner.to_batches(), schema_for(name, snap.get("dim") or 384), columns)
        except IndexError_:
            raise
        except Exception as exc:  # noqa: BLE001
            raise self._damaged(name, snap, exc) from None

    def _damaged(self, name: str, snap: dict[str, Any] | None, exc: Exception) -> IndexError_:
        pinned = (snap or {}).get("tables", {}).get(name, "latest")
        where = f"version {pinned} of snapshot v{snap['version']}" if snap else "latest version"
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        first = re.sub(r", /\S+\.rs:\d+:\d+", "", first)  # the Rust source line Lance appends says nothing here
        return IndexDamaged(
            f"table {name} ({where}) cannot be read: {first}. Its files under {self._db_uri} are damaged "
            "or missing: `strata rollback --to` an earlier snapshot whose tables read, or rebuild with "
            "`strata update --full`"
        )

    def verify(self, snap: dict[str, Any]) -> list[str]:
        """Read one column of every table the snapshot pins, through every data file: what cannot be read."""
        problems = []
        for name in SNAPSHOT_TABLES:
            try:
                tbl = self.open_table(name, snap=snap)
                if tbl is not None:  # one column of every row: every data file of the version is opened
                    tbl.search().select([tbl.schema.names[0]]).limit(None).to_arrow()
            except Exception as exc:  # noqa: BLE001
                problems.append(str(self._damaged(name, snap, exc)))
        return problems

    def counts(self, snap: dict[str, Any]) -> dict[str, int]:
        out = {}
        for name in SNAPSHOT_TABLES:
            tbl = self.open_table(name, snap=snap)
            out[name] = tbl.count_rows() if tbl is not None else 0
        runs = self.open_table("runs")
        out["runs"] = runs.count_rows() if runs is not None else 0
        return out

    # ------------------------------------------------------------------ writes
    #: tables an update writes as a change of the pinned version (``rows.delta_against``): kept snapshots share the
    #: rows it did not change, so the index grows with the churn, not with its size per snapshot
    DELTA_TABLES = ("chunks", "entities", "relations", "communities", "community_reports")

    def _write(
        self,
        name: str,
        data: pa.Table | TableDelta | SpilledTable,
        ann_min_rows: int | None = None,
        pinned: int | None = None,
        mapper: Any = None,
    ) -> int:
        """Write one table's new version: a ``TableDelta`` (or a whole table that ``change`` finds one in) is
        applied to the pinned version (rows deleted, rows appended); a whole table replaces the rows; a spilled
        table's parts are written as fragments by tasks on ``mapper`` and committed as one version."""
        if isinstance(data, TableDelta):
            return self._apply_delta(name, data, pinned)
        if isinstance(data, SpilledTable) and data.files:
            current = self.db.open_table(name).version if self.has_table(name) else None
            options = None if self.root is not None else storage_options(self.uri, self.storage)
            write_spilled(mapper or LocalMapper(), data, f"{self._db_uri}/{name}.lance", self.uri, options, current)
            return self._vector_index(self.db.open_table(name), ann_min_rows)
        if isinstance(data, pa.Table) and (delta := self.change(name, data, pinned)) is not None:
            return self._apply_delta(name, delta, pinned)
        data = data.reader(WRITE_BATCH_ROWS) if isinstance(data, SpilledTable) else plain_batches(data)
        if self.has_table(name):
            tbl = self.db.open_table(name)
            tbl.add(data, mode="overwrite")
        else:
            tbl = self.db.create_table(name, data=data)
        return self._vector_index(tbl, ann_min_rows)

    def change(self, name: str, data: pa.Table, pinned: int | None) -> TableDelta | None:
        """``data``, the whole new table ``name``, as a change of its version ``pinned`` (``rows.delta_against``);
        None where it is written whole (not one of ``DELTA_TABLES``, no pinned version, most rows changed)."""
        if pinned is None or name not in self.DELTA_TABLES or not self.has_table(name):
            return None
        (old := self.db.open_table(name)).checkout(pinned)
        columns = [c for c in data.column_names if c != "vector"]
        if not set(columns) <= set(old.schema.names):  # written before a column was declared: written whole
            return None
        return delta_against(old.search().select(columns).limit(None).to_batches(65_536), data)

    @staticmethod
    def _vector_index(tbl: Any, ann_min_rows: int | None) -> int:
        if ann_min_rows is not None and "vector" in tbl.schema.names and tbl.count_rows() >= ann_min_rows:
            build_vector_index(tbl)  # a version of its own: the snapshot pins the indexed one
        return tbl.version

    def _apply_delta(self, name: str, delta: TableDelta, pinned: int | None) -> int:
        if pinned is None or not self.has_table(name):
            raise ValueError(f"table {name}: a delta needs the version the previous snapshot pinned")
        tbl = self.db.open_table(name)
        if tbl.version != pinned:  # a later version exists (a rollback, or a run that never committed): start over
            tbl.checkout(pinned)  # from the pinned one, as the new latest
            tbl.restore()
        if not set(delta.add.schema.names) <= set(tbl.schema.names):  # written before a column was declared: whole
            return self._write(name, applied(tbl.to_arrow(), delta))
        if delta.values:  # one delete by an Arrow filter (25k ids as SQL IN lists: +418 MB at 100k chunks; +78)
            tbl.to_lance().delete(pc.field(delta.column).isin(pa.array(delta.values, pa.string())))
        if delta.add.num_rows:
            self.db.open_table(name).add(plain_batches(delta.add))
        return self.db.open_table(name).version

    def publish(
        self,
        tables: dict[str, Any],
        run_id: str,
        kind: str,
        dim: int,
        version: int | None = None,
        note: str = "",
        ann_min_rows: int | None = None,
        mapper: Any = None,
    ) -> int:
        """Write the given tables (full replacement) and commit a snapshot pinning them and the unchanged ones.
        A vector table of at least ``ann_min_rows`` rows gets its vector index, part of the snapshot. A spilled
        table is written by tasks on ``mapper`` (the run's Dask workers), a part each."""
        previous = self.snapshot()
        pins: dict[str, int] = dict(previous["tables"]) if previous else {}
        for name in SNAPSHOT_TABLES:
            if name in tables:
                try:
                    pins[name] = self._retrying(
                        f"writing table {name}",
                        functools.partial(self._write, name, tables[name], ann_min_rows, pins.get(name), mapper),
                    )
                except Exception as exc:  # noqa: BLE001 - nothing is committed until the _snapshots append
                    kept = f"snapshot v{previous['version']} stays published" if previous else "nothing was published"
                    if self.root is None and _transient(exc):
                        raise self._unavailable(f"writing table {name}", kept, exc) from exc
                    if not _disk_full(exc):
                        raise
                    raise DiskFull(
                        f"disk full while writing table {name} to {self._db_uri}: {kept}. Free space "
                        "(`strata gc --keep N` drops old table versions) and run the same command "
                        "again"
                    ) from exc
        new_version = version if version is not None else (previous["version"] + 1 if previous else 1)
        return self._commit(new_version, run_id, kind, pins, dim, note)

    def _commit(self, version: int, run_id: str, kind: str, pins: dict[str, int], dim: int, note: str) -> int:
        if self._lease is not None:
            self._lease.check()  # a writer that lost its lock (stalled past the expiry) must not commit
        row = {
            "version": version,
            "created_at": datetime.now(UTC),
            "run_id": run_id,
            "kind": kind,
            "tables": json.dumps(pins, sort_keys=True),
            "dim": dim,
            "note": note,
        }
        data = rows_to_table([row], SNAPSHOT_SCHEMA)
        tries: list[int] = []

        def append() -> None:
            if tries and any(s["version"] == version and s["run_id"] == run_id for s in self.snapshots()):
                return  # the failed attempt did commit (its answer was lost)
            tries.append(1)
            if self.has_table(SNAPSHOTS):
                self.db.open_table(SNAPSHOTS).add(data)  # the atomic commit point
            else:
                self.db.create_table(SNAPSHOTS, data=data)

        try:
            self._retrying(f"committing snapshot v{version}", append)
        except Exception as exc:  # noqa: BLE001
            if self.root is None and _transient(exc):
                raise self._unavailable(
                    f"committing snapshot v{version}", "the previous snapshot stays published", exc
                ) from exc
            raise
        return version

    def _retrying(self, what: str, fn: Any) -> Any:
        """``fn()``, tried again (up to ``STORE_ATTEMPTS``, with backoff) when a remote store failed transiently."""
        import logging
        import random

        for attempt in range(1, STORE_ATTEMPTS + 1):
            try:
                return fn()
            except IndexError_:
                raise
            except Exception as exc:  # noqa: BLE001
                if self.root is not None or attempt == STORE_ATTEMPTS or not _transient(exc):
                    raise
                delay = min(8.0, 0.5 * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)
                logging.getLogger(__name__).warning(
                    "%s on %s failed (%s); attempt %d of %d in %.1fs",
                    what,
                    self.uri,
                    str(exc).strip().splitlines()[0][:200],
                    attempt + 1,
                    STORE_ATTEMPTS,
                    delay,
                )
                time.sleep(delay)
        raise AssertionError("unreachable")

    def _unavailable(self, what: str, kept: str, exc: BaseException) -> StoreUnavailable:
        first = re.sub(r", /\S+\.rs:\d+:\d+", "", str(exc).strip().splitlines()[0])[:300]
        return StoreUnavailable(
            f"the store of {self.uri} kept failing while {what} ({first}), after "
            f"{STORE_ATTEMPTS} attempts, each request retried up to {self.storage.max_retries} times: "
            f"nothing was committed, {kept}. Run the same command again once the store answers "
            "(storage.max_retries and storage.retry_timeout_s retry longer)"
        )

    def rollback(self, to_version: int, run_id: str) -> int:
        """Publish a new snapshot that pins the table versions of snapshot ``to_version``: nothing is rewritten."""
        target = self.require_snapshot(to_version)  # None only without snapshots: raises as the next line did
        latest = self.require_snapshot()
        return self._commit(
            latest["version"] + 1,
            run_id,
            "rollback",
            dict(target["tables"]),
            target["dim"],
            json.dumps({**snapshot_note(target), "rollback_to": to_version}),
        )

    def gc(self, keep: int, **compaction: Any) -> dict[str, Any]:
        """Keep the newest ``keep`` snapshots, drop the table versions no kept one pins, compact what updates
        deleted (``tasks.store.gc``)."""

        return collect_garbage(self, keep, **compaction)

    # ------------------------------------------------------------------ run log
    def log_run(self, row: dict[str, Any]) -> None:
        data = rows_to_table([row], schema_for("runs", 0))

        def append() -> None:
            if self.has_table("runs"):
                self.db.open_table("runs").add(data)
            else:
                self.db.create_table("runs", data=data)

        self._retrying("logging the run", append)

    def finish_run(self, run_id: str, values: dict[str, Any]) -> None:
        self._retrying(
            "logging the run", lambda: self.db.open_table("runs").update(where=f"id = '{run_id}'", values=values)
        )

    def runs(self, limit: int | None = None) -> list[dict[str, Any]]:
        tbl = self.open_table("runs")
        if tbl is None:
            return []
        rows = sorted(tbl.to_arrow().to_pylist(), key=lambda r: r["started_at"])
        return rows[-limit:] if limit else rows

    # ------------------------------------------------------------------ writer lock
    @contextlib.contextmanager
    def writer_lock(self, timeout_s: float = 0.0) -> Iterator[None]:
        """One writer per index: a second one waits up to ``timeout_s`` and then fails with a clear message
        (``tasks.store.locks.writer_lock``)."""

        with writer_lock(self, timeout_s) as lease:
            self._lease = lease
            try:
                yield
            finally:
                self._lease = None
