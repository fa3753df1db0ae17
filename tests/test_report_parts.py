"""The parts a build's reports are made in (``tasks.methods.report_parts``), on hand-computed cases."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from tasks.methods.report_parts import (
    COMMUNITY_COLUMNS,
    COMMUNITY_SCHEMA,
    RELATION_SCHEMA,
    REPORT_COLUMNS,
    plan_task,
    split_task,
)
from tasks.store.spill import read_split


def _communities(path):
    rows = [  # (id, level, parent, members): trees A (5 members, two children), B (3), C (2), D (1)
        ("A", 0, None, ["a1", "a2", "a3", "a4", "a5"]),
        ("B", 0, None, ["b1", "b2", "b3"]),
        ("C", 0, None, ["c1", "c2"]),
        ("D", 0, None, ["d1"]),
        ("A1", 1, "A", ["a1", "a2", "a3"]),
        ("A2", 1, "A", ["a4", "a5"]),
    ]
    cols = list(zip(*rows))
    table = pa.table(
        {
            "id": list(cols[0]),
            "level": pa.array(cols[1], pa.int64()),
            "parent_id": pa.array(cols[2], pa.string()),
            "entity_ids": list(cols[3]),
            "size": [len(m) for m in cols[3]],
        }
    )
    pq.write_table(table.select(COMMUNITY_COLUMNS), path)
    return path


def test_community_trees_go_to_the_least_loaded_part_largest_first(tmp_path):
    # 11 members, parts of 6: two parts. A (5) -> 0; B (3) -> 1; C (2) -> 1 (3 < 5); D (1) -> 0 (5 = 5: lower part)
    assert plan_task(str(tmp_path), [str(_communities(tmp_path / "c.parquet"))], part_entities=6) == 2
    parts = [read_split([str(tmp_path / "communities.parquet")], p, COMMUNITY_SCHEMA).column("id").to_pylist() for p in (0, 1)]
    assert parts == [["A", "D", "A1", "A2"], ["B", "C"]]  # each part in the communities' order
    members = pq.read_table(tmp_path / "members.parquet").to_pylist()
    assert {m["id"]: m["part"] for m in members} == {
        **dict.fromkeys(["a1", "a2", "a3", "a4", "a5", "d1"], 0),
        **dict.fromkeys(["b1", "b2", "b3", "c1", "c2"], 1),
    }
    # never more parts than trees; one part when they all fit
    assert plan_task(str(tmp_path), [str(tmp_path / "c.parquet")], part_entities=1) == 4
    assert plan_task(str(tmp_path), [str(tmp_path / "c.parquet")], part_entities=100) == 1


def test_a_relation_goes_to_the_part_of_both_its_ends_and_nowhere_across_parts(tmp_path):
    plan_task(str(tmp_path), [str(_communities(tmp_path / "c.parquet"))], part_entities=6)
    ends = [("a1", "a4"), ("a1", "b1"), ("b1", "c2"), ("d1", "a5"), ("c1", "x9")]
    rels = pa.table(
        {
            "id": [f"r{i}" for i in range(len(ends))],
            "source_id": [s for s, _ in ends],
            "target_id": [t for _, t in ends],
            "kind": ["extracted"] * len(ends),
            "description": ["d"] * len(ends),
            "weight": [1.0] * len(ends),
            "label": pa.nulls(len(ends), pa.string()),
            "label_from": pa.nulls(len(ends), pa.string()),
        }
    )
    pq.write_table(rels, tmp_path / "r.parquet")
    job = (str(tmp_path / "r.parquet"), str(tmp_path / "split.parquet"))
    members = str(tmp_path / "members.parquet")
    # a1-b1 joins two parts (no report reads it); c1-x9 has an end in no community
    assert split_task(job, REPORT_COLUMNS, ["source_id", "target_id"], members) == 3
    got = [read_split([job[1]], p, RELATION_SCHEMA).column("id").to_pylist() for p in (0, 1)]
    assert got == [["r0", "r3"], ["r2"]]
