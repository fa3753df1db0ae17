"""Vector search past memory: a table's LanceDB vector index, built once it is large, and searched instead of
scanning every vector.
"""

from __future__ import annotations

from typing import Any

# ---------------------------------------------------------------------------- vector search past memory
#: IVF partitions a query visits (of sqrt(rows)); recall@20 1.000 on 200k clustered vectors (benchmarks/bench_ann.py)
ANN_NPROBES = 20


def build_vector_index(tbl: Any) -> None:
    """A cosine IVF index on a table's ``vector`` column (sqrt(rows) partitions, full vectors kept): searched
    instead of scanning every vector in memory, once a table is past ``retrieval.ann_min_vectors`` rows."""
    tbl.create_index(
        metric="cosine",
        vector_column_name="vector",
        index_type="IVF_FLAT",
        num_partitions=max(1, int(tbl.count_rows() ** 0.5)),
        replace=True,
    )


def has_vector_index(tbl: Any) -> bool:
    return any("vector" in (getattr(i, "columns", None) or []) for i in tbl.list_indices())


def ann_search(tbl: Any, q: Any, k: int) -> tuple[list[str], list[float]]:
    """The ``k`` rows nearest ``q`` through the table's vector index: their ids and cosine similarities."""
    hits = (
        tbl.search(q, vector_column_name="vector")
        .distance_type("cosine")
        .limit(k)
        .nprobes(ANN_NPROBES)
        .select(["id", "_distance"])
        .to_arrow()
    )
    return hits.column("id").to_pylist(), [1.0 - d for d in hits.column("_distance").to_pylist()]
