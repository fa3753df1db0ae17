"""One HiIndex clustering layer at scale (prints figures; not a test).

Synthetic 384-d unit vectors with real two-level cluster structure (super-topics made of
topics, Gaussian noise). For each N: seconds and cluster sparsity of Strata's clustering
(two-level soft GMM, diagonal covariance, bounded log-spaced BIC sweep, sample-fit then
predict). On the smallest N, in the same script, a straightforward exact RAPTOR-style fit —
the same two-level scheme with the full BIC sweep k = 1..49 on all points and full
covariance — for the time ratio and the CS difference.

Next to it, on the same points, one HyGRAG layer (``index.method = "hygrag"``): LSH buckets of 5..50
(16 seeded hyperplanes, split and merge), with the GMM / LSH time ratio. ``--index DIR`` does the same on the
layer-0 entity and chunk vectors of a published index (HyGRAG's layer-0 nodes), Cleora's two steps over
the hybrid graph timed on their own.

    .venv/bin/python benchmarks/bench_hierarchy.py [--sizes 20000 100000 250000] [--no-exact] [--index DIR]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from schemas.config import HierarchyConfig, HyGRAGConfig  # noqa: E402
from tasks.methods.hirag.hierarchy import cluster_sparsity, gmm_clusters, reduce_dims, soft_assign  # noqa: E402
from tasks.methods.hygrag import lsh_buckets  # noqa: E402


def both(x: np.ndarray, cfg: HierarchyConfig, label: str) -> tuple[float, float]:
    """One GMM layer and one LSH layer on ``x``: prints both, returns (GMM seconds, CS)."""
    h = HyGRAGConfig()
    t0 = time.perf_counter()
    clusters = gmm_clusters(x, cfg, seed=1)
    secs = time.perf_counter() - t0
    cs = cluster_sparsity([len(c) for c in clusters], len(x))
    t0 = time.perf_counter()
    buckets = lsh_buckets(x, h.lsh_bits, h.min_bucket, h.max_bucket, seed=1)
    lsecs = time.perf_counter() - t0
    sizes = [len(b) for b in buckets]
    print(f"{label:>8}{secs:>10.1f}{len(clusters):>10}{cs:>9.4f}   | LSH {lsecs:>7.2f} s {len(buckets):>7} buckets "
          f"(sizes {min(sizes)}..{max(sizes)}, CS {cluster_sparsity(sizes, len(x)):.4f})   GMM/LSH {secs / lsecs:>6.1f}x",
          flush=True)
    return secs, cs


def index_nodes(index: str, cfg: HierarchyConfig) -> None:
    """GMM vs LSH on a published index's layer-0 entities + chunks; Cleora over its hybrid graph."""
    import pyarrow.compute as pc

    from tasks.store.catalog import Catalog
    from tasks.store.rows import vector_matrix
    from tasks.methods.hygrag import chunk_links, cleora, hybrid_adjacency

    cat = Catalog(index)
    snap = cat.require_snapshot()
    ents = cat.read("entities", snap=snap)
    ents = ents.filter(pc.equal(ents.column("layer"), 0))
    chunks = cat.read("chunks", snap=snap)
    rels = cat.read("relations", snap=snap, columns=["source_id", "target_id", "weight", "kind"])
    x = np.concatenate([vector_matrix(ents), vector_matrix(chunks)]).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    h = HyGRAGConfig()
    t0 = time.perf_counter()
    at = {c: j for j, c in enumerate(chunks.column("id").to_pylist())}
    index_of = {e: i for i, e in enumerate(ents.column("id").to_pylist())}
    entity_chunks = [[at[c] for c in cs if c in at] for cs in ents.column("source_chunk_ids").to_pylist()]
    links = chunk_links(entity_chunks, len(at), h.shared_entities, max(1, int(h.max_entity_chunks * len(at))))
    pairs = [(index_of.get(a), index_of.get(b), w) for a, b, w, k in zip(*(rels.column(c).to_pylist() for c in
                                                                         ("source_id", "target_id", "weight", "kind")))
             if k == "extracted"]
    adj = hybrid_adjacency(len(index_of), [p for p in pairs if p[0] is not None and p[1] is not None], entity_chunks, links)
    cleora(adj, x, h.cleora_iterations)
    print(f"\n{index}: {len(index_of)} entities + {len(at)} chunks, {links.nnz // 2} chunk links; hybrid graph + "
          f"Cleora ({h.cleora_iterations} steps) {time.perf_counter() - t0:.1f} s")
    both(x, cfg, "index")


def synthetic(n: int, seed: int = 0, d: int = 384, supers: int = 40, topics_per: int = 12) -> np.ndarray:
    rng = np.random.default_rng(seed)
    super_c = rng.normal(size=(supers, d)).astype(np.float32)
    topic_c = (np.repeat(super_c, topics_per, axis=0) + 0.7 * rng.normal(size=(supers * topics_per, d))).astype(np.float32)
    labels = rng.integers(0, len(topic_c), n)
    x = topic_c[labels] + 0.9 * rng.normal(size=(n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def exact_raptor(x: np.ndarray, cfg: HierarchyConfig, seed: int) -> list[np.ndarray]:
    """RAPTOR's scheme without bounds: global then local GMMs, BIC over every k in 1..49, full covariance, all points."""
    from sklearn.mixture import GaussianMixture

    def best_fit(z: np.ndarray, s: int) -> np.ndarray:
        best = None
        for k in range(1, min(50, len(z))):
            g = GaussianMixture(n_components=k, covariance_type="full", random_state=s).fit(z)
            bic = g.bic(z)
            if best is None or bic < best[0]:
                best = (bic, g)
        return best[1].predict_proba(z)

    z = reduce_dims(x, cfg, seed)
    clusters = []
    for gi, members in enumerate(soft_assign(best_fit(z, seed), cfg.posterior_threshold)):
        if len(members) <= cfg.cluster_size_hint * 2:
            clusters.append(members)
            continue
        zl = reduce_dims(x[members], cfg, seed)
        clusters.extend(members[c] for c in soft_assign(best_fit(zl, seed + gi + 1), cfg.posterior_threshold))
    return clusters


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[20_000, 100_000, 250_000])
    ap.add_argument("--no-exact", action="store_true", help="skip the exact RAPTOR-style baseline")
    ap.add_argument("--index", help="also the layer-0 entities + chunks of this published index")
    args = ap.parse_args()
    cfg = HierarchyConfig()
    print(f"config: reduction={cfg.reduction}({cfg.reduced_dim}) covariance={cfg.covariance_type} reg_covar={cfg.reg_covar} "
          f"bic_steps={cfg.bic_steps} fit_sample={cfg.fit_sample} local_fit_sample={cfg.local_fit_sample} "
          f"threshold={cfg.posterior_threshold}")
    print(f"{'N':>8}{'seconds':>10}{'clusters':>10}{'CS':>9}")
    ours = {}
    for n in args.sizes:
        x = synthetic(n)
        secs, cs = both(x, cfg, str(n))
        ours[n] = (secs, cs, x if n == min(args.sizes) else None)
    if args.index:
        index_nodes(args.index, cfg)
    if not args.no_exact:
        n = min(args.sizes)
        secs, cs, x = ours[n]
        t0 = time.perf_counter()
        exact = exact_raptor(x, cfg, seed=1)
        esecs = time.perf_counter() - t0
        ecs = cluster_sparsity([len(c) for c in exact], n)
        print(f"\nexact RAPTOR-style on {n}: {esecs:.1f} s, {len(exact)} clusters, CS {ecs:.4f}")
        print(f"ratio exact / Strata time: {esecs / secs:.1f}x   CS difference: {cs - ecs:+.4f}")
        largest = max(args.sizes)
        print(f"target: {largest} in <= 60 s -> {ours[largest][0]:.1f} s; CS within ±0.02 of exact -> {abs(cs - ecs):.4f}")


if __name__ == "__main__":
    main()
