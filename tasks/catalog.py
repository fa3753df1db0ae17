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
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa

from schemas.tables import LOG_TABLES, SNAPSHOT_TABLES, schema_for
from tasks.errors import DamagedError, NotFoundError, RefusedError, StrataError, UsageError
from tasks.spill import SpilledTable, plain_schema

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


def _disk_full(exc: BaseException) -> bool:
    import errno

    return (isinstance(exc, OSError) and exc.errno == errno.ENOSPC) or "No space left on device" in str(exc)


def is_local(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file://")


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
    def __init__(self, uri: str | Path, create: bool = True):
        """The catalog at ``uri``; a local folder is created if missing unless ``create`` is false (then a missing
        folder, or a file, is a clear error instead): see ``open_index`` for commands that only read."""
        self.uri = str(uri)
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

        return lancedb.connect(self._db_uri)

    # ------------------------------------------------------------------ locations
    @property
    def cache_dir(self) -> Path:
        if self.root is not None:
            return self.root / "_cache"
        base = Path(os.environ.get("STRATA_HOME", Path.home() / ".cache" / "strata"))
        return base / "cache" / self.uri.replace("://", "_").replace("/", "_")

    # ------------------------------------------------------------------ snapshots
    def _table_names(self) -> set[str]:
        res = self.db.list_tables()
        names = getattr(res, "tables", res)
        return set(names)

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
                    pins[name] = self._write(name, tables[name], ann_min_rows, pins.get(name))
                except Exception as exc:  # noqa: BLE001 - nothing is committed until the _snapshots append
                    if not _disk_full(exc):
                        raise
                    kept = f"snapshot v{previous['version']} stays published" if previous else "nothing was published"
                    raise DiskFull(f"disk full while writing table {name} to {self._db_uri}: {kept}. Free space "
                                      "(`strata gc --keep N` drops old table versions) and run the same command "
                                      "again") from exc
        new_version = version if version is not None else (previous["version"] + 1 if previous else 1)
        return self._commit(new_version, run_id, kind, pins, dim, note)

    def _commit(self, version: int, run_id: str, kind: str, pins: dict[str, int], dim: int, note: str) -> int:
        row = {"version": version, "created_at": datetime.now(timezone.utc), "run_id": run_id, "kind": kind,
               "tables": json.dumps(pins, sort_keys=True), "dim": dim, "note": note}
        data = rows_to_table([row], _SNAPSHOT_SCHEMA)
        if self.has_table(SNAPSHOTS):
            self.db.open_table(SNAPSHOTS).add(data)  # the atomic commit point
        else:
            self.db.create_table(SNAPSHOTS, data=data)
        return version

    def rollback(self, to_version: int, run_id: str) -> int:
        """Publish a new snapshot that pins the table versions of snapshot ``to_version``: nothing is rewritten."""
        target = self.snapshot(to_version)
        latest = self.require_snapshot()
        return self._commit(latest["version"] + 1, run_id, "rollback", dict(target["tables"]), target["dim"],
                            json.dumps({**snapshot_note(target), "rollback_to": to_version}))

    def gc(self, keep: int) -> dict[str, Any]:
        """Keep the newest ``keep`` snapshots; drop the older ones and every table version older than the oldest
        version a kept snapshot pins (a pinned version is never removed; Lance keeps each table's latest)."""
        from datetime import timedelta

        snaps = self.snapshots()
        if keep < 1:
            raise ValueError("gc --keep must be at least 1: the latest snapshot is always kept")
        kept, dropped = snaps[-keep:], snaps[:-keep]
        removed: dict[str, int] = {}
        now = datetime.now(timezone.utc)
        for name in SNAPSHOT_TABLES:
            pinned = [s["tables"][name] for s in kept if name in s["tables"]]
            if not pinned or not self.has_table(name):
                continue
            tbl = self.db.open_table(name)
            stamps = {v["version"]: v["timestamp"] for v in tbl.list_versions()}
            oldest = stamps[min(pinned)]
            oldest = oldest if oldest.tzinfo else oldest.replace(tzinfo=timezone.utc)
            before = len(stamps)
            # a margin of a second: a version written just before the oldest pinned one survives, never the reverse
            tbl.optimize(cleanup_older_than=now - oldest + timedelta(seconds=1))
            removed[name] = before - len(tbl.list_versions())
        if dropped:
            self.db.open_table(SNAPSHOTS).delete(f"version < {kept[0]['version']}")
        return {"kept": [s["version"] for s in kept], "dropped": [s["version"] for s in dropped], "versions_removed": removed}

    # ------------------------------------------------------------------ run log
    def log_run(self, row: dict[str, Any]) -> None:
        data = rows_to_table([row], schema_for("runs", 0))
        if self.has_table("runs"):
            self.db.open_table("runs").add(data)
        else:
            self.db.create_table("runs", data=data)

    def finish_run(self, run_id: str, values: dict[str, Any]) -> None:
        tbl = self.db.open_table("runs")
        tbl.update(where=f"id = '{run_id}'", values=values)

    def runs(self, limit: int | None = None) -> list[dict[str, Any]]:
        tbl = self.open_table("runs")
        if tbl is None:
            return []
        rows = sorted(tbl.to_arrow().to_pylist(), key=lambda r: r["started_at"])
        return rows[-limit:] if limit else rows

    # ------------------------------------------------------------------ writer lock
    @contextlib.contextmanager
    def writer_lock(self, timeout_s: float = 0.0) -> Iterator[None]:
        """One writer per index: a second one waits up to ``timeout_s`` and then fails with a clear message."""
        if self.root is None:  # object storage: serialise with a Prefect concurrency limit instead
            yield
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
