import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tasks.errors import IndexError_, LockTimeout
from tasks.index.validate import validate_tables
from tasks.runtime.parallel import LocalMapper
from tasks.store.catalog import Catalog
from tasks.store.spill import SpilledTable
from tests.helpers import DIM, tiny_tables


def test_publish_pins_versions_and_old_snapshots_stay_readable(tmp_path):
    cat = Catalog(tmp_path / "idx")
    assert cat.snapshot() is None
    with pytest.raises(IndexError_, match="no published index"):
        cat.require_snapshot()
    v1 = cat.publish(tiny_tables(1), "run-1", "full", DIM)
    v2 = cat.publish(tiny_tables(2, suffix=" II"), "run-2", "full", DIM)
    assert (v1, v2) == (1, 2)
    assert cat.read("entities").column("name").to_pylist() == ["Scrooge II", "London"]
    assert cat.read("entities", as_of=1).column("name").to_pylist() == ["Scrooge", "London"]
    assert [s["version"] for s in cat.snapshots()] == [1, 2]
    with pytest.raises(IndexError_, match="not found"):
        cat.read("entities", as_of=7)


def test_read_only_some_columns_and_rows_of_a_pinned_version(tmp_path):
    cat = Catalog(tmp_path / "idx")
    cat.publish(tiny_tables(1), "run-1", "full", DIM)
    cat.publish(tiny_tables(2, suffix=" II"), "run-2", "full", DIM)
    part = cat.read("entities", as_of=1, columns=["id", "name"], where="name = 'London'")
    assert part.column_names == ["id", "name"] and part.column("name").to_pylist() == ["London"]
    rows = cat.read("entities", as_of=2, where="name <> 'London'")
    assert rows.column_names == cat.read("entities").column_names and rows.column("name").to_pylist() == ["Scrooge II"]


def test_a_publish_that_dies_before_its_commit_leaves_the_previous_snapshot(tmp_path, monkeypatch):
    cat = Catalog(tmp_path / "idx")
    cat.publish(tiny_tables(1), "run-1", "full", DIM)
    real_write = Catalog._write
    calls = []

    def dying_write(self, name, data, *args):
        calls.append(name)
        if len(calls) == 3:
            raise RuntimeError("disk full")
        return real_write(self, name, data, *args)

    monkeypatch.setattr(Catalog, "_write", dying_write)
    with pytest.raises(RuntimeError, match="disk full"):
        cat.publish(tiny_tables(2, suffix=" II"), "run-2", "full", DIM)
    fresh = Catalog(tmp_path / "idx")
    assert fresh.snapshot()["version"] == 1
    for name in ("documents", "chunks", "entities"):  # the two tables already overwritten are still read at v1
        assert fresh.read(name).column("version").to_pylist()[0] == 1
    assert fresh.read("entities").column("name").to_pylist() == ["Scrooge", "London"]


def test_writer_lock_fails_fast_with_a_clear_message(tmp_path):
    cat = Catalog(tmp_path / "idx")
    other = Catalog(tmp_path / "idx")
    with cat.writer_lock():
        with pytest.raises(LockTimeout, match="is being written by pid"):
            with other.writer_lock(timeout_s=0.3):
                pass
    with other.writer_lock():
        pass


@pytest.mark.parametrize("spilled", [False, True])
def test_valid_tables_pass(spilled, tmp_path):
    tables = tiny_tables()
    if spilled:
        tables = {name: _in_parts(t, tmp_path / name) for name, t in tables.items()}
    report = validate_tables(tables, DIM, mapper=LocalMapper(), workdir=tmp_path / "work")
    assert report.success, report.failures
    assert report.checked["relations"] >= 6


def _replace(table: pa.Table, column: str, values) -> pa.Table:
    idx = table.schema.get_field_index(column)
    return table.set_column(idx, table.schema.field(column), pa.array(values, type=table.schema.field(column).type))


@pytest.mark.parametrize(
    "table, corrupt, expectation",
    [
        ("entities", lambda t: _replace(t, "id", ["ent-a", "ent-a"]), "expect_column_values_to_be_unique"),
        ("entities", lambda t: _replace(t, "id", [None, "ent-b"]), "expect_column_values_to_not_be_null"),
        ("relations", lambda t: _replace(t, "target_id", ["ent-missing"]), "expect_column_values_to_be_null"),
        ("chunks", lambda t: _replace(t, "document_id", ["doc-1", "doc-gone"]), "expect_column_values_to_be_null"),
        ("entities", lambda t: _replace(t, "vector", [np.full(DIM, np.nan, np.float32), np.ones(DIM, np.float32)]),
         "expect_column_values_to_be_in_set"),
        ("entities", lambda t: _replace(t, "source_chunk_ids", [["chunk-404"], ["chunk-1"]]), "expect_column_values_to_be_in_set"),
        ("relations", lambda t: _replace(t, "kind", ["invented"]), "expect_column_values_to_be_in_set"),
    ],
)
@pytest.mark.parametrize("spilled", [False, True])
def test_corrupted_tables_fail_their_suite(table, corrupt, expectation, spilled, tmp_path):
    tables = tiny_tables()
    tables[table] = corrupt(tables[table])
    if spilled:  # as a build hands them over: each table in parts (here a row per part), checked a part per task
        tables = {name: _in_parts(t, tmp_path / name) for name, t in tables.items()}
    report = validate_tables(tables, DIM, mapper=LocalMapper(), workdir=tmp_path / "work")
    assert not report.success
    assert any(f["table"] == table and f["expectation"] == expectation for f in report.failures), report.failures


def _in_parts(table: pa.Table, folder) -> SpilledTable:
    folder.mkdir()
    files = [folder / f"part-{i:05d}.parquet" for i in range(table.num_rows)]
    for i, f in enumerate(files):
        pq.write_table(table.slice(i, 1), f)
    return SpilledTable(files, table.schema, table.num_rows)


def test_dangling_reference_names_the_missing_id():
    tables = tiny_tables()
    tables["relations"] = _replace(tables["relations"], "target_id", ["ent-missing"])
    failure = next(f for f in validate_tables(tables, DIM).failures if f["column"] == "target_id_dangling")
    assert failure["unexpected_count"] == 1 and failure["sample"] == ["ent-missing"]


def test_unaccounted_chunk_fails():
    tables = tiny_tables()
    tables["quarantine"] = tables["quarantine"].slice(0, 0)  # chunk-2 says quarantined but no row says why
    report = validate_tables(tables, DIM)
    assert any(f["table"] == "chunks" and f["column"] == "accounted" for f in report.failures)


def test_wrong_vector_dimension_fails():
    report = validate_tables(tiny_tables(), DIM + 1)
    assert {f["column"] for f in report.failures} == {"vector_dim"}


def test_disk_full_during_publish_leaves_the_previous_snapshot(tmp_path, monkeypatch):
    import errno

    cat = Catalog(tmp_path / "idx")
    cat.publish(tiny_tables(1), "run-1", "full", DIM)
    before = {name: cat.read(name).to_pylist() for name in ("documents", "chunks", "entities")}
    real, written = Catalog._write, []

    def full_disk(self, name, data, *args):
        written.append(name)
        if len(written) == 3:  # two tables already rewritten, the third hits ENOSPC
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, name, data, *args)

    monkeypatch.setattr(Catalog, "_write", full_disk)
    with pytest.raises(IndexError_, match="disk full while writing table entities .*snapshot v1 stays published"):
        cat.publish(tiny_tables(2, suffix="-new"), "run-2", "full", DIM)
    monkeypatch.undo()
    again = Catalog(tmp_path / "idx")
    assert again.snapshot()["version"] == 1
    # documents and chunks were rewritten before the failure, but v1 still pins its own versions of them
    assert {name: again.read(name).to_pylist() for name in before} == before


@pytest.mark.parametrize("bucket_rows", [1, 1_000_000])  # a bucket per row, or one bucket for every part
def test_a_repeat_across_parts_is_found_whatever_bucket_its_values_hash_to(bucket_rows, tmp_path, monkeypatch):
    import tasks.index.validate as validate

    monkeypatch.setattr(validate, "UNIQUE_BUCKET_ROWS", bucket_rows)
    tables = tiny_tables()
    tables["entities"] = _replace(tables["entities"], "id", ["ent-a", "ent-a"])
    tables = {name: _in_parts(t, tmp_path / name) for name, t in tables.items()}
    report = validate_tables(tables, DIM, mapper=LocalMapper(), workdir=tmp_path / "work")
    [repeated] = [f for f in report.failures if f["expectation"] == "expect_column_values_to_be_unique"]
    assert repeated["unexpected_count"] == 2 and repeated["sample"] == ["ent-a", "ent-a"]
    assert len(list((tmp_path / "work" / "validate-entities").glob("id-*.parquet"))) == 2 * (2 if bucket_rows == 1 else 1)


def test_validation_in_slices_counts_every_bad_row_and_sees_repeats_across_slices():
    tables = tiny_tables()
    tables["entities"] = _replace(tables["entities"], "id", ["ent-a", "ent-a"])  # one row in each slice of 1
    tables["chunks"] = _replace(tables["chunks"], "document_id", ["doc-gone", "doc-gone"])
    failures = {(f["table"], f["expectation"]): f for f in validate_tables(tables, DIM, batch_rows=1).failures}
    repeated = failures[("entities", "expect_column_values_to_be_unique")]
    assert repeated["unexpected_count"] == 2 and repeated["sample"] == ["ent-a", "ent-a"]
    assert failures[("chunks", "expect_column_values_to_be_null")]["unexpected_count"] == 2


def test_validation_on_workers_keeps_great_expectations_out_of_the_run_process(tmp_path):
    """With a mapper every table is checked by tasks (a table in memory written as one part): the process that
    asks never imports great-expectations (~155 MB resident), and gets the report it would get itself."""
    import subprocess
    import sys

    script = (
        "import sys, json\n"
        "from tasks.index.validate import validate_tables\n"
        "from tasks.runtime.parallel import ProcessMapper\n"
        "from tests.helpers import DIM, tiny_tables\n"
        "t = tiny_tables()\n"
        "m = ProcessMapper()\n"
        f"r = validate_tables(t, DIM, mapper=m, workdir={str(tmp_path / 'work')!r})\n"
        "m.release()\n"
        "print(json.dumps([r.success, r.checked, 'great_expectations' in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    success, checked, imported = json.loads(out.stdout.strip().splitlines()[-1])
    assert success and not imported
    assert checked == validate_tables(tiny_tables(), DIM).checked


def test_an_update_rewrites_only_the_rows_it_changed_and_earlier_snapshots_still_read(tmp_path):
    from tasks.store.rows import delta_against, to_table

    def chunks(texts: dict[str, str], version: int) -> pa.Table:
        rows = [{"id": k, "document_id": "d", "chunk_index": i, "text": t, "n_tokens": 1, "start": 0, "end": 1,
                 "status": "extracted"} for i, (k, t) in enumerate(texts.items())]
        return to_table("chunks", rows, DIM, version, np.ones((len(rows), DIM), np.float32))

    first = {f"c{i}": f"text {i}" for i in range(10)}
    cat = Catalog(tmp_path / "index")
    cat.publish({"chunks": chunks(first, 1)}, "run-1", "full", DIM, 1)
    second = {k: v for k, v in first.items() if k != "c9"} | {"c8": "text 8, edited", "c10": "text 10"}
    cat.publish({"chunks": chunks(second, 2)}, "run-2", "incremental", DIM, 2)

    now = {r["id"]: (r["text"], r["version"]) for r in cat.read("chunks").to_pylist()}
    assert {k: t for k, (t, _) in now.items()} == second
    assert {k for k, (_, v) in now.items() if v == 2} == {"c8", "c10"}  # the kept rows keep when they were written
    fragments = cat.db.open_table("chunks").to_lance().get_fragments()
    assert [f.count_rows() for f in fragments][-1] == 2  # only the edited and the new row were written again
    assert {r["id"]: r["text"] for r in cat.read("chunks", as_of=1).to_pylist()} == first  # v1 reads as it was

    # a repeated key, or a change of most rows, is written whole
    doubled = pa.concat_tables([chunks(first, 1), chunks({"c0": "again"}, 1)])
    assert delta_against(chunks(first, 1), doubled) is None
    assert delta_against(chunks(first, 1), chunks({k: "all new" for k in first}, 2)) is None
    delta = delta_against(chunks(first, 1), chunks(second, 2))
    assert delta is not None and delta.values == ["c8", "c9"] and sorted(delta.add.column("id").to_pylist()) == ["c10", "c8"]


def test_a_table_written_before_a_column_was_declared_reads_it_as_nulls_and_takes_it_on_the_next_write(tmp_path):
    """An index of an earlier release: its relations have no ``label`` columns. Reads (whole, some columns, in
    batches) give them as nulls; the next publish writes the table whole with them, and the old version still reads."""
    from tasks.store.rows import to_table

    old = tiny_tables(1)
    old["relations"] = old["relations"].drop(["label", "label_from"])
    cat = Catalog(tmp_path / "idx")
    cat.publish(old, "run-1", "full", DIM)
    whole = cat.read("relations")
    assert whole.column_names == to_table("relations", [], DIM, 0).column_names
    assert whole.column("label").null_count == whole.num_rows > 0
    assert cat.read("relations", columns=["id", "label"]).column_names == ["id", "label"]
    snap = cat.snapshot()
    batches = list(cat.batches("relations", snap, ["id", "label_from"]))
    assert batches and batches[0].schema.names == ["id", "label_from"]
    from flows.run import rows_in  # an update's read of the rows it recomputes, the filter pushed down

    ids = sorted(set(whole.column("id").to_pylist()))[:2]
    some = rows_in(cat, snap, "relations", "id", ids)
    assert sorted(some.column("id").to_pylist()) == ids and some.column("label").null_count == len(ids)

    new = tiny_tables(2)
    rows = new["relations"].to_pylist()
    rows[0]["label"], rows[0]["label_from"] = "employs", rows[0]["source_id"]
    new["relations"] = to_table("relations", rows, DIM, 2)
    cat.publish(new, "run-2", "incremental", DIM, 2)
    assert cat.read("relations").column("label").to_pylist()[0] == "employs"
    assert cat.read("relations", as_of=1).column("label").null_count == whole.num_rows

    # an update's change of such a table (rows gone, rows added) is applied to it whole, once
    from tasks.store.rows import TableDelta

    again = Catalog(tmp_path / "again")
    again.publish(old, "run-1", "full", DIM)
    gone, added = whole.column("id")[0].as_py(), to_table("relations", rows[:1], DIM, 2)
    again.publish({"relations": TableDelta("id", [gone], added)}, "run-2", "incremental", DIM, 2)
    after = again.read("relations").to_pylist()
    assert len(after) == whole.num_rows and [r["label"] for r in after if r["id"] == rows[0]["id"]] == ["employs"]
    assert again.read("relations", as_of=1).num_rows == whole.num_rows
