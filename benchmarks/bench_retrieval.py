"""Retrieval latency (no LLM), printed as figures; not a test.

1. A real index (default: the MuSiQue index built by `strata eval`), every question of its
   queries.jsonl in every mode.
2. A synthetic index of 100k entities (three layers, a clustered layer-0 graph, summary_of
   links, Leiden communities and reports), queried with vectors near random entities.

Reports p50 / p99 of context retrieval, with the question vector given (retrieval only); the
question-embedding cost is printed separately.

    .venv/bin/python benchmarks/bench_retrieval.py [--index DIR --dataset DIR] [--entities 100000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import flows  # noqa: E402,F401
from flows.pipeline import _to_table  # noqa: E402
from schemas.config import RetrievalConfig  # noqa: E402
from tasks.catalog import Catalog  # noqa: E402
from tasks.communities import detect_communities  # noqa: E402
from tasks.retrieve import MODES, IndexView, retrieve  # noqa: E402


def percentiles(ms: list[float]) -> str:
    return f"p50 {np.percentile(ms, 50):7.1f} ms   p99 {np.percentile(ms, 99):7.1f} ms   max {max(ms):7.1f} ms"


def time_queries(view: IndexView, vectors: np.ndarray, cfg: RetrievalConfig, modes=MODES) -> None:
    retrieve(view, "warm-up", vectors[0], "hi", cfg)
    for mode in modes:
        ms = []
        for v in vectors:
            t0 = time.perf_counter()
            retrieve(view, "q", v, mode, cfg)
            ms.append((time.perf_counter() - t0) * 1000)
        print(f"  {mode:<12} {percentiles(ms)}   ({len(ms)} queries)")


def synthetic_index(path: Path, n_entities: int, dim: int = 384, seed: int = 0) -> Catalog:
    rng = np.random.default_rng(seed)
    n1, n2 = n_entities // 10, n_entities // 100
    n0 = n_entities - n1 - n2
    topics = rng.normal(size=(n1, dim)).astype(np.float32)
    topic_of = rng.integers(0, n1, n0)
    v0 = topics[topic_of] + 0.8 * rng.normal(size=(n0, dim)).astype(np.float32)
    v1 = topics.copy()
    v2 = rng.normal(size=(n2, dim)).astype(np.float32)
    vecs = np.concatenate([v0, v1, v2])
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    layer = np.concatenate([np.zeros(n0, int), np.ones(n1, int), np.full(n2, 2)])
    ids = [f"ent-{i}" for i in range(n_entities)]
    n_chunks = n0 // 5
    chunk_of = rng.integers(0, n_chunks, n0)
    ents = [{"id": ids[i], "name": f"entity {i}", "type": "concept", "description": f"Entity {i} of topic {topic_of[i] if i < n0 else -1}.",
             "layer": int(layer[i]), "source_chunk_ids": [f"chunk-{chunk_of[i]}"] if i < n0 else [], "degree": 1, "vector": vecs[i]}
            for i in range(n_entities)]
    rels = []
    by_topic: dict[int, list[int]] = {}
    for i, t in enumerate(topic_of):
        by_topic.setdefault(int(t), []).append(i)
    for t, members in by_topic.items():  # clustered layer 0: chains and chords inside a topic, a few across
        for a, b in zip(members, members[1:]):
            rels.append((a, b, "extracted"))
        if len(members) > 3:
            rels.append((members[0], members[-1], "extracted"))
        rels.append((members[0], int(rng.integers(0, n0)), "extracted"))
        for m in members:
            rels.append((m, n0 + t, "summary_of"))
    for t in range(n1):
        rels.append((n0 + t, n0 + n1 + t % n2, "summary_of"))
    rel_rows = [{"id": f"rel-{k}", "source_id": ids[a], "target_id": ids[b], "kind": kind, "description": f"{a} to {b}",
                 "weight": 1.0, "source_chunk_ids": []} for k, (a, b, kind) in enumerate(rels)]
    comms = detect_communities(ids, rel_rows, max_cluster_size=50, seed=1)
    reports = [{"id": f"rep-{c['id']}", "community_id": c["id"], "level": c["level"], "title": f"Community {k}",
                "summary": f"A community of {c['size']} entities.", "rating": 5.0, "findings": ["a finding"], "full_text": "",
                "vector": vecs[0]} for k, c in enumerate(comms)]
    now = datetime.now(timezone.utc)
    docs = [{"id": "doc-0", "uri": "synthetic", "root": "synthetic", "source_id": "synthetic", "title": "synthetic",
             "text": "x", "content_hash": "0" * 64, "n_tokens": 1, "ingested_at": now}]
    chunk_vecs = np.zeros((n_chunks, dim), np.float32)
    np.add.at(chunk_vecs, chunk_of, vecs[:n0])
    chunk_vecs /= np.maximum(np.linalg.norm(chunk_vecs, axis=1, keepdims=True), 1e-9)
    chunks = [{"id": f"chunk-{j}", "document_id": "doc-0", "chunk_index": j, "text": f"Chunk {j} text. " * 20,
               "n_tokens": 80, "start": 0, "end": 1, "status": "extracted", "vector": chunk_vecs[j]} for j in range(n_chunks)]
    tables = {"documents": _to_table("documents", docs, dim, 1), "chunks": _to_table("chunks", chunks, dim, 1),
              "entities": _to_table("entities", ents, dim, 1), "relations": _to_table("relations", rel_rows, dim, 1),
              "communities": _to_table("communities", comms, dim, 1),
              "community_reports": _to_table("community_reports", reports, dim, 1)}
    cat = Catalog(path)
    cat.publish(tables, "synthetic", "synthetic", dim)
    print(f"  synthetic index: {n_entities} entities (layers {n0}/{n1}/{n2}), {len(rel_rows)} relations, "
          f"{len(comms)} communities, {n_chunks} chunks")
    return cat


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", help="a built index to time (e.g. the one `strata eval` built for MuSiQue)")
    ap.add_argument("--dataset", default=str(REPO.parent / "shared" / "datasets" / "musique"))
    ap.add_argument("--entities", type=int, default=100_000)
    args = ap.parse_args()
    cfg = RetrievalConfig()
    if args.index:
        from schemas.config import EmbeddingConfig
        from tasks.embed import get_embedder
        from tasks.evaluate import load_queries

        cat = Catalog(args.index)
        t0 = time.perf_counter()
        view = IndexView.load(cat)
        print(f"real index {args.index}: {len(view.ent_ids)} entities, {view.graph.number_of_edges()} edges, "
              f"{len(view.communities)} communities, {len(view.chunk_ids)} chunks (loaded in {time.perf_counter() - t0:.1f} s)")
        questions = [q["question"] for q in load_queries(Path(args.dataset))]
        emb = get_embedder(EmbeddingConfig())
        emb.embed(["warm-up"])
        ms = []
        vecs = []
        for q in questions:
            t0 = time.perf_counter()
            vecs.append(emb.embed([q])[0])
            ms.append((time.perf_counter() - t0) * 1000)
        print(f"  question embedding: {percentiles(ms)}")
        time_queries(view, np.stack(vecs), cfg)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        cat = synthetic_index(Path(tmp) / "synthetic", args.entities)
        view = IndexView.load(cat)
        print(f"  built and loaded in {time.perf_counter() - t0:.1f} s")
        rng = np.random.default_rng(1)
        picks = rng.choice(len(view.ent_ids), 200, replace=False)
        q = view.ent_vecs[picks] + 0.5 * rng.normal(size=(200, view.ent_vecs.shape[1])).astype(np.float32) / np.sqrt(view.ent_vecs.shape[1])
        q /= np.linalg.norm(q, axis=1, keepdims=True)
        time_queries(view, q, cfg)


if __name__ == "__main__":
    main()
