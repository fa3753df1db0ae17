"""ArchRAG's C-HNSW search against an exhaustive per-layer search (prints figures; not a test).

Synthetic unit vectors in clusters (``--n`` entities, 384-d). Layers are built as ArchRAG builds them, with
the summaries' text vectors replaced by their members' centroids: KNN edges (k = 10, cosine >= threshold)
weighted by cosine, weighted Leiden, one node per community, until a layer has fewer than 8 nodes or stops
shrinking. Then the C-HNSW links (M intra-layer, one inter-layer per node). Queries are stored vectors plus
noise. For each query: the top-k of every layer by the top-down search and by an exhaustive scan of that
layer; recall@k of the search against the scan (layer 0 and all layers), and both timings (p50 / p99).

    .venv/bin/python benchmarks/bench_chnsw.py [--n 100000] [--k 20] [--queries 200] [--ef 64 --ef 256]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from schemas.config import ArchRAGConfig, RetrievalConfig  # noqa: E402
from tasks.methods.archrag import attributed_edges, chnsw_links, leiden_groups  # noqa: E402
from tasks.methods.archrag_search import hierarchical_search  # noqa: E402
from tasks.methods.common import unit  # noqa: E402
from tasks.retrieval.context import top_k


def synthetic(n: int, clusters: int, seed: int = 0, d: int = 384) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, d)).astype(np.float32)
    x = centres[rng.integers(0, clusters, n)] + 0.8 * rng.standard_normal((n, d)).astype(np.float32)
    return unit(x)


def layers_of(x: np.ndarray, cfg: ArchRAGConfig, seed: int) -> list[np.ndarray]:
    layers = [x]
    while len(layers) <= cfg.max_layers and len(layers[-1]) >= cfg.min_nodes:
        top = layers[-1]
        t0 = time.perf_counter()
        groups = leiden_groups(len(top), attributed_edges(top, [], cfg.knn_k, cfg.knn_threshold), cfg.resolution, seed)
        if len(groups) > (1 - cfg.min_shrink) * len(top):
            break
        layers.append(unit(np.stack([top[g].mean(axis=0) for g in groups])))
        print(f"  layer {len(layers) - 1}: {len(groups)} communities of {len(top)} nodes ({time.perf_counter() - t0:.1f} s)",
              flush=True)
    return layers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--k", type=int, default=20)
    ap.add_argument("--ef", type=int, action="append", help="search ef, repeatable (default 64)")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--scan-max", type=int, default=RetrievalConfig().search_scan_max,
                    help="layers of at most this many nodes are scanned (retrieval.search_scan_max; 0: walk every layer)")
    ap.add_argument("--threshold", type=float, default=0.3, help="KNN edge threshold (synthetic cosines run lower than text)")
    args = ap.parse_args()
    cfg = ArchRAGConfig(knn_threshold=args.threshold)
    x = synthetic(args.n, max(2, args.n // 50))
    print(f"{args.n} vectors; building layers (k={cfg.knn_k}, threshold={cfg.knn_threshold}) ...", flush=True)
    t0 = time.perf_counter()
    layers = layers_of(x, cfg, seed=1)
    t_layers = time.perf_counter() - t0
    t0 = time.perf_counter()
    intra, inter = chnsw_links(layers, cfg.hnsw_m)
    t_links = time.perf_counter() - t0
    print(f"layers {[len(layer) for layer in layers]} in {t_layers:.1f} s; C-HNSW links (M={cfg.hnsw_m}) in {t_links:.1f} s")
    rng = np.random.default_rng(2)
    noise = rng.standard_normal((args.queries, x.shape[1])).astype(np.float32)
    queries = unit(x[rng.integers(0, len(x), args.queries)] + 0.5 * unit(noise))  # a stored vector, noise of norm 0.5
    exact, t_scan = [], []
    for q in queries:
        t0 = time.perf_counter()
        exact.append([top_k(layer @ q, args.k) for layer in layers])
        t_scan.append(time.perf_counter() - t0)
    ms = lambda v, p: 1000 * float(np.percentile(v, p))  # noqa: E731
    print(f"exhaustive per layer p50 {ms(t_scan, 50):.1f} ms p99 {ms(t_scan, 99):.1f} ms")
    for ef in args.ef or [64]:
        t_search, hits = [], []
        for q, ex in zip(queries, exact):
            t0 = time.perf_counter()
            found = hierarchical_search(q, layers, intra, inter, args.k, ef, args.scan_max)
            t_search.append(time.perf_counter() - t0)
            hits.append([len(set(f) & set(e)) / max(1, len(e)) for f, e in zip(found, ex)])
        per_layer = np.mean(np.asarray(hits), axis=0)
        print(f"ef={ef}: recall@{args.k} vs exhaustive per layer {' / '.join(f'{r:.3f}' for r in per_layer)} "
              f"(layer 0 min {np.min(np.asarray(hits)[:, 0]):.2f}); C-HNSW search p50 {ms(t_search, 50):.1f} ms "
              f"p99 {ms(t_search, 99):.1f} ms; exhaustive / search {np.median(t_scan) / np.median(t_search):.1f}x")


if __name__ == "__main__":
    main()
