"""Small hand-built tables for catalog and validation tests."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np

from tasks.store.rows import to_table

DIM = 8


def _to_table(name: str, rows: list[dict], dim: int, version: int):
    """Hand-written rows that carry their ``vector`` inline, as a table (production stages pass a matrix)."""
    vectors = [r["vector"] for r in rows if "vector" in r]
    plain = [{k: v for k, v in r.items() if k != "vector"} for r in rows]
    return to_table(name, plain, dim, version, np.stack(vectors) if vectors else None)


def vec(i: int) -> np.ndarray:
    v = np.zeros(DIM, dtype=np.float32)
    v[i % DIM] = 1.0
    return v


def tiny_tables(version: int = 1, suffix: str = "") -> dict:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    docs = [{"id": "doc-1", "uri": "/c/a.txt", "root": "/c", "source_id": "a.txt", "title": "A", "text": "Scrooge. London.",
             "content_hash": "0" * 64, "n_tokens": 4, "ingested_at": now}]
    chunks = [
        {"id": "chunk-1", "document_id": "doc-1", "chunk_index": 0, "text": "Scrooge.", "n_tokens": 2, "start": 0, "end": 8,
         "status": "extracted", "vector": vec(0)},
        {"id": "chunk-2", "document_id": "doc-1", "chunk_index": 1, "text": "London.", "n_tokens": 2, "start": 9, "end": 16,
         "status": "quarantined", "vector": vec(1)},
    ]
    ents = [
        {"id": "ent-a", "name": "Scrooge" + suffix, "type": "person", "description": "d", "layer": 0,
         "source_chunk_ids": ["chunk-1"], "degree": 1, "vector": vec(2)},
        {"id": "ent-b", "name": "London", "type": "location", "description": "d", "layer": 0,
         "source_chunk_ids": ["chunk-1"], "degree": 1, "vector": vec(3)},
    ]
    rels = [{"id": "rel-1", "source_id": "ent-a", "target_id": "ent-b", "kind": "extracted", "description": "d",
             "weight": 1.0, "source_chunk_ids": ["chunk-1"]}]
    quarantine = [{"id": "q-1", "item": "chunk-2", "stage": "extract", "error": "boom"}]
    return {
        "documents": _to_table("documents", docs, DIM, version),
        "chunks": _to_table("chunks", chunks, DIM, version),
        "entities": _to_table("entities", ents, DIM, version),
        "relations": _to_table("relations", rels, DIM, version),
        "quarantine": _to_table("quarantine", quarantine, DIM, version),
    }


def assert_layers_match_membership(entities: list[dict], relations: list[dict], built_layers: list[dict]) -> None:
    """Each built layer's recorded ``n_entities``, ``n_clusters`` and cluster sparsity equal those recomputed
    from the published entities and ``summary_of`` links (eq. 17 written out, independent of the code under test)."""
    import pytest

    layer_of = {e["id"]: e["layer"] for e in entities}
    for layer in built_layers:
        members: dict[str, int] = {}
        for r in relations:
            if r["kind"] == "summary_of" and layer_of[r["target_id"]] == layer["layer"]:
                members[r["target_id"]] = members.get(r["target_id"], 0) + 1
        n = sum(1 for e in entities if e["layer"] == layer["layer"] - 1)
        assert (n, len(members)) == (layer["n_entities"], layer["n_clusters"]), layer
        cs = 1 - sum(s * (s - 1) for s in members.values()) / (n * (n - 1))
        assert cs == pytest.approx(layer["cluster_sparsity"]), layer


KILL_DURING_PUBLISH = """
import os, signal, sys
sys.path.insert(0, {repo!r})
from flows.env import apply_offline_defaults
apply_offline_defaults()
from tasks.store.catalog import Catalog
real = Catalog._write
written = []
def write_then_die(self, name, data, *args):
    written.append(name)
    if len(written) == {after}:  # tables overwritten, snapshot not committed: the worst moment
        os.kill(os.getpid(), signal.SIGKILL)
    return real(self, name, data, *args)
Catalog._write = write_then_die
from flows.pipeline import {entry}
from schemas.config import load_config
{entry}({corpus!r}, Catalog({index!r}), load_config(overrides={overrides!r}))
"""


def run_killed_during_publish(entry: str, corpus, index, overrides: dict, after: int):
    """Run ``flows.pipeline.<entry>`` in a subprocess that SIGKILLs itself on its ``after``-th table write."""
    import subprocess
    import sys
    from pathlib import Path

    repo = str(Path(__file__).resolve().parent.parent)
    script = KILL_DURING_PUBLISH.format(repo=repo, after=after, entry=entry, corpus=str(corpus), index=str(index),
                                        overrides=overrides)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)


def stop_server(server, sig) -> None:
    """Send ``sig`` to a server process and wait for it; killed if it has not exited within 30 s."""
    import subprocess

    server.send_signal(sig)
    try:
        server.wait(30)
    except subprocess.TimeoutExpired:
        server.kill()


def blas_threads(_: object = None) -> list[int]:
    """The thread counts of the BLAS libraries loaded in this process (a ``ProcessMapper`` task: one argument)."""
    from threadpoolctl import threadpool_info

    return sorted({i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"})


def publish_concurrently(uri: str, storage, writers: int = 3, each: int = 2) -> None:
    """``writers`` threads publish ``each`` snapshots apiece to ``uri`` through its writer lock; then every snapshot
    is there, versions 1..n, each one's tables exactly those its writer wrote (no commit lost, none mixed)."""
    import threading

    from tasks.store.catalog import Catalog

    errors: list[BaseException] = []

    def writer(w: int) -> None:
        try:
            for i in range(each):
                cat = Catalog(uri, storage=storage)
                with cat.writer_lock(timeout_s=120):
                    cat.publish(tiny_tables(1, suffix=f"-w{w}-{i}"), f"run-w{w}-{i}", "full", 8)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    cat = Catalog(uri, storage=storage)
    snaps = cat.snapshots()
    assert [s["version"] for s in snaps] == list(range(1, writers * each + 1))
    assert sorted(s["run_id"] for s in snaps) == sorted(f"run-w{w}-{i}" for w in range(writers) for i in range(each))
    for s in snaps:
        name = cat.read("entities", snap=s).column("name").to_pylist()[0]
        assert name == "Scrooge" + s["run_id"].removeprefix("run"), (s["version"], name)


def refused_then_waits(lease_class, uri: str, storage) -> None:
    """A second writer's lease (``lease_class``) is refused at once while the first holds the lock ("being written
    by", "--lock-timeout"), and waits for it where the first releases it meanwhile."""
    import threading

    import pytest

    from tasks.errors import LockTimeout

    holder = lease_class(uri, storage)
    holder.acquire()
    with pytest.raises(LockTimeout, match=f"index {uri} is being written by pid .*--lock-timeout"):
        lease_class(uri, storage).acquire(0)
    threading.Timer(1.5, holder.release).start()  # the first writer finishes meanwhile: the second one waits
    second = lease_class(uri, storage)
    second.acquire(30)
    second.release()


def publish_through_faults(uri: str, storage, faults, rules) -> None:
    """A snapshot published, then a second one through the writer lock while ``faults`` (a proxy's ``Faults``)
    fails each of ``rules`` once: it lands (version 2, its own tables), every rule fired exactly once, one
    snapshot row per publish (no commit twice) and the first still readable."""
    from tasks.store.catalog import Catalog

    Catalog(uri, storage=storage).publish(tiny_tables(1, suffix="-1"), "run-1", "full", 8)
    faults.injected.clear()
    faults.rules = rules
    try:
        cat = Catalog(uri, storage=storage)
        with cat.writer_lock():
            version = cat.publish(tiny_tables(2, suffix="-2"), "run-2", "full", 8)
    finally:
        faults.off()
    assert version == 2
    assert [r.fired for r in rules] == [1] * len(rules), [(r.method, r.path, r.seen) for r in rules]
    cat = Catalog(uri, storage=storage)
    assert [s["version"] for s in cat.snapshots()] == [1, 2]
    assert cat.read("entities").column("name").to_pylist()[0] == "Scrooge-2"
    assert cat.read("entities", as_of=1).column("name").to_pylist()[0] == "Scrooge-1"


def take_over_a_stale_lock(uri: str, storage) -> None:
    """A writer's lock stops being renewed (its heartbeat stalls): a second writer is refused at once ("renewed"),
    takes the lock over once ``storage.lock_ttl_s`` has passed, and publishes; the stalled holder's publish fails
    ("lost the writer lock"). One snapshot, the second writer's."""
    import time

    import pytest

    from tasks.errors import LockTimeout
    from tasks.store.catalog import Catalog

    stalled = Catalog(uri, storage=storage)
    with stalled.writer_lock():
        lease = stalled._lease
        assert lease is not None and lease._thread is not None
        lease._stop.set()  # the holder stalls: no more heartbeats
        lease._thread.join()
        other = Catalog(uri, storage=storage)
        with pytest.raises(LockTimeout, match="renewed"), other.writer_lock(0):
            pass
        started = time.monotonic()
        with other.writer_lock(timeout_s=20):  # taken over once not renewed for lock_ttl_s
            assert time.monotonic() - started >= 1.0
            other.publish(tiny_tables(1), "run-other", "full", 8)
            with pytest.raises(LockTimeout, match="lost the writer lock"):
                stalled.publish(tiny_tables(2), "run-stalled", "full", 8)
        assert lease.lost
    assert [s["run_id"] for s in Catalog(uri, storage=storage).snapshots()] == ["run-other"]


def heartbeat_keeps_the_lock(uri: str, storage) -> None:
    """A live writer holds its lock past ``storage.lock_ttl_s`` (3 s: renewed every second): a second writer is
    refused ("renewed") and the holder publishes."""
    import time

    import pytest

    from tasks.errors import LockTimeout
    from tasks.store.catalog import Catalog

    cat = Catalog(uri, storage=storage)
    with cat.writer_lock():
        time.sleep(5)  # longer than the lock's lifetime
        with pytest.raises(LockTimeout, match="renewed"):
            with Catalog(uri, storage=storage).writer_lock(0):
                pass
        cat.publish(tiny_tables(1), "run-1", "full", 8)
    snap = Catalog(uri, storage=storage).snapshot()
    assert snap is not None and snap["version"] == 1
