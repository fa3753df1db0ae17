"""strata rollback and strata gc on a hand-built index of four snapshots."""

from __future__ import annotations

import time
from pathlib import Path

from typer.testing import CliRunner

from flows.cli import app
from tasks.store.catalog import Catalog
from tests.helpers import tiny_tables


def _four_snapshots(path) -> Catalog:
    cat = Catalog(path)
    for v in range(1, 5):
        cat.publish(tiny_tables(v, suffix=f"-{v}"), f"run-{v}", "full", 8)
        time.sleep(1.1)  # gc keeps what was written within a second of a pinned version
    return cat


def test_rollback_pins_an_earlier_snapshot_and_is_recorded(tmp_path):
    cat = _four_snapshots(tmp_path / "idx")
    res = CliRunner().invoke(app, ["rollback", "--index", str(tmp_path / "idx"), "--to", "2"])
    assert res.exit_code == 0 and "snapshot v5 published" in res.output, res.output
    latest = Catalog(tmp_path / "idx").snapshot()
    assert latest["kind"] == "rollback" and latest["tables"] == cat.snapshot(2)["tables"]
    assert Catalog(tmp_path / "idx").read("entities").column("name").to_pylist()[0] == "Scrooge-2"
    run = Catalog(tmp_path / "idx").runs()[-1]
    assert run["flow"] == "rollback" and run["status"] == "published" and run["snapshot_version"] == 5
    res = CliRunner().invoke(app, ["rollback", "--index", str(tmp_path / "idx"), "--to", "9"])
    assert res.exit_code == 3 and "snapshot version 9 not found" in res.output


def test_gc_keeps_every_version_a_kept_snapshot_pins(tmp_path):
    cat = _four_snapshots(tmp_path / "idx")
    cat.rollback(2, "rb")  # v5 pins v2's tables: gc must keep them although v2 itself goes
    res = CliRunner().invoke(app, ["gc", "--index", str(tmp_path / "idx"), "--keep", "2"])
    assert res.exit_code == 0, res.output
    cat = Catalog(tmp_path / "idx")
    assert [s["version"] for s in cat.snapshots()] == [4, 5]
    assert cat.read("entities", as_of=4).column("name").to_pylist()[0] == "Scrooge-4"
    assert cat.read("entities", as_of=5).column("name").to_pylist()[0] == "Scrooge-2"
    versions = [v["version"] for v in cat.db.open_table("entities").list_versions()]
    assert 1 not in versions and {2, 4} <= set(versions)  # older than every pin: gone; pinned: kept
    assert CliRunner().invoke(app, ["gc", "--index", str(tmp_path / "idx"), "--keep", "0"]).exit_code == 2


def test_a_table_delta_applies_to_the_pinned_version_not_to_an_uncommitted_one(tmp_path):
    from tasks.store.rows import TableDelta
    from tests.helpers import _to_table

    cat = Catalog(tmp_path / "idx")
    cat.publish(tiny_tables(1), "run-1", "full", 8)
    pinned = cat.snapshot()["tables"]["quarantine"]
    # a run that wrote the table and died before its snapshot: its rows must not leak into the next one
    cat._write("quarantine", _to_table("quarantine", [{"id": "q-x", "item": "x", "stage": "extract", "error": "e"}], 8, 2))
    new = _to_table("quarantine", [{"id": "q-2", "item": "chunk-3", "stage": "extract", "error": "late"}], 8, 2)
    cat.publish({"quarantine": TableDelta("item", ["chunk-2"], new)}, "run-2", "incremental", 8)
    assert cat.read("quarantine").column("id").to_pylist() == ["q-2"]  # q-1 deleted, q-2 added, q-x never seen
    assert cat.read("quarantine", as_of=1).column("id").to_pylist() == ["q-1"]  # the previous snapshot is intact
    assert cat.snapshot()["tables"]["quarantine"] > pinned
    assert cat.snapshot()["tables"]["entities"] == cat.snapshot(1)["tables"]["entities"]  # untouched tables stay pinned


def test_gc_removes_the_fragments_of_a_run_killed_before_its_commit(tmp_path):
    """A build writes its spilled mentions as Lance fragments and commits them as one version; a run killed in
    between leaves files no version references, and its work folder. gc (under the writer lock) removes them."""
    import pyarrow as pa
    from lance.fragment import write_fragments

    cat = Catalog(tmp_path / "idx")
    cat.publish(tiny_tables(1), "run-1", "full", 8)
    data = tmp_path / "idx" / "lance" / "entities.lance" / "data"
    before = set(data.iterdir())
    entities = cat.read("entities")
    write_fragments(pa.Table.from_batches(entities.to_batches()), str(data.parent), schema=entities.schema)
    orphans = set(data.iterdir()) - before
    assert orphans and cat.read("entities").num_rows == entities.num_rows  # written, never committed
    time.sleep(1.1)
    cat.publish(tiny_tables(2, suffix="-2"), "run-2", "full", 8)
    left = tmp_path / "idx" / "_cache" / "spill" / "run-killed" / "mentions"  # a killed run's work folder
    left.mkdir(parents=True)
    (left / "part-00000.parquet").write_bytes(b"PAR1")
    res = CliRunner().invoke(app, ["gc", "--index", str(tmp_path / "idx"), "--keep", "1"])
    assert res.exit_code == 0, res.output
    assert not orphans & set(data.iterdir())
    assert not (tmp_path / "idx" / "_cache" / "spill").exists()
    assert Catalog(tmp_path / "idx").read("entities").column("name").to_pylist()[0] == "Scrooge-2"


def test_gc_removes_unreferenced_files_only_under_a_real_writer_lock():
    """Files no version references are removed only where gc holds a lock that keeps writers out: not on object
    storage with ``storage.writer_lock = "off"``, where they may be a running build's fragments before its commit."""
    from types import SimpleNamespace

    from tasks.store.gc import lock_held

    def store(lock: str) -> SimpleNamespace:
        return SimpleNamespace(writer_lock=lock)

    assert lock_held(SimpleNamespace(root=Path("/idx"), storage=store("off")))  # a folder: the fcntl lock
    assert lock_held(SimpleNamespace(root=None, storage=store("auto")))
    assert not lock_held(SimpleNamespace(root=None, storage=store("off")))


def _entity(i: int, name: str) -> dict:
    from tests.helpers import vec

    return {"id": f"ent-{i:02d}", "name": name, "type": "person", "description": "d", "layer": 0,
            "source_chunk_ids": ["chunk-1"], "degree": 1, "vector": vec(i % 4)}  # fmt: skip


def _three_snapshots(path) -> Catalog:
    """v1: ten entities "a"; v2 replaces four with "b"; v3 replaces ent-09 with "c" (each a change of the last)."""
    from tasks.store.rows import TableDelta
    from tests.helpers import DIM, _to_table

    cat = Catalog(path)
    cat.publish(dict(tiny_tables(1), entities=_to_table("entities", [_entity(i, "a") for i in range(10)], DIM, 1)),
                "run-1", "full", 8)  # fmt: skip
    new = _to_table("entities", [_entity(i, "b") for i in range(4)], DIM, 2)
    cat.publish({"entities": TableDelta("id", [f"ent-{i:02d}" for i in range(4)], new)}, "run-2", "incremental", 8)
    new = _to_table("entities", [_entity(9, "c")], DIM, 3)
    cat.publish({"entities": TableDelta("id", ["ent-09"], new)}, "run-3", "incremental", 8)
    return cat


def _rows(cat: Catalog, version: int) -> list[dict]:
    return sorted(cat.read("entities", as_of=version).to_pylist(), key=lambda r: r["id"])


def test_gc_writes_a_tables_history_again_each_kept_snapshot_reading_the_same_rows_from_only_those(tmp_path):
    from tasks.store.rows import TableDelta
    from tests.helpers import DIM, _to_table

    cat = _three_snapshots(tmp_path / "idx")
    before = {v: _rows(cat, v) for v in (2, 3)}
    pinned = {v: cat.snapshot(v)["tables"] for v in (2, 3)}
    # kept v2 and v3 read 11 distinct rows (a4..a9, b0..b3, c9); the files hold 15: a0..a3 only v1 read
    res = CliRunner().invoke(app, ["gc", "--index", str(tmp_path / "idx"), "--keep", "2", "--compact-share", "0.5"])
    assert res.exit_code == 0 and "compacted" not in res.output, res.output  # 4 of 11: below a share of 0.5
    res = CliRunner().invoke(app, ["gc", "--index", str(tmp_path / "idx"), "--keep", "2"])
    assert res.exit_code == 0 and "compacted: entities (4 rows no snapshot reads dropped)" in res.output, res.output
    cat = Catalog(tmp_path / "idx")
    assert [s["version"] for s in cat.snapshots()] == [2, 3]
    for v in (2, 3):  # re-pinned, the same rows
        assert cat.snapshot(v)["tables"]["entities"] != pinned[v]["entities"]
        assert {k: t for k, t in cat.snapshot(v)["tables"].items() if k != "entities"} == {
            k: t for k, t in pinned[v].items() if k != "entities"}  # fmt: skip
        assert _rows(cat, v) == before[v]
    # the table's files now hold each of the 11 rows once, grouped by the snapshots reading them; nothing deleted
    dataset = cat.db.open_table("entities").to_lance()
    kept = [dataset.checkout_version(cat.snapshot(v)["tables"]["entities"]) for v in (2, 3)]
    assert [d.count_rows() for d in kept] == [10, 10]
    files = {f.data_files()[0].path: (f.physical_rows, f.num_deletions) for d in kept for f in d.get_fragments()}
    assert sorted(files.values()) == [(1, 0), (1, 0), (9, 0)]
    data = Path(tmp_path / "idx" / "lance" / "entities.lance" / "data")
    assert sorted(p.name for p in data.iterdir()) == sorted(files)  # the old files are gone
    # the next update writes its change on the rewritten latest version; a gc with nothing to drop writes nothing
    cat.publish({"entities": TableDelta("id", ["ent-08"], _to_table("entities", [_entity(8, "d")], DIM, 4))},
                "run-4", "incremental", 8)  # fmt: skip
    names = dict(zip(*(cat.read("entities").column(c).to_pylist() for c in ("id", "name"))))
    assert names == {**{f"ent-{i:02d}": "b" for i in range(4)}, **{f"ent-{i:02d}": "a" for i in range(4, 8)},
                     "ent-08": "d", "ent-09": "c"}  # fmt: skip
    res = CliRunner().invoke(app, ["gc", "--index", str(tmp_path / "idx"), "--keep", "3"])
    assert res.exit_code == 0 and "compacted" not in res.output, res.output  # a8 only: 1 of 12 rows


def test_a_rewritten_tables_vector_index_is_kept_and_a_read_of_its_old_version_is_retryable(tmp_path):
    import numpy as np
    import pytest

    from tasks.errors import SnapshotGone
    from tasks.retrieval.view import removed_meanwhile
    from tasks.store.rows import TableDelta
    from tasks.store.vectors import ann_search, has_vector_index
    from tests.helpers import DIM, _to_table

    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(64, DIM)).astype(np.float32)

    def table(ids, version):
        rows = [{"id": f"ent-{i:02d}", "name": f"n{i}-{version}", "type": "person", "description": "d", "layer": 0,
                 "source_chunk_ids": ["chunk-1"], "degree": 1, "vector": vectors[i]} for i in ids]  # fmt: skip
        return _to_table("entities", rows, DIM, version)

    cat = Catalog(tmp_path / "idx")
    cat.publish(dict(tiny_tables(1), entities=table(range(64), 1)), "run-1", "full", DIM, ann_min_rows=32)
    cat.publish({"entities": TableDelta("id", [f"ent-{i:02d}" for i in range(16)], table(range(16), 2))},
                "run-2", "incremental", DIM, ann_min_rows=32)  # fmt: skip
    old = cat.snapshot(2)
    assert cat.gc(keep=1)["compacted"] == {"entities": 16}
    tbl = cat.open_table("entities", snap=cat.snapshot(2))
    assert has_vector_index(tbl) and tbl.count_rows() == 64
    ids, _ = ann_search(tbl, vectors[20], 1)
    assert ids == ["ent-20"]
    # a reader holding the version gc replaced: a clear, retryable error, not an internal one
    with pytest.raises(SnapshotGone, match="rewritten by `strata gc`"), removed_meanwhile(cat, 2, old["tables"]):
        cat.read("entities", snap=old)


def test_gc_stopped_before_the_pins_move_leaves_every_snapshot_as_it_was(tmp_path, monkeypatch):
    import pytest

    import tasks.store.gc as gc
    from tasks.store.rows import TableDelta
    from tests.helpers import DIM, _to_table

    cat = _three_snapshots(tmp_path / "idx")
    before, pinned = {v: _rows(cat, v) for v in (2, 3)}, {v: cat.snapshot(v)["tables"] for v in (2, 3)}
    rewrite = gc.rewrite_history

    def killed(*args, **kwargs):
        rewrite(*args, **kwargs)  # the new versions written, the snapshots not yet pinned to them
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(gc, "rewrite_history", killed)
    with pytest.raises(KeyboardInterrupt):
        cat.gc(keep=2)
    monkeypatch.undo()
    cat = Catalog(tmp_path / "idx")
    assert {v: cat.snapshot(v)["tables"] for v in (2, 3)} == pinned
    assert {v: _rows(cat, v) for v in (2, 3)} == before
    # the next update writes on the pinned version (not on the unpinned rewrite), the next gc rewrites
    cat.publish({"entities": TableDelta("id", ["ent-08"], _to_table("entities", [_entity(8, "d")], DIM, 4))},
                "run-4", "incremental", 8)  # fmt: skip
    assert dict(zip(*(cat.read("entities").column(c).to_pylist() for c in ("id", "name"))))["ent-08"] == "d"
    assert len(cat.read("entities")) == 10
    assert cat.gc(keep=2)["compacted"] == {"entities": 5}  # a0..a3 and a9: no kept snapshot (v3, v4) reads them
    assert _rows(cat, 3) == before[3]
