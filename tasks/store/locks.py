"""One writer per index. A folder: an fcntl lock on ``<index>/.writer.lock`` naming its holder. s3://, gs://, az://,
abfs[s]://: a lease object written with a conditional write (``tasks.store.leases``), renewed while the run lasts
and checked before the snapshot commit.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from tasks.errors import LockTimeout, UsageError
from tasks.store.leases import Lease, lease_for

if TYPE_CHECKING:
    from schemas.config import StorageConfig


class Catalog(Protocol):
    """What a lock needs of an index's catalog (``tasks.store.catalog.Catalog``)."""

    root: Path | None
    uri: str

    @property
    def storage(self) -> StorageConfig: ...


@contextlib.contextmanager
def writer_lock(catalog: Catalog, timeout_s: float = 0.0) -> Iterator[Lease | None]:
    """One writer per index: a second one waits up to ``timeout_s`` and then fails with a clear message.
    A folder: an fcntl lock on ``<index>/.writer.lock``. Object storage: a lock object (``tasks.store.leases``)."""
    if catalog.root is None:
        yield from _remote_lock(catalog, timeout_s)
        return
    path = catalog.root / ".writer.lock"
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
                        f"index {catalog.uri} is being written by {holder}; waited {timeout_s:.0f}s "
                        "(raise --lock-timeout to wait longer)"
                    ) from None
                time.sleep(0.2)
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()} since {datetime.now(UTC).isoformat(timespec='seconds')}")
        fh.flush()
        yield None
    finally:
        fcntl.flock(fh, fcntl.LOCK_UN)
        fh.close()


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An fcntl lock on the file ``path`` (made when missing), waited for: one process of several (a service's
    workers) does what the others then read."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _remote_lock(catalog: Catalog, timeout_s: float) -> Iterator[Lease | None]:
    if catalog.storage.writer_lock == "off":
        yield None
        return
    lease = lease_for(catalog.uri, catalog.storage)
    if lease is None:
        raise UsageError(
            f"no writer lock for {catalog.uri.split('://')[0]}:// indexes (there is one for s3://, gs://, az:// "
            "and abfs[s]://): point --index at the store's S3-compatible endpoint (s3:// with storage.endpoint), or set "
            'storage.writer_lock = "off" when your writers are serialised otherwise (one deployment, a concurrency '
            "limit of 1)"
        )
    lease.acquire(timeout_s)
    try:
        yield lease
    finally:
        lease.release()
