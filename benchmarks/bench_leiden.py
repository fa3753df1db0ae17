"""Leiden's memory per edge: what the communities stage (one task, hierarchical Leiden over the whole graph) needs.

For each size and each way, a fresh process builds a graph of N nodes and M weighted edges with community structure
(nodes in groups of ~50, 80 % of a node's edges inside its group, seeded) and runs hierarchical Leiden over it:

* ``arrays``: as the communities stage runs it (``communities.hierarchical_leiden``: integer arrays, graspologic-native's
  ``leiden_csr`` reading a CSR matrix in place);
* ``tuples``: the baseline, as it ran before (a list of (node name, node name, weight) tuples handed to
  ``graspologic_native.hierarchical_leiden``, which copies it into a network of its own).

Reports the process's peak RSS over its baseline (Python and the imports), split into the input and Leiden itself;
whether the two ways give the same level 0 (the same partition); and the modularity of each way's deepest
communities. Prints MB and bytes per edge, the ratio of the two, and the largest graph a worker of a given memory
can take.

    .venv/bin/python benchmarks/bench_leiden.py --edges 500000 2000000 [--worker-gb 16] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def child(way: str, saved: str, seed: int) -> None:
    import hashlib

    import numpy as np

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

    def rss_mb() -> float:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * 4096 / 2**20

    graph = np.load(saved)
    n_nodes = int(graph["nodes"])
    if way == "arrays":
        import pyarrow as pa

        from tasks.methods.hirag.communities import Graph, hierarchical_leiden
    else:
        import graspologic_native as gn
    base = rss_mb()
    lo, hi, weight = graph["lo"], graph["hi"], graph["weight"]
    names = [f"ent-{i:012x}" for i in range(n_nodes)]  # an id's length, one string per node
    if way == "arrays":
        graph = Graph(pa.array(names), lo.astype(np.int32), hi.astype(np.int32), weight)  # as ``graph_arrays`` gives
        del names
    else:
        edges = [(names[a], names[b], w) for a, b, w in zip(lo.tolist(), hi.tolist(), weight.tolist())]
    listed = rss_mb()
    t0 = time.perf_counter()
    label0 = np.full(n_nodes, -1)
    deepest = np.full(n_nodes, -1)
    if way == "arrays":
        levels = hierarchical_leiden(graph, max_cluster_size=10, seed=seed)
        seconds = time.perf_counter() - t0
        label0[levels[0].nodes] = levels[0].cluster
        for lv in levels:
            deepest[lv.nodes] = lv.cluster
        depth = len(levels)
    else:
        found = gn.hierarchical_leiden(edges=edges, max_cluster_size=10, seed=seed)
        seconds = time.perf_counter() - t0
        at = {}
        for hc in found:
            i = int(hc.node[4:], 16)
            if hc.level == 0:
                label0[i] = hc.cluster
            if hc.level >= at.get(i, -1):
                at[i], deepest[i] = hc.level, hc.cluster
        depth = 1 + max(hc.level for hc in found)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    def partition(labels) -> str:  # the same partition gives the same digest, whatever the community numbers
        _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
        return hashlib.sha256(np.argsort(np.argsort(first))[inverse].tobytes()).hexdigest()[:16]

    def modularity(labels) -> float:
        _, c = np.unique(labels, return_inverse=True)
        m = weight.sum()
        degree = np.bincount(np.r_[lo, hi], weights=np.r_[weight, weight], minlength=n_nodes)
        return float(weight[c[lo] == c[hi]].sum() / m - (np.bincount(c, weights=degree) ** 2).sum() / (4 * m * m))

    print(
        "RESULT "
        + json.dumps(
            {
                "way": way,
                "edges": len(lo),
                "nodes": n_nodes,
                "base_mb": base,
                "input_mb": listed - base,
                "peak_over_base_mb": peak - base,
                "leiden_s": seconds,
                "levels": depth,
                "level0": partition(label0),
                "modularity_level0": modularity(label0),
                "modularity_deepest": modularity(deepest),
            }
        )
    )


def generate(n_edges: int, seed: int, path: str) -> None:
    """A graph of ``n_edges`` edge draws over ``n_edges // 10`` nodes in groups of ~50 (80 % of the draws inside a
    group), each pair once, weights 1 to 3, saved to ``path`` (``.npz``): the children read it without building it."""
    import numpy as np

    n_nodes = max(100, n_edges // 10)  # ~20 edge ends a node, as layer 0 at 100k chunks (120k entities, 2.3M edges)
    rng = np.random.default_rng(seed)
    src = rng.integers(0, n_nodes, n_edges)
    group = src // 50
    inside = rng.random(n_edges) < 0.8
    dst = np.minimum(
        np.where(inside, group * 50 + rng.integers(0, 50, n_edges), rng.integers(0, n_nodes, n_edges)), n_nodes - 1
    )
    keep = src != dst
    pair = np.unique(np.minimum(src, dst)[keep] * n_nodes + np.maximum(src, dst)[keep])  # each pair once, sorted
    weight = rng.integers(1, 4, len(pair)).astype(np.float64)
    np.savez(path, lo=pair // n_nodes, hi=pair % n_nodes, weight=weight, nodes=n_nodes)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--edges", type=int, nargs="+", default=[500_000, 2_000_000])
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--worker-gb", type=float, default=16.0)
    ap.add_argument("--json")
    args = ap.parse_args()
    results = []
    work = tempfile.TemporaryDirectory(prefix="bench-leiden-")  # the graphs the children read, removed at the end
    for m in args.edges:
        pair = {}
        saved = os.path.join(work.name, f"graph-{m}.npz")
        generate(m, args.seed, saved)
        for way in ("tuples", "arrays"):
            out = subprocess.run(
                [sys.executable, __file__, "--child", way, saved, str(args.seed)],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            r = json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])
            r["bytes_per_edge"] = r["peak_over_base_mb"] * 2**20 / r["edges"]
            results.append(r)
            pair[way] = r
            print(
                f"{r['edges']:>11,} edges, {r['nodes']:>9,} nodes, {way:>6}: input {r['input_mb']:.0f} MB, peak "
                f"{r['peak_over_base_mb']:.0f} MB over the process's {r['base_mb']:.0f} MB "
                f"({r['bytes_per_edge']:.0f} bytes an edge), Leiden {r['leiden_s']:.1f} s, {r['levels']} levels, "
                f"modularity level 0 {r['modularity_level0']:.4f}, deepest {r['modularity_deepest']:.4f}",
                flush=True,
            )
        t, a = pair["tuples"], pair["arrays"]
        print(
            f"{'':>11}  arrays / tuples: memory {a['bytes_per_edge'] / t['bytes_per_edge']:.2f}x, time "
            f"{a['leiden_s'] / t['leiden_s']:.2f}x; level 0 the same partition: {a['level0'] == t['level0']}",
            flush=True,
        )
    work.cleanup()
    for way in ("tuples", "arrays"):  # what one edge more costs, the process's fixed part left out
        mine = sorted((r for r in results if r["way"] == way), key=lambda r: r["edges"])
        if len(mine) > 1 and mine[-1]["edges"] > mine[0]["edges"]:
            extra = (mine[-1]["peak_over_base_mb"] - mine[0]["peak_over_base_mb"]) * 2**20
            print(f"{way}: {extra / (mine[-1]['edges'] - mine[0]['edges']):.0f} bytes an edge between the sizes")
    per_edge = max(r["bytes_per_edge"] for r in results if r["way"] == "arrays")
    print(
        f"a {args.worker_gb:g} GB worker takes about {args.worker_gb * 2**30 * 0.8 / per_edge / 1e6:.0f}M edges "
        f"(80 % of its memory at {per_edge:.0f} bytes an edge)"
    )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=2)


if __name__ == "__main__":
    main()
