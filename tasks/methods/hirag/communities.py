"""Communities: seeded hierarchical Leiden over the whole hierarchical KG G_k (all layers).

Uses graspologic-native, graspologic's own Leiden engine, on the graph as integer arrays (``leiden_csr`` reads a
CSR matrix in place), never as a Python edge list (a tuple and two strings an edge, which the engine then copies
into a network of its own; docs/benchmarks.md, "Leiden on arrays", measures both). Every connected component takes
part (GraphRAG and the HiRAG reference keep only the largest one), and entities with no edge at all become
singleton communities, so every node of G_k belongs to a level-0 community.

The hierarchy is graspologic-native's ``hierarchical_leiden``'s: Leiden over the whole graph is level 0; each
community of at least ``max_cluster_size`` entities is cut by Leiden over its own edges a level down, and so on,
until none is that large or none of those left splits. Level 0 is the same partition as ``hierarchical_leiden``'s
for the same edges and seed (nodes are numbered in the order its edge list first names them; a test pins this).
The levels below may differ from it: it draws every sub-run's randomness from one generator that its Python API
does not expose, where each sub-run here starts from ``seed``, so a community's split does not depend on which
others split before it.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from tasks.store.ids import make_id
from tasks.store.rows import relation_table


class Graph(NamedTuple):
    """Undirected weighted edges, each pair once: ``names[lo[i]]`` — ``names[hi[i]]`` of weight ``weight[i]``, with
    ``lo < hi``, sorted by (lo, hi); ``names`` sorted."""

    names: pa.Array
    lo: np.ndarray
    hi: np.ndarray
    weight: np.ndarray


def graph_arrays(relations: pa.Table | list[dict[str, Any]]) -> Graph:
    """G_k's undirected weighted edges (extracted and summary_of), merged per endpoint pair (weights summed in
    relation order), self-loops left out; endpoints as positions in the sorted node names (2.3M relations at 100k
    chunks: no string per edge, no Python object per edge)."""
    import pyarrow.compute as pc

    t = relation_table(relations)
    ends = [t.column(c) for c in ("source_id", "target_id")]
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
    total = np.add.reduceat(w, first) if len(key) else w.astype(np.float64)
    key = key[first]
    width = np.int32 if n < 2**31 else np.int64
    return Graph(names, (key // n).astype(width), (key % n).astype(width), total.astype(np.float64))


def _first_named(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The nodes of edges (lo, hi) in the order a walk over the edges first names them: graspologic-native's
    numbering of an edge list's nodes."""
    both = np.empty(2 * len(lo), dtype=np.int64)
    both[0::2], both[1::2] = lo, hi
    nodes, first = np.unique(both, return_index=True)
    return nodes[np.argsort(first, kind="stable")]


def leiden_arrays(
    lo: np.ndarray, hi: np.ndarray, w: np.ndarray, seed: int, resolution: float
) -> tuple[np.ndarray, np.ndarray]:
    """Leiden (modularity) over the edges (lo, hi, w) of node ids, each pair once: (the nodes, each one's
    community), the nodes in ``_first_named`` order, communities numbered from 0. The partition is
    graspologic-native's ``leiden`` over the same edges as (name, name, weight) tuples, from the same seed."""
    import graspologic_native as gn

    nodes = _first_named(lo, hi)
    local = np.zeros(int(nodes.max()) + 1, dtype=np.int32)  # a node's number in ``nodes``
    local[nodes] = np.arange(len(nodes), dtype=np.int32)
    rows = np.concatenate([local[lo], local[hi]])  # each edge both ways: the symmetric matrix the engine reads
    indices = np.concatenate([local[hi], local[lo]])
    del local
    order = np.lexsort((indices, rows))
    indptr = np.zeros(len(nodes) + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=len(nodes)), out=indptr[1:])
    del rows
    indices = indices[order]
    data = np.concatenate([w, w])[order]
    del order
    _, found = gn.leiden_csr(indptr, indices, data, len(nodes), resolution=resolution, seed=seed, use_modularity=True)
    return nodes, np.fromiter((found[i] for i in range(len(nodes))), dtype=np.int64, count=len(nodes))


class Level(NamedTuple):
    """One level's assignments: ``nodes[i]`` is in community ``cluster[i]``, a part of ``parent[i]`` a level up
    (level 0: no parent)."""

    level: int
    nodes: np.ndarray
    cluster: np.ndarray
    parent: np.ndarray | None


def hierarchical_leiden(graph: Graph, max_cluster_size: int, seed: int, resolution: float = 1.0) -> list[Level]:
    """The levels of hierarchical Leiden over ``graph`` (module docstring): level 0 covers every node an edge
    names; a level below holds the nodes of the communities it split. Community numbers are unique across levels."""
    lo, hi, w = graph.lo, graph.hi, graph.weight
    if not len(lo):
        return []
    nodes, cluster = leiden_arrays(lo, hi, w, seed, resolution)
    levels = [Level(0, nodes, cluster, None)]
    where = np.full(len(graph.names), -1, dtype=np.int64)  # each node's community, the deepest so far
    where[nodes] = cluster
    unsplit: set[int] = set()
    following = int(cluster.max()) + 1
    while True:
        sizes = np.bincount(where[where >= 0])
        cut = [int(k) for k in np.flatnonzero(sizes >= max(2, max_cluster_size)) if int(k) not in unsplit]
        if not cut:
            return levels
        inside = (where[lo] == where[hi]) & np.isin(where[lo], cut)
        ea, eb, ew = lo[inside], hi[inside], w[inside]
        owner = where[ea]
        order = np.argsort(owner, kind="stable")
        ea, eb, ew, owner = ea[order], eb[order], ew[order], owner[order]
        bounds = np.searchsorted(owner, cut + [max(cut) + 1])  # ``cut`` is ascending: each community's edges
        parts: list[tuple[np.ndarray, np.ndarray, int]] = []
        for k, start, end in zip(cut, bounds[:-1], bounds[1:]):
            if start == end:  # no edge inside (Leiden's communities are connected: not seen)
                unsplit.add(k)
                continue
            sub, found = leiden_arrays(ea[start:end], eb[start:end], ew[start:end], seed, resolution)
            if found.max() == 0:  # Leiden keeps it whole: it is not cut again
                unsplit.add(k)
                continue
            parts.append((sub, found + following, k))
            following += int(found.max()) + 1
        if not parts:
            return levels
        sub_nodes = np.concatenate([p[0] for p in parts])
        sub_cluster = np.concatenate([p[1] for p in parts])
        levels.append(
            Level(len(levels), sub_nodes, sub_cluster, np.concatenate([np.full(len(p[0]), p[2]) for p in parts]))
        )
        where[sub_nodes] = sub_cluster


def community_id(level: int, members: list[str]) -> str:
    return make_id("comm", level, ",".join(sorted(members)))


def detect_communities(
    entity_ids: list[str],
    relations: pa.Table | list[dict[str, Any]] | Graph,
    max_cluster_size: int,
    seed: int,
    resolution: float = 1.0,
) -> list[dict[str, Any]]:
    """Community rows ``{id, level, parent_id, entity_ids, size}``; level 0 covers every entity. ``relations``: G_k's
    relations, or their ``graph_arrays`` (a caller that need not hold the relations while Leiden runs)."""
    graph = relations if isinstance(relations, Graph) else graph_arrays(relations)
    rows = level_rows(graph, hierarchical_leiden(graph, max_cluster_size, seed, resolution))
    covered = {e for r in rows if r["level"] == 0 for e in r["entity_ids"]}
    for eid in sorted(set(entity_ids) - covered):  # isolated entities: kept as singletons
        rows.append({"id": community_id(0, [eid]), "level": 0, "parent_id": None, "entity_ids": [eid], "size": 1})
    return sorted(rows, key=lambda r: (r["level"], r["id"]))


def level_rows(graph: Graph, levels: list[Level], offset: int = 0, parent: str | None = None) -> list[dict[str, Any]]:
    """Community rows ``{id, level, parent_id, entity_ids, size}`` of ``hierarchical_leiden``'s ``levels`` over
    ``graph``, each level ``offset`` deeper, the first level's communities parts of ``parent`` (an id)."""
    members: dict[tuple[int, int], list[str]] = defaultdict(list)
    parent_of: dict[tuple[int, int], int | None] = {}
    for lv in levels:
        names = graph.names.take(pa.array(lv.nodes)).to_pylist()
        parents = lv.parent.tolist() if lv.parent is not None else [None] * len(names)
        for node, cluster, up in zip(names, lv.cluster.tolist(), parents):
            members[(lv.level, cluster)].append(node)
            parent_of[(lv.level, cluster)] = up
    # ids are content hashes of (level, members); parents map by (level - 1, parent community)
    ids = {key: community_id(key[0] + offset, m) for key, m in members.items()}
    return [
        {
            "id": ids[(level, cluster)],
            "level": level + offset,
            "parent_id": ids.get((level - 1, up)) if up is not None else parent,
            "entity_ids": sorted(m),
            "size": len(m),
        }
        for (level, cluster), m in members.items()
        for up in [parent_of[(level, cluster)]]
    ]
