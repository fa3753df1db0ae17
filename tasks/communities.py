"""Communities: seeded hierarchical Leiden over the whole hierarchical KG G_k (all layers).

Uses graspologic-native, graspologic's own Leiden engine. Every connected component takes
part (GraphRAG and the HiRAG reference keep only the largest one), and entities with no edge
at all become singleton communities, so every node of G_k belongs to a level-0 community.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pyarrow as pa

from tasks.catalog import relation_table
from tasks.ids import make_id


def graph_edges(relations: pa.Table | list[dict[str, Any]]) -> list[tuple[str, str, float]]:
    """Undirected weighted edges of G_k (extracted and summary_of), merged per endpoint pair, sorted."""
    import polars as pl

    t = pl.from_arrow(relation_table(relations).select(["source_id", "target_id", "weight"]))
    t = (t.filter(pl.col("source_id") != pl.col("target_id"))
         .select(a=pl.min_horizontal("source_id", "target_id"), b=pl.max_horizontal("source_id", "target_id"), w="weight")
         .group_by("a", "b", maintain_order=True).agg(pl.col("w").sum()).sort("a", "b"))
    # one Python string per node, shared by its edges (2.3M edges over 121k nodes at 100k chunks: a string per
    # edge end was ~300 MB more at the communities stage's peak)
    names = pl.concat([t.get_column("a"), t.get_column("b")]).unique().sort()
    node = names.to_list()
    at = [t.get_column(c).cast(pl.Enum(names)).to_physical().to_list() for c in ("a", "b")]
    return [(node[i], node[j], w) for i, j, w in zip(at[0], at[1], t.get_column("w").to_list())]


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
