"""Leiden's memory per edge: what the communities stage (one task, graspologic-native's hierarchical Leiden) needs.

For each size, a fresh process builds a graph of N nodes and M weighted edges with community structure (nodes in
groups of ~50, 80 % of a node's edges inside its group, seeded), as ``communities.graph_edges`` hands it to
``graspologic_native.hierarchical_leiden`` (a list of (node name, node name, weight) tuples), runs it, and reports
the process's peak RSS over its baseline (Python and the imports), split into the edge list and Leiden itself.
Prints MB and bytes per edge, and the largest edge list a worker of a given memory can take.

    .venv/bin/python benchmarks/bench_leiden.py --edges 500000 2000000 [--worker-gb 16] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def child(n_edges: int, seed: int) -> None:
    import graspologic_native as gn
    import numpy as np

    def rss_mb() -> float:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * 4096 / 2**20

    n_nodes = max(100, n_edges // 10)  # ~20 edge ends a node, as layer 0 at 100k chunks (120k entities, 2.3M edges)
    rng = np.random.default_rng(seed)
    base = rss_mb()
    src = rng.integers(0, n_nodes, n_edges)
    group = src // 50
    inside = rng.random(n_edges) < 0.8
    dst = np.where(inside, group * 50 + rng.integers(0, 50, n_edges), rng.integers(0, n_nodes, n_edges))
    dst = np.minimum(dst, n_nodes - 1)
    keep = src != dst
    names = [f"ent-{i:012x}" for i in range(n_nodes)]  # an id's length, one string per node
    edges = [(names[a], names[b], 1.0) for a, b in zip(src[keep].tolist(), dst[keep].tolist())]
    del src, dst, group, inside, keep
    listed = rss_mb()
    t0 = time.perf_counter()
    levels = max(hc.level for hc in gn.hierarchical_leiden(edges=edges, max_cluster_size=10, seed=7))
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        "RESULT "
        + json.dumps(
            {
                "edges": len(edges),
                "nodes": n_nodes,
                "base_mb": base,
                "edge_list_mb": listed - base,
                "peak_over_base_mb": peak - base,
                "leiden_s": seconds,
                "levels": levels + 1,
            }
        )
    )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(int(sys.argv[2]), int(sys.argv[3]))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--edges", type=int, nargs="+", default=[500_000, 2_000_000])
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--worker-gb", type=float, default=16.0)
    ap.add_argument("--json")
    args = ap.parse_args()
    results = []
    for m in args.edges:
        out = subprocess.run(
            [sys.executable, __file__, "--child", str(m), str(args.seed)], capture_output=True, text=True, check=True
        ).stdout
        r = json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])
        r["bytes_per_edge"] = r["peak_over_base_mb"] * 2**20 / r["edges"]
        results.append(r)
        print(
            f"{r['edges']:>11,} edges, {r['nodes']:>10,} nodes: edge list {r['edge_list_mb']:.0f} MB, peak "
            f"{r['peak_over_base_mb']:.0f} MB over the process's {r['base_mb']:.0f} MB "
            f"({r['bytes_per_edge']:.0f} bytes an edge), Leiden {r['leiden_s']:.1f} s, {r['levels']} levels",
            flush=True,
        )
    per_edge = max(r["bytes_per_edge"] for r in results)
    print(
        f"a {args.worker_gb:g} GB worker takes about {args.worker_gb * 2**30 * 0.8 / per_edge / 1e6:.0f}M edges "
        f"(80 % of its memory at {per_edge:.0f} bytes an edge)"
    )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=2)


if __name__ == "__main__":
    main()
