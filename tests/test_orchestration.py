"""Data-engineering face: backfill with a failure and resume, serialized writers, lineage, an external Dask cluster."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import flows.index_flow as index_flow_module
from flows.cli import app, date_partitions
from schemas.config import DaskConfig
from tasks.store.catalog import Catalog
from tests.conftest import REPO, musique_passages

runner = CliRunner()
SETS = ["--set", "dask.processes=false", "--set", "chunking.size=200", "--set", "chunking.overlap=20"]


def _partitions(root: Path) -> list[Path]:
    rows = musique_passages(9)
    parts = []
    for i in range(3):
        p = root / f"2026-01-0{i + 1}"
        p.mkdir(parents=True)
        for r in rows[i * 3 : (i + 1) * 3]:
            (p / f"{r['id']}.txt").write_text(f"# {r['title']}\n\n{r['text']}\n")
        parts.append(p)
    return parts


def test_backfill_with_a_failed_partition_resumes_with_exactly_the_right_rows(tmp_path, monkeypatch):
    parts = _partitions(tmp_path / "corpus")
    index = tmp_path / "index"
    real = index_flow_module.update_index
    failed = []

    def flaky(corpus, *a, **kw):
        if corpus.endswith("2026-01-02") and not failed:
            failed.append(corpus)
            raise RuntimeError("injected failure in partition 2026-01-02")
        return real(corpus, *a, **kw)

    monkeypatch.setattr(index_flow_module, "update_index", flaky)
    args = ["backfill", *map(str, parts), "--index", str(index), *SETS]
    res = runner.invoke(app, args)
    assert res.exit_code == 1 and "injected failure" in res.output and "re-run the same command" in res.output
    cat = Catalog(index)
    assert cat.read("documents").num_rows == 3  # the first partition is in, nothing of the failed one
    runs = cat.runs()
    assert [r["status"] for r in runs] == ["published"]  # the injected failure happened before its run started
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    statuses = [(r["flow"].split(":")[-1][-10:], r["status"]) for r in Catalog(index).runs()]
    assert statuses[-3:] == [("2026-01-01", "nothing-to-do"), ("2026-01-02", "published"), ("2026-01-03", "published")]
    docs = Catalog(index).read("documents").to_pylist()
    assert sorted(d["source_id"] for d in docs) == sorted(f"{r['id']}.txt" for r in musique_passages(9))
    assert {d["root"] for d in docs} == {str(p.resolve()) for p in parts}
    assert runner.invoke(app, ["validate", "--index", str(index)]).exit_code == 0


def test_date_range_maps_to_folders():
    assert date_partitions("c/{date:%Y/%m/%d}", "2026-01-30", "2026-02-01") == ["c/2026/01/30", "c/2026/01/31", "c/2026/02/01"]
    with pytest.raises(ValueError):
        date_partitions("{date}", "2026-02-01", "2026-01-01")


def test_concurrent_writers_serialize(tmp_path, small_corpus):
    index = tmp_path / "index"
    cat = Catalog(index)
    with cat.writer_lock():  # another writer holds the index
        res = runner.invoke(app, ["update", str(small_corpus), "--index", str(index), "--quiet", *SETS])
    assert res.exit_code == 5 and "is being written by pid" in res.output
    assert Catalog(index).snapshot() is None  # nothing half-written

    lock = Catalog(index).writer_lock()
    lock.__enter__()
    threading.Timer(1.5, lambda: lock.__exit__(None, None, None)).start()
    t0 = time.perf_counter()
    res = runner.invoke(app, ["update", str(small_corpus), "--index", str(index), "--quiet", "--lock-timeout", "60", *SETS])
    assert res.exit_code == 0, res.output
    assert time.perf_counter() - t0 >= 1.4  # it waited for the first writer, then ran
    run = Catalog(index).runs()[-1]
    assert run["status"] == "published" and run["n_inputs"] == 15 and len(run["input_digest"]) == 64
    assert run["code_version"] and run["parameters"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_local_cluster_leaves_the_runs_environment_as_it_was(monkeypatch):
    """A Dask nanny writes its workers' settings (OMP_NUM_THREADS=1, MALLOC_TRIM_THRESHOLD_=65536) into the
    environment of the process that starts it; the run's later children (the embedding model's) must not inherit
    them, so the local cluster takes them back, while it runs and after it closes."""
    from tasks.runtime.parallel import _nanny_environ, dask_client

    names = _nanny_environ()
    assert {"OMP_NUM_THREADS", "MALLOC_TRIM_THRESHOLD_"} <= set(names)
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    before = {k: os.environ.get(k) for k in names}
    with dask_client(DaskConfig(n_workers=1, processes=True)) as client:
        assert client.submit(sum, [1, 2]).result() == 3
        assert {k: os.environ.get(k) for k in names} == before
    assert {k: os.environ.get(k) for k in names} == before


@pytest.mark.slow
def test_real_prefect_server_deploys_and_runs_a_refresh(tmp_path, small_corpus):
    """prefect server + a process worker on 127.0.0.1; deploy deployments/prefect.yaml; trigger a run; wait."""
    import urllib.request

    port = _free_port()
    bin_dir = Path(sys.executable).parent
    prefect = str(bin_dir / "prefect")
    env = dict(os.environ, PREFECT_HOME=str(tmp_path / "prefect-home"), PREFECT_API_URL=f"http://127.0.0.1:{port}/api",
               PREFECT_SERVER_ANALYTICS_ENABLED="false", DO_NOT_TRACK="1", STRATA_REPO=str(REPO),
               PREFECT_WORKER_QUERY_SECONDS="2", PREFECT_LOGGING_LEVEL="WARNING",
               PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", None)
    logs = tmp_path / "logs"
    logs.mkdir()
    procs = [subprocess.Popen([prefect, "server", "start", "--host", "127.0.0.1", "--port", str(port)], env=env,
                              stdout=open(logs / "server.log", "w"), stderr=subprocess.STDOUT)]
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, (logs / "server.log").read_text()[-3000:]
            time.sleep(1)

        def prefect_cli(*args):
            res = subprocess.run([prefect, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
            assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
            return res.stdout

        prefect_cli("work-pool", "create", "strata", "--type", "process")
        prefect_cli("--no-prompt", "deploy", "--all", "--prefect-file", "deployments/prefect.yaml")
        procs.append(subprocess.Popen([prefect, "worker", "start", "--pool", "strata", "--limit", "1"], env=env, cwd=REPO,
                                      stdout=open(logs / "worker.log", "w"), stderr=subprocess.STDOUT))
        index = tmp_path / "index"
        trigger = (
            "from prefect.deployments import run_deployment\n"
            f"fr = run_deployment('strata-refresh/nightly-refresh', parameters={{'corpus': {str(small_corpus)!r}, "
            f"'index': {str(index)!r}, 'overrides': {{'dask': {{'processes': False}}, 'chunking': {{'size': 300}}}}}}, "
            "timeout=900)\n"
            "print('STATE', fr.state.type.value)\n"
        )
        res = subprocess.run([sys.executable, "-c", trigger], env=env, cwd=REPO, capture_output=True, text=True, timeout=960)
        assert "STATE COMPLETED" in res.stdout, res.stdout[-2000:] + res.stderr[-2000:] + (logs / "worker.log").read_text()[-4000:]
        cat = Catalog(index)
        assert cat.snapshot()["version"] == 1 and cat.read("entities").num_rows > 0
        run = cat.runs()[-1]
        assert run["flow"] == "strata-refresh" and run["deployment"] == "nightly-refresh"
        assert "0 2 * * *" in prefect_cli("deployment", "inspect", "strata-refresh/nightly-refresh")  # the cron schedule
        prefect_cli("deployment", "inspect", "strata-refresh/full-rebuild")
        prefect_cli("deployment", "inspect", "strata-backfill/backfill")
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


SHARED_STAGES = ["ingest", "chunk", "extract", "merge", "embed", "communities", "reports", "validate", "publish"]


def _task_names(flow_run_id: str) -> set[str]:
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    async def read():
        async with get_client() as client:
            runs = await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
            return {r.name.rsplit("-", 1)[0] for r in runs}

    return asyncio.run(read())


def test_build_and_update_show_every_stage_as_a_prefect_task(tmp_path, small_corpus):
    import shutil

    corpus = tmp_path / "corpus"
    shutil.copytree(small_corpus, corpus)
    overrides = {"dask": {"processes": False}, "chunking": {"size": 300}}
    index = str(tmp_path / "index")
    built = index_flow_module.refresh_flow(str(corpus), index, None, overrides)
    (corpus / "notes" / "fezziwig.md").write_text("# Fezziwig\n\nOld Fezziwig employed young Ebenezer Scrooge.\n")
    updated = index_flow_module.refresh_flow(str(corpus), index, None, overrides)
    assert built["status"] == updated["status"] == "published"
    build_tasks = _task_names(built["run_id"].removeprefix("run-"))
    update_tasks = _task_names(updated["run_id"].removeprefix("run-"))
    assert build_tasks == set(SHARED_STAGES) | {"hierarchy"}
    assert update_tasks == set(SHARED_STAGES) | {"diff", "attach"}  # the update-only steps are named stages
    # the run record lists the same stages
    stages = json.loads(Catalog(index).runs()[-1]["stage_counts"])
    assert set(stages) - {"dask-start"} == update_tasks


def test_sigterm_ends_a_command_through_its_exit_handlers(tmp_path):
    """A SIGTERM'd command exits as Ctrl-C would, through the exit handlers: the one Prefect registers to stop
    the local server a run started runs too (Python's default handler would leave that server running)."""
    import signal
    import subprocess
    import sys

    mark = tmp_path / "stopped"
    code = (
        "import atexit, time; from flows.cli.common import exit_on_sigterm; exit_on_sigterm(); "
        f"atexit.register(lambda: open({str(mark)!r}, 'w').write('ok')); print('ready', flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM
    assert "terminated; the previous snapshot is still the published one" in out + err
    assert mark.read_text() == "ok"


def test_an_update_runs_at_a_lower_cpu_priority_set_once(monkeypatch):
    """``incremental.nice``: an update (and what it starts) runs niced, so a service beside it keeps its cores; a
    process cannot take its priority back, so a second update in it does not lower it again."""
    from types import SimpleNamespace

    import flows.pipeline as pipeline
    from schemas.config import load_config

    code = (
        "import os; from tasks.runtime.process import lower_priority; b = os.nice(0); lower_priority(b + 3); "
        "lower_priority(b + 3); a = os.nice(0); lower_priority(b + 1); print(a - b, os.nice(0) - b)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["3", "3"]
    seen: list[int] = []
    monkeypatch.setattr("tasks.runtime.process.lower_priority", seen.append)
    monkeypatch.setattr(pipeline, "_execute", lambda *_a, **_k: "ran")
    cfg = load_config(overrides={"incremental": {"nice": 7}})
    assert pipeline.update_index("corpus", SimpleNamespace(snapshot=lambda: None), cfg) == "ran"
    assert seen == [7]


def test_a_reader_runs_blas_on_one_thread_and_leaves_its_children_theirs(monkeypatch, tmp_path):
    """Opening a reader (``strata query``, ``shell``, ``eval``, each ``serve`` worker) limits BLAS to one thread in
    its process: a query's products are small, and a second BLAS thread only spun (Reader.ask on MuSiQue: 57-62 ->
    25 ms of CPU; ``strata eval`` on the subset: 41 -> 28 s). A process it starts (a build) keeps its default:
    the limit inherited by ``strata index`` changed its entity vectors' last bits."""
    from schemas.config import load_config
    from tasks.errors import IndexNotFound
    from tasks.query.reader import open_reader

    code = (
        "import os, subprocess, sys, numpy; from threadpoolctl import threadpool_info; "
        "from tasks.runtime.process import one_blas_thread; one_blas_thread(); "
        "blas = lambda: sorted({i['num_threads'] for i in threadpool_info() if i['user_api'] == 'blas'}); "
        "child = 'import os; print(os.environ.get(\"OPENBLAS_NUM_THREADS\"), os.environ.get(\"MKL_NUM_THREADS\"))'; "
        "print(blas(), subprocess.run([sys.executable, '-c', child], capture_output=True, text=True).stdout.strip())"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[1] None None", out.stdout  # this process's BLAS; nothing a child inherits
    seen: list[bool] = []
    monkeypatch.setattr("tasks.runtime.process.one_blas_thread", lambda with_scipy=True: seen.append(with_scipy))
    with pytest.raises(IndexNotFound):  # the limit is set first: cheap, and harmless where opening fails
        open_reader(str(tmp_path / "none"), load_config())
    assert seen == [False]  # numpy's BLAS only: a query calls no scipy BLAS, so it need not import scipy.linalg


def _plus_len(batch: int, rows: list[int]) -> int:
    return batch + len(rows)


def test_a_worker_reuses_large_buffers_within_an_embedding_or_extraction_task_and_hands_them_back_after_it():
    """A nanny starts its worker with ``MALLOC_TRIM_THRESHOLD_`` set, which fixes glibc's mmap threshold at 128 KiB:
    each 1 MiB buffer is mapped afresh, 256 new pages faulted in every time. Within ``large_buffers_reused`` (the
    embedding and extraction tasks) a freed buffer is reused, its pages faulted in once; after it what the block
    held at once (100 MiB) has gone back to the system."""
    from tasks.runtime.parallel import dask_client

    with dask_client(DaskConfig(n_workers=1, processes=True)) as client:
        assert list(client.run(os.getenv, "MALLOC_TRIM_THRESHOLD_").values()) == ["65536"]  # the nanny's setting
        faults = client.submit(_faults_and_memory_left, pure=False).result()
    before, within, left = faults
    assert before >= 100 * 256 and within < 10 * 256
    assert left < 20  # MB: without the trim after the block, the 64 MiB of its trim threshold would stay resident


def _faults_and_memory_left() -> tuple[int, int, float]:
    import numpy as np

    from tasks.runtime.process import large_buffers_reused
    from tasks.runtime.stages import memory

    before = _page_faults_of_1mib_buffers()
    resident = memory()["rss_mb"]
    with large_buffers_reused():
        within = _page_faults_of_1mib_buffers()
        held = [np.ones(2**20, dtype=np.uint8) for _ in range(100)]
        del held
    return before, within, memory()["rss_mb"] - resident


def _page_faults_of_1mib_buffers(times: int = 100) -> int:
    import resource

    import numpy as np

    start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(times):
        np.ones(2**20, dtype=np.uint8).sum()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start


def test_a_large_keyword_argument_reaches_every_task_on_a_cluster():
    """distributed makes a ``Client.map`` keyword over 100 kB a graph node named after the keyword, which its
    scheduler fails to run; ``map_batches`` scatters such a value first (layer 1's sample rows at 20k chunks)."""
    from distributed import Client, LocalCluster

    from tasks.runtime.parallel import map_batches

    rows = list(range(50_000))  # ~1.8 MB
    with (
        LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        assert map_batches(client, _plus_len, [1, 2, 3], rows=rows) == [50_001, 50_002, 50_003]
        assert map_batches(client, _plus_len, [4], rows=rows[:60_000] + [0] * 10_000) == [60_004]
        assert map_batches(client, _plus_len, [5], rows=rows[:10]) == [15]


def test_a_worker_s_share_of_its_machine_s_cores_counts_every_worker_thread_on_its_host():
    from tasks.runtime.process import core_shares

    workers = {
        "tcp://a:1": {"host": "a", "nthreads": 1},
        "tcp://a:2": {"host": "a", "nthreads": 1},  # two one-thread workers on two cores: a core each
        "tcp://b:1": {"host": "b", "nthreads": 2},  # one worker running two tasks at once on eight cores: four each
        "tcp://c:1": {"host": "c", "nthreads": 4},  # more threads than cores: one, never zero
        "tcp://d:1": {"host": "d", "nthreads": 1},  # its cores unknown: one
    }
    cpus = {"tcp://a:1": 2, "tcp://a:2": 2, "tcp://b:1": 8, "tcp://c:1": 2, "tcp://d:1": None}
    assert core_shares(workers, cpus) == {"tcp://a:1": 1, "tcp://a:2": 1, "tcp://b:1": 4, "tcp://c:1": 1, "tcp://d:1": 1}
