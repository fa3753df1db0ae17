"""Communities: seeded hierarchical Leiden over the whole hierarchical KG G_k (all layers).

Uses graspologic-native, graspologic's own Leiden engine. Every connected component takes
part (GraphRAG and the HiRAG reference keep only the largest one), and entities with no edge
at all become singleton communities, so every node of G_k belongs to a level-0 community.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pyarrow as pa

from tasks.store.ids import make_id
from tasks.store.rows import relation_table


def graph_edges(relations: pa.Table | list[dict[str, Any]]) -> list[tuple[str, str, float]]:
    """Undirected weighted edges of G_k (extracted and summary_of), merged per endpoint pair (weights summed in
    relation order), sorted."""
    import numpy as np
    import pyarrow.compute as pc

    t = relation_table(relations)
    ends = [t.column(c) for c in ("source_id", "target_id")]
    # endpoints as positions in the sorted node names: pairs are merged and sorted as integers (2.3M relations at
    # 100k chunks: grouping them as strings held ~800 MB at the communities stage's peak), and each node is one
    # Python string shared by its edges
    names = pc.unique(pa.chunked_array([c for e in ends for c in e.chunks], pa.string()))
    names = names.take(pc.sort_indices(names))
    a, b = (pc.index_in(e, value_set=names).to_numpy().astype(np.int64) for e in ends)
    w = t.column("weight").to_numpy()
    loop = a == b
    lo, hi, w = np.minimum(a, b)[~loop], np.maximum(a, b)[~loop], w[~loop]
    n = max(1, len(names))
    key = lo * n + hi
    order = np.argsort(key, kind="stable")
    key, w = key[order], w[order]
    first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if len(key) else np.zeros(0, dtype=np.int64)
    total = np.add.reduceat(w, first) if len(key) else w
    node = names.to_pylist()
    pairs = zip((key[first] // n).tolist(), (key[first] % n).tolist(), total.tolist())
    return [(node[i], node[j], s) for i, j, s in pairs]


def community_id(level: int, members: list[str]) -> str:
    return make_id("comm", level, ",".join(sorted(members)))


def detect_communities(
    entity_ids: list[str],
    relations: pa.Table | list[dict[str, Any]],
    max_cluster_size: int,
    seed: int,
    resolution: float = 1.0,
) -> list[dict[str, Any]]:
    """Community rows ``{id, level, parent_id, entity_ids, size}``; level 0 covers every entity."""
    import graspologic_native as gn

    edges = graph_edges(relations)
    assignments: list[tuple[str, int, int | None, int]] = []
    if edges:
        for hc in gn.hierarchical_leiden(
            edges=edges, max_cluster_size=max_cluster_size, seed=seed, resolution=resolution, use_modularity=True
        ):
            assignments.append((hc.node, hc.cluster, hc.parent_cluster, hc.level))
    members: dict[tuple[int, int], list[str]] = defaultdict(list)
    parent_of: dict[tuple[int, int], int | None] = {}
    for node, cluster, parent, level in assignments:
        members[(level, cluster)].append(node)
        parent_of[(level, cluster)] = parent
    # ids are content hashes of (level, members); parents map by (level - 1, parent cluster)
    ids = {key: community_id(key[0], m) for key, m in members.items()}
    rows = []
    for (level, cluster), m in members.items():
        parent = parent_of[(level, cluster)]
        rows.append(
            {
                "id": ids[(level, cluster)],
                "level": level,
                "parent_id": ids.get((level - 1, parent)) if parent is not None else None,
                "entity_ids": sorted(m),
                "size": len(m),
            }
        )
    covered = {node for node, *_ in assignments}
    for eid in sorted(set(entity_ids) - covered):  # isolated entities: kept as singletons
        rows.append({"id": community_id(0, [eid]), "level": 0, "parent_id": None, "entity_ids": [eid], "size": 1})
    return sorted(rows, key=lambda r: (r["level"], r["id"]))
