"""Probes of the shared source ranking's top (issue 64, item 4): R@2 / R@5 / R@10 of `ppr` (and `dense`) with a variant
applied, paired per question against the ranking as it is (bootstrap 95 %). No product change: each variant replaces
one input of ``retrieve.source_ranking`` for the run of this script only.

    .venv/bin/python benchmarks/probe_ranking.py --index ./mq-sub --dataset DIR [--variants csls center stem]

DIR holds ``corpus.jsonl`` and ``queries.jsonl`` (a shuffled copy of ``musique/subset100``: file order is no signal);
the index is the one ``strata eval --dataset DIR --index ./mq-sub --build`` builds. Variants:

* ``csls``: hubness reduction of the dense scores (Conneau et al. 2018): cos(q, p) − a · r(p), r(p) the mean cosine
  of passage p to its k nearest passages, for k in 5 / 10 / 20 and a in 0.25 / 0.5 / 1;
* ``center``: the corpus mean vector subtracted (times b) from passage and question vectors before the cosine;
* ``stem``: BM25 over stemmed words (Snowball, or the first six letters) for the chain seeds' sentences only, or for
  the sentences and the passages' prior alike (needs PyStemmer, not a dependency of Strata);
* ``sentences``: each passage scored by its best sentence's cosine too (sentences embedded alone or after their
  document's title), alone or mixed with the passage's own at a share of 0.3 / 0.5 / 0.7;
* ``combo``: ``csls`` (k = 20) and ``sentences`` (embedded alone) together: (1 − s) · (cos(q, p) − a · r(p)) + s ·
  the best sentence's cosine, a in 0.25 / 0.5, s in 0.3 / 0.5;
* ``hop``: a second hop, the question with the best sentence (or the whole text) of its top one or two passages
  appended and embedded again, mixed with the first round (0.3 / 0.5) or taking the larger score;
* ``facts``: HippoRAG 2's query-to-triple step on the offline graph: the sentences entities were extracted from (the
  walk's chain-seed sentences) embedded, and the entities of the question's k most similar ones added as walk seeds
  (``FACT_GRID``: k, their share of the restart, over the whole corpus or the prior's top chunks, with hubness
  reduction of the passages' cosines or not, BM25 in place of the cosine; ``--pooled``: the sentence vectors pooled
  from their chunk's pass instead of embedded alone).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from flows.env import apply_offline_defaults  # noqa: E402

apply_offline_defaults()

from schemas.config import load_config  # noqa: E402
from tasks.index.embed import question_embedder  # noqa: E402
from tasks.query.evaluate import load_queries  # noqa: E402
from tasks.query.retrieve import source_ranking  # noqa: E402
from tasks.retrieval import graph_rank, lexical  # noqa: E402
from tasks.retrieval.view import load_view  # noqa: E402
from tasks.store.catalog import Catalog  # noqa: E402

KS = (2, 5, 10)


def passages(view, order: list[int]) -> list[str]:
    out: list[str] = []
    for j in order:
        p = view.doc_source.get(view.chunk_doc[j])
        if p is not None and p not in out:
            out.append(p)
    return out


def run(view, queries, vecs, cfg, how: str) -> list[dict[int, float]]:
    rows = []
    for q, v in zip(queries, vecs):
        dense = view.similarity("chunks", v, cfg.ann_candidates)
        ents = view.similarity("entities", v, cfg.ann_candidates)
        ranked = passages(view, source_ranking(view, q["question"], dense, ents, how, cfg)[0])
        gold = q["supporting_passage_ids"]
        rows.append({k: sum(g in ranked[:k] for g in gold) / len(gold) for k in KS})
    return rows


def line(rows, base) -> str:
    d = np.array([r[5] - b[5] for r, b in zip(rows, base)])
    rng = np.random.default_rng(0)
    boot = [d[rng.integers(0, len(d), len(d))].mean() for _ in range(2000)]
    recall = " ".join(f"R@{k} {np.mean([r[k] for r in rows]):.3f}" for k in KS)
    return (
        f"{recall}  ΔR@5 {d.mean():+.3f} [{np.percentile(boot, 2.5):+.3f}, {np.percentile(boot, 97.5):+.3f}] "
        f"{(d > 1e-9).sum()}/{(d < -1e-9).sum()}"
    )


def _neighbour_cosines(chunks: np.ndarray) -> np.ndarray:
    """Each passage's cosines to the others, ascending (its own left out): CSLS's r(p) is the mean of the last k."""
    sims = chunks @ chunks.T
    np.fill_diagonal(sims, -1.0)
    return np.sort(sims, axis=1)


def dense_variants(view) -> dict[str, object]:
    chunks = view.chunk_vecs.astype(np.float32)
    ordered = _neighbour_cosines(chunks)
    out: dict[str, object] = {}
    for k in (5, 10, 20):
        r = ordered[:, -k:].mean(axis=1)
        for a in (0.25, 0.5, 1.0):
            out[f"csls k={k} a={a}"] = lambda q, r=r, a=a: chunks @ q - a * r
    mean = chunks.mean(axis=0)
    for b in (0.5, 1.0):
        centred = chunks - b * mean
        centred /= np.linalg.norm(centred, axis=1, keepdims=True)
        out[f"center b={b}"] = lambda q, c=centred, b=b: c @ ((q - b * mean) / np.linalg.norm(q - b * mean))
    return out


def sentence_variants(view, embedder, titled: tuple[bool, ...] = (False, True)) -> dict[str, object]:
    """Each passage scored by its sentences as well: the best sentence's cosine (each sentence embedded alone, or
    after its document's title), mixed with the passage's own cosine at a share."""
    from tasks.runtime.text import split_sentences

    chunks = view.chunk_vecs.astype(np.float32)
    from tasks.index.chunk import explicit_title

    titles = {d: explicit_title({"title": t, "source_id": view.doc_source[d]}) for d, t in view.doc_title.items()}
    out: dict[str, object] = {}
    for with_title in titled:
        owner, texts = [], []
        for j, text in enumerate(view.chunk_text):
            title = titles.get(view.chunk_doc[j]) if with_title else None
            for s in split_sentences(text) or [text]:
                owner.append(j)
                texts.append(f"{title}: {s}" if title else s)
        sv = embedder.embed(texts).astype(np.float32)
        owner_a = np.array(owner)
        print(f"{len(texts)} sentences embedded (titled={with_title}, {len(titles)} titles)", flush=True)

        def best(q, sv=sv, owner_a=owner_a):
            s = sv @ q
            top = np.full(len(chunks), -1.0, dtype=np.float32)
            np.maximum.at(top, owner_a, s)
            return top

        tag = "titled " if with_title else ""
        out[f"sentences {tag}max"] = best
        for a in (0.3, 0.5, 0.7):
            out[f"sentences {tag}mix a={a}"] = lambda q, a=a, best=best: (1 - a) * (chunks @ q) + a * best(q)
    return out


def combo_variants(view, embedder) -> dict[str, object]:
    """The two signals that each gave about +2 points at rank 5, together: hubness reduction of the passage's cosine
    (CSLS, k = 20) and its best sentence's cosine."""
    chunks = view.chunk_vecs.astype(np.float32)
    r = _neighbour_cosines(chunks)[:, -20:].mean(axis=1)
    best = sentence_variants(view, embedder, titled=(False,))["sentences max"]
    out: dict[str, object] = {}
    for a in (0.25, 0.5):
        for s in (0.3, 0.5):
            out[f"combo a={a} s={s}"] = lambda q, a=a, s=s: (1 - s) * (chunks @ q - a * r) + s * best(q)
    return out


def hop_variants(view, embedder, texts) -> dict[str, object]:
    """A second hop by the dense scores: the question with the best sentence (or the whole text) of its top
    passage(s) appended, embedded again; each passage's score mixes the two rounds."""
    from tasks.runtime.text import split_sentences

    chunks = view.chunk_vecs.astype(np.float32)
    sents = [split_sentences(t) or [t] for t in view.chunk_text]
    cache: dict = {}

    def second(q, what, top):
        key = (tuple(q[:8].tolist()), what, top)
        if key not in cache:
            question = texts[tuple(q[:8].tolist())]
            d1 = chunks @ q
            firsts = np.argsort(-d1, kind="stable")[:top]
            extra = []
            for j in firsts:
                if what == "sentence":
                    sv = embedder.embed(sents[j]).astype(np.float32)
                    extra.append(sents[j][int(np.argmax(sv @ q))])
                else:
                    extra.append(view.chunk_text[j])
            v2 = embedder.embed([question + " " + " ".join(extra)])[0].astype(np.float32)
            cache[key] = (d1, chunks @ v2)
        return cache[key]

    out: dict[str, object] = {}
    for what in ("sentence", "passage"):
        for top in (1, 2):
            for a in (0.3, 0.5):
                out[f"hop {what} top={top} mix a={a}"] = lambda q, what=what, top=top, a=a: (
                    (1 - a) * second(q, what, top)[0] + a * second(q, what, top)[1]
                )
            out[f"hop {what} top={top} max"] = lambda q, what=what, top=top: np.maximum(*second(q, what, top))
    return out


@dataclass(frozen=True)
class Facts:
    """A fact-seed variant: the entities of the question's ``k`` most similar extracted sentences get a share ``w`` of
    the walk's restart mass (spread by similarity x specificity, divided by the sentence's rank where ``by_rank``),
    only those found in another chunk too (``bridge``); the sentences of the prior's ``top_n`` chunks only (0: all),
    scored by cosine (``bm25``: by BM25, scaled to the best); ``csls``: hubness reduction (k, a) of the passages' own
    cosines as well, on the dense top ``M`` (the others get the largest penalty among them)."""

    k: int
    w: float
    by_rank: bool = True
    bridge: bool = True
    top_n: int = 0
    bm25: bool = False
    csls: tuple[int, float, int] | None = None
    entities: bool = False  # the question's most similar layer-0 entities (their vectors: name, type, description)

    def name(self) -> str:
        how = f"{'entities' if self.entities else 'bm25' if self.bm25 else 'cosine'} k={self.k} w={self.w} {'by rank' if self.by_rank else 'flat'}"
        where = f"{'bridge' if self.bridge else 'all'}{f' top_n={self.top_n}' if self.top_n else ''}"
        return f"facts {how} {where}" + (
            f" + csls k={self.csls[0]} a={self.csls[1]} M={self.csls[2]}" if self.csls else ""
        )


#: the first sweep (global sentences), smaller shares around its best, then with hubness reduction and the sentences
#: restricted to the prior's top chunks (what a query can afford), BM25 in place of the cosine
FACT_GRID = [Facts(k, w, d) for k in (3, 5, 10) for w in (0.25, 0.5, 1.0) for d in (False, True)]
FACT_GRID += [Facts(k, 0.5, False, False) for k in (3, 5, 10)]
FACT_GRID += [Facts(k, w, d) for k in (2, 3, 5) for w in (0.05, 0.1) for d in (False, True)]
FACT_GRID += [
    Facts(k, w, d, csls=(c, a, 50))
    for k, w, d in ((3, 0.25, False), (5, 0.5, True), (5, 0.25, True))
    for c, a in ((5, 0.25), (10, 0.5), (20, 0.5))
]
FACT_GRID += [
    Facts(k, w, True, entities=True, csls=c) for k in (3, 5, 10) for w in (0.25, 0.5) for c in (None, (10, 0.5, 50))
]
FACT_GRID += [
    Facts(5, w, True, top_n=n, bm25=b, csls=c)
    for b in (False, True)
    for n in (0, 10)
    for w in (0.25, 0.5)
    for c in (None, (10, 0.5, 50))
]


def sentence_vectors(view, embedder, sents: list[str], sent_chunk: np.ndarray, pooled: bool) -> np.ndarray:
    """Each extracted sentence embedded alone, or (``pooled``) its pieces' states mean-pooled from its chunk's own
    pass (free at build time: the chunk's vector comes from the same pass); alone where the pieces are not found."""
    vecs = embedder.embed(sents).astype(np.float32)
    if not pooled:
        return vecs
    inner = embedder
    while not hasattr(inner, "_hidden"):
        inner = inner.inner
    states = {}
    for idx, hidden, mask, ids in inner._hidden(list(view.chunk_text)):
        for r, j in enumerate(idx):
            n = int(mask[r].sum())
            states[j] = (ids[r, :n].tolist(), hidden[r, :n])
    found = 0
    for i, piece_ids in enumerate(e.ids[1:-1] for e in inner._tokenizer().encode_batch(sents)):
        ids, hidden = states[int(sent_chunk[i])]
        at = next((s for s in range(1, len(ids) - len(piece_ids) + 1) if ids[s : s + len(piece_ids)] == piece_ids), -1)
        if piece_ids and at >= 0:
            v = hidden[at : at + len(piece_ids)].mean(axis=0)
            vecs[i], found = v / np.linalg.norm(v), found + 1
    print(f"{found} of {len(sents)} sentences pooled from their chunk's pass", flush=True)
    return vecs


def graph_sentences(view, rcfg) -> tuple[graph_rank.PassageGraph, list[str]]:
    """The view's passage graph, built again, and its sentences in the order of its sentence x entity rows."""
    captured: dict[str, list[str]] = {}
    index_class = graph_rank.BM25Index

    class Capturing(index_class):
        def __init__(self, sents, **kw):
            super().__init__(sents, **kw)
            captured["sents"] = list(sents)

    graph_rank.BM25Index = Capturing
    view._lazy.clear()
    try:
        graph = view.passage_graph(graph_rank.RankParams.from_config(rcfg))
    finally:
        graph_rank.BM25Index = index_class
    return graph, captured["sents"]


def _with_seeds(s: np.ndarray, g, extra: np.ndarray, w: float) -> np.ndarray:
    """The restart (mass 1) with ``extra`` added to its entities at a share ``w`` of its mass, normalised again."""
    if extra.sum() <= 0:
        return s
    s = np.concatenate([s[: g.n_chunks], s[g.n_chunks :] + w * extra / extra.sum()])
    return s / s.sum()


def fact_personalization(f: Facts, sv: np.ndarray, asked: dict[str, np.ndarray], original=None):
    """``graph_rank.personalization`` with ``f``'s fact seeds added (``sv``: the graph's sentence vectors; ``asked``:
    each question's vector)."""
    original = original or graph_rank.personalization

    def seeded(g, question, prior, params, ent_sims=None):
        s, seeds = original(g, question, prior, params, ent_sims)
        spec = 1.0 / np.maximum(g.df, 1)
        extra = np.zeros(g.n_entities)
        if f.entities:  # the entities themselves, by their own vectors' cosine
            sims = np.where(g.seedable & (g.df > 1) if f.bridge else g.seedable, ent_sims, -1.0)
            best = np.argsort(-sims, kind="stable")[: f.k]
            best = best[sims[best] > 0]
            extra[best] = sims[best] * spec[best] / ((np.arange(len(best)) + 1) if f.by_rank else 1)
            return _with_seeds(s, g, extra, f.w), seeds
        sims = g.sent_index.scores(question) if f.bm25 else sv @ asked[question]
        sims = sims / max(float(sims.max()), 1e-9) if f.bm25 else sims
        cand = np.arange(len(sims))
        if f.top_n:
            top = np.argsort(-prior, kind="stable")[: f.top_n]
            cand = cand[np.isin(g.sent_chunk, top[prior[top] > 0])]
        best = cand[np.argsort(-sims[cand], kind="stable")[: f.k]]
        for rank, i in enumerate(best[sims[best] > 0]):
            ents = g.sent_ent[i].indices
            ents = ents[g.seedable[ents] & ((g.df[ents] > 1) if f.bridge else True)]
            extra[ents] += float(sims[i]) * spec[ents] / ((rank + 1) if f.by_rank else 1)
        return _with_seeds(s, g, extra, f.w), seeds

    return seeded


def hubness(chunks: np.ndarray, ordered: np.ndarray, k: int, a: float, top: int):
    """CSLS of the passages' cosines on the dense top ``top``: cos(q, p) - a · r(p), r(p) the mean of p's ``k`` best
    cosines to the other passages (``ordered``: ``_neighbour_cosines``); the others take the largest penalty of those."""
    r = ordered[:, -k:].mean(axis=1)

    def score(q):
        c = chunks @ q
        m = min(top, len(c))
        best = np.argpartition(-c, m - 1)[:m]
        out = c - a * r[best].max()
        out[best] = c[best] - a * r[best]
        return out.astype(np.float32)

    return score


def fact_probe(view, embedder, rcfg, queries, vecs, base, pooled: bool) -> None:
    """Each ``FACT_GRID`` variant patched into ``graph_rank.personalization`` (and the chunks' similarity for
    ``csls``), ``ppr``'s R@k paired against the ranking as it is."""
    graph, sents = graph_sentences(view, rcfg)
    sv = sentence_vectors(view, embedder, sents, graph.sent_chunk, pooled)
    print(f"{len(sv)} extracted sentences embedded", flush=True)
    asked = {q["question"]: v for q, v in zip(queries, vecs)}
    chunks = view.chunk_vecs.astype(np.float32)
    ordered = _neighbour_cosines(chunks)
    original, similarity = graph_rank.personalization, view.similarity
    for f in FACT_GRID:
        graph_rank.personalization = fact_personalization(f, sv, asked, original)
        if f.csls:
            score = hubness(chunks, ordered, *f.csls)
            view.similarity = lambda kind, q, k, score=score: score(q) if kind == "chunks" else similarity(kind, q, k)
        print(f"{f.name()} | ppr {line(run(view, queries, vecs, rcfg, 'ppr'), base)}", flush=True)
        graph_rank.personalization, view.similarity = original, similarity


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", required=True)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--variants", nargs="+", default=["csls", "center", "stem"])
    ap.add_argument("--pooled", action="store_true", help="facts: sentence vectors pooled from their chunk's pass")
    args = ap.parse_args()
    cfg = load_config()
    rcfg = cfg.retrieval
    view = load_view(Catalog(args.index, create=False))
    queries = [q for q in load_queries(Path(args.dataset)) if q["supporting_passage_ids"]]
    vecs = question_embedder(cfg.embedding, cfg.llm).embed([q["question"] for q in queries]).astype(np.float32)
    base = {how: run(view, queries, vecs, rcfg, how) for how in ("dense", "ppr")}
    for how, rows in base.items():
        print(f"{how:6s} as ranked: {line(rows, rows)}")
    similarity = view.similarity

    def probe(variants: dict[str, object]) -> None:
        """Each variant's passage scores in place of the dense ones, R@k paired against the ranking as it is."""
        for name, score in variants.items():
            view.similarity = lambda kind, q, k, score=score: (
                score(q).astype(np.float32) if kind == "chunks" else similarity(kind, q, k)
            )
            print(name, "|", " | ".join(f"{h} {line(run(view, queries, vecs, rcfg, h), base[h])}" for h in base))
            view.similarity = similarity

    probe({name: score for name, score in dense_variants(view).items() if name.split()[0] in args.variants})
    if "sentences" in args.variants:
        probe(sentence_variants(view, question_embedder(cfg.embedding, cfg.llm, threads=None)))
    if "combo" in args.variants:
        probe(combo_variants(view, question_embedder(cfg.embedding, cfg.llm, threads=None)))
    if "hop" in args.variants:
        texts = {tuple(v[:8].tolist()): q["question"] for q, v in zip(queries, vecs)}
        probe(hop_variants(view, question_embedder(cfg.embedding, cfg.llm, threads=None), texts))
    if "facts" in args.variants:
        embedder = question_embedder(cfg.embedding, cfg.llm, threads=None)
        fact_probe(view, embedder, rcfg, queries, vecs, base["ppr"], args.pooled)
    if "stem" in args.variants:
        import Stemmer

        tokenize, index_class = lexical.tokenize, graph_rank.BM25Index
        for stem_name, stem in (("snowball", Stemmer.Stemmer("english").stemWord), ("six letters", _six)):
            stemmed = lambda texts, stem=stem: [[stem(w) for w in ws] for ws in tokenize(texts)]
            for where in ("sentences", "sentences and passages"):
                graph_rank.BM25Index = _stemmed_index(stemmed)
                if where != "sentences":
                    lexical.tokenize = stemmed
                view._lazy.clear()  # the BM25 indexes and the passage graph are built again
                print(f"stem {stem_name}, {where} | ppr {line(run(view, queries, vecs, rcfg, 'ppr'), base['ppr'])}")
                lexical.tokenize, graph_rank.BM25Index = tokenize, index_class
                view._lazy.clear()


def _six(word: str) -> str:
    return word[:6] if len(word) > 6 else word.removesuffix("s")


def _stemmed_index(stemmed):
    class Stemmed(lexical.BM25Index):
        def __init__(self, texts, **kw):
            saved, lexical.tokenize = lexical.tokenize, stemmed
            try:
                super().__init__(texts, **kw)
            finally:
                lexical.tokenize = saved

        def scores(self, query):
            saved, lexical.tokenize = lexical.tokenize, stemmed
            try:
                return super().scores(query)
            finally:
                lexical.tokenize = saved

    return Stemmed


if __name__ == "__main__":
    main()
