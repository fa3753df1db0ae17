"""An index on Google Cloud Storage (``gs://``) of a local stand-in for GCS (``tests/gcs_server.py``): real LanceDB
writes over GCS's XML API on 127.0.0.1, and the writer lock on GCS's generation preconditions through
google-cloud-storage — concurrent writers lose no commit, a second writer is refused or waits, a stale lock is taken
over and its holder cannot commit, the heartbeat keeps a live one; throttling and dropped connections cost retries,
not the snapshot."""

from __future__ import annotations

import json
import uuid

import pytest

from schemas.config import StorageConfig
from tasks.errors import UsageError
from tasks.store.leases import Conflict, GCSLease, _gcs_bucket, lease_for
from tests.helpers import (
    heartbeat_keeps_the_lock,
    publish_concurrently,
    publish_through_faults,
    refused_then_waits,
    take_over_a_stale_lock,
)
from tests.s3_server import Fault, fault_proxy


def _index(gcs_server, endpoint: str = "", **settings) -> tuple[str, StorageConfig]:
    bucket = gcs_server.create_bucket(f"b{uuid.uuid4().hex[:12]}")
    return f"gs://{bucket}/idx", StorageConfig(options=gcs_server.options(endpoint), **settings)


def test_the_gcs_lock_reads_the_settings_lancedb_reads_and_says_what_is_missing(tmp_path, monkeypatch):
    """``storage.options`` (a key's JSON, or its path) first, then the GOOGLE_* variables; a key that cannot be
    read, or no credential at all, is a usage error naming what to set; an emulator's key (``gcs_base_url``,
    ``disable_oauth``) is honoured."""
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    key = {"gcs_base_url": "http://h:1", "disable_oauth": True, "client_email": "", "private_key": ""}
    bucket = _gcs_bucket("gs://bk/idx", StorageConfig(options={"google_service_account_key": json.dumps(key)}), {})
    assert (bucket.name, bucket.client._connection.API_BASE_URL) == ("bk", "http://h:1")
    path = tmp_path / "key.json"
    path.write_text(json.dumps({**key, "gcs_base_url": "http://h:2"}))
    bucket = _gcs_bucket("gs://bk", StorageConfig(), {"GOOGLE_SERVICE_ACCOUNT": str(path)})
    assert bucket.client._connection.API_BASE_URL == "http://h:2"
    bucket = _gcs_bucket("gs://bk", StorageConfig(options={"service_account_path": str(path)}), {})
    assert bucket.client._connection.API_BASE_URL == "http://h:2"
    with pytest.raises(UsageError, match="cannot be read"):
        _gcs_bucket("gs://bk", StorageConfig(options={"google_service_account": str(tmp_path / "none.json")}), {})
    with pytest.raises(UsageError, match="cannot be read"):
        _gcs_bucket("gs://bk", StorageConfig(options={"google_service_account_key": "{not json"}), {})

    def no_default_credentials(**kwargs):
        raise DefaultCredentialsError("none found")

    monkeypatch.setattr(google.auth, "default", no_default_credentials)
    with pytest.raises(UsageError, match=r"storage.options.google_service_account .* storage.writer_lock"):
        _gcs_bucket("gs://bk", StorageConfig(), {})
    assert isinstance(lease_for("gs://bk/a/b", StorageConfig(options={"google_service_account_key": json.dumps(key)})),
                      GCSLease)


def test_gcs_preconditions_hold_for_the_lock_object(gcs_server):
    """Create, replace and delete each hold only for the generation they name: the second create and a replace of
    a stale generation are conflicts and change nothing."""
    uri, storage = _index(gcs_server)
    first, second = GCSLease(uri, storage), GCSLease(uri, storage)
    generation = first._create(b'{"token": "a"}')
    with pytest.raises(Conflict):
        second._create(b'{"token": "b"}')
    newer = first._replace(b'{"token": "a2"}', generation)
    assert int(newer) > int(generation)
    with pytest.raises(Conflict):
        second._replace(b'{"token": "b"}', generation)
    read = second._read()
    assert read is not None and read[0] == newer and read[1] == {"token": "a2"} and -1 < read[2] < 5
    with pytest.raises(Conflict):
        second._delete(generation)
    first._delete(newer)
    assert second._read() is None and gcs_server.objects(uri.split("/")[2]) == []


def test_concurrent_writers_on_gcs_lose_no_commit_and_mix_none(gcs_server):
    """Three writers publish two snapshots each through the lock: six snapshots, versions 1..6, each one's tables
    exactly those its writer wrote; the lock object is gone at the end."""
    uri, storage = _index(gcs_server, lock_ttl_s=10)
    publish_concurrently(uri, storage)
    assert not gcs_server.objects(uri.split("/")[2], "idx/.writer.lock")


def test_a_second_gcs_writer_is_refused_then_waits_and_a_stale_lock_is_taken_over(gcs_server):
    uri, storage = _index(gcs_server, lock_ttl_s=3)
    refused_then_waits(GCSLease, uri, storage)
    assert not gcs_server.objects(uri.split("/")[2], "idx/.writer.lock")  # released

    take_over_a_stale_lock(uri, storage)


def test_the_heartbeat_keeps_a_live_gcs_lock(gcs_server):
    heartbeat_keeps_the_lock(*_index(gcs_server, lock_ttl_s=3))


def test_throttling_and_dropped_connections_on_gcs_cost_retries_not_the_snapshot(gcs_server):
    """Through a proxy in front of the store that fails requests by what they are (``tests/s3_server.py``): a
    manifest write throttled, a data file's connection reset before the store has it, a manifest read dropped, the
    writer lock's create throttled, then done with its answer lost. The publish retries and lands: one snapshot,
    its own tables."""
    with fault_proxy(gcs_server.port) as proxy:
        uri, storage = _index(gcs_server, f"http://127.0.0.1:{proxy.server_address[1]}")
        rules = [
            Fault("PUT", "/_versions/", "503"),
            Fault("PUT", "/data/", "drop"),
            Fault("GET", "/_versions/", "drop"),
            Fault("POST", r"^/upload/storage/v1/b/[^/]+/o$", "503"),  # the lock's create, throttled
            Fault("POST", r"^/upload/storage/v1/b/[^/]+/o$", "lost"),  # then done, its answer lost: the retry is
            # refused (412) and the lock read back as this writer's own
        ]
        publish_through_faults(uri, storage, proxy.faults, rules)
