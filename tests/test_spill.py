"""The spill that holds a run's mentions on disk: every row once, every key in one part, the same table
whatever order the tasks that wrote them end in; the uniqueness check that reads a column piece by piece."""

import numpy as np
import pyarrow as pa
import pytest

from tasks.index.merge import graph_from_mentions, in_chunk_order, mention_rows
from tasks.index.validate import unique_mask, validate_tables
from tasks.runtime.parallel import LocalMapper
from tasks.store.spill import gather, plain_schema, read_split, write_parts, write_split
from tests.helpers import DIM, tiny_tables


def _mentions(n_chunks: int) -> pa.Table:
    from tasks.store.rows import to_table

    ents = [
        {
            "name": f"Name {(c * 7 + i) % 11}",
            "type": "person",
            "description": f"Sentence {c}.{i}.",
            "chunk_id": f"c{c:03d}",
        }
        for c in range(n_chunks)
        for i in range(3)
    ]
    rels = [
        {
            "source": f"Name {c % 11}",
            "target": f"Name {(c + 1) % 11}",
            "description": f"Sentence {c}.0.",
            "weight": 1.0,
            "chunk_id": f"c{c:03d}",
        }
        for c in range(n_chunks)
    ]
    return to_table("mentions", mention_rows(ents, rels), 0, 1)


def _spill(tmp_path, batches, n_parts):
    """As extraction spills: each batch (a task) writes its file split by key hash, a task per part gathers."""
    (tmp_path / "tasks").mkdir(parents=True)
    files = [str(tmp_path / "tasks" / f"task-{i:05d}.parquet") for i in range(len(batches))]
    for b, f in zip(batches, files):
        write_split(b, "key", n_parts, f)
    return gather(LocalMapper(), files, batches[0].schema, n_parts, tmp_path / "parts", in_chunk_order)


def test_every_row_lands_once_with_each_key_in_one_part_and_arrival_order_does_not_matter(tmp_path):
    table = _mentions(40)
    batches = [table.slice(i, 17) for i in range(0, table.num_rows, 17)]
    forward = _spill(tmp_path / "a", batches, 4)
    backward = _spill(tmp_path / "b", batches[::-1], 4)
    assert forward.num_rows == table.num_rows == sum(t.num_rows for t in forward.parts())
    assert sorted(forward.column("id").to_pylist()) == sorted(table.column("id").to_pylist())
    assert forward.read_all().equals(backward.read_all())
    parts_of_key: dict[str, set[int]] = {}
    for p, part in enumerate(forward.parts(["key"])):
        for k in part.column("key").to_pylist():
            parts_of_key.setdefault(k, set()).add(p)
    assert len(forward.files) == 4 and all(len(p) == 1 for p in parts_of_key.values())
    for part in forward.parts():  # each part in canonical (chunk id, seq) order
        assert part.equals(in_chunk_order(part))
    assert forward.reader().read_all().equals(forward.read_all())


def test_an_empty_split_reads_as_a_table_of_no_rows_with_its_columns(tmp_path):
    table = _mentions(6)
    schema = plain_schema(table.schema)
    assert read_split([], 0, table.schema).schema == schema  # no unit wrote a file (a graph without relations)
    assert read_split([], 3, table.schema, ["id", "key"]).column_names == ["id", "key"]
    write_parts(table.cast(schema), np.zeros(table.num_rows, np.int32), tmp_path / "unit.parquet")
    assert read_split([str(tmp_path / "unit.parquet")], 1, table.schema).num_rows == 0  # a part no row went to
    assert read_split([str(tmp_path / "unit.parquet")], 0, table.schema).num_rows == table.num_rows


def test_one_part_reads_back_the_whole_table_in_canonical_order(tmp_path):
    table = _mentions(12)
    shuffled = table.take(pa.array(list(range(table.num_rows))[::-1]))
    assert _spill(tmp_path, [shuffled], 1).read_all().equals(in_chunk_order(table))


def test_merge_from_a_spill_equals_merge_from_the_table(tmp_path):
    table = _mentions(40)
    spilled = _spill(tmp_path, [table], 3)
    assert graph_from_mentions(spilled, 100) == graph_from_mentions(table, 100)
    empty = _spill(tmp_path / "e", [table.slice(0, 0)], 3)
    assert empty.num_rows == 0 and graph_from_mentions(empty, 100)[0] == []


@pytest.mark.parametrize("collide", [False, True])
def test_unique_mask_over_pieces_marks_every_repeat_and_no_null(monkeypatch, collide):
    if collide:  # every hash the same: the values decide
        import numpy as np

        monkeypatch.setattr("tasks.store.spill.key_hash", lambda col: np.zeros(len(col), dtype=np.uint64))
    pieces = [pa.array(["a", "b", None]), pa.array(["c", "a"]), pa.array([None, "d", "b", "e"])]
    assert unique_mask(lambda: iter(pieces)).tolist() == [False, False, True, True, False, True, True, False, True]


@pytest.mark.parametrize("tasks", [False, True])
def test_validation_reads_a_spilled_table_part_by_part_and_sees_repeats_across_parts(tmp_path, tasks):
    """In this process (``unique_mask`` over the parts) or a task per part (``validate.validate_spilled``: the
    run's Dask workers; here, in process): the same report."""
    from tasks.runtime.parallel import LocalMapper

    tables = tiny_tables()
    chunk = tables["chunks"].column("id")[0].as_py()
    rows = _mentions(6).to_pylist()
    for r in rows:
        r["chunk_id"] = chunk
    rows[-1]["id"] = rows[0]["id"]  # the same id in two parts
    rows[1]["chunk_id"] = "chunk-gone"
    from tasks.store.rows import to_table

    table = to_table("mentions", rows, 0, 1)
    spilled = _spill(tmp_path, [table], 3)
    assert len(spilled.files) > 1
    tables["mentions"] = spilled
    on = {"mapper": LocalMapper(), "workdir": tmp_path / "work"} if tasks else {}
    report = validate_tables(tables, DIM, batch_rows=2, **on)
    failures = {f["expectation"]: f for f in report.failures}
    assert report.checked["mentions"] == 5 and len(report.failures) == 2
    assert failures["expect_column_values_to_be_unique"]["unexpected_count"] == 2
    assert failures["expect_column_values_to_be_unique"]["sample"] == [rows[0]["id"]] * 2
    assert failures["expect_column_values_to_be_null"]["unexpected_count"] == 1


def test_a_one_off_child_first_ends_idle_process_mappers(tmp_path):
    """``in_child_process`` ends the child of a ProcessMapper that is not mapping (the embedding model's, between
    two embeddings), which starts a new one on its next map; one that is mapping keeps its child."""
    import os
    import threading
    import time

    from tasks.runtime.parallel import ProcessMapper, in_child_process, release_idle_children

    idle, busy = ProcessMapper(), ProcessMapper()
    try:
        first = idle(_pid, [None])[0]
        in_child_process(os.getpid, workdir=tmp_path)
        assert not idle.started
        assert idle(_pid, [None])[0] not in (first, os.getpid())

        mapping = threading.Thread(target=busy, args=(time.sleep, [1.0]))
        mapping.start()
        while not busy.started:
            time.sleep(0.01)
        release_idle_children()
        assert busy.started and not idle.started
        mapping.join()
    finally:
        idle.release()
        busy.release()


def _pid(_batch) -> int:
    import os

    return os.getpid()


def _fails(message: str) -> None:
    raise ValueError(message)


def test_in_child_process_returns_the_result_and_reports_a_failure(tmp_path):
    """The function runs in another process (its pid differs), its result comes back whole; an exception there
    is an error here that names the function and quotes the child's traceback; no pickle file stays behind."""
    import os

    import pytest

    from tasks.index.merge import graph_from_mentions, mention_rows
    from tasks.runtime.parallel import in_child_process

    assert in_child_process(os.getpid, workdir=tmp_path) != os.getpid()
    raw_e = [
        {"name": "Scrooge", "type": "person", "description": "Scrooge counts.", "chunk_id": "c1"},
        {"name": "Marley", "type": "person", "description": "Marley is dead.", "chunk_id": "c2"},
    ]
    raw_r = [{"source": "Scrooge", "target": "Marley", "description": "Partners.", "chunk_id": "c2"}]

    rows = mention_rows(raw_e, raw_r)
    here = graph_from_mentions(rows, 100, {"c1": ("a", 0), "c2": ("a", 1)})
    there = in_child_process(graph_from_mentions, rows, 100, {"c1": ("a", 0), "c2": ("a", 1)}, workdir=tmp_path)
    assert there[0] == here[0] and there[1].equals(here[1])
    with pytest.raises(RuntimeError, match=r"_fails failed in its child process(.|\n)*ValueError: no luck"):
        in_child_process(_fails, "no luck", workdir=tmp_path)
    assert not list(tmp_path.glob("*.pkl*"))


def test_tables_cross_to_a_child_process_as_streams_of_their_own_rows(tmp_path):
    """Arrow tables and batches go to and from a child as IPC stream files (``parallel._dump``): a slice of a large
    table carries its rows, not its parent's buffers (pickled, it would carry them whole); the same object twice
    is one file; the values come back equal, and no stream file stays behind."""
    import io
    import pickle

    import pyarrow as pa

    from tasks.runtime.parallel import _dump, in_child_process

    big = pa.table({"n": pa.array(range(200_000), pa.int64()), "s": pa.array([f"id-{i}" for i in range(200_000)])})
    part = pa.concat_tables([big.slice(1_000 * i, 5) for i in range(20)])
    batch, empty = big.to_batches()[0].slice(3, 2), pa.record_batch({"x": pa.array([], pa.int64())})
    buffer = io.BytesIO()
    _dump({"part": part, "again": part, "batch": batch, "empty": empty, "rows": [1, "a"]}, buffer, tmp_path / "t")
    assert len(list(tmp_path.glob("t-*.arrows"))) == 3
    stream_bytes = sum(p.stat().st_size for p in tmp_path.glob("t-*.arrows"))
    assert stream_bytes < big.nbytes / 20  # the 100 rows, not the 200k rows' buffers
    buffer.seek(0)
    back = pickle.load(buffer)
    assert back["part"].equals(part) and back["again"] is back["part"] and back["rows"] == [1, "a"]
    assert back["batch"].equals(batch) and back["empty"].equals(empty)
    assert not list(tmp_path.glob("t-*.arrows"))
    assert in_child_process(pa.concat_tables, [part, part], workdir=tmp_path / "child").num_rows == 200


def test_a_mapper_told_not_to_keep_results_hands_each_to_on_done_only():
    """``keep=False`` (the embedder's vectors): every result reaches ``on_done`` once, in any mapper, and the list
    returned holds none of them."""
    from tasks.runtime.parallel import LocalMapper, ProcessMapper

    for mapper in (LocalMapper(), ProcessMapper()):
        seen: dict[int, int] = {}
        try:
            out = mapper(abs, [-1, -2, -3], on_done=seen.__setitem__, keep=False)
        finally:
            mapper.release()
        assert out == [None, None, None] and seen == {0: 1, 1: 2, 2: 3}
        assert mapper(abs, [-4]) == [4]


def test_a_part_writer_writes_the_parts_and_row_groups_of_a_whole_table_written_at_once(tmp_path):
    """Rows written a few at a time (``PartWriter``) give the parts and row groups that cutting the whole table
    into parts and writing each with ``write_whole(row_group_rows=...)`` gives: extraction's tasks are those."""
    import pyarrow.parquet as pq

    from tasks.store.spill import PartWriter

    schema = pa.schema([("id", pa.string()), ("n", pa.int64())])
    table = pa.table({"id": [f"r{i}" for i in range(23)], "n": list(range(23))}, schema=schema)
    writer = PartWriter(tmp_path / "parts", schema, part_rows=10, row_group_rows=4)
    for s, k in ((0, 3), (3, 1), (4, 9), (13, 10)):  # batches that cross row groups and parts
        writer.write(table.slice(s, k))
    out = writer.close()
    assert out.num_rows == 23 and len(out.files) == 3 and out.read_all().equals(table)
    groups = [
        [pq.ParquetFile(f).metadata.row_group(g).num_rows for g in range(pq.ParquetFile(f).num_row_groups)]
        for f in out.files
    ]
    assert groups == [[4, 4, 2], [4, 4, 2], [3]]
    assert not list((tmp_path / "parts").glob("*.tmp"))
    empty = PartWriter(tmp_path / "none", schema, 10).close()
    assert empty.num_rows == 0 and empty.files == [] and empty.read_all().num_rows == 0


def test_plain_rows_give_each_distinct_id_one_string_and_equal_arrows_rows():
    from tasks.store.rows import plain_rows

    ids = pa.list_(pa.string())
    table = pa.concat_tables(
        [
            pa.table({"id": ["a", "b"], "source_chunk_ids": pa.array([["c1", "c2"], None], ids), "version": [1, 1]}),
            pa.table({"id": ["c", "d"], "source_chunk_ids": pa.array([[], ["c2", "c3", "c1"]], ids), "version": [1, 1]}),
        ]
    )
    for t in (table, table.slice(1, 3), table.slice(0, 0)):
        assert plain_rows(t) == t.drop(["version"]).to_pylist()
    rows = plain_rows(table)
    assert [list(r) for r in rows] == [["id", "source_chunk_ids"]] * 4  # the column keeps its place
    assert rows[0]["source_chunk_ids"][0] is rows[3]["source_chunk_ids"][2]  # "c1": one string
