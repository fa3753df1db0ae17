"""Graph-ranked sources: PPR, seed specificity, BM25 + dense fusion, and the second hop."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
import scipy.sparse as sp

from tasks.retrieval.graph_rank import RankParams, build_passage_graph, personalization, ppr, question_entities
from tasks.retrieval.lexical import BM25Index, ranks, rrf, tokenize


def _walk(edges: list[tuple[int, int]], n: int, damping: float) -> sp.csr_matrix:
    a = np.zeros((n, n))
    for i, j in edges:
        a[i, j] = a[j, i] = 1.0
    p = a / a.sum(axis=1, keepdims=True)
    return sp.csr_matrix(damping * p.T)


TRIANGLES = [(0, 1), (1, 2), (0, 2), (3, 4), (4, 5), (3, 5)]


def test_ppr_six_nodes_hand_computed():
    # two triangles, d = 0.5, restart on node 0: r0 = 0.5 + 0.5 r1 and r1 = r2 = 0.5 (r0 + r1) / 2
    # give r1 = r0 / 3, r0 = 0.6, r1 = r2 = 0.2; the other triangle is never reached
    walk = _walk(TRIANGLES, 6, 0.5)
    r = ppr(walk, np.array([1.0, 0, 0, 0, 0, 0]), 0.5, iterations=200, tol=1e-12)
    assert r == pytest.approx([0.6, 0.2, 0.2, 0, 0, 0], abs=1e-9)
    # the walk is linear in its restart vector: half the restart on each triangle halves each answer
    r = ppr(walk, np.array([0.5, 0, 0, 0.5, 0, 0]), 0.5, iterations=200, tol=1e-12)
    assert r == pytest.approx([0.3, 0.1, 0.1, 0.3, 0.1, 0.1], abs=1e-9)


def test_ppr_matches_the_closed_form():
    rng = np.random.default_rng(0)
    edges = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 0), (0, 3)]
    walk = _walk(edges, 6, 0.5)
    s = rng.random(6)
    s /= s.sum()
    exact = np.linalg.solve(np.eye(6) - walk.toarray(), 0.5 * s)
    assert ppr(walk, s, 0.5, iterations=200, tol=1e-14) == pytest.approx(exact, abs=1e-10)


def _mentions(rows: list[tuple[str, str, str]]) -> pl.DataFrame:
    return pl.DataFrame({"chunk_id": [r[0] for r in rows], "key": [r[1] for r in rows], "description": [r[2] for r in rows]})


def _graph(chunks: int, names: list[str], rows, relations=(), params=RankParams(), types=None):
    chunk_index = {f"c{i}": i for i in range(chunks)}
    return build_passage_graph(chunk_index, names, types or ["concept"] * len(names),
                               np.zeros(len(names), dtype=np.int64), _mentions(rows), list(relations), params)


def test_seed_specificity_divides_by_chunk_count():
    # "Rare" occurs in one chunk, "common" in four: named together, Rare weighs four times as much
    rows = [("c0", "rare", "Rare and common."), *[(f"c{i}", "common", f"Common {i}.") for i in range(4)]]
    params = RankParams(prior_weight=0.0, chain_chunks=0, max_df=1.0)
    g = _graph(20, ["Rare", "Common"], rows, params=params)
    assert question_entities(g, "Is the Rare thing Common?") == [0, 1]
    s, seeds = personalization(g, "Is the Rare thing Common?", np.zeros(20), params)
    ents = s[g.n_chunks:]
    assert ents[0] / ents[1] == pytest.approx(4.0)
    assert ents.sum() == pytest.approx(1.0)


def test_common_nouns_and_numbers_are_not_names():
    rows = [(f"c{i}", "album", "An album.") for i in range(10)] + [("c0", "1990", "In 1990."), ("c1", "beatles", "Beatles.")]
    params = RankParams(prior_weight=0.0, chain_chunks=0, max_df=0.2)  # 0.2 x 20 chunks: at most 4 chunks
    g = _graph(20, ["album", "1990", "Beatles"], rows, params=params)
    s, seeds = personalization(g, "Which Beatles album came out in 1990?", np.zeros(20), params)
    assert seeds["named"] == [2]  # "album" is one lowercase word (a common noun, not a name), 1990 is a number


def test_a_name_in_every_chunk_still_seeds_weakly_and_a_verb_is_not_a_name():
    # a 10-chunk book: Scrooge is in every chunk (past any max_df share), "visit" is a noun phrase elsewhere
    rows = [(f"c{i}", "scrooge", f"Scrooge {i}.") for i in range(10)] + [("c3", "visit", "A visit."), ("c4", "fog", "Fog.")]
    params = RankParams(prior_weight=0.0, chain_chunks=0, max_df=0.05)
    g = _graph(10, ["Scrooge", "visit", "fog"], rows, params=params, types=["person", "concept", "concept"])
    s, seeds = personalization(g, "How many spirits visit Scrooge in the fog?", np.zeros(10), params)
    assert seeds["named"] == [0]  # "visit" (a verb here) and "fog" (a common noun) are no names
    # a one-word concept the book capitalises (at the head of a sentence) is a name only where the question does too
    rows += [("c5", "bring", "Bring down the box.")]
    g = _graph(10, ["Scrooge", "visit", "fog", "Bring"], rows, params=params, types=["person", *["concept"] * 3])
    assert personalization(g, "Who came to bring him home?", np.zeros(10), params)[1]["named"] == []
    assert personalization(g, "What did Bring say?", np.zeros(10), params)[1]["named"] == [3]
    assert not g.seedable[0] and s[g.n_chunks:][0] == pytest.approx(1.0)  # alone, so all the entity mass


def test_a_possessive_and_a_partial_name_resolve_to_the_entities_they_name():
    names = ["Jacob Marley", "Ebenezer Scrooge", "Bob Cratchit", "Marley's Ghost"]
    rows = [("c0", "jacob marley", "Jacob Marley was dead."), ("c1", "ebenezer scrooge", "Ebenezer Scrooge."),
            ("c2", "bob cratchit", "Bob Cratchit."), ("c3", "marley ghost", "Marley's Ghost spoke."),
            ("c4", "ebenezer scrooge", "Scrooge again.")]
    params = RankParams(prior_weight=0.0, chain_chunks=0)
    g = _graph(5, names, rows, params=params, types=["person", "person", "person", "person"])
    s, seeds = personalization(g, "What did Marley's ghost warn Scrooge about?", np.zeros(5), params)
    # "Marley's ghost" is the ghost's own name (the possessive dropped); "Scrooge" is one word of a longer name
    assert seeds["named"] == [3, 1]
    ents = s[g.n_chunks:]
    assert ents[3] == pytest.approx(2 * ents[1]) and ents[0] == ents[2] == 0  # Scrooge's name is in 2 chunks
    # "Marley's" alone is a word of two names: each gets half of a seed
    s, seeds = personalization(g, "What did Marley's partner say?", np.zeros(5), params)
    assert seeds["named"] == [0, 3] and s[g.n_chunks:][0] == pytest.approx(s[g.n_chunks:][3])


def test_a_merged_name_seeds_its_entity_unless_another_entity_owns_or_shares_it():
    names = ["Jacob Marley", "Ebenezer Scrooge", "Marley", "Tim Burton", "Tim Robbins"]
    rows = [("c0", "jacob marley", "Jacob Marley was dead."), ("c1", "ebenezer scrooge", "Scrooge, Ebenezer."),
            ("c2", "marley", "Marley of another book."), ("c3", "tim burton", "Tim Burton."),
            ("c4", "tim robbins", "Tim Robbins.")]
    aliases = [["Marley", "Jacob"], ["Scrooge", "Ebenezer"], None, ["Tim"], ["Tim"]]
    params = RankParams(prior_weight=0.0, chain_chunks=0)
    g = build_passage_graph({f"c{i}": i for i in range(5)}, names, ["person"] * 5, np.zeros(5, dtype=np.int64),
                            _mentions(rows), [], params, aliases)
    # "Scrooge" is a name merged into Ebenezer Scrooge; "Marley" is another entity's own; "Tim" is two entities'
    assert question_entities(g, "Did Scrooge pay Marley?") == [1, 2]
    assert question_entities(g, "Did Tim pay Jacob?") == [0]


def test_longest_name_wins():
    g = _graph(2, ["Journal of Foo", "Foo"], [("c0", "journal of foo", "x."), ("c1", "foo", "y.")])
    assert question_entities(g, "Who publishes the Journal of Foo?") == [0]


def test_rrf_hand_computed():
    dense = np.array([0.9, 0.5, 0.7])  # ranks 1, 3, 2
    bm25 = np.array([0.0, 2.0, 1.0])  # ranks -, 1, 2 (no query word in item 0: no contribution)
    assert list(ranks(dense)) == [1, 3, 2]
    fused = rrf([dense, bm25], k=1)
    assert fused == pytest.approx([1 / 2, 1 / 4 + 1 / 2, 1 / 3 + 1 / 3])
    assert list(np.argsort(-fused)) == [1, 2, 0]


def test_bm25_prefers_rare_exact_names():
    idx = BM25Index(["The Zyxx Foundation funds research.", "A foundation funds research.", "Cats."])
    s = idx.scores("Who funds the Zyxx Foundation?")
    assert s.argmax() == 0 and s[2] == 0
    assert idx.scores("").sum() == 0


SECOND_HOP = [
    {"id": "p1", "title": "Journal of Glorpology", "text": "The Journal of Glorpology is a quarterly periodical issued by the Vantress Academy since 1950."},
    {"id": "p2", "title": "Vantress Academy", "text": "The Vantress Academy elected Mirela Oduya as its inaugural chairwoman in 1901, in Brussels."},
    {"id": "d1", "title": "Editors", "text": "The founding head of an organization that publishes a journal is often its first editor."},
    {"id": "d2", "title": "Charters", "text": "Many organizations publish journals; the founding head of each is recorded in its charter."},
    {"id": "d3", "title": "First issues", "text": "An organization that publishes a journal often names its founding head in the first issue."},
    {"id": "d4", "title": "Scholars", "text": "A learned society publishes journals, and its founding head is usually a scholar of the field."},
    {"id": "d5", "title": "Periodicals", "text": "A periodical is a publication issued at regular intervals, such as a journal or a magazine."},
]


@pytest.mark.slow
def test_ppr_finds_the_second_hop_that_naive_misses(tmp_path):
    import tempfile
    from pathlib import Path

    from flows.pipeline import build_index
    from schemas.config import load_config
    from tasks.index.embed import get_embedder
    from tasks.query.retrieve import retrieve
    from tasks.retrieval.view import load_view
    from tasks.store.catalog import Catalog

    corpus = Path(tempfile.gettempdir()) / "strata-second-hop" / "hops.jsonl"  # ids hash the root: one fixed place
    corpus.parent.mkdir(exist_ok=True)
    corpus.write_text("\n".join(json.dumps(r) for r in SECOND_HOP) + "\n")
    cfg = load_config(overrides={"dask": {"processes": False}})
    build_index(str(corpus), Catalog(tmp_path / "idx"), cfg)
    view = load_view(Catalog(tmp_path / "idx"))
    question = "Who was the founding head of the organization that publishes the Journal of Glorpology?"
    words = tokenize([question, SECOND_HOP[1]["text"]])
    assert not set(words[0]) & set(words[1])  # the second hop shares no content word with the question
    q = get_embedder(cfg.embedding).embed([question])[0]
    rcfg = cfg.retrieval.model_copy(update={"safety_top": 0})

    def top3(mode):
        return [view.doc_source[view.chunk_doc[view.chunk_index[c]]] for c in retrieve(view, question, q, mode, rcfg).ranked_chunk_ids[:3]]

    assert "p2" not in top3("naive")
    assert "p2" in top3("ppr")
    assert top3("ppr")[0] == "p1"


def test_vector_seeds_are_reported_apart_from_named_ones():
    rows = [("c0", "beatles", "Beatles."), ("c1", "wings", "Wings."), ("c2", "abba", "Abba.")]
    params = RankParams(prior_weight=0.0, chain_chunks=0, vector_seeds=2, vector_threshold=0.4)
    g = _graph(3, ["Beatles", "Wings", "Abba"], rows, params=params)
    sims = np.array([0.9, 0.8, 0.1])  # Beatles is named and near; Wings only near; Abba neither
    _, seeds = personalization(g, "Who were the Beatles?", np.zeros(3), params, sims)
    assert seeds["named"] == [0] and seeds["similar"] == [1]
