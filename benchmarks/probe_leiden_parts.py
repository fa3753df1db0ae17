"""A probe of communities over parts (issue 69, item 1): Leiden per part of the graph, then Leiden over the graph
contracted by the parts' communities, against one Leiden over the whole graph. No product change.

Reads the published relations of an index (layer 0 and the hierarchy's ``summary_of`` links: the graph the
communities stage runs on), and prints for each way of cutting the graph into parts: the parts' communities
(the contracted graph's nodes), its pairs of nodes, and the modularity of the result on the whole graph, beside
the single task's.

    .venv/bin/python benchmarks/probe_leiden_parts.py --index IDX [--parts 4 16] [--seed 42]

Ways (each node of the graph in one part):

* ``document``: a layer-0 entity's part is a hash of the document of its first source chunk (the chunks a document
  holds stay together; a summary entity's is its own first chunk's);
* ``random``: a seeded draw; also with each part's Leiden at resolution 16 and 64 (finer communities of the parts);
* ``clusters``: no parts, the hierarchy's layer-1 clusters as the contracted graph's nodes (each layer-0 entity in
  the first cluster it is a member of).

The contracted graph carries no self-loops; ``--loops`` adds each node's inner weight as one (x1 and x2).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def modularity(lo: np.ndarray, hi: np.ndarray, w: np.ndarray, n: int, comm: np.ndarray) -> float:
    """Newman's modularity (resolution 1) of the partition ``comm`` (a community number per node)."""
    m = w.sum()
    deg = np.bincount(lo, w, n) + np.bincount(hi, w, n)
    same = comm[lo] == comm[hi]
    k = int(comm.max()) + 1
    inner = np.bincount(comm[lo][same], w[same], k)
    total = np.bincount(comm, deg, k)
    return float((inner / m - (total / (2 * m)) ** 2).sum())


def leiden_with_loops(a: np.ndarray, b: np.ndarray, w: np.ndarray, n: int, loops: np.ndarray, seed: int) -> np.ndarray:
    """graspologic-native's Leiden over a symmetric CSR matrix with ``loops`` on its diagonal; a community a node."""
    import graspologic_native as gn

    rows = np.concatenate([a, b, np.arange(n)])
    cols = np.concatenate([b, a, np.arange(n)])
    data = np.concatenate([w, w, loops])
    keep = data > 0
    rows, cols, data = rows[keep], cols[keep], data[keep]
    order = np.lexsort((cols, rows))
    rows, cols, data = rows[order], cols[order], data[order]
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n), out=indptr[1:])
    _, found = gn.leiden_csr(indptr, cols.astype(np.int32), data.astype(np.float64), n, seed=seed, use_modularity=True)
    return np.array([found.get(i, i + n) for i in range(n)])


def numbered(labels: np.ndarray) -> np.ndarray:
    return np.unique(labels, return_inverse=True)[1]


def contract(lo, hi, w, n, sup, seed, loops_factor, label, parts=None):
    """Leiden over the graph whose nodes are ``sup`` (a super-node per node), then the modularity on the whole."""
    a, b = sup[lo], sup[hi]
    s = int(sup.max()) + 1
    cross = a != b
    loops = np.bincount(a[~cross], w[~cross], s) * loops_factor
    ca, cb, cw = np.minimum(a, b)[cross], np.maximum(a, b)[cross], w[cross]
    key = ca * s + cb
    order = np.argsort(key, kind="stable")
    key, cw = key[order], cw[order]
    first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    total, key = np.add.reduceat(cw, first), key[first]
    top = leiden_with_loops(key // s, key % s, total, s, loops, seed)
    comm = numbered(top[sup])
    q = modularity(lo, hi, w, n, comm)
    print(
        f"{label:<44} {parts or '—':>5} {s:>9,} {len(key):>9,} {loops_factor:>5} {q:>10.4f} {int(comm.max()) + 1:>6}"
    )


def per_part(lo, hi, w, n, part, seed, resolution):
    """Each node's community of Leiden over its part's own edges (a node with none: a community of its own)."""
    from tasks.methods.hirag.communities import leiden_arrays

    sup, following = np.full(n, -1), 0
    for p in range(int(part.max()) + 1):
        inside = (part[lo] == p) & (part[hi] == p)
        if inside.any():
            nodes, found = leiden_arrays(lo[inside], hi[inside], w[inside], seed, resolution)
            sup[nodes] = found + following
            following += int(found.max()) + 1
    lone = sup < 0
    sup[lone] = np.arange(int(lone.sum())) + following
    return sup


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--index", required=True)
    ap.add_argument("--parts", type=int, nargs="+", default=[4, 16])
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--loops", action="store_true", help="also with the inner weight as a self-loop (x1, x2)")
    args = ap.parse_args()

    from flows.cli.common import open_catalog
    from tasks.methods.hirag.communities import graph_arrays, leiden_arrays
    from tasks.query.inspect import inspect_data

    cat = open_catalog(args.index, None, None)
    snap = cat.require_snapshot(inspect_data(cat, None, 1)["version"])
    rels = cat.read("relations", snap=snap, columns=["source_id", "target_id", "kind", "weight"])
    ents = cat.read("entities", snap=snap, columns=["id", "layer", "source_chunk_ids"]).to_pylist()
    chunks = cat.read("chunks", snap=snap, columns=["id", "document_id"]).to_pylist()
    g = graph_arrays(rels)
    names, n = g.names.to_pylist(), len(g.names)
    lo, hi, w = g.lo.astype(np.int64), g.hi.astype(np.int64), g.weight
    nodes, found = leiden_arrays(lo, hi, w, args.seed, 1.0)
    single = np.arange(n) + n
    single[nodes] = found
    single = numbered(single)
    print(f"graph: {n:,} nodes, {len(lo):,} edges; one Leiden task: modularity {modularity(lo, hi, w, n, single):.4f}, "
          f"{int(found.max()) + 1} communities")  # fmt: skip
    print(f"{'way':<44} {'parts':>5} {'nodes':>9} {'pairs':>9} {'loops':>5} {'modularity':>10} {'comms':>6}")
    loops = (0.0, 1.0, 2.0) if args.loops else (0.0,)

    document = {c["id"]: c["document_id"] for c in chunks}
    home = {e["id"]: document.get(min(e["source_chunk_ids"] or [e["id"]]), e["id"]) for e in ents}
    digest = [int(hashlib.md5(home.get(x, x).encode()).hexdigest(), 16) for x in names]
    for p in args.parts:
        sup = per_part(lo, hi, w, n, np.array([d % p for d in digest]), args.seed, 1.0)
        for f in loops:
            contract(lo, hi, w, n, sup, args.seed, f, "document", p)
        drawn = np.random.default_rng(args.seed).integers(0, p, n)
        for resolution in (1.0, 16.0, 64.0):
            sup = per_part(lo, hi, w, n, drawn, args.seed, resolution)
            for f in loops:
                contract(lo, hi, w, n, sup, args.seed, f, f"random, parts' resolution {resolution:g}", p)

    layer = {e["id"]: e["layer"] for e in ents}
    cluster: dict[str, str] = {}
    ends = zip(*(rels.column(c).to_pylist() for c in ("kind", "source_id", "target_id")))
    for kind, s, t in sorted(ends, key=lambda r: (r[1], r[2])):
        if kind == "summary_of" and layer.get(s) == 0 and layer.get(t) == 1:
            cluster.setdefault(s, t)
    at = {x: i for i, x in enumerate(names)}
    sup = np.array([at.get(cluster.get(x, x), i) for i, x in enumerate(names)])
    for f in loops:
        contract(lo, hi, w, n, numbered(sup), args.seed, f, "clusters: layer 1's as the nodes")


if __name__ == "__main__":
    main()
