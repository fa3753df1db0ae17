"""Indexes on object storage: every command on an ``s3://`` index of moto's S3 server (real LanceDB writes over
HTTP on 127.0.0.1), the tables identical to the same build on local disk (``file://``); the writer lock on S3;
throttling and dropped connections during a publish."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from flows.cli import app
from schemas.config import StorageConfig, load_config
from schemas.tables import SNAPSHOT_TABLES
from tasks.errors import EXIT_CODES, StoreUnavailable, UsageError
from tasks.store.catalog import Catalog
from tasks.store.leases import S3Lease
from tasks.store.remote import storage_options
from tests.conftest import SMALL
from tests.helpers import (
    heartbeat_keeps_the_lock,
    publish_concurrently,
    publish_through_faults,
    take_over_a_stale_lock,
    tiny_tables,
)
from tests.s3_server import FAKE_CREDENTIALS, Fault, bucket_name

runner = CliRunner()
OVERRIDES = {"chunking": SMALL["chunking"], "extract": SMALL["extract"], "dask": SMALL["dask"]}
#: columns that differ between two builds of the same corpus whatever the location: when, and how long
VOLATILE = {"documents": ["ingested_at"], "layers": ["seconds"]}


def _sets(overrides: dict) -> list[str]:
    return [a for section, values in overrides.items() for k, v in values.items()
            for a in ("--set", f"{section}.{k}={json.dumps(v)}")]


def _invoke(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def _tables(cat: Catalog, as_of: int | None = None) -> dict:
    snap = cat.require_snapshot(as_of)
    return {name: cat.read(name, snap=snap).drop(VOLATILE.get(name, [])) for name in SNAPSHOT_TABLES}


def _assert_same_tables(a: Catalog, b: Catalog, as_of_a: int | None = None, as_of_b: int | None = None) -> None:
    ta, tb = _tables(a, as_of_a), _tables(b, as_of_b)
    for name in SNAPSHOT_TABLES:
        assert ta[name].column_names == tb[name].column_names, name
        assert ta[name].equals(tb[name]), f"{name} differs between {a.uri} and {b.uri}"


@pytest.fixture(scope="module")
def s3_env(s3_server):
    """The usual AWS variables, pointing at the test server (and nothing else of the developer's)."""
    with pytest.MonkeyPatch.context() as mp:
        for key in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION"):
            mp.delenv(key, raising=False)
        for key, value in s3_server.env().items():
            mp.setenv(key, value)
        yield s3_server


@pytest.fixture(scope="module")
def built(s3_env, small_corpus, tmp_path_factory):
    """The small corpus indexed through the CLI twice: on S3 and on local disk given as a file:// URI."""
    bucket = s3_env.create_bucket(bucket_name())
    uri = f"s3://{bucket}/team/idx"
    local = "file://" + str(tmp_path_factory.mktemp("s3cmp") / "local")
    for index in (uri, local):
        res = _invoke("index", small_corpus, "--index", index, "--quiet", *_sets(OVERRIDES))
        assert res.exit_code == 0, res.output
        assert "published snapshot v1" in res.output
    return {"uri": uri, "bucket": bucket, "local": local, "server": s3_env}


def test_index_on_s3_gives_the_tables_of_a_local_build_and_keeps_secrets_and_caches_out(built):
    server, bucket = built["server"], built["bucket"]
    s3, local = Catalog(built["uri"]), Catalog(built["local"])
    _assert_same_tables(s3, local)
    keys = server.objects(bucket)
    assert keys and all(k.startswith("team/idx/lance/") for k in keys), sorted(keys)[:5]  # no lock left, no caches
    # the caches are local, under $STRATA_HOME/cache, one folder per index
    assert s3.cache_dir.parent == Path(__import__("os").environ["STRATA_HOME"]) / "cache"
    assert (s3.cache_dir / "embeddings.sqlite").exists()
    # nothing secret in any object of the index (the run's recorded parameters included)
    client = server.client()
    for key in keys:
        body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        assert FAKE_CREDENTIALS["AWS_SECRET_ACCESS_KEY"].encode() not in body, key
        assert FAKE_CREDENTIALS["AWS_ACCESS_KEY_ID"].encode() not in body, key
    run = s3.runs()[-1]
    assert run["status"] == "published" and json.loads(run["parameters"])["index"] == built["uri"]
    inspected = {}
    for where in ("uri", "local"):
        res = _invoke("inspect", "--index", built[where], "--json")
        assert res.exit_code == 0, res.output
        inspected[where] = json.loads(res.stdout)
    assert inspected["uri"]["tables"] == inspected["local"]["tables"] and inspected["uri"]["version"] == 1


def test_query_and_serve_on_s3_answer_as_on_local_disk(built):
    answers = {}
    for where in ("uri", "local"):
        res = _invoke("query", "Who was Scrooge's clerk?", "--index", built[where], "--json", *_sets(OVERRIDES))
        assert res.exit_code == 0, res.output
        data = json.loads(res.stdout)
        answers[where] = ([c["id"] for c in data["chunks"]], data["answer"]["text"], data["version"])
    assert answers["uri"] == answers["local"] and answers["uri"][2] == 1
    views = Catalog(built["uri"], create=False).cache_dir / "views"
    assert (views / "head.json").exists()  # a remote index's view is left in the local cache, for the next query
    from tasks.retrieval import view as views_module

    views_module._VIEWS.clear()  # the next process: the view from the local cache, after one LIST request
    assert views_module.load_view(Catalog(built["uri"], create=False)).from_disk
    with TestClient(create_app(built["uri"])) as client:
        res = client.post("/query", json={"question": "Who was Scrooge's clerk?", "mode": "hi"})
        assert res.status_code == 200, res.text
        assert res.json()["version"] == 1 and res.json()["chunks"]
        assert client.get("/snapshots").status_code == 200


def create_app(index: str):
    from flows.serve import create_app as make

    return make(index, load_config(overrides={**OVERRIDES, "serve": {"auth": "none"}}))


@pytest.mark.slow
def test_update_validate_export_rollback_and_gc_on_s3(built, small_corpus, tmp_path):
    """``strata update`` on S3 while the store throttles (503 SlowDown) or drops the connection (before or after doing
    it) of manifest, data-file and transaction writes, of reads and of a listing: retried, published, the same tables
    as the update on local disk; then validate, export, rollback and gc."""
    corpus = tmp_path / "corpus"
    shutil.copytree(small_corpus, corpus)
    (corpus / "notes" / "fezziwig.md").write_text(
        "# Fezziwig\n\nOld Fezziwig kept a warehouse in London where young Ebenezer Scrooge was apprenticed. "
        "Fezziwig gave a Christmas Eve ball for his apprentices, Dick Wilkins and Scrooge.\n", encoding="utf-8")
    faults = built["server"].faults
    rules = [  # by what each request is (``Fault``), not by its place in the stream
        Fault("PUT", "/_versions/", "503", times=2), Fault("PUT", "/_versions/", "lost"),
        Fault("PUT", "/data/", "drop", times=2), Fault("PUT", "/_transactions/", "lost"),
        Fault("GET", "/data/", "503", times=2, after=1), Fault("GET", "/_versions/", "drop", times=2),
        Fault("HEAD", "/_versions/", "503"), Fault("GET", r"^/[^/]+/?$", "drop"),
    ]
    for where in ("uri", "local"):
        faults.rules = rules if where == "uri" else []
        try:
            res = _invoke("update", corpus, "--index", built[where], "--replace-root", small_corpus, "--quiet",
                          *_sets(OVERRIDES))
        finally:
            faults.off()
        assert res.exit_code == 0, res.output
    assert [r.fired for r in rules] == [r.times for r in rules], [(r.method, r.path, r.seen) for r in rules]
    s3, local = Catalog(built["uri"]), Catalog(built["local"])
    assert [s["version"] for s in s3.snapshots()] == [1, 2]
    _assert_same_tables(s3, local)
    res = _invoke("validate", "--index", built["uri"])
    assert res.exit_code == 0 and "all expectations passed" in res.output, res.output
    for where in ("uri", "local"):
        res = _invoke("export", "--index", built[where], "--out", tmp_path / where)
        assert res.exit_code == 0, res.output
    for name in ("documents", "entities", "relations", "communities"):
        a, b = pq.read_table(tmp_path / "uri" / f"{name}.parquet"), pq.read_table(tmp_path / "local" / f"{name}.parquet")
        drop = VOLATILE.get(name, [])
        assert a.drop(drop).equals(b.drop(drop)), name
    res = _invoke("rollback", "--index", built["uri"], "--to", "1")
    assert res.exit_code == 0 and "snapshot v3 published" in res.output, res.output
    _assert_same_tables(Catalog(built["uri"]), local, None, 1)
    time.sleep(1.1)  # gc keeps what was written within a second of a pinned version
    res = _invoke("gc", "--index", built["uri"], "--keep", "1")
    assert res.exit_code == 0, res.output
    s3 = Catalog(built["uri"])
    assert [s["version"] for s in s3.snapshots()] == [3]
    _assert_same_tables(s3, local, None, 1)  # v3 pins v1's table versions: gc kept every one of them
    assert not s3.verify(s3.snapshot())
    assert _invoke("validate", "--index", built["uri"]).exit_code == 0


@pytest.mark.slow
def test_an_update_in_child_processes_reads_the_index_on_s3(s3_env, small_corpus, tmp_path):
    """An update of a large index extracts and merges in child processes (``MERGE_IN_CHILD_ROWS``, here 0): the
    merge's child opens the S3 index again from what it is handed (``SnapshotReads``), and the tables are those of
    the same update in one process on local disk."""
    from unittest import mock

    from tasks.runtime import parallel

    uri, local, corpus = _fresh(s3_env), "file://" + str(tmp_path / "local"), tmp_path / "corpus"
    shutil.copytree(small_corpus, corpus)
    for index in (uri, local):
        assert _invoke("index", corpus, "--index", index, "--quiet", *_sets(OVERRIDES)).exit_code == 0
    (corpus / "notes" / "fezziwig.md").write_text(
        "# Fezziwig\n\nOld Fezziwig kept a warehouse in London where young Ebenezer Scrooge was apprenticed.\n",
        encoding="utf-8")
    with (
        mock.patch("tasks.index.merge.MERGE_IN_CHILD_ROWS", 0),
        mock.patch("tasks.runtime.parallel.in_child_process", wraps=parallel.in_child_process) as in_child,
    ):
        res = _invoke("update", corpus, "--index", uri, "--quiet", *_sets(OVERRIDES))
    assert res.exit_code == 0, res.output
    assert [c.args[0].__name__ for c in in_child.call_args_list] == ["update_layer0"]
    assert _invoke("update", corpus, "--index", local, "--quiet", *_sets(OVERRIDES)).exit_code == 0
    _assert_same_tables(Catalog(uri), Catalog(local))


# ---------------------------------------------------------------------------------------------- the writer lock
def _fresh(server, name: str = "idx") -> str:
    return f"s3://{server.create_bucket(bucket_name())}/{name}"


def test_gc_writes_a_tables_history_again_on_s3(s3_env):
    from tests.test_rollback_gc import _rows, _three_snapshots

    uri = _fresh(s3_env, "gc")
    cat = _three_snapshots(uri)
    before = {v: _rows(cat, v) for v in (2, 3)}
    res = _invoke("gc", "--index", uri, "--keep", "2")
    assert res.exit_code == 0 and "compacted: entities (4 rows no snapshot reads dropped)" in res.output, res.output
    cat = Catalog(uri)
    assert {v: _rows(cat, v) for v in (2, 3)} == before and not cat.verify(cat.snapshot())
    keys = [k for k in s3_env.objects(uri.split("/")[2]) if "/entities.lance/data/" in k]
    assert len(keys) == 3  # the rows the kept snapshots read, in three files; the old ones deleted


def test_a_second_writer_is_refused_with_exit_5_or_waits_for_the_first(s3_env):
    uri = _fresh(s3_env)
    Catalog(uri).publish(tiny_tables(1), "run-1", "full", 8)
    holder = S3Lease(uri, StorageConfig())
    holder.acquire()
    try:
        res = _invoke("rollback", "--index", uri, "--to", "1")
        assert res.exit_code == EXIT_CODES["refused"] == 5, res.output
        assert f"index {uri} is being written by pid" in res.output and "--lock-timeout" in res.output
        threading.Timer(1.5, holder.release).start()  # the first writer finishes meanwhile: the second one waits
        started = time.monotonic()
        res = _invoke("rollback", "--index", uri, "--to", "1", "--lock-timeout", "30")
        assert res.exit_code == 0 and "snapshot v2 published" in res.output, res.output
        assert 1.0 < time.monotonic() - started < 30
    finally:
        holder.release()
    assert [s["version"] for s in Catalog(uri).snapshots()] == [1, 2]
    assert not s3_env.objects(uri.split("/")[2], "idx/.writer.lock")  # released


def test_concurrent_writers_on_s3_lose_no_commit_and_mix_none(s3_env):
    """Three writers publish two snapshots each through the lock: six snapshots, versions 1..6, each one's
    tables exactly those its writer wrote."""
    publish_concurrently(_fresh(s3_env), StorageConfig(lock_ttl_s=10))


def test_a_stale_lock_is_taken_over_and_its_holder_cannot_commit(s3_env):
    take_over_a_stale_lock(_fresh(s3_env), StorageConfig(lock_ttl_s=3))


def test_the_heartbeat_keeps_a_live_lock(s3_env):
    heartbeat_keeps_the_lock(_fresh(s3_env), StorageConfig(lock_ttl_s=3))


# ---------------------------------------------------------------------------------------------- faults
def test_throttling_and_dropped_connections_during_a_publish_are_retried(s3_env):
    # by what each request is, not by its place in the stream (a read pattern that changes moves no fault)
    rules = [
        Fault("PUT", "/_versions/", "503"),  # a manifest, throttled
        Fault("PUT", "/_versions/", "lost"),  # the next manifest written, its answer lost (the table written again)
        Fault("PUT", "/data/", "drop"),  # a data file, its connection reset before the store has it
        Fault("PUT", "/_transactions/", "lost"),  # a transaction file written, its answer lost
        Fault("GET", "/_versions/", "drop"),  # a manifest read
        Fault("GET", "/data/", "503", after=1),  # a data file read (not the first)
        Fault("GET", r"^/[^/]+/?$", "drop"),  # a listing
        Fault("PUT", r"\.writer\.lock", "503"),  # the writer lock's lease
    ]
    publish_through_faults(_fresh(s3_env), None, s3_env.faults, rules)


def test_a_store_that_keeps_failing_stops_the_publish_with_a_clear_error_and_the_previous_snapshot_intact(s3_env):
    uri = _fresh(s3_env)
    Catalog(uri).publish(tiny_tables(1, suffix="-1"), "run-1", "full", 8)
    storage = StorageConfig(max_retries=1, retry_timeout_s=5)
    faults = s3_env.faults
    faults.every, faults.skip, faults.kinds, faults.methods = 1, 0, ("503", "drop"), ("PUT",)
    try:
        with pytest.raises(StoreUnavailable) as err:
            Catalog(uri, storage=storage).publish(tiny_tables(2, suffix="-2"), "run-2", "full", 8)
    finally:
        faults.off()
        faults.methods = ("GET", "PUT", "POST", "HEAD", "DELETE")
    assert err.value.exit_code == 5
    assert "kept failing while writing table" in str(err.value) and "snapshot v1 stays published" in str(err.value)
    cat = Catalog(uri)
    assert [s["version"] for s in cat.snapshots()] == [1]
    assert cat.read("entities").column("name").to_pylist()[0] == "Scrooge-1"
    assert not cat.verify(cat.snapshot())
    assert cat.publish(tiny_tables(2, suffix="-2"), "run-2", "full", 8) == 2  # the same publish, once it answers


# ---------------------------------------------------------------------------------------------- settings
def test_endpoint_region_and_credentials_come_from_settings_else_the_usual_variables():
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_DEFAULT_REGION": "eu-west-3", "AWS_ACCESS_KEY_ID": "env-id",
           "AWS_SECRET_ACCESS_KEY": "env-secret", "AWS_SESSION_TOKEN": "env-token"}
    opts = storage_options("s3://b/p", StorageConfig(), env)
    assert opts == {"client_max_retries": "10", "client_retry_timeout": "180", "aws_endpoint": "http://127.0.0.1:9",
                    "aws_region": "eu-west-3", "aws_access_key_id": "env-id", "aws_secret_access_key": "env-secret",
                    "aws_session_token": "env-token", "allow_http": "true"}
    cfg = load_config(environ={"STRATA_STORAGE__ENDPOINT": "https://minio.example:9000",
                               "STRATA_STORAGE__SECRET_ACCESS_KEY": "cfg-secret", "STRATA_STORAGE__MAX_RETRIES": "3"})
    opts = storage_options("s3://b/p", cfg.storage, {**env, "AWS_REGION": "us-west-2"})
    assert opts["aws_endpoint"] == "https://minio.example:9000" and "allow_http" not in opts
    assert opts["aws_secret_access_key"] == "cfg-secret" and opts["aws_region"] == "us-west-2"
    assert opts["client_max_retries"] == "3"
    assert "cfg-secret" not in json.dumps(cfg.fingerprint()) and "cfg-secret" not in repr(cfg)
    gcs = storage_options("gs://b/p", StorageConfig(options={"google_service_account": "/k.json"}), env)
    assert gcs == {"client_max_retries": "10", "client_retry_timeout": "180", "google_service_account": "/k.json"}


def test_set_never_puts_store_credentials_into_flow_parameters(monkeypatch):
    from flows.cli.common import overrides

    monkeypatch.delenv("STRATA_STORAGE__SECRET_ACCESS_KEY", raising=False)
    data = overrides(["storage.secret_access_key=s3cr3t", "storage.endpoint=http://127.0.0.1:9000"])
    assert data == {"storage": {"endpoint": "http://127.0.0.1:9000"}}
    assert load_config(overrides=data).storage.secret_access_key.get_secret_value() == "s3cr3t"  # by environment
    monkeypatch.delenv("STRATA_STORAGE__SECRET_ACCESS_KEY")


def test_remote_caches_go_to_the_cache_setting_and_other_stores_need_an_explicit_lock_choice(tmp_path):
    cat = Catalog("s3://bucket/a/b", storage=StorageConfig(cache_dir=str(tmp_path / "c")))
    assert cat.cache_dir == tmp_path / "c" / "s3_bucket_a_b"
    assert Catalog("file://" + str(tmp_path / "x")).cache_dir == tmp_path / "x" / "_cache"
    with pytest.raises(UsageError, match="writer_lock"):
        with Catalog("oss://bucket/idx", storage=StorageConfig()).writer_lock():
            pass
    with Catalog("oss://bucket/idx", storage=StorageConfig(writer_lock="off")).writer_lock():
        pass


def test_the_snapshots_head_is_read_off_the_manifest_names_locally_and_on_s3(s3_env, tmp_path):
    for cat in (Catalog(_fresh(s3_env)), Catalog(tmp_path / "idx")):
        assert cat.snapshots_head() is None
        cat.publish(tiny_tables(1), "run-1", "full", 8)
        first = cat.snapshots_head()
        assert first == cat.db.open_table("_snapshots").version
        cat.rollback(1, "rb")
        assert cat.snapshots_head() == first + 1
