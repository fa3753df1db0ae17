"""Communities over parts of the graph: the ``parts`` engine of the communities stage, whose largest task is bounded
by ``communities.part_relations``, not by the corpus (issue 69; figures: docs/benchmarks.md, "Communities over
parts").

Level 0 is Louvain's (``hirag.louvain``) in synchronous rounds: the graph's directed edges are split into parts by
their source node (``edges_task``, then ``gather_task``), each round is a task per part (``moves_task``) against the
labels of the round's start, and each level's communities are contracted into the next level's nodes by a task per
part (``contract_task``), until a level fits one task (``finish_task``) or merges nothing; last, single nodes move
between the final communities over the first level's parts. The run's process holds the ids (sorted once) and a
label and a degree per node, never an edge. Each level-0 community is then cut into its connected pieces (Leiden's communities are connected;
Louvain's need not be), and the levels below are ``hierarchical_leiden``'s over each piece's own edges, a task per
bucket of communities (``rows_task``), so the hierarchy keeps its meaning: a community larger than
``max_cluster_size`` is cut a level down.

The same relations and settings give the same communities. Another ``part_relations`` gives communities of the
same modularity but not always the same ones: the level that is finished in one task comes at another level, and
the coarse levels sum their weights in another order. On full MuSiQue's graph (one task holds it) the partition
differs from the ``leiden`` engine's (another algorithm) with modularity 0.644 against 0.629.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from schemas.tables import schema_for
from tasks.methods.base import check_memory
from tasks.methods.hirag import louvain
from tasks.methods.hirag.communities import Graph, community_id, hierarchical_leiden, level_rows
from tasks.store import workfs
from tasks.store.rows import to_table
from tasks.store.spill import SpilledTable, write_whole

#: what a part's task holds per relation of its part, at most: each relation twice (a directed edge each way) as
#: (source, target, weight) and the sort of one round (``louvain.best_moves``), with room to spare
PART_BYTES_PER_RELATION = 160
#: and per node of the graph: its label, its degree, the community totals of a round, and (in the tasks that map
#: ids to numbers or numbers to ids) its id with the lookup's hash table
PART_BYTES_PER_NODE = 100

_EDGES = pa.schema([("src", pa.int64()), ("dst", pa.int64()), ("w", pa.float64())])


def check_part_memory(part_relations: int, nodes: int, room: int) -> None:
    """Refuse, before the communities stage starts, parts whose task would not fit in a worker (``room`` bytes)."""
    check_memory(
        part_relations * PART_BYTES_PER_RELATION + nodes * PART_BYTES_PER_NODE,
        room,
        f"the communities stage's tasks over parts of {part_relations:,} relations of a graph of {nodes:,} entities",
        "a worker has",
        "Make the parts smaller (communities.part_relations), or run on workers with more memory.",
    )


def communities_in_parts(ctx: Any, entity_ids: pa.ChunkedArray, relations: SpilledTable, work: str) -> SpilledTable:
    """The ``communities`` table of the graph whose relations are spilled, over parts (module docstring): files of
    rows stamped with the run's version, in ``work`` (made here, after ``check_part_memory``). A node's number is
    its entity id's place among the ids sorted; a relation whose end is not an entity is left out."""
    cfg, mapper, seed = ctx.cfg.communities, ctx.mapper, ctx.cfg.seed
    names = pc.unique(entity_ids)
    names, n = names.take(pc.sort_indices(names)), len(names)
    check_part_memory(min(cfg.part_relations, relations.num_rows), n, mapper.task_memory())
    workfs.mkdirs(work)
    parts = max(1, math.ceil(relations.num_rows / cfg.part_relations))
    names_at = workfs.join(work, "names.parquet")
    write_whole(pa.table({"id": names}), names_at)
    jobs = list(enumerate(relations.files))
    mapper(edges_task, jobs, names=names_at, parts=parts, work=work)
    files = gather(ctx, work, "0", [[workfs.join(work, f"e-{i}-{p}.parquet") for i, _ in jobs] for p in range(parts)])
    deg = np.zeros(n)
    for nodes, d in mapper(degree_task, files):
        deg[nodes] += d
    m = float(deg.sum()) / 2
    labels = np.arange(n, dtype=np.int64)
    if m > 0:
        labels = coarsened(ctx, work, files, deg, m, parts)
        labels = rounds(ctx, work, files, labels, deg, m, louvain.REFINE_LEVEL)
    at = workfs.join(work, "labels-final.npy")
    workfs.save_array(labels, at)
    mapper(intra_task, list(enumerate(files)), labels=at, buckets=parts, work=work)
    outs = [workfs.join(work, f"communities-{b}.parquet") for b in range(parts)]
    counts = mapper(
        rows_task,
        list(enumerate(outs)),
        parts=parts,
        work=work,
        labels=at,
        names=names_at,
        max_cluster_size=cfg.max_cluster_size,
        seed=seed,
        resolution=cfg.resolution,
        version=ctx.version,
    )
    return SpilledTable(outs, schema_for("communities", 0), sum(counts))


def gather(ctx: Any, work: str, level: str, pieces: list[list[str]]) -> list[str]:
    """Each part's pieces as one file (``gather_task``): the level's part files."""
    outs = [workfs.join(work, f"part-{level}-{p}.parquet") for p in range(len(pieces))]
    ctx.mapper(gather_task, list(zip(outs, pieces)))
    return outs


def coarsened(ctx: Any, work: str, files: list[str], deg: np.ndarray, m: float, parts: int) -> np.ndarray:
    """Each node's community after Louvain's levels over the parts (``louvain``'s, a round a map of tasks): a
    level that fits one task (``communities.part_relations`` relations) is finished in it."""
    cfg, mapper = ctx.cfg.communities, ctx.mapper
    mapping = np.arange(len(deg), dtype=np.int64)
    level, level_deg = 0, deg
    while True:
        edges = sum(workfs.parquet_file(f).metadata.num_rows for f in files)
        if edges <= 2 * cfg.part_relations:
            [labels] = mapper(
                finish_task, [files], deg=_saved(work, f"deg-{level}", level_deg), m=m, seed=ctx.cfg.seed,
                level=level, resolution=cfg.resolution,
            )  # fmt: skip
            return labels[mapping]
        labels = rounds(ctx, work, files, np.arange(len(level_deg), dtype=np.int64), level_deg, m, level)
        if int(labels.max()) + 1 == len(level_deg):
            return mapping
        at = _saved(work, f"labels-{level}", labels)
        mapper(contract_task, list(enumerate(files)), labels=at, parts=parts, work=work, level=level + 1)
        files = gather(
            ctx, work, str(level + 1),
            [[workfs.join(work, f"c{level + 1}-{i}-{p}.parquet") for i in range(len(files))] for p in range(parts)],
        )  # fmt: skip
        mapping, level_deg = labels[mapping], np.bincount(labels, level_deg, int(labels.max()) + 1)
        level += 1


def rounds(
    ctx: Any, work: str, files: list[str], labels: np.ndarray, deg: np.ndarray, m: float, level: int
) -> np.ndarray:
    """``louvain.level_rounds`` with a task per part a round: each moves its nodes of the round's half against the
    labels of the round's start (saved for them), until a round moves nothing."""
    cfg, mapper = ctx.cfg.communities, ctx.mapper
    deg_at = _saved(work, f"deg-{level}", deg)
    for r in range(louvain.MAX_ROUNDS):
        at = _saved(work, f"labels-{level}-{r}", labels)
        moved = mapper(
            moves_task, files, labels=at, deg=deg_at, m=m, seed=ctx.cfg.seed, level=level, round_=r,
            resolution=cfg.resolution,
        )  # fmt: skip
        workfs.remove(at)
        if not any(len(nodes) for nodes, _ in moved):
            break
        labels = labels.copy()
        for nodes, to in moved:
            labels[nodes] = to
    return louvain.numbered(labels)


def _saved(work: str, name: str, x: np.ndarray) -> str:
    at = workfs.join(work, f"{name}.npy")
    workfs.save_array(x, at)
    return at


def _edges(files: list[str]) -> pa.Table:
    return pa.concat_tables([_EDGES.empty_table(), *(workfs.read_table(f) for f in files if workfs.exists(f))])


def _arrays(t: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return tuple(t.column(c).to_numpy() for c in ("src", "dst", "w"))  # type: ignore[return-value]


def _split(src: np.ndarray, dst: np.ndarray, w: np.ndarray, by: np.ndarray, parts: int, at) -> None:
    """The edges as a file per part (``by % parts``), ``at(p)`` its path; none for a part that gets none."""
    part = by % parts
    for p in np.unique(part).tolist():
        keep = part == p
        write_whole(pa.table([src[keep], dst[keep], w[keep]], schema=_EDGES), at(p))


def edges_task(job: tuple[int, str], names: str, parts: int, work: str) -> int:
    """One relation file's edges, both ways, as node numbers (places in ``names``), split by source node into
    ``parts`` files (a task); self-loops and ends that name no entity left out."""
    i, file = job
    t = workfs.read_table(file, columns=["source_id", "target_id", "weight"])
    value_set = workfs.read_table(names).column("id")
    a, b = (
        pc.fill_null(pc.index_in(t.column(c), value_set=value_set), -1).to_numpy().astype(np.int64)
        for c in ("source_id", "target_id")
    )
    w = t.column("weight").to_numpy().astype(np.float64)
    keep = (a >= 0) & (b >= 0) & (a != b)
    a, b, w = a[keep], b[keep], w[keep]
    src, dst = np.concatenate([a, b]), np.concatenate([b, a])
    _split(src, dst, np.concatenate([w, w]), src, parts, lambda p: workfs.join(work, f"e-{i}-{p}.parquet"))
    return len(src)


def gather_task(job: tuple[str, list[str]]) -> int:
    """A part's pieces (each file's share) as one file, in the pieces' order (a task)."""
    out, pieces = job
    t = _edges(pieces)
    write_whole(t, out)
    return t.num_rows


def degree_task(file: str) -> tuple[np.ndarray, np.ndarray]:
    """(nodes, their degrees) of a part's source nodes (a task)."""
    src, _, w = _arrays(workfs.read_table(file))
    nodes, inverse = np.unique(src, return_inverse=True)
    return nodes, np.bincount(inverse, w, len(nodes))


def moves_task(
    file: str, labels: str, deg: str, m: float, seed: int, level: int, round_: int, resolution: float
) -> tuple[np.ndarray, np.ndarray]:
    """A part's moves of one round (``louvain.best_moves``, a task)."""
    src, dst, w = _arrays(workfs.read_table(file))
    lab, dg = workfs.load_array(labels), workfs.load_array(deg)
    tot = np.bincount(lab, dg, int(lab.max()) + 1)
    return louvain.best_moves(src, dst, w, lab, dg, tot, m, resolution, louvain.movers(src, seed, level, round_))


def contract_task(job: tuple[int, str], labels: str, parts: int, work: str, level: int) -> int:
    """A part's edges between communities (``louvain.contract``), split by the source community into ``parts``
    files: pieces of the next level's parts (a task)."""
    i, file = job
    src, dst, w = louvain.contract(*_arrays(workfs.read_table(file)), workfs.load_array(labels))
    _split(src, dst, w, src, parts, lambda p: workfs.join(work, f"c{level}-{i}-{p}.parquet"))
    return len(src)


def finish_task(files: list[str], deg: str, m: float, seed: int, level: int, resolution: float) -> np.ndarray:
    """The rest of Louvain's levels over a level that fits one task: each of its nodes' community (a task)."""
    src, dst, w = _arrays(_edges(files))
    dg = workfs.load_array(deg)
    return louvain.louvain(src, dst, w, len(dg), seed, resolution, deg=dg, m=m, first_level=level)


def intra_task(job: tuple[int, str], labels: str, buckets: int, work: str) -> int:
    """A part's edges inside a community, once each (source < target), split by community into ``buckets``
    files (a task)."""
    p, file = job
    src, dst, w = _arrays(workfs.read_table(file))
    lab = workfs.load_array(labels)
    keep = (src < dst) & (lab[src] == lab[dst])
    src, dst, w = src[keep], dst[keep], w[keep]
    _split(src, dst, w, lab[src], buckets, lambda b: workfs.join(work, f"in-{p}-{b}.parquet"))
    return len(src)


def rows_task(
    job: tuple[int, str],
    parts: int,
    work: str,
    labels: str,
    names: str,
    max_cluster_size: int,
    seed: int,
    resolution: float,
    version: int,
) -> int:
    """The ``communities`` rows of a bucket of level-0 communities (a task): each cut into its connected pieces
    (level 0), each piece of at least ``max_cluster_size`` entities cut by ``hierarchical_leiden`` over its own
    edges a level down and so on; written to ``out``, their number returned. Bucket ``b`` of as many as there are
    ``parts``: the communities whose number is ``b`` modulo that, their edges the pieces each part wrote for it."""
    b, out = job
    lab = workfs.load_array(labels)
    buckets = parts
    src, dst, w = _arrays(_edges([workfs.join(work, f"in-{p}-{b}.parquet") for p in range(parts)]))
    ids = workfs.read_table(names).column("id")
    mine = np.flatnonzero(lab % buckets == b)
    mine = mine[np.argsort(lab[mine], kind="stable")]
    bounds = np.flatnonzero(np.r_[True, lab[mine][1:] != lab[mine][:-1], True]) if len(mine) else np.zeros(1, int)
    order = np.argsort(lab[src], kind="stable")
    src, dst, w = src[order], dst[order], w[order]
    owner, communities = lab[src], lab[mine[bounds[:-1]]]
    edge_at = np.searchsorted(owner, communities, side="left")
    edge_end = np.searchsorted(owner, communities, side="right")
    rows: list[dict[str, Any]] = []
    for k in range(len(bounds) - 1):
        members = mine[bounds[k] : bounds[k + 1]]
        s, e = edge_at[k], edge_end[k]
        rows.extend(_community_rows(members, src[s:e], dst[s:e], w[s:e], ids, max_cluster_size, seed, resolution))
    write_whole(to_table("communities", sorted(rows, key=lambda r: (r["level"], r["id"])), 0, version), out)
    return len(rows)


def _community_rows(
    members: np.ndarray,
    src: np.ndarray,
    dst: np.ndarray,
    w: np.ndarray,
    ids: pa.ChunkedArray,
    max_cluster_size: int,
    seed: int,
    resolution: float,
) -> list[dict[str, Any]]:
    """One level-0 community's rows: its connected pieces, and the levels below each large one."""
    local = np.searchsorted(members, src), np.searchsorted(members, dst)
    size = len(members)
    graph = coo_matrix((np.ones(len(src)), local), shape=(size, size))
    _, piece = connected_components(graph, directed=False)
    rows = []
    for k in range(int(piece.max()) + 1 if size else 0):
        inside = np.flatnonzero(piece == k)
        names = pa.concat_arrays(ids.take(pa.array(members[inside])).chunks)  # sorted: node numbers follow the ids
        entity_ids = names.to_pylist()
        row_id = community_id(0, entity_ids)
        rows.append({"id": row_id, "level": 0, "parent_id": None, "entity_ids": entity_ids, "size": len(inside)})
        if len(inside) < max(2, max_cluster_size):
            continue
        sub = _piece_graph(local, w, inside, size, names)
        levels = hierarchical_leiden(sub, max_cluster_size, seed, resolution)
        if levels and int(levels[0].cluster.max()) > 0:  # Leiden keeps it whole: no level below
            rows.extend(level_rows(sub, levels, offset=1, parent=row_id))
    return rows


def _piece_graph(
    local: tuple[np.ndarray, np.ndarray], w: np.ndarray, inside: np.ndarray, size: int, names: pa.Array
) -> Graph:
    """A connected piece's edges (``local``: its community's edges as places among the ``size`` members;
    ``inside``: the piece's places, ascending) as a ``Graph`` over its own nodes, each pair once with its summed
    weight in (lo, hi) order (``louvain.contract`` with a node a community), as ``graph_arrays`` makes them
    (``names``: the piece's ids, sorted, as node numbers follow the ids)."""
    place = np.full(size, -1, dtype=np.int64)
    place[inside] = np.arange(len(inside))
    a, b = place[local[0]], place[local[1]]
    keep = (a >= 0) & (b >= 0)
    lo, hi, total = louvain.contract(np.minimum(a, b)[keep], np.maximum(a, b)[keep], w[keep], np.arange(len(inside)))
    return Graph(names, lo, hi, total.astype(np.float64))
