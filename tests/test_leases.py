"""The writer lease's protocol (``tasks.store.leases.Lease``) on an in-memory store with exact preconditions: what a
write whose answer was lost leaves, checked without a network."""

from __future__ import annotations

import json

import pytest

from schemas.config import StorageConfig
from tasks.errors import LockTimeout
from tasks.store.leases import Conflict, Gone, Lease


class MemoryLease(Lease):
    """One object, ETags counted up; ``lose_next`` applies the next write and then answers as a retry of it would
    (the object exists now: ``Conflict``)."""

    store: dict = {}

    def __init__(self, storage: StorageConfig):
        super().__init__("mem://idx", storage)
        self.lose_next = False

    def _put(self, body: bytes, etag: str | None) -> str:
        current = self.store.get("lock")
        if (etag is None and current) or (etag not in (None, "*") and (not current or current[0] != etag)):
            raise Conflict("412")
        if etag == "*" and not current:
            raise Gone("404")
        new = f"e{len(self.store.setdefault('history', [])) + 1}"
        self.store["history"].append(new)
        self.store["lock"] = (new, json.loads(body), 0.0)
        if self.lose_next:
            self.lose_next = False
            raise Conflict("412: the retry of a write the store had applied")
        return new

    def _create(self, body: bytes) -> str:
        return self._put(body, None)

    def _replace(self, body: bytes, etag: str) -> str:
        return self._put(body, etag)

    def _read(self):
        return self.store.get("lock")

    def _delete(self, etag: str) -> None:
        if self.store.get("lock", ("",))[0] == etag:
            del self.store["lock"]


def test_a_lease_whose_create_answer_was_lost_is_held_and_counts_as_renewed():
    MemoryLease.store = {}
    lease = MemoryLease(StorageConfig(lock_ttl_s=30))
    lease.lose_next = True
    lease.acquire()
    try:
        assert lease.etag == MemoryLease.store["lock"][0]
        lease.check()  # held, renewed when the store wrote it: no "not renewed" before the first heartbeat
        with pytest.raises(LockTimeout, match="being written by pid"):
            MemoryLease(StorageConfig(lock_ttl_s=30)).acquire(0)
    finally:
        lease.release()
    assert "lock" not in MemoryLease.store
