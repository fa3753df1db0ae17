"""Past one machine: a real external Dask cluster (``dask scheduler`` and two ``dask worker`` processes on
127.0.0.1), the build's merge as tasks on it, the same tables as in-process, and a worker SIGKILLed mid-merge."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from distributed.diagnostics.plugin import WorkerPlugin

from tests.conftest import REPO
from tests.test_golden_tables import table_digests

STRATA = str(Path(sys.executable).parent / "strata")
SETS = ["--set", "chunking.size=200", "--set", "dask.part_rows=400"]  # ~12 spilled parts: a merge task each
S3_SETS = ["--set", "chunking.size=200", "--set", "dask.part_rows=2000"]  # ~3 parts: each S3 request ~15 ms on moto


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def external_cluster(env: dict[str, str]):
    """A scheduler and two workers (each under its nanny, which restarts a killed worker), as separate processes
    with the environment ``env``."""
    from distributed import Client

    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    dask = str(Path(sys.executable).parent / "dask")
    quiet: dict[str, Any] = {"env": dict(env, PYTHONPATH=str(REPO)), "cwd": REPO, "stdout": subprocess.DEVNULL,
                             "stderr": subprocess.DEVNULL}
    procs = [
        subprocess.Popen([dask, "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"], **quiet)
    ]
    worker = [dask, "worker", address, "--nthreads", "1", "--no-dashboard", "--host", "127.0.0.1"]
    try:
        for _ in range(2):
            procs.append(subprocess.Popen([*worker, "--memory-limit", "2GiB"], **quiet))
        with Client(address, timeout="60s") as client:
            client.wait_for_workers(2, timeout=120)
        yield address
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)


@pytest.fixture(scope="module")
def cluster():
    with external_cluster(dict(os.environ)) as address:
        yield address


def assert_same_tables(index: Path, reference: Path, drop: tuple[str, ...] = ()) -> None:
    """Every table row for row (but ``drop``), the mentions and the description state as sets: they are stored in
    the order of their spilled parts, which ``dask.part_rows`` sets (the reference has one part, the cluster runs a
    dozen)."""
    from tasks.store.catalog import Catalog

    got, want = table_digests(index, drop), table_digests(reference, drop)
    as_sets = ("mentions", "merge_state")
    assert {k: v for k, v in got.items() if k not in as_sets} == {k: v for k, v in want.items() if k not in as_sets}
    for name in as_sets:
        a, b = (Catalog(i).read(name, snap=Catalog(i).require_snapshot()) for i in (index, reference))
        assert a.num_rows > 0 and a.sort_by("id").equals(b.sort_by("id"))


def _strata(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [STRATA, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, **(env or {}), PYTHONPATH=str(REPO)),
    )


@pytest.fixture(scope="module")
def in_process(tmp_path_factory, small_corpus):
    """The reference: the small corpus built with every stage in this process (no Dask), the default parts."""
    from flows.pipeline import build_index
    from schemas.config import load_config
    from tasks.store.catalog import Catalog

    index = tmp_path_factory.mktemp("direct") / "index"
    build_index(str(small_corpus), Catalog(index), load_config(overrides={"chunking": {"size": 200}}))
    return index


@pytest.mark.slow
def test_tables_are_the_same_in_process_on_the_local_cluster_and_on_an_external_one(
    tmp_path, small_corpus, in_process, cluster
):
    local, external = tmp_path / "local", tmp_path / "external"
    # dask.min_chunks=0: the small corpus on a local cluster (it would run in the CLI's process otherwise)
    res = _strata("index", str(small_corpus), "--index", str(local), *SETS, "--set", "dask.min_chunks=0")
    assert res.returncode == 0, res.stderr
    res = _strata("index", str(small_corpus), "--index", str(external), *SETS, "--set", f"dask.address={cluster}")
    assert res.returncode == 0, res.stderr
    # a successful run logs no errors and no warnings: neither Dask's (worker heartbeats, lost connections, a
    # large graph), Prefect's nor Lance's
    noise = ("ERROR", "Traceback", "WARN", "large graph")
    assert not [line for line in (res.stdout + res.stderr).splitlines() if any(n in line for n in noise)]
    from distributed import Client

    with Client(cluster, timeout="60s") as client:  # the workers loaded the embedding model; the run did not need to
        assert all(
            client.run(
                lambda: (
                    "tasks.index.embed" in sys.modules
                    and __import__("tasks.index.embed").index.embed._local.cache_info().currsize > 0
                )
            ).values()
        )
        # each worker's model on its share of the machine's cores: two one-thread workers here, a core each at least
        from tasks.runtime.process import usable_cpus

        shares = client.run(lambda: __import__("tasks.runtime.process").runtime.process.task_threads())
        assert list(shares.values()) == [max(1, usable_cpus() // 2)] * 2
    # every id and row equal whatever ran the merge, in how many parts; the local cluster's vectors too (the
    # model runs in this machine's run process either way); the external workers embed with one thread each, so
    # their vectors may differ in the last bits
    assert_same_tables(local, in_process)
    assert_same_tables(external, in_process, ("vector",))
    from tasks.store.catalog import Catalog

    a_cat, b_cat = Catalog(in_process), Catalog(external)
    for name in ("chunks", "entities", "community_reports"):
        a, b = (c.read(name, snap=c.require_snapshot()) for c in (a_cat, b_cat))
        va, vb = (np.array(t.column("vector").to_pylist(), dtype=np.float32) for t in (a, b))
        assert va.shape == vb.shape and float(np.min(np.sum(va * vb, axis=1))) > 0.999, name


class KillOnce(WorkerPlugin):
    """SIGKILL the worker process (as the OOM killer would) the first time a task of each of ``tasks`` starts on
    it, once per kind across the cluster (a marker file per kind says it happened)."""

    def __init__(self, tasks: list[str], markers: str):
        self.tasks, self.markers = tasks, markers

    def transition(self, key, start, finish, **kwargs):
        if finish != "executing":
            return
        for task in self.tasks:
            if str(key).startswith(task):
                try:
                    os.close(os.open(os.path.join(self.markers, task), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                except FileExistsError:
                    return
                os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.parametrize(
    "tasks",
    [  # every stage that runs on the workers, a kill each, in two builds (each kill costs a worker restart)
        ["batch_mentions", "gather_part", "merge_relations", "sort_entities", "communities_task", "summary_task", "check_part"],
        ["merge_entities", "sort_relations", "local_task", "reports_task", "write_part"],
    ],
)
def test_a_worker_killed_mid_stage_costs_a_retry_not_the_run(tmp_path, small_corpus, in_process, cluster, tasks):
    from distributed import Client

    markers = tmp_path / "killed"
    markers.mkdir()
    with Client(cluster, timeout="60s") as client:
        client.register_plugin(KillOnce(tasks, str(markers)), name="kill")
        try:
            res = _strata(
                "index",
                str(small_corpus),
                "--index",
                str(tmp_path / "index"),
                *SETS,
                "--set",
                f"dask.address={cluster}",
            )
        finally:
            client.unregister_worker_plugin("kill")
        client.wait_for_workers(2, timeout=120)  # the nannies brought the killed workers back
    assert sorted(p.name for p in markers.iterdir()) == sorted(tasks), "a kind of task never ran on the cluster"
    assert res.returncode == 0, res.stderr
    # the tables an undisturbed run publishes: no row lost, none twice
    assert_same_tables(tmp_path / "index", in_process, ("vector",))


@pytest.mark.slow
def test_an_index_on_s3_keeps_the_work_folder_under_its_uri_for_the_workers_to_reach(
    tmp_path, small_corpus, in_process, s3_server, monkeypatch
):
    """An external cluster's workers reach an index on object storage only through the store: its work folder
    goes under the index URI (``<index>/_work/<run>``), read and written by the run and the workers through their
    own credentials, and is gone when the run ends; the tables are the in-process build's. Workers that cannot
    reach the store stop the run before extraction (exit 2), naming the folder."""
    from tests.s3_server import bucket_name

    env = {**s3_server.env(), "STRATA_HOME": str(tmp_path / "home")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    bucket = s3_server.create_bucket(bucket_name())
    uri = f"s3://{bucket}/idx"
    with external_cluster(dict(os.environ)) as address:
        res = _strata("index", str(small_corpus), "--index", uri, *S3_SETS, "--set", f"dask.address={address}", env=env)
    assert res.returncode == 0, res.stderr
    noise = ("ERROR", "Traceback", "WARN", "large graph")
    assert not [line for line in (res.stdout + res.stderr).splitlines() if any(n in line for n in noise)]
    assert_same_tables(uri, in_process, ("vector",))
    objects = s3_server.objects(bucket, "idx/")
    assert not [k for k in objects if k.startswith("idx/_work/")], "the run's work folder outlived the run"
    assert not list((tmp_path / "home").rglob("spill")), "the work folder went to the run's machine"
    # workers whose store is elsewhere (here: nowhere) cannot read what the run writes there: refused up front
    blind = dict(os.environ, AWS_ENDPOINT_URL=f"http://127.0.0.1:{_free_port()}", STRATA_STORAGE__MAX_RETRIES="0")
    with external_cluster(blind) as address:
        res = _strata("index", str(small_corpus), "--index", uri, *S3_SETS, "--set", f"dask.address={address}", env=env)
    assert res.returncode == 2, res.stderr
    assert f"cannot reach the run's work folder {uri}/_work/" in res.stderr and "credentials" in res.stderr


@pytest.mark.slow
def test_communities_over_parts_on_the_cluster_survive_a_killed_task_and_cover_every_entity(
    tmp_path, small_corpus, in_process, cluster
):
    """``communities.engine = "parts"`` on the external cluster, a round's task and a bucket's task each killed once:
    the run publishes, every table but the communities and their reports is the one-Leiden-task build's, and every
    entity is in exactly one level-0 community whose descendants hold only its members."""
    from distributed import Client

    from tasks.store.catalog import Catalog

    markers = tmp_path / "killed"
    markers.mkdir()
    parts = ["--set", "communities.engine=parts", "--set", "communities.part_relations=150"]
    with Client(cluster, timeout="60s") as client:
        client.register_plugin(KillOnce(["moves_task", "rows_task"], str(markers)), name="kill")
        try:
            index = tmp_path / "index"
            address = ["--set", f"dask.address={cluster}"]
            res = _strata("index", str(small_corpus), "--index", str(index), *SETS, *parts, *address)
        finally:
            client.unregister_worker_plugin("kill")
        client.wait_for_workers(2, timeout=120)
    assert sorted(p.name for p in markers.iterdir()) == ["moves_task", "rows_task"]
    assert res.returncode == 0, res.stderr
    got, want = table_digests(index, ("vector",)), table_digests(in_process, ("vector",))
    other = {"communities", "community_reports", "mentions", "merge_state"}  # the last two: by set, other tests
    assert {k: v for k, v in got.items() if k not in other} == {k: v for k, v in want.items() if k not in other}
    cat = Catalog(index)
    snap = cat.require_snapshot()
    comms = cat.read("communities", snap=snap).to_pylist()
    entities = cat.read("entities", snap=snap, columns=["id"]).column("id").to_pylist()
    level0 = [e for c in comms if c["level"] == 0 for e in c["entity_ids"]]
    assert sorted(level0) == sorted(entities)
    by_id = {c["id"]: c for c in comms}
    assert all(set(c["entity_ids"]) <= set(by_id[c["parent_id"]]["entity_ids"]) for c in comms if c["level"] > 0)
    assert cat.read("community_reports", snap=snap).num_rows == len(comms)
