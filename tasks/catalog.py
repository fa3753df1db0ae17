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
import fcntl
import functools
import json
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from schemas.tables import LOG_TABLES, SNAPSHOT_TABLES, schema_for
from tasks.errors import DamagedError, NotFoundError, RefusedError, StrataError, UsageError
from tasks.spill import SpilledTable, plain_schema

if TYPE_CHECKING:
    from schemas.config import StorageConfig

SNAPSHOTS = "_snapshots"
_SNAPSHOT_SCHEMA = pa.schema(
    [
        ("version", pa.int64()),
        ("created_at", pa.timestamp("us", tz="UTC")),
        ("run_id", pa.string()),
        ("kind", pa.string()),
        ("tables", pa.string()),  # JSON {table: lance version}
        ("dim", pa.int64()),
        ("note", pa.string()),
    ]
)


class IndexError_(StrataError):
    """The index is missing, locked or inconsistent; the message says what to do."""


class IndexNotFound(IndexError_, NotFoundError):
    """No index, or no such snapshot, at the location."""


class IndexDamaged(IndexError_, DamagedError):
    """A table the snapshot pins cannot be read."""


class LockTimeout(IndexError_, RefusedError):
    """Another run is writing the index."""


class DiskFull(IndexError_, RefusedError):
    """The disk filled up while a table was written: nothing was committed."""


class StoreUnavailable(IndexError_, RefusedError):
    """The object store kept failing (throttling, dropped connections) past every retry: nothing was committed."""


#: attempts at one table write or snapshot commit of a remote index. object_store retries each request with backoff
#: (``storage.max_retries``), but not a commit whose connection dropped before the store got it: Lance then fails
#: the write, which left nothing behind (the next attempt starts again from the pinned version)
STORE_ATTEMPTS = 4
_TRANSIENT = ("error sending request", "Commit result for version", "connection", "Connection", "SlowDown", "503",
              "timed out", "reset by peer", "Broken pipe")


def _transient(exc: BaseException) -> bool:
    return any(s in str(exc) for s in _TRANSIENT)


def _disk_full(exc: BaseException) -> bool:
    import errno

    return (isinstance(exc, OSError) and exc.errno == errno.ENOSPC) or "No space left on device" in str(exc)


def is_local(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file://")


def _secret(value: Any) -> str | None:
    return value.get_secret_value() if value is not None else None


def s3_settings(storage: "StorageConfig", environ: dict[str, str] | None = None) -> dict[str, str]:
    """Endpoint, region and credentials of an s3:// index: each ``storage.*`` setting, else its usual AWS variable
    (absent keys: the SDK's own chain decides, e.g. an instance role)."""
    env = os.environ if environ is None else environ
    values = {
        "endpoint": storage.endpoint or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL"),
        "region": storage.region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION"),
        "access_key_id": _secret(storage.access_key_id) or env.get("AWS_ACCESS_KEY_ID"),
        "secret_access_key": _secret(storage.secret_access_key) or env.get("AWS_SECRET_ACCESS_KEY"),
        "session_token": _secret(storage.session_token) or env.get("AWS_SESSION_TOKEN"),
    }
    return {k: v for k, v in values.items() if v}


def storage_options(uri: str, storage: "StorageConfig", environ: dict[str, str] | None = None) -> dict[str, str]:
    """LanceDB's ``storage_options`` for a remote index: object_store's client retries (with exponential backoff,
    on 429/503 SlowDown, 5xx and dropped connections), and for s3:// the endpoint, region and credentials. Holds
    secrets: never logged, never stored."""
    opts = {"client_max_retries": str(storage.max_retries), "client_retry_timeout": str(storage.retry_timeout_s)}
    if uri.startswith(("s3://", "s3a://")):
        s3 = s3_settings(storage, environ)
        for key, option in (("endpoint", "aws_endpoint"), ("region", "aws_region"), ("access_key_id", "aws_access_key_id"),
                            ("secret_access_key", "aws_secret_access_key"), ("session_token", "aws_session_token")):
            if key in s3:
                opts[option] = s3[key]
        if s3.get("endpoint", "").startswith("http://"):
            opts["allow_http"] = "true"
    opts.update({k: v.get_secret_value() for k, v in storage.options.items()})
    return opts


def _default_storage() -> "StorageConfig":
    """The ``storage`` settings of ``$STRATA_CONFIG`` and the environment (``STRATA_STORAGE__*``), for a catalog
    opened without a loaded config (``validate``, ``export``, ``rollback``, ``gc``)."""
    from schemas.config import load_config

    return load_config().storage


def rows_to_table(rows: list[dict[str, Any]], schema: pa.Schema, fixed: dict[str, Any] | None = None,
                  defaults: dict[str, Any] | None = None) -> pa.Table:
    """Rows (dicts) to an Arrow table of exactly ``schema`` (missing columns null, extra keys ignored); a column in
    ``fixed`` takes that value in every row, one in ``defaults`` takes it where the row has none (no row copied)."""
    fixed, defaults = fixed or {}, defaults or {}

    def column(name: str) -> list[Any]:
        if name in fixed:
            return [fixed[name]] * len(rows)
        if name in defaults:
            return [defaults[name] if r.get(name) is None else r[name] for r in rows]
        return [r.get(name) for r in rows]

    return pa.Table.from_pydict({f.name: column(f.name) for f in schema}, schema=schema)


def to_table(name: str, rows: list[dict[str, Any]], dim: int, version: int, vectors: Any = None) -> pa.Table:
    """Rows of table ``name`` as Arrow, stamped with ``version``; ``vectors`` (an n x dim matrix aligned with
    the rows) fills the vector column. A summary or report written now has ``staleness`` 0 unless it says otherwise."""
    import numpy as np

    schema = schema_for(name, dim)
    stamp = {"fixed": {"version": version}, "defaults": {"staleness": 0.0}}
    if "vector" not in schema.names:
        return rows_to_table(rows, schema, **stamp)
    table = rows_to_table(rows, schema.remove(schema.get_field_index("vector")), **stamp)
    vecs = np.zeros((len(rows), dim), np.float32) if vectors is None and not rows else np.asarray(vectors, dtype=np.float32)
    if vecs.shape != (len(rows), dim):
        raise ValueError(f"{name}: {len(rows)} rows but a {vecs.shape} vector matrix (dimension {dim})")
    column = pa.FixedSizeListArray.from_arrays(pa.array(vecs.reshape(-1), type=pa.float32()), dim)
    return table.append_column(schema.field("vector"), column).select(schema.names)


def relation_table(relations: "pa.Table | list[dict[str, Any]]") -> pa.Table:
    """Relations as an Arrow table of the ``relations`` schema: a table passes through, rows are converted (the
    ``version`` stamp is 0 until the run stamps the snapshot's). Relations outnumber every other row of a
    graph by far, so the pipeline holds them in this form, never as a dict per relation."""
    if isinstance(relations, pa.Table):
        return relations
    return to_table("relations", relations, 0, 0)


def plain_rows(table: pa.Table) -> list[dict[str, Any]]:
    """A table's rows as dicts, without the ``version`` stamp and the ``vector`` column (vectors travel as matrices)."""
    return table.drop([c for c in ("version", "vector") if c in table.column_names]).to_pylist()


def snapshot_note(snap: dict[str, Any] | None) -> dict[str, Any]:
    """A snapshot's note (method, drift, root locations, rollback), empty for snapshots written without one."""
    text = (snap or {}).get("note") or ""
    return json.loads(text) if text.startswith("{") else {}


def vector_matrix(table: pa.Table) -> Any:
    """The ``vector`` column of a table as an n x dim float32 matrix."""
    import numpy as np

    if table.num_rows == 0:
        return np.zeros((0, table.schema.field("vector").type.list_size), dtype=np.float32)
    col = table.column("vector").combine_chunks()
    return np.asarray(col.values.to_numpy(zero_copy_only=False), dtype=np.float32).reshape(table.num_rows, -1)


@dataclass
class TableDelta:
    """A table's change from the previous snapshot: the rows whose ``column`` is one of ``values`` go, the rows
    of ``add`` come (the kept rows are not rewritten: an update's cost follows its delta)."""

    column: str
    values: list[str]
    add: pa.Table


#: rows per batch handed to LanceDB: its writer's memory grows with the batches it is given (100k chunks as one
#: 225 MB batch: +630 MB while written; in batches of 8,192 rows: +140 MB)
WRITE_BATCH_ROWS = 8192


def _plain(data: pa.Table) -> pa.RecordBatchReader:
    """A table as LanceDB writes it: batches of at most ``WRITE_BATCH_ROWS`` rows, dictionary-encoded columns as
    plain strings."""
    plain = plain_schema(data.schema)
    batches = data.to_batches(max_chunksize=WRITE_BATCH_ROWS)
    return pa.RecordBatchReader.from_batches(plain, (b.cast(plain) for b in batches) if plain != data.schema else batches)


class Catalog:
    def __init__(self, uri: str | Path, create: bool = True, storage: "StorageConfig | None" = None):
        """The catalog at ``uri``; a local folder is created if missing unless ``create`` is false (then a missing
        folder, or a file, is a clear error instead): see ``open_index`` for commands that only read.

        ``storage``: how a remote index is reached, and where its caches go (default: the ``storage`` settings of
        ``$STRATA_CONFIG`` and the environment, read only for a remote index)."""
        self.uri = str(uri)
        self._storage = storage
        self._lease: S3Lease | None = None
        if is_local(self.uri):
            self.root = Path(self.uri.removeprefix("file://")).expanduser().resolve()
            if self.root.exists() and not self.root.is_dir():
                raise UsageError(f"--index {self.uri} is a file, not an index folder")
            if create:
                self.root.mkdir(parents=True, exist_ok=True)
            elif not (self.root / "lance").is_dir():
                what = "no such folder" if not self.root.exists() else "the folder holds no Strata index"
                raise IndexNotFound(f"no index at {self.uri} ({what}): check --index, or build one with "
                                    f"`strata index CORPUS --index {self.uri}`")
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
    def storage(self) -> "StorageConfig":
        if self._storage is None:
            self._storage = _default_storage()
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
                pages = _s3_client(self.storage).get_paginator("list_objects_v2").paginate(
                    Bucket=bucket, Prefix=f"{prefix.strip('/')}/{SNAPSHOTS}.lance/_versions/")
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
            versions.append(2**64 - 1 - n if n >= 2**63 else n)  # Lance names manifests u64::MAX - version (newest first)
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

    def read(self, name: str, as_of: int | None = None, snap: dict[str, Any] | None = None,
             columns: list[str] | None = None, where: str | None = None) -> pa.Table:
        """A table (of the snapshot), whole or only ``columns`` (the others are never read), all rows or those
        matching the SQL filter ``where`` (read with the filter pushed down)."""
        snap = snap if snap is not None else (self.snapshot(as_of) if name not in LOG_TABLES else None)
        dim = (snap or {}).get("dim") or 384
        try:
            tbl = self.open_table(name, snap=snap) if (snap or name in LOG_TABLES) else None
            if tbl is None:
                empty = schema_for(name, dim).empty_table()
                return empty.select(columns) if columns else empty
            if columns is None and where is None:
                return tbl.to_arrow()
            query = tbl.search().where(where) if where else tbl.search()
            return query.select(columns or tbl.schema.names).limit(None).to_arrow()
        except IndexError_:
            raise
        except Exception as exc:  # noqa: BLE001 - a damaged or missing file: say which table and version
            raise self._damaged(name, snap, exc) from None

    def batches(self, name: str, snap: dict[str, Any], columns: list[str], batch_rows: int = 200_000
                ) -> Iterator[pa.RecordBatch]:
        """A table of the snapshot read ``batch_rows`` rows at a time, only ``columns``: for scans that keep
        a few rows of a table too large to hold."""
        try:
            tbl = self.open_table(name, snap=snap)
            if tbl is None:
                return
            yield from tbl.search().select(columns).limit(None).to_batches(batch_rows)
        except IndexError_:
            raise
        except Exception as exc:  # noqa: BLE001
            raise self._damaged(name, snap, exc) from None

    def _damaged(self, name: str, snap: dict[str, Any] | None, exc: Exception) -> "IndexError_":
        pinned = (snap or {}).get("tables", {}).get(name, "latest")
        where = f"version {pinned} of snapshot v{snap['version']}" if snap else "latest version"
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        first = re.sub(r", /\S+\.rs:\d+:\d+", "", first)  # the Rust source line Lance appends says nothing here
        return IndexDamaged(f"table {name} ({where}) cannot be read: {first}. Its files under {self._db_uri} are damaged "
                           "or missing: `strata rollback --to` an earlier snapshot whose tables read, or rebuild with "
                           "`strata update --full`")

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
    def _write(self, name: str, data: "pa.Table | TableDelta", ann_min_rows: int | None = None,
               pinned: int | None = None) -> int:
        """Write one table's new version: a whole table replaces the rows; a ``TableDelta`` is applied to the
        version the previous snapshot pinned (rows deleted, rows appended) without rewriting the others."""
        if isinstance(data, TableDelta):
            return self._apply_delta(name, data, pinned)
        data = data.reader(WRITE_BATCH_ROWS) if isinstance(data, SpilledTable) else _plain(data)
        if self.has_table(name):
            tbl = self.db.open_table(name)
            tbl.add(data, mode="overwrite")
        else:
            tbl = self.db.create_table(name, data=data)
        if ann_min_rows is not None and "vector" in data.schema.names and tbl.count_rows() >= ann_min_rows:
            build_vector_index(tbl)  # a version of its own: the snapshot pins the indexed one
        return tbl.version

    def _apply_delta(self, name: str, delta: "TableDelta", pinned: int | None) -> int:
        if pinned is None or not self.has_table(name):
            raise ValueError(f"table {name}: a delta needs the version the previous snapshot pinned")
        tbl = self.db.open_table(name)
        if tbl.version != pinned:  # a later version exists (a rollback, or a run that never committed): start over
            tbl.checkout(pinned)  # from the pinned one, as the new latest
            tbl.restore()
        for s in range(0, len(delta.values), 5000):
            part = ", ".join("'" + v.replace("'", "''") + "'" for v in delta.values[s : s + 5000])
            tbl.delete(f"{delta.column} IN ({part})")
        if delta.add.num_rows:
            tbl.add(_plain(delta.add))
        return tbl.version

    def publish(
        self, tables: dict[str, pa.Table], run_id: str, kind: str, dim: int, version: int | None = None, note: str = "",
        ann_min_rows: int | None = None,
    ) -> int:
        """Write the given tables (full replacement) and commit a snapshot pinning them and the unchanged ones.
        A vector table of at least ``ann_min_rows`` rows gets its vector index, part of the snapshot."""
        previous = self.snapshot()
        pins: dict[str, int] = dict(previous["tables"]) if previous else {}
        for name in SNAPSHOT_TABLES:
            if name in tables:
                try:
                    pins[name] = self._retrying(f"writing table {name}", functools.partial(
                        self._write, name, tables[name], ann_min_rows, pins.get(name)))
                except Exception as exc:  # noqa: BLE001 - nothing is committed until the _snapshots append
                    kept = f"snapshot v{previous['version']} stays published" if previous else "nothing was published"
                    if self.root is None and _transient(exc):
                        raise self._unavailable(f"writing table {name}", kept, exc) from exc
                    if not _disk_full(exc):
                        raise
                    raise DiskFull(f"disk full while writing table {name} to {self._db_uri}: {kept}. Free space "
                                      "(`strata gc --keep N` drops old table versions) and run the same command "
                                      "again") from exc
        new_version = version if version is not None else (previous["version"] + 1 if previous else 1)
        return self._commit(new_version, run_id, kind, pins, dim, note)

    def _commit(self, version: int, run_id: str, kind: str, pins: dict[str, int], dim: int, note: str) -> int:
        if self._lease is not None:
            self._lease.check()  # a writer that lost its lock (stalled past the expiry) must not commit
        row = {"version": version, "created_at": datetime.now(timezone.utc), "run_id": run_id, "kind": kind,
               "tables": json.dumps(pins, sort_keys=True), "dim": dim, "note": note}
        data = rows_to_table([row], _SNAPSHOT_SCHEMA)
        tries = []

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
                raise self._unavailable(f"committing snapshot v{version}", "the previous snapshot stays published",
                                        exc) from exc
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
                logging.getLogger(__name__).warning("%s on %s failed (%s); attempt %d of %d in %.1fs", what, self.uri,
                                                    str(exc).strip().splitlines()[0][:200], attempt + 1, STORE_ATTEMPTS,
                                                    delay)
                time.sleep(delay)
        raise AssertionError("unreachable")

    def _unavailable(self, what: str, kept: str, exc: BaseException) -> StoreUnavailable:
        first = re.sub(r", /\S+\.rs:\d+:\d+", "", str(exc).strip().splitlines()[0])[:300]
        return StoreUnavailable(f"the store of {self.uri} kept failing while {what} ({first}), after "
                                f"{STORE_ATTEMPTS} attempts, each request retried up to {self.storage.max_retries} times: "
                                f"nothing was committed, {kept}. Run the same command again once the store answers "
                                "(storage.max_retries and storage.retry_timeout_s retry longer)")

    def rollback(self, to_version: int, run_id: str) -> int:
        """Publish a new snapshot that pins the table versions of snapshot ``to_version``: nothing is rewritten."""
        target = self.snapshot(to_version)
        latest = self.require_snapshot()
        return self._commit(latest["version"] + 1, run_id, "rollback", dict(target["tables"]), target["dim"],
                            json.dumps({**snapshot_note(target), "rollback_to": to_version}))

    def gc(self, keep: int) -> dict[str, Any]:
        """Keep the newest ``keep`` snapshots; drop the older ones and every table version older than the oldest
        version a kept snapshot pins (a pinned version is never removed; Lance keeps each table's latest). The log
        tables (``_snapshots``, ``runs``) lose their versions older than the oldest kept snapshot. Nothing is
        compacted or rewritten: the index only shrinks."""
        from datetime import timedelta

        snaps = self.snapshots()
        if keep < 1:
            raise UsageError("gc --keep must be at least 1: the latest snapshot is always kept")
        kept, dropped = snaps[-keep:], snaps[:-keep]
        removed: dict[str, int] = {}
        freed = 0

        def cleanup(name: str, since: datetime) -> None:
            nonlocal freed
            since = since if since.tzinfo else since.replace(tzinfo=timezone.utc)
            # a margin of a second: a version written just before the oldest kept one survives, never the reverse.
            # The age is Lance's, from when it cleans: measured now, not when gc began (each table takes a second
            # on object storage, which would move the cut past the pinned version)
            tbl = self.db.open_table(name)
            stats = tbl.cleanup_old_versions(older_than=datetime.now(timezone.utc) - since + timedelta(seconds=1))
            removed[name] = int(stats.old_versions)
            freed += int(stats.bytes_removed)

        if dropped:
            self.db.open_table(SNAPSHOTS).delete(f"version < {kept[0]['version']}")
        for name in SNAPSHOT_TABLES:
            pinned = [s["tables"][name] for s in kept if name in s["tables"]]
            if not pinned or not self.has_table(name):
                continue
            stamps = {v["version"]: v["timestamp"] for v in self.db.open_table(name).list_versions()}
            cleanup(name, stamps[min(pinned)])
        for name in (SNAPSHOTS, *LOG_TABLES):
            if self.has_table(name):
                cleanup(name, kept[0]["created_at"])
        return {"kept": [s["version"] for s in kept], "dropped": [s["version"] for s in dropped],
                "versions_removed": removed, "bytes_removed": freed}

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
        self._retrying("logging the run", lambda: self.db.open_table("runs").update(where=f"id = '{run_id}'", values=values))

    def runs(self, limit: int | None = None) -> list[dict[str, Any]]:
        tbl = self.open_table("runs")
        if tbl is None:
            return []
        rows = sorted(tbl.to_arrow().to_pylist(), key=lambda r: r["started_at"])
        return rows[-limit:] if limit else rows

    # ------------------------------------------------------------------ writer lock
    @contextlib.contextmanager
    def writer_lock(self, timeout_s: float = 0.0) -> Iterator[None]:
        """One writer per index: a second one waits up to ``timeout_s`` and then fails with a clear message.
        A folder: an fcntl lock on ``<index>/.writer.lock``. s3://: a lock object (``S3Lease``)."""
        if self.root is None:
            yield from self._remote_lock(timeout_s)
            return
        path = self.root / ".writer.lock"
        fh = open(path, "a+")
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        fh.seek(0)
                        holder = fh.read().strip() or "another process"
                        raise LockTimeout(
                            f"index {self.uri} is being written by {holder}; waited {timeout_s:.0f}s "
                            "(raise --lock-timeout to wait longer)"
                        ) from None
                    time.sleep(0.2)
            fh.seek(0)
            fh.truncate()
            fh.write(f"pid {os.getpid()} since {datetime.now(timezone.utc).isoformat(timespec='seconds')}")
            fh.flush()
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
            fh.close()

    def _remote_lock(self, timeout_s: float) -> Iterator[None]:
        if self.storage.writer_lock == "off":
            yield
            return
        if not self.uri.startswith(("s3://", "s3a://")):
            raise UsageError(f"no writer lock for {self.uri.split('://')[0]}:// indexes: point --index at the store's "
                             "S3-compatible endpoint (s3:// with storage.endpoint), or set storage.writer_lock = \"off\" "
                             "when your writers are serialised otherwise (one deployment, a concurrency limit of 1)")
        lease = S3Lease(self.uri, self.storage)
        lease.acquire(timeout_s)
        self._lease = lease
        try:
            yield
        finally:
            self._lease = None
            lease.release()


# ---------------------------------------------------------------------------- the writer lock on S3
def _s3_client(storage: "StorageConfig") -> Any:
    """A boto3 S3 client for the lock object: the index's endpoint, region and credentials, and the same retries
    (standard mode: 503 SlowDown, 5xx and dropped connections, with backoff)."""
    import boto3
    from botocore.config import Config

    s3 = s3_settings(storage)
    return boto3.client("s3", endpoint_url=s3.get("endpoint"), region_name=s3.get("region"),
                        aws_access_key_id=s3.get("access_key_id"), aws_secret_access_key=s3.get("secret_access_key"),
                        aws_session_token=s3.get("session_token"),
                        config=Config(retries={"max_attempts": storage.max_retries + 1, "mode": "standard"},
                                      connect_timeout=5, read_timeout=30))


def _error_code(exc: BaseException) -> str:
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))


#: a conditional write that did not hold (412), or one racing another conditional write on the key (409)
_CONFLICT = ("PreconditionFailed", "412", "ConditionalRequestConflict", "409")
_GONE = ("NoSuchKey", "404", "NotFound")


class S3Lease:
    """One writer per s3:// index: the object ``<prefix>/.writer.lock``, naming its holder. It is created with a
    conditional put (``If-None-Match: *``: of two writers, exactly one creates it) and rewritten every third of
    ``storage.lock_ttl_s`` (a heartbeat, ``If-Match`` its own ETag). A lock not rewritten for ``lock_ttl_s`` by the
    store's clock is stale: the next writer takes it over with ``If-Match`` on the stale ETag (again one wins). It is
    deleted at the end; a holder that lost it (stalled past the expiry) is refused at its commit."""

    def __init__(self, uri: str, storage: "StorageConfig", client: Any = None):
        bucket, _, prefix = uri.split("://", 1)[1].partition("/")
        self.uri, self.bucket, self.ttl = uri, bucket, storage.lock_ttl_s
        self.key = (prefix.strip("/") + "/" if prefix.strip("/") else "") + ".writer.lock"
        self.token = uuid.uuid4().hex
        self.holder = f"pid {os.getpid()} on {socket.gethostname()}"
        self.since = ""
        self.etag: str | None = None
        self.lost: str | None = None
        self.renewed = 0.0
        self.client = client or _s3_client(storage)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def location(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    def _put(self, **condition: str) -> str:
        body = json.dumps({"holder": self.holder, "since": self.since, "token": self.token, "ttl_s": self.ttl})
        etag = self.client.put_object(Bucket=self.bucket, Key=self.key, Body=body.encode(),
                                      ContentType="application/json", **condition)["ETag"]
        self.renewed = time.monotonic()
        return etag

    def _read(self) -> tuple[str, dict[str, Any], float] | None:
        """The lock's ETag, its content and its age (seconds since it was last written, by the store's clock)."""
        from email.utils import parsedate_to_datetime

        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=self.key)
        except Exception as exc:  # noqa: BLE001
            if _error_code(exc) in _GONE:
                return None
            raise
        try:
            body = json.loads(resp["Body"].read() or b"{}")
        except ValueError:
            body = {}
        date = resp.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
        now = parsedate_to_datetime(date) if date else datetime.now(timezone.utc)
        return resp["ETag"], body, (now - resp["LastModified"]).total_seconds()

    def _try(self) -> str | None:
        """Take the lock: None when taken, else who holds it ("" to try again at once)."""
        try:
            self.etag = self._put(IfNoneMatch="*")
            return None
        except Exception as exc:  # noqa: BLE001
            if _error_code(exc) not in _CONFLICT:
                raise
        current = self._read()
        if current is None:
            return ""  # released meanwhile
        etag, body, age = current
        if body.get("token") == self.token:  # our own put, applied though its answer was lost and retried
            self.etag = etag
            return None
        holder = f"{body.get('holder', 'another writer')} since {body.get('since', '?')}"
        if age <= self.ttl:
            return (f"{holder} (lock {self.location}, renewed {max(age, 0):.0f}s ago; taken over once not renewed "
                    f"for {self.ttl:.0f}s)")
        try:  # stale: take it over, unless another writer renewed it or took it over meanwhile
            self.etag = self._put(IfMatch=etag)
        except Exception as exc:  # noqa: BLE001
            if _error_code(exc) not in _CONFLICT + _GONE:
                raise
            return ""
        import logging

        logging.getLogger(__name__).warning("took over the writer lock %s of %s: not renewed for %.0fs",
                                            self.location, holder, age)
        return None

    def acquire(self, timeout_s: float = 0.0) -> None:
        deadline = time.monotonic() + timeout_s
        self.since = datetime.now(timezone.utc).isoformat(timespec="seconds")
        while (holder := self._try()) is not None:
            if holder and time.monotonic() >= deadline:
                raise LockTimeout(f"index {self.uri} is being written by {holder}; waited {timeout_s:.0f}s "
                                  "(raise --lock-timeout to wait longer)")
            time.sleep(0.05 if not holder else min(0.5, max(0.05, deadline - time.monotonic())))
        self._thread = threading.Thread(target=self._heartbeat, name="strata-writer-lock", daemon=True)
        self._thread.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                self.etag = self._put(IfMatch=self.etag or "*")
            except Exception as exc:  # noqa: BLE001
                if _error_code(exc) not in _CONFLICT + _GONE:
                    continue  # the store is unreachable beyond the client's retries: again at the next beat
                current = self._read()
                if current is not None and current[1].get("token") == self.token:
                    self.etag = current[0]  # our own renewal, applied though its answer was lost
                    continue
                taker = current[1].get("holder", "another writer") if current else "nobody (deleted)"
                self.lost = f"the lock {self.location} was taken over by {taker}"
                return

    def check(self) -> None:
        """Refuse when the lock may no longer be ours: taken over, or not renewed for its whole lifetime."""
        if self.lost is None and time.monotonic() - self.renewed > self.ttl:
            self.lost = f"the lock {self.location} was not renewed for {time.monotonic() - self.renewed:.0f}s"
        if self.lost is not None:
            raise LockTimeout(f"lost the writer lock of {self.uri}: {self.lost}; nothing was committed by this run, "
                              "run it again")

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self.lost is not None:
            return
        try:
            current = self._read()
            if current is not None and current[1].get("token") == self.token:
                self.client.delete_object(Bucket=self.bucket, Key=self.key, IfMatch=current[0])
        except Exception as exc:  # noqa: BLE001 - it expires after lock_ttl_s anyway
            import logging

            logging.getLogger(__name__).warning("could not release the writer lock %s (%s): it expires after %.0fs",
                                                self.location, _error_code(exc) or type(exc).__name__, self.ttl)


# ---------------------------------------------------------------------------- vector search past memory
#: IVF partitions a query visits (of sqrt(rows)); recall@20 1.000 on 200k clustered vectors (benchmarks/bench_ann.py)
ANN_NPROBES = 20


def build_vector_index(tbl: Any) -> None:
    """A cosine IVF index on a table's ``vector`` column (sqrt(rows) partitions, full vectors kept): searched
    instead of scanning every vector in memory, once a table is past ``retrieval.ann_min_vectors`` rows."""
    tbl.create_index(metric="cosine", vector_column_name="vector", index_type="IVF_FLAT",
                     num_partitions=max(1, int(tbl.count_rows() ** 0.5)), replace=True)


def has_vector_index(tbl: Any) -> bool:
    return any("vector" in (getattr(i, "columns", None) or []) for i in tbl.list_indices())


def ann_search(tbl: Any, q: Any, k: int) -> tuple[list[str], list[float]]:
    """The ``k`` rows nearest ``q`` through the table's vector index: their ids and cosine similarities."""
    hits = (tbl.search(q, vector_column_name="vector").distance_type("cosine").limit(k).nprobes(ANN_NPROBES)
            .select(["id", "_distance"]).to_arrow())
    return hits.column("id").to_pylist(), [1.0 - d for d in hits.column("_distance").to_pylist()]
