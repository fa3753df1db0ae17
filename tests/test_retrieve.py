"""HiRetrieval on a hand-built hierarchical graph: which entities, which communities, which path."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from schemas.config import RetrievalConfig
from tasks.query.answer import extractive_answer
from tasks.query.evaluate import answer_in_context, normalize_answer, passage_recall
from tasks.query.retrieve import retrieve
from tasks.retrieval.view import IndexView
from tasks.store.catalog import Catalog
from tests.helpers import _to_table

DIM = 4


def unit(v):
    v = np.asarray(v, dtype=np.float32)
    return v / np.linalg.norm(v)


VECS = {
    "A": unit([1, 0, 0, 0]), "B": unit([0.9, 0.1, 0, 0]), "C": unit([0, 1, 0, 0]), "D": unit([0, 0, 1, 0]),
    "E": unit([0, 0, 0, 1]), "S1": unit([1, 1, 0, 0]), "S2": unit([0, 0, 1, 1]), "T": unit([1, 1, 1, 1]),
}
LAYER = {"A": 0, "B": 0, "C": 0, "D": 0, "E": 0, "S1": 1, "S2": 1, "T": 2}
EDGES = [("A", "B", "extracted"), ("B", "C", "extracted"), ("D", "E", "extracted"),
         ("A", "S1", "summary_of"), ("B", "S1", "summary_of"), ("C", "S1", "summary_of"),
         ("D", "S2", "summary_of"), ("E", "S2", "summary_of"), ("S1", "T", "summary_of"), ("S2", "T", "summary_of")]
COMMS = {"c1": ["A", "B", "C", "S1"], "c2": ["D", "E", "S2"], "c3": ["T"]}


def build(tmp_path, empty=False, ann_min_rows=None, reports_said=None, labels=None, aliases=None) -> IndexView:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    docs: list[dict[str, Any]] = [{"id": f"doc{i}", "uri": f"/c#{i}", "root": "/c", "source_id": f"p{i}", "title": f"Doc {i}", "text": t,
             "content_hash": "0" * 64, "n_tokens": 5, "ingested_at": now}
            for i, t in ((1, "Alpha met Beta in Paris."), (2, "Delta married Epsilon."))]
    chunks = [{"id": f"ch{i}", "document_id": f"doc{i}", "chunk_index": 0, "text": d["text"], "n_tokens": 5, "start": 0,
               "end": len(d["text"]), "status": "extracted", "vector": VECS["A"] if i == 1 else VECS["D"]}
              for i, d in ((1, docs[0]), (2, docs[1]))]
    ents = [{"id": n, "name": n, "type": "concept", "description": f"{n} is here.", "layer": LAYER[n],
             "source_chunk_ids": (["ch1"] if n in "ABC" else ["ch2"]) if LAYER[n] == 0 else [], "degree": 1,
             "vector": VECS[n], "aliases": (aliases or {}).get(n)} for n in VECS]
    rels = [{"id": f"{a}-{b}", "source_id": a, "target_id": b, "kind": k, "description": f"{a} to {b}", "weight": 1.0,
             "source_chunk_ids": []} for a, b, k in EDGES]
    for r in rels:  # (label, the end it reads from) given by the test
        r["label"], r["label_from"] = (labels or {}).get((r["source_id"], r["target_id"]), (None, None))
    comms = [{"id": c, "level": 0, "parent_id": None, "entity_ids": m, "size": len(m)} for c, m in COMMS.items()]
    reports = [{"id": f"r-{c}", "community_id": c, "level": 0, "title": f"Report {c}", "summary": f"About {c}.",
                "rating": 5.0, "findings": [f"{c} finding"], "full_text": "", "vector": VECS["T"]} for c in COMMS]
    for r in reports:  # (title, summary) given by the test: the report says that and no finding
        if r["community_id"] in (reports_said or {}):
            r["title"], r["summary"] = reports_said[r["community_id"]]
            r["findings"] = []
    if empty:
        docs, chunks, ents, rels, comms, reports = [], [], [], [], [], []
    tables = {
        "documents": _to_table("documents", docs, DIM, 1), "chunks": _to_table("chunks", chunks, DIM, 1),
        "entities": _to_table("entities", ents, DIM, 1), "relations": _to_table("relations", rels, DIM, 1),
        "communities": _to_table("communities", comms, DIM, 1),
        "community_reports": _to_table("community_reports", reports, DIM, 1),
    }
    cat = Catalog(tmp_path / "idx")
    cat.publish(tables, "run", "full", DIM, ann_min_rows=ann_min_rows)
    return IndexView.load(cat)


Q = unit([1, 0, 0.5, 0])  # A .894, B .889, T .671, S1 .632, D .447, S2 .316, C 0, E 0
CFG = RetrievalConfig(top_n=3, top_m=2, token_budget=2000, level_budget="after_sources")  # each level whole: its own choice


def test_local_global_bridge_by_hand(tmp_path):
    view = build(tmp_path)
    ctx = retrieve(view, "q", Q, "hi", CFG)
    assert [e["id"] for e in ctx.entities] == ["A", "B", "T"]  # eq. 12 over all layers
    assert [c["id"] for c in ctx.communities] == ["c1", "c3"]  # eq. 13, most hits first
    # eq. 14: keys [A, B] from c1, [T] from c3; eq. 15: A-B, B-S1-T; eq. 16: path edges, then A-S1 (both ends on paths)
    assert [(b["source"], b["target"]) for b in ctx.bridge] == [("A", "B"), ("B", "S1"), ("S1", "T"), ("A", "S1")]
    assert [c["id"] for c in ctx.chunks] == ["ch1", "ch2"]  # graph-ranked sources: the closer chunk first
    assert ctx.chunks[0]["source_id"] == "p1"


def test_a_bridge_path_reads_a_labelled_relation_from_its_subject(tmp_path):
    ctx = retrieve(build(tmp_path, labels={("A", "B"): ("employs", "B")}), "q", Q, "hi", CFG)
    texts = {(b["source"], b["target"]): b["text"] for b in ctx.bridge}
    assert texts[("A", "B")] == "- B —employs→ A: A to B"
    assert texts[("B", "S1")] == "- B —[summary_of]→ S1: B to S1"


def test_flat_mode_uses_layer0_only_and_skips_missing_paths(tmp_path):
    view = build(tmp_path)
    ctx = retrieve(view, "q", Q, "flat", CFG)
    assert [e["id"] for e in ctx.entities] == ["A", "B", "D"]
    assert [c["id"] for c in ctx.communities] == ["c1", "c2"]
    # keys [A, B, D, E]: B-D has no layer-0 path and is skipped, never an error
    assert [(b["source"], b["target"]) for b in ctx.bridge] == [("A", "B"), ("D", "E")]


def test_modes_differ_only_where_they_should(tmp_path):
    view = build(tmp_path)
    hi, nob = retrieve(view, "q", Q, "hi", CFG), retrieve(view, "q", Q, "hi-nobridge", CFG)
    assert nob.bridge == [] and nob.entities == hi.entities and nob.communities == hi.communities
    naive = retrieve(view, "q", Q, "naive", CFG)
    assert naive.entities == naive.communities == naive.bridge == []
    assert [c["id"] for c in naive.chunks] == ["ch1", "ch2"]  # chunk vector search only
    for ctx in (hi, nob, naive):
        assert sum(ctx.tokens.values()) <= CFG.token_budget


def test_budget_is_respected_and_output_is_deterministic(tmp_path):
    view = build(tmp_path)
    tight = RetrievalConfig(top_n=3, top_m=2, token_budget=100)
    a, b = retrieve(view, "q", Q, "hi", tight), retrieve(view, "q", Q, "hi", tight)
    assert a.as_dict() == b.as_dict()
    assert sum(a.tokens.values()) <= 100


def test_the_levels_take_only_what_no_whole_source_fits_unless_shares_are_asked_for(tmp_path):
    view = build(tmp_path)
    cfg = RetrievalConfig(top_n=3, top_m=2, token_budget=100)
    hi, ppr = retrieve(view, "q", Q, "hi", cfg), retrieve(view, "q", Q, "ppr", cfg)
    # the sources are packed as ppr packs them; the levels get what is left, within the budget
    assert [c["id"] for c in hi.chunks] == [c["id"] for c in ppr.chunks] == ["ch1", "ch2"]
    assert hi.tokens["chunks"] == ppr.tokens["chunks"] and hi.entities
    left = cfg.token_budget - hi.tokens["chunks"]
    assert sum(v for k, v in hi.tokens.items() if k != "chunks") <= left
    # fixed shares give the levels 30 % of the budget whatever the sources need
    shared = retrieve(view, "q", Q, "hi", cfg.model_copy(update={"level_budget": "shares"}))
    assert shared.tokens["chunks"] <= 70 and shared.tokens.get("entities", 0) <= 10


def test_by_value_a_report_that_repeats_the_sources_gets_no_budget_and_one_with_a_new_fact_does(tmp_path):
    view = build(
        tmp_path,
        reports_said={"c1": ("Alpha, Beta", "Alpha met Beta in Paris."), "c3": ("Tau", "Tau founded Rome in 753.")},
    )
    cfg = RetrievalConfig(top_n=3, top_m=2, token_budget=2000, level_budget="value")
    ctx = retrieve(view, "q", Q, "hi", cfg)
    assert [c["id"] for c in ctx.chunks] == ["ch1", "ch2"]  # the sources, whole, in ranking order first
    assert [c["id"] for c in ctx.communities] == ["c3"]  # c1's report says only what ch1 says
    # "A is here." first: B's and T's descriptions add no word to it (one-letter names are no words)
    assert [e["id"] for e in ctx.entities] == ["A"]
    assert sum(ctx.tokens.values()) <= cfg.token_budget
    assert ctx.as_dict() == retrieve(view, "q", Q, "hi", cfg).as_dict()
    # a tight budget: what the sources leave goes to the best value per token, never past the budget
    tight = cfg.model_copy(update={"token_budget": 30})
    small = retrieve(view, "q", Q, "hi", tight)
    assert sum(small.tokens.values()) <= 30
    # ch1 first (ranking order); then entity A (cosine .894, all new) is worth more than ch2 (.447), and ch2 no
    # longer fits what A leaves
    assert [c["id"] for c in small.chunks] == ["ch1"] and [e["id"] for e in small.entities] == ["A"]


def test_by_value_takes_relevance_times_novelty_greedily_within_the_budget():
    from tasks.query.packing import Candidate, by_value, content_words

    def cand(section, order, text, relevance, tokens):
        return Candidate(section, order, {"text": text}, relevance, tokens, content_words(text))

    sources = content_words("Scrooge kept Marley's name above the warehouse door.")
    repeat = cand("communities", 0, "Marley's name above the warehouse door", 0.9, 10)  # novelty 0
    fact = cand("entities", 0, "Fezziwig threw a Christmas ball for his apprentices", 0.5, 10)
    half = cand("entities", 1, "Scrooge kept a Christmas ball", 0.6, 10)  # new: christmas, ball (2 of 4 words)
    big = cand("chunks", 0, "Fred invited Scrooge to Christmas dinner every year", 0.8, 50)  # does not fit
    weak = cand("bridge", 0, "Topper courted the plump sister", 0.1, 5)  # under min_relevance
    held = set(sources)
    chosen = by_value([repeat, fact, half, big, weak], held, 30, min_relevance=0.15)
    # fact (0.5 x 1) first; then half's new words are taken already (christmas, ball): 0.6 x 0 = nothing
    assert chosen == [fact] and held == sources | fact.words  # what the context holds now
    # half alone: 0.6 x 0.5 = 0.3 (christmas, ball new; scrooge, kept held): taken, then fact (0.5 x 4/6 new)
    assert by_value([half, fact], set(sources), 15, 0.15) == [fact]  # one fits: fact's 0.5 beats half's 0.3
    more = cand("entities", 1, "Scrooge kept a Christmas ball and a goose", 0.6, 10)  # christmas, ball, goose new
    assert by_value([more, fact], set(sources), 30, 0.15) == [fact, more]  # then more's goose: 0.6 x 1/5


def test_empty_and_unrelated_index_give_an_empty_context_with_a_message(tmp_path):
    view = build(tmp_path / "full")
    far = unit([0, -1, -1, -1])
    ctx = retrieve(view, "q", far, "hi", CFG)
    assert ctx.empty and "nothing in the index is related" in ctx.message
    empty = build(tmp_path / "empty", empty=True)
    ctx = retrieve(empty, "q", Q, "hi", CFG)
    assert ctx.empty and ctx.message == "the index is empty: nothing to retrieve"
    assert extractive_answer(ctx) == ""


def test_extractive_answer_picks_matching_sentences(tmp_path):
    view = build(tmp_path)
    ctx = retrieve(view, "Whom did Alpha meet in Paris?", Q, "hi", CFG)
    assert extractive_answer(ctx).startswith("Alpha met Beta in Paris. (Doc 1)")


def test_sentences_keep_abbreviations_initials_and_quotes():
    from tasks.runtime.text import split_sentences

    assert split_sentences("Mrs. Cratchit, wife of Bob Cratchit, came in.  Tim was there.") == [
        "Mrs. Cratchit, wife of Bob Cratchit, came in.", "Tim was there."]
    assert split_sentences("Professor Michael S. Hart was the originator. The U.S. Army used it.") == [
        "Professor Michael S. Hart was the originator.", "The U.S. Army used it."]
    assert split_sentences('He said "Go away!" and left. Bob Cratchit, clerk to Scrooge. "Bah!" said Scrooge.') == [
        'He said "Go away!" and left.', "Bob Cratchit, clerk to Scrooge.", '"Bah!" said Scrooge.']
    # titles pySBD does not know end no sentence
    assert split_sentences("The leader is Hon. Winnie Kiiza of the Forum. Fr. Brown came.") == [
        "The leader is Hon. Winnie Kiiza of the Forum.", "Fr. Brown came."]


def test_sentences_are_found_back_as_pysbd_finds_them():
    """The segmenter finds its sentences back in the text with ``str.find`` rather than a pattern per sentence:
    the same spans as pySBD's own search, a repeated sentence taken at its next occurrence, trailing whitespace
    (any kind) kept with the sentence before it."""
    import pysbd

    from tasks.runtime.text import _segmenter_class

    texts = [
        "Yes. No. Yes. No.",  # each repeat at its own place
        "Bah!  Humbug!\tBah! \u00a0Humbug! ",
        'He said "Go." Then "Go." again. Mr. Go went.',
        "A. B. A. B. a. b.",
        "",
        "One sentence without an end",
    ]
    def spans(segmenter, text):
        return [(s.sent, s.start, s.end) for s in segmenter.segment(text)]

    ours = _segmenter_class()(language="en", clean=False, char_span=True)
    theirs = pysbd.Segmenter(language="en", clean=False, char_span=True)
    for text in texts:
        assert spans(ours, text) == spans(theirs, text), text
    assert spans(ours, "Yes. No. Yes. No.") == [("Yes. ", 0, 5), ("No. ", 5, 9), ("Yes. ", 9, 14), ("No.", 14, 17)]


def test_eval_measures_by_hand():
    assert normalize_answer("The  Eiffel-Tower!") == "eiffel tower"
    assert answer_in_context(["Stanley Hall"], "...was G. Stanley Hall, who...")
    assert not answer_in_context(["Hall"], "Hallway")
    assert passage_recall(["p1", "p2"], {"p2", "p9"}) == 0.5
    assert np.isnan(passage_recall([], {"p1"}))


def test_bridge_path_search_is_shortest_and_bounded():
    import networkx as nx

    from tasks.methods.hirag.retrieval import shortest_path

    # a chain 0-1-2-3-4-5 with a shortcut 1-4: 0 -> 5 takes 0-1-4-5 (3 hops)
    g = nx.Graph([(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (1, 4)])
    adj = [sorted(g.adj[n]) for n in range(6)]
    assert shortest_path(adj, 0, 5, 6) == [0, 1, 4, 5]
    assert shortest_path(adj, 0, 5, 2) is None  # longer than the cap: skipped
    assert shortest_path(adj, 3, 3, 1) == [3]
    rng = np.random.default_rng(3)
    r = nx.gnm_random_graph(60, 90, seed=3)
    adj = [sorted(r.adj[n]) for n in range(60)]
    for a, b in rng.integers(0, 60, (40, 2)):
        path = shortest_path(adj, int(a), int(b), 60)
        if nx.has_path(r, int(a), int(b)):
            assert len(path) - 1 == nx.shortest_path_length(r, int(a), int(b))
            assert all(r.has_edge(u, v) for u, v in zip(path, path[1:]))
        else:
            assert path is None


def test_vector_tables_past_the_threshold_are_searched_through_their_index(tmp_path):
    from tasks.store.vectors import has_vector_index

    exact = build(tmp_path / "exact")
    indexed = build(tmp_path / "ann", ann_min_rows=2)  # both vector tables have at least 2 rows
    assert indexed.ent_vecs is None and indexed.chunk_vecs is None and exact.ent_vecs is not None
    assert all(has_vector_index(t) for t in indexed.ann.values()) and set(indexed.ann) == {"entities", "chunks"}
    # every partition is probed on a table this small: the same scores, so the same contexts
    assert np.allclose(indexed.similarity("entities", Q, 8), exact.similarity("entities", Q, 8), atol=1e-5)
    # only the k nearest come back from an index; the rest score -1
    top2 = indexed.similarity("entities", Q, 2)
    assert sorted(np.flatnonzero(top2 > -1)) == [exact.ent_index["A"], exact.ent_index["B"]]
    for mode in ("hi", "naive"):
        assert retrieve(indexed, "Alpha?", Q, mode, CFG).text() == retrieve(exact, "Alpha?", Q, mode, CFG).text()


def test_a_view_left_on_disk_is_read_while_its_snapshot_is_the_latest_and_ignored_after(tmp_path):
    import json

    from tasks.retrieval import view as R

    build(tmp_path)
    cat = Catalog(tmp_path / "idx")
    R._VIEWS.clear()
    first = R.load_view(cat)
    assert not first.from_disk and first.lance_version is not None
    expected = retrieve(first, "Alpha", Q, "hi", CFG).as_dict()  # builds the BM25 index and the passage graph
    R.remember_view(first)
    head = json.loads((cat.cache_dir / "views" / "head.json").read_text())
    assert head["version"] == 1 and (cat.cache_dir / "views" / head["file"]).exists()

    R._VIEWS.clear()  # another process: the view comes from disk, LanceDB untouched
    fresh = Catalog(tmp_path / "idx")
    again = R.load_view(fresh)
    assert again.from_disk and "db" not in fresh.__dict__
    assert retrieve(again, "Alpha", Q, "hi", CFG).as_dict() == expected
    R.remember_view(again)  # nothing to write: it came from there

    # a publish appends to _snapshots: the copy no longer names the latest snapshot
    cat.publish({"layers": cat.read("layers")}, "run2", "incremental", DIM)
    R._VIEWS.clear()
    newer = R.load_view(Catalog(tmp_path / "idx"))
    assert not newer.from_disk and newer.version == 2
    R.remember_view(newer)
    # a damaged copy is ignored, not fatal
    (cat.cache_dir / "views" / "view-v2.pkl").write_bytes(b"not a pickle")
    R._VIEWS.clear()
    damaged = R.load_view(Catalog(tmp_path / "idx"))
    assert not damaged.from_disk and damaged.version == 2
    R._VIEWS.clear()


def test_lexical_scores_never_import_numba():
    """bm25s imports numba when it is installed (~0.15 s of a cold query); Strata uses its numpy backend."""
    import subprocess
    import sys

    code = ("import sys; from tasks.retrieval.lexical import BM25Index; s = BM25Index(['Scrooge paid Bob', 'Marley died']).scores("
            "'Who paid Bob?'); assert s[0] > 0 == s[1], s; assert 'numba' not in sys.modules; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parent.parent)
    assert out.stdout.strip() == "ok", out.stderr


def test_the_view_copy_is_stamped_with_the_versions_of_the_libraries_it_pickles(monkeypatch):
    """A copy pickled under another bm25s (or numpy, pyarrow, networkx, scipy) is not read back."""
    from tasks.retrieval.lexical import bm25s
    from tasks.retrieval.view import _code_stamp

    _code_stamp.cache_clear()
    before = _code_stamp()
    monkeypatch.setattr(bm25s(), "__version__", "0.0.0+other")
    _code_stamp.cache_clear()
    assert _code_stamp() != before
    monkeypatch.undo()
    _code_stamp.cache_clear()
    assert _code_stamp() == before


def test_the_entities_section_shows_what_the_question_names_then_named_entities_then_concepts():
    from tasks.methods.hirag.retrieval import named_first

    items = [{"name": n, "type": t} for n, t in [("marriage", "concept"), ("Tim Cratchit", "person"),
                                                 ("cripple", "concept"), ("Bob Cratchit", "person"),
                                                 ("Christmas Eve", "concept")]]
    order = lambda q: [i["name"] for i in named_first(items, q)]  # noqa: E731
    assert order("Who employed Bob Cratchit?") == ["Bob Cratchit", "Tim Cratchit", "Christmas Eve", "marriage", "cripple"]
    # a question about a concept keeps it first
    assert order("Whose marriage was happy?")[0] == "marriage"


def test_the_sources_sentences_are_embedded_before_a_question_and_kept_for_the_next_process(tmp_path):
    from tasks.query.answer import TokenVectors, warm_sentences
    from tests.test_answer import WordPieces

    view = build(tmp_path)
    model = WordPieces()
    calls = model.calls
    vectors = TokenVectors(model)
    # each source's title (what a question names is looked for there too), then its sentences
    assert warm_sentences(view, vectors, limit=2) == 2 and calls == [["Doc 1", "Alpha met Beta in Paris."]]
    assert warm_sentences(view, vectors, limit=10) == 4 and calls[-1] == ["Doc 2", "Delta married Epsilon."]  # once
    vectors.save(tmp_path / "views" / "sentences.pkl", "model-a")
    again = TokenVectors(model)
    assert again.load(tmp_path / "views" / "sentences.pkl", "model-b") == 0 and not again.seen  # another model's
    assert again.load(tmp_path / "views" / "sentences.pkl", "model-a") == 4
    assert warm_sentences(view, again, limit=10) == 4 and len(calls) == 2  # nothing embedded again
    assert again(["Delta married Epsilon."])[0][0].tolist() == [model.ids[w] for w in ("delta", "married", "epsilon")]
    (tmp_path / "views" / "sentences.pkl").write_bytes(b"damaged")
    assert TokenVectors(model).load(tmp_path / "views" / "sentences.pkl", "model-a") == 0


def test_workers_starting_together_embed_the_sources_sentences_once(tmp_path):
    """A service's workers warm up at once: the first embeds and saves, the others wait and read its vectors."""
    import threading

    from tasks.query.answer import TokenVectors, warm_saved
    from tests.test_answer import WordPieces

    view = build(tmp_path)
    model = WordPieces(delay=0.2)  # the others reach the lock while the first embeds
    calls = model.calls

    path, got = tmp_path / "views" / "sentences.pkl", []
    workers = [
        threading.Thread(target=lambda: got.append(warm_saved(view, TokenVectors(model), 10, path, "m")))
        for _ in range(3)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert calls == [["Doc 1", "Alpha met Beta in Paris.", "Doc 2", "Delta married Epsilon."]]
    assert sorted(got) == [(4, 0), (4, 4), (4, 4)]  # one embedded both sources' texts, two read them


def test_a_summary_entity_card_lists_its_members_sources(tmp_path):
    from tasks.query.browse import _layer0_members, entity_card

    view = build(tmp_path)
    index = view.ent_index
    # T summarises S1 (degree 4) and S2 (3); S1 holds B (degree 3), A and C (2 each, by id), S2 holds D and E
    assert [view.ent_ids[i] for i in _layer0_members(view, index["T"])] == ["B", "A", "C", "D", "E"]
    top = entity_card(view, "T")
    assert (top["sources_of"], top["n_sources"], [s["id"] for s in top["sources"]]) == ("members", 2, ["ch1", "ch2"])
    s2 = entity_card(view, "S2")
    assert (s2["sources_of"], [s["id"] for s in s2["sources"]]) == ("members", ["ch2"])
    a = entity_card(view, "A")
    assert (a["sources_of"], [s["id"] for s in a["sources"]]) == ("entity", ["ch1"])


def test_an_entity_card_and_the_search_show_and_match_its_merged_names(tmp_path):
    from tasks.query.browse import entity_card, search_entities

    view = build(tmp_path, aliases={"A": ["Alf", "Mr. A"]})
    assert entity_card(view, "A")["aliases"] == ["Alf", "Mr. A"] and entity_card(view, "B")["aliases"] == []
    assert [e["id"] for e in search_entities(view, "alf")] == ["A"]
