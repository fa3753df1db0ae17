"""Retrieval latency (no LLM), printed as figures; not a test.

1. A real index (``--index DIR``, e.g. the MuSiQue index built by `strata eval`), every question
   of ``--dataset``/queries.jsonl in every mode, question texts and their embeddings.
2. A synthetic index of 100k entities (three layers, a clustered layer-0 graph, summary_of
   links, Leiden communities and reports) with what graph-ranked retrieval reads: chunk texts
   made of sentences naming their entities (distinct pronounceable names from a seeded syllable
   generator, so BM25 sees real, rare words), a ``mentions`` table (every layer-0 entity in its
   chunk, 20 % also in a second one, so the passage graph links chunks), documents with titles.
   200 questions name one or two layer-0 entities ("What connects A to B?"), with a vector near
   theirs, so PPR gets named and vector seeds and BM25 gets matches.

Per mode: p50 / p99 / max of ``retrieve`` with the question vector given (retrieval only), plus
sanity figures: the share of questions whose text names an entity (n-gram lookup), per mode the
share whose walk got a seed (named or near the question vector) and, on the synthetic index, the
share whose first named entity's own chunk ranks in the top 10 sources. One-time costs are printed separately: view
load, first build of BM25 over the chunks (``view.lexical()``) and of the passage graph
(``view.passage_graph``), peak RSS (process-wide, so cumulative over the sections). The synthetic
index is built in a child process, so its build does not count in the peak.

    .venv/bin/python benchmarks/bench_retrieval.py [--index DIR --dataset DIR] [--entities 100000]
        [--profile hi,ppr --profile-queries 50]
"""

from __future__ import annotations

import argparse
import cProfile
import multiprocessing as mp
import pstats
import resource
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from flows.env import apply_offline_defaults  # noqa: E402

apply_offline_defaults()
from tests.helpers import _to_table  # noqa: E402
from schemas.config import RetrievalConfig  # noqa: E402
from tasks.store.catalog import Catalog
from tasks.runtime.tokens import count_tokens  # noqa: E402
from tasks.methods.hirag.communities import detect_communities  # noqa: E402
from tasks.retrieval.graph_rank import question_entities  # noqa: E402
from tasks.store.ids import normalize_name  # noqa: E402
from tasks.methods.registry import all_modes  # noqa: E402
from tasks.retrieval.view import IndexView
from tasks.retrieval.graph_rank import RankParams  # noqa: E402
from tasks.query.retrieve import retrieve


def percentiles(ms: list[float]) -> str:
    return f"p50 {np.percentile(ms, 50):7.1f} ms   p99 {np.percentile(ms, 99):7.1f} ms   max {max(ms):7.1f} ms"


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def load_and_build(cat: Catalog, cfg: RetrievalConfig) -> IndexView:
    """Load the view, then build BM25 and the passage graph once, each timed (the one-time costs)."""
    t0 = time.perf_counter()
    view = IndexView.load(cat)
    t1 = time.perf_counter()
    view.lexical()
    t2 = time.perf_counter()
    graph = view.passage_graph(RankParams.from_config(cfg))
    t3 = time.perf_counter()
    print(f"  one-time: view load {t1 - t0:.2f} s, BM25 over chunks {t2 - t1:.2f} s, passage graph {t3 - t2:.2f} s "
          f"({graph.n_chunks} chunks + {graph.n_entities} entity nodes, {graph.walk.nnz} edges, "
          f"{graph.sent_ent.shape[0]} sentences); peak RSS {peak_rss_mb():.0f} MiB")
    return view


def time_queries(view: IndexView, questions: list[str], vectors: np.ndarray, cfg: RetrievalConfig,
                 modes=None, gold: list[str | None] | None = None) -> None:
    graph = view.passage_graph(RankParams.from_config(cfg))
    named = [len(question_entities(graph, q)) for q in questions]
    print(f"  questions naming an entity (n-gram match): {np.mean([n > 0 for n in named]):.0%}, "
          f"{np.mean(named):.2f} entities per question")
    for mode in modes or all_modes():
        retrieve(view, questions[0], vectors[0], mode, cfg)  # warm-up, not timed
        ms, seeded, hits = [], 0, 0
        for i, (question, v) in enumerate(zip(questions, vectors)):
            t0 = time.perf_counter()
            ctx = retrieve(view, question, v, mode, cfg)
            ms.append((time.perf_counter() - t0) * 1000)
            seeded += bool(ctx.seeds.get("named"))  # named by the question or near its vector
            if gold is not None and gold[i] in ctx.ranked_chunk_ids[:10]:
                hits += 1
        extra = f"   seeded {seeded / len(ms):4.0%}" if SOURCE_IS_PPR.get(mode) else " " * 14
        if gold is not None:
            extra += f"   own chunk@10 {hits / len(ms):4.0%}"
        print(f"  {mode:<12} {percentiles(ms)}{extra}   ({len(ms)} queries)")
    print(f"  peak RSS {peak_rss_mb():.0f} MiB")


SOURCE_IS_PPR = {"hi": True, "hi-nobridge": True, "flat": True, "ppr": True}


def profile(view: IndexView, questions: list[str], vectors: np.ndarray, cfg: RetrievalConfig, mode: str, n: int) -> None:
    prof = cProfile.Profile()
    prof.enable()
    for question, v in list(zip(questions, vectors))[:n]:
        retrieve(view, question, v, mode, cfg)
    prof.disable()
    print(f"\n  cProfile, {mode}, {n} queries, top 15 by cumulative time:")
    pstats.Stats(prof, stream=sys.stdout).strip_dirs().sort_stats("cumulative").print_stats(15)


# ---------------------------------------------------------------------------- synthetic index
ONSETS = "b d f g k l m n p r s t v z br dr gr kr tr st sh th".split()
VOWELS = "a e i o u ai ei ou".split()
CODAS = ["", "", "", "n", "r", "l", "s"]
TYPES = ["person", "organization", "place", "work", "event", "concept"]
TEMPLATES = [
    "{a} was founded near {b} during the early period.",
    "{a} is a {t} that worked closely with {b} for many years.",
    "In later years {a} moved to the region around {b}.",
    "{a} received a famous award from {b} after a long dispute.",
    "According to several accounts {a} was first described by {b}.",
]
SOLO = [
    "{a} is a {t} mentioned in many regional chronicles.",
    "{a} later became widely known across the northern provinces.",
    "Little is recorded about the origins of {a}.",
]
FILLER = [
    "Historians still disagree about the exact dates involved.",
    "The surviving records are incomplete and partly contradictory.",
    "Several later editions expanded the original account considerably.",
    "The matter was discussed again at a public meeting the following spring.",
]


def syllable_names(rng: np.random.Generator, n: int) -> list[str]:
    """n distinct (after normalize_name) pronounceable names of one or two words, e.g. 'Travoulin Desko'."""
    def word() -> str:
        k = int(rng.integers(2, 4))
        return "".join(ONSETS[rng.integers(len(ONSETS))] + VOWELS[rng.integers(len(VOWELS))] + CODAS[rng.integers(len(CODAS))]
                       for _ in range(k)).capitalize()

    names, seen = [], set()
    while len(names) < n:
        name = word() if rng.random() < 0.3 else f"{word()} {word()}"
        key = normalize_name(name)
        if key not in seen:
            seen.add(key)
            names.append(name)
    return names


def synthetic_index(path: Path, n_entities: int, dim: int = 384, seed: int = 0) -> None:
    t0 = time.perf_counter()
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
    names = syllable_names(rng, n_entities)
    types = [TYPES[t] for t in rng.integers(0, len(TYPES), n_entities)]

    # layer-0 entities in chunks: each in its own chunk, 20 % also in a second one
    n_chunks = n0 // 5
    chunk_of = rng.integers(0, n_chunks, n0)
    second = np.flatnonzero(rng.random(n0) < 0.2)
    second_chunk = rng.integers(0, n_chunks, len(second))
    in_chunk: list[list[int]] = [[] for _ in range(n_chunks)]
    for i, c in enumerate(chunk_of):
        in_chunk[c].append(i)
    ent_chunks: list[list[str]] = [[f"chunk-{c}"] for c in chunk_of]
    for i, c in zip(second, second_chunk):
        if c != chunk_of[i]:
            in_chunk[c].append(int(i))
            ent_chunks[i].append(f"chunk-{c}")

    # chunk texts: sentences naming one or two of the chunk's entities, plus filler; mentions = (entity, its sentence)
    mentions, chunk_texts, first_sentence = [], [], {}
    for c, members in enumerate(in_chunk):
        order = [members[k] for k in rng.permutation(len(members))]
        sentences = []
        for k in range(0, len(order), 2):
            pair = order[k : k + 2]
            if len(pair) == 2:
                s = TEMPLATES[rng.integers(len(TEMPLATES))].format(a=names[pair[0]], b=names[pair[1]], t=types[pair[0]])
            else:
                s = SOLO[rng.integers(len(SOLO))].format(a=names[pair[0]], t=types[pair[0]])
            sentences.append(s)
            for e in pair:
                first_sentence.setdefault(e, s)
                mentions.append({"id": f"m-{len(mentions)}", "chunk_id": f"chunk-{c}", "seq": len(mentions), "kind": "entity",
                                 "key": normalize_name(names[e]), "name": names[e], "target": None, "type": types[e],
                                 "description": s, "weight": None})
        for k in rng.choice(len(FILLER), 2, replace=False):
            sentences.insert(int(rng.integers(0, len(sentences) + 1)), FILLER[k])
        chunk_texts.append(" ".join(sentences))

    ents = [{"id": ids[i], "name": names[i], "type": types[i] if i < n0 else "summary",
             "description": first_sentence.get(i, f"{names[i]} summarises a group of related entities."),
             "layer": int(layer[i]), "source_chunk_ids": ent_chunks[i] if i < n0 else [], "degree": 1, "vector": vecs[i]}
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
    rel_rows = [{"id": f"rel-{k}", "source_id": ids[a], "target_id": ids[b], "kind": kind,
                 "description": f"{names[a]} is related to {names[b]}.", "weight": 1.0,
                 "source_chunk_ids": [f"chunk-{chunk_of[a]}"] if kind == "extracted" else []}
                for k, (a, b, kind) in enumerate(rels)]
    comms = detect_communities(ids, rel_rows, max_cluster_size=50, seed=1)
    reports = [{"id": f"rep-{c['id']}", "community_id": c["id"], "level": c["level"], "title": f"Community {k}",
                "summary": f"A community of {c['size']} entities.", "rating": 5.0, "findings": ["a finding"], "full_text": "",
                "vector": vecs[0]} for k, c in enumerate(comms)]
    now = datetime.now(timezone.utc)
    n_docs = (n_chunks + 1) // 2  # two chunks per document, titled by an entity of its first chunk (as in Wikipedia)
    docs = [{"id": f"doc-{d}", "uri": f"synthetic/{d}", "root": "synthetic", "source_id": f"doc-{d}",
             "title": names[in_chunk[2 * d][0]] if in_chunk[2 * d] else f"Record {d}",
             "text": " ".join(chunk_texts[2 * d : 2 * d + 2]), "content_hash": "0" * 64, "n_tokens": 1, "ingested_at": now}
            for d in range(n_docs)]
    chunk_vecs = np.zeros((n_chunks, dim), np.float32)
    np.add.at(chunk_vecs, chunk_of, vecs[:n0])
    np.add.at(chunk_vecs, second_chunk, vecs[second])
    chunk_vecs /= np.maximum(np.linalg.norm(chunk_vecs, axis=1, keepdims=True), 1e-9)
    chunks = [{"id": f"chunk-{j}", "document_id": f"doc-{j // 2}", "chunk_index": j % 2, "text": chunk_texts[j],
               "n_tokens": count_tokens(chunk_texts[j]), "start": 0, "end": len(chunk_texts[j]), "status": "extracted",
               "vector": chunk_vecs[j]} for j in range(n_chunks)]
    tables = {"documents": _to_table("documents", docs, dim, 1), "chunks": _to_table("chunks", chunks, dim, 1),
              "entities": _to_table("entities", ents, dim, 1), "relations": _to_table("relations", rel_rows, dim, 1),
              "communities": _to_table("communities", comms, dim, 1),
              "community_reports": _to_table("community_reports", reports, dim, 1),
              "mentions": _to_table("mentions", mentions, dim, 1)}
    Catalog(path).publish(tables, "synthetic", "synthetic", dim)
    tokens = [c["n_tokens"] for c in chunks]
    print(f"  synthetic index: {n_entities} entities (layers {n0}/{n1}/{n2}), {len(rel_rows)} relations, "
          f"{len(comms)} communities, {n_chunks} chunks (mean {np.mean(tokens):.0f} tokens) in {n_docs} documents, "
          f"{len(mentions)} mentions ({len(mentions) - n0} second mentions); built in {time.perf_counter() - t0:.1f} s",
          flush=True)


def synthetic_questions(view: IndexView, n: int = 200, seed: int = 1) -> tuple[list[str], np.ndarray, list[str]]:
    """n questions naming one layer-0 entity, or two related ones (a relation neighbour: a second hop),
    with a vector near theirs; and the first entity's own chunk (a sanity check of the ranking)."""
    rng = np.random.default_rng(seed)
    layer0 = np.flatnonzero(view.ent_layer == 0)
    picks = rng.choice(layer0, n, replace=False)
    questions, vectors, gold = [], [], []
    one = ["Who founded {a}?", "Where is {a} located?", "What is {a} known for?", "When was {a} first described?"]
    two = ["What connects {a} to {b}?", "When did {a} meet {b}?", "Which award did {a} receive from {b}?"]
    dim = view.ent_vecs.shape[1]
    for a in picks:
        a = int(a)
        near = [b for b in view.graph.adj[a] if view.ent_layer[b] == 0]
        if near and rng.random() < 0.5:
            b = int(near[rng.integers(len(near))])
            questions.append(two[rng.integers(len(two))].format(a=view.ent_name[a], b=view.ent_name[b]))
            v = view.ent_vecs[a] + view.ent_vecs[b]
        else:
            questions.append(one[rng.integers(len(one))].format(a=view.ent_name[a]))
            v = view.ent_vecs[a].copy()
        v = v / np.linalg.norm(v) + 0.5 * rng.normal(size=dim).astype(np.float32) / np.sqrt(dim)
        vectors.append(v / np.linalg.norm(v))
        gold.append(view.ent_chunks[a][0])
    return questions, np.stack(vectors).astype(np.float32), gold


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", help="a built index to time (e.g. the one `strata eval` built for MuSiQue)")
    ap.add_argument("--dataset", default=str(REPO.parent / "shared" / "datasets" / "musique"))
    ap.add_argument("--entities", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--modes", default=",".join(all_modes()), help="comma-separated modes to time")
    ap.add_argument("--profile", default="", help="comma-separated modes to profile (cProfile) on the synthetic index")
    ap.add_argument("--profile-queries", type=int, default=50)
    args = ap.parse_args()
    cfg = RetrievalConfig()
    modes = [m for m in args.modes.split(",") if m]
    if args.index:
        from schemas.config import EmbeddingConfig
        from tasks.index.embed import get_embedder
        from tasks.query.evaluate import load_queries

        print(f"real index {args.index}:")
        view = load_and_build(Catalog(args.index), cfg)
        print(f"  {len(view.ent_ids)} entities, {view.graph.number_of_edges()} edges, "
              f"{len(view.communities)} communities, {len(view.chunk_ids)} chunks")
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
        time_queries(view, questions, np.stack(vecs), cfg, modes)
        del view
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "synthetic"
        child = mp.get_context("spawn").Process(target=synthetic_index, args=(path, args.entities))
        child.start()
        child.join()
        if child.exitcode:
            raise SystemExit(f"building the synthetic index failed (exit {child.exitcode})")
        view = load_and_build(Catalog(path), cfg)
        questions, vectors, gold = synthetic_questions(view, args.queries)
        print(f"  e.g. {questions[0]!r}, {questions[1]!r}")
        time_queries(view, questions, vectors, cfg, modes, gold)
        for mode in [m for m in args.profile.split(",") if m]:
            profile(view, questions, vectors, cfg, mode, args.profile_queries)


if __name__ == "__main__":
    main()
