"""Vector search past memory: LanceDB vector indexes against exact search (prints figures; not a test).

Writes N synthetic unit vectors (384-d, clustered like entity embeddings: 2,000 centres plus noise) to a
LanceDB table, builds the vector index ``Catalog`` builds at publish (``tasks.store.catalog.build_vector_index``),
and queries it with perturbed copies of stored vectors, the way a question lands near its entities. Prints
the index build time, recall@20 against exact search (numpy, same process) and p50/p99 latency of both.

    .venv/bin/python benchmarks/bench_ann.py [--n 1000000] [--queries 200]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from flows.env import apply_offline_defaults  # noqa: E402

apply_offline_defaults()
from tasks.store.vectors import ann_search, build_vector_index


def vectors(n: int, dim: int, rng: np.random.Generator) -> np.ndarray:
    centres = rng.standard_normal((2000, dim)).astype(np.float32)
    out = np.empty((n, dim), np.float32)
    for s in range(0, n, 100_000):
        part = centres[rng.integers(0, len(centres), min(100_000, n - s))]
        part += 0.6 * rng.standard_normal(part.shape).astype(np.float32)
        out[s : s + len(part)] = part / np.linalg.norm(part, axis=1, keepdims=True)
    return out


def main() -> None:
    import lancedb

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--k", type=int, default=20)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    dim = 384
    vecs = vectors(args.n, dim, rng)
    ids = pa.array([f"e{i:08d}" for i in range(args.n)])
    with tempfile.TemporaryDirectory() as tmp:
        db = lancedb.connect(tmp)
        column = pa.FixedSizeListArray.from_arrays(pa.array(vecs.reshape(-1)), dim)
        tbl = db.create_table("entities", data=pa.table({"id": ids, "vector": column}))
        t0 = time.perf_counter()
        build_vector_index(tbl)
        build_s = time.perf_counter() - t0
        picks = rng.integers(0, args.n, args.queries)
        print(f"{args.n:,} vectors of {dim} dimensions; {args.queries} queries; index build: {build_s:.1f} s")
        for noise in (0.5, 1.0):  # query = a stored vector plus noise of this norm (1.0: half the signal)
            queries = vecs[picks] + noise * rng.standard_normal((args.queries, dim)).astype(np.float32) / np.sqrt(dim)
            queries /= np.linalg.norm(queries, axis=1, keepdims=True)
            exact_ms, ann_ms, recalls = [], [], []
            for q in queries:
                t0 = time.perf_counter()
                truth = set(np.argpartition(-(vecs @ q), args.k)[: args.k].tolist())
                exact_ms.append((time.perf_counter() - t0) * 1000)
                t0 = time.perf_counter()
                found, _ = ann_search(tbl, q, args.k)
                ann_ms.append((time.perf_counter() - t0) * 1000)
                recalls.append(len(truth & {int(i[1:]) for i in found}) / args.k)
            print(f"query noise {noise}: recall@{args.k} vs exact {np.mean(recalls):.3f} (min {np.min(recalls):.2f}); "
                  f"latency ms exact numpy p50 {np.percentile(exact_ms, 50):.1f} p99 {np.percentile(exact_ms, 99):.1f}, "
                  f"lancedb index p50 {np.percentile(ann_ms, 50):.1f} p99 {np.percentile(ann_ms, 99):.1f}")
    print(f"vectors in memory for exact search: {vecs.nbytes / 2**20:.0f} MB; with the index: none")


if __name__ == "__main__":
    main()
