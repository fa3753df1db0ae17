"""An index on Azure Blob Storage (``az://``) of Azurite, the Azure Storage emulator: real LanceDB writes over HTTP on
127.0.0.1, and the writer lock on Azure's ETag preconditions — concurrent writers lose no commit, a second writer
is refused or waits, a stale lock is taken over and its holder cannot commit, the heartbeat keeps a live one;
throttling and dropped connections cost retries, not the snapshot."""

from __future__ import annotations

import uuid

import pytest

from schemas.config import StorageConfig
from tasks.errors import UsageError
from tasks.store.leases import AzureLease, _azure_client, azure_location
from tests.helpers import (
    heartbeat_keeps_the_lock,
    publish_concurrently,
    publish_through_faults,
    refused_then_waits,
    take_over_a_stale_lock,
)
from tests.s3_server import Fault, fault_proxy


def _index(azurite, **settings) -> tuple[str, StorageConfig]:
    container = azurite.create_container(f"c{uuid.uuid4().hex[:12]}")
    return f"az://{container}/idx", StorageConfig(options=azurite.options(), **settings)


def test_the_lock_location_is_read_off_every_azure_uri_form():
    assert azure_location("az://cont/a/b") == ("cont", None, "a/b")
    assert azure_location("abfss://cont@acct.dfs.core.windows.net/idx") == ("cont", "acct", "idx")
    assert azure_location("azure://cont") == ("cont", None, "")


def test_the_azure_lock_reads_the_settings_lancedb_reads_and_says_what_is_missing():
    """``storage.options`` first, then AZURE_STORAGE_* variables; the account may come from an abfss:// URI; no
    account, or no key or SAS token, is a usage error naming the setting (no request is made)."""
    with pytest.raises(UsageError, match="azure_storage_account_name"):
        _azure_client("az://cont/idx", StorageConfig(), environ={})
    with pytest.raises(UsageError, match="azure_storage_account_key or azure_storage_sas_token"):
        _azure_client("abfss://cont@acct.dfs.core.windows.net/idx", StorageConfig(), environ={})
    client = _azure_client(
        "az://cont/idx", StorageConfig(), environ={"AZURE_STORAGE_ACCOUNT_NAME": "acct", "AZURE_STORAGE_SAS_TOKEN": "sv=x"}
    )
    assert (client.url, client.container_name, client.blob_name) == (
        "https://acct.blob.core.windows.net/cont/idx/.writer.lock?sv=x",  # the SAS token signs the URL
        "cont",
        "idx/.writer.lock",
    )
    options = {"azure_storage_account_name": "dev", "azure_storage_account_key": "a2V5", "azure_storage_endpoint": "http://h:1/dev"}
    client = _azure_client("az://cont", StorageConfig(options=options), environ={})
    assert client.url == "http://h:1/dev/cont/.writer.lock"


def test_concurrent_writers_on_azure_lose_no_commit_and_mix_none(azurite):
    """Three writers publish two snapshots each through the lock: six snapshots, versions 1..6, each one's tables
    exactly those its writer wrote; the lock object is gone at the end."""
    uri, storage = _index(azurite, lock_ttl_s=10)
    publish_concurrently(uri, storage)
    assert not azurite.blobs(uri.split("/")[2], "idx/.writer.lock")


def test_a_second_azure_writer_is_refused_then_waits_and_a_stale_lock_is_taken_over(azurite):
    uri, storage = _index(azurite, lock_ttl_s=3)
    refused_then_waits(AzureLease, uri, storage)
    assert not azurite.blobs(uri.split("/")[2], "idx/.writer.lock")  # released

    take_over_a_stale_lock(uri, storage)


def test_the_heartbeat_keeps_a_live_azure_lock(azurite):
    heartbeat_keeps_the_lock(*_index(azurite, lock_ttl_s=3))


def test_throttling_and_dropped_connections_on_azure_cost_retries_not_the_snapshot(azurite):
    """Through a proxy in front of Azurite that fails requests by what they are (``tests/s3_server.py``): a
    manifest write throttled, a data file's connection reset before the store has it, a manifest read dropped, the
    writer lock's lease throttled. The publish retries and lands: one snapshot, its own tables."""
    with fault_proxy(azurite.port) as proxy:
        container = azurite.create_container(f"c{uuid.uuid4().hex[:12]}")
        storage = StorageConfig(options=azurite.options(f"http://127.0.0.1:{proxy.server_address[1]}/devstoreaccount1"))
        rules = [
            Fault("PUT", "/_versions/", "503"),
            Fault("PUT", "/data/", "drop"),
            Fault("GET", "/_versions/", "drop"),
            Fault("PUT", r"\.writer\.lock", "503"),
        ]
        publish_through_faults(f"az://{container}/idx", storage, proxy.faults, rules)
