import asyncio
import json

import numpy as np

from tasks.methods.hirag.communities import detect_communities, graph_arrays, hierarchical_leiden
from tasks.methods.reports import build_reports
from tasks.methods.summarize import Cluster, LLMSummarizer, OfflineSummarizer
from tasks.runtime.text import split_sentences


def _rel(a, b, w=1.0, kind="extracted"):
    return {"id": f"r-{a}-{b}", "source_id": a, "target_id": b, "kind": kind, "weight": w, "description": f"{a} meets {b}."}


def _graph():
    rels = [_rel("a", "b"), _rel("b", "c"), _rel("c", "a"), _rel("d", "e"), _rel("e", "f"), _rel("f", "d"),
            _rel("c", "d", 0.1), _rel("a", "S", kind="summary_of"), _rel("d", "S", kind="summary_of")]
    ents = [{"id": n, "name": n.upper(), "type": "concept", "description": f"{n} is a node.", "layer": 1 if n == "S" else 0}
            for n in "abcdefgS"]
    return ents, rels


def test_leiden_covers_every_node_including_isolated_and_other_layers():
    ents, rels = _graph()
    comms = detect_communities([e["id"] for e in ents], rels, max_cluster_size=10, seed=42)
    level0 = [c for c in comms if c["level"] == 0]
    covered = [n for c in level0 for n in c["entity_ids"]]
    assert sorted(covered) == sorted(e["id"] for e in ents)  # each node in exactly one level-0 community
    assert ["g"] in [c["entity_ids"] for c in level0]  # the isolated node is kept
    groups = {frozenset(c["entity_ids"]) for c in level0}
    assert any({"a", "b", "c"} <= g for g in groups) and any({"d", "e", "f"} <= g for g in groups)
    again = detect_communities([e["id"] for e in ents], rels, max_cluster_size=10, seed=42)
    assert again == comms


def test_small_max_cluster_size_adds_levels_with_parents():
    rng = np.random.default_rng(0)
    nodes = [f"n{i}" for i in range(60)]
    rels = [_rel(nodes[i], nodes[j]) for i in range(60) for j in range(i + 1, 60) if rng.random() < 0.1]
    comms = detect_communities(nodes, rels, max_cluster_size=8, seed=1)
    ids = {c["id"] for c in comms}
    assert max(c["level"] for c in comms) >= 1
    for c in comms:
        if c["level"] > 0:
            assert c["parent_id"] in ids


def test_graph_arrays_merge_each_pair_once_without_loops():
    rels = [_rel("a", "b", 1.0), _rel("b", "a", 2.0), _rel("a", "a", 5.0), _rel("c", "b", 1.0)]
    g = graph_arrays(rels)
    assert g.names.to_pylist() == ["a", "b", "c"]
    assert g.lo.tolist() == [0, 1] and g.hi.tolist() == [1, 2] and g.weight.tolist() == [3.0, 1.0]


def _grouped_graph(n=400, draws=4000, seed=3):
    rng = np.random.default_rng(seed)
    src = rng.integers(0, n, draws)
    dst = np.where(rng.random(draws) < 0.8, src // 40 * 40 + rng.integers(0, 40, draws), rng.integers(0, n, draws))
    return [_rel(f"n{a:03d}", f"n{b:03d}", float(w)) for a, b, w in zip(src, dst, rng.integers(1, 4, draws))]


def _partition(labels):
    groups = {}
    for node, label in labels:
        groups.setdefault(label, set()).add(node)
    return sorted(sorted(g) for g in groups.values())


def test_level_0_is_graspologic_natives_partition():
    # the engine's own hierarchical Leiden over the edge list it was handed before (names, merged pairs, in order)
    import graspologic_native as gn

    g = graph_arrays(_grouped_graph())
    names = g.names.to_pylist()
    edges = [(names[a], names[b], w) for a, b, w in zip(g.lo.tolist(), g.hi.tolist(), g.weight.tolist())]
    theirs = [(h.node, h.cluster) for h in gn.hierarchical_leiden(edges=edges, max_cluster_size=10, seed=42) if h.level == 0]
    [ours, *_] = hierarchical_leiden(g, max_cluster_size=10, seed=42)
    assert _partition(zip([names[i] for i in ours.nodes], ours.cluster.tolist())) == _partition(theirs)


def test_a_level_cuts_each_large_community_into_parts():
    comms = detect_communities([], _grouped_graph(), max_cluster_size=10, seed=42)
    by_id = {c["id"]: c for c in comms}
    children = {}
    for c in comms:
        if c["parent_id"]:
            children.setdefault(c["parent_id"], []).append(c)
    assert max(c["level"] for c in comms) >= 2
    for parent_id, kids in children.items():
        parent = by_id[parent_id]
        assert parent["size"] >= 10 and all(k["level"] == parent["level"] + 1 for k in kids)
        assert sorted(e for k in kids for e in k["entity_ids"]) == parent["entity_ids"]  # a partition of it
        assert len(kids) >= 2
    again = detect_communities([], _grouped_graph(), max_cluster_size=10, seed=42)
    assert again == comms


def _directed(pairs, weights=None):
    lo = np.array([a for a, _ in pairs])
    hi = np.array([b for _, b in pairs])
    w = np.ones(len(pairs)) if weights is None else np.asarray(weights, dtype=float)
    return np.concatenate([lo, hi]), np.concatenate([hi, lo]), np.concatenate([w, w])


def test_louvain_moves_and_modularity_by_hand():
    from tasks.methods.hirag import louvain

    # two triangles joined by an edge: m = 7, each triangle 3 inside of a degree sum of 7: Q = 2 (3/7 - 1/4) = 5/14
    src, dst, w = _directed([(0, 1), (0, 2), (1, 2), (3, 4), (3, 5), (4, 5), (2, 3)])
    assert abs(louvain.modularity(src, dst, w, np.array([0, 0, 0, 1, 1, 1])) - 5 / 14) < 1e-12
    # a triangle and an edge 3-4, node 0 alone: m = 4, degrees 2 2 2 1 1. Node 0 into {1, 2}: 2/4 - 2 (4 - 0) / 32
    # = 0.25; node 3 into {4}: 1/4 - 1 (1 - 0) / 32 = 0.21875; nodes 1, 2 would leave their community for less
    src, dst, w = _directed([(0, 1), (0, 2), (1, 2), (3, 4)])
    labels, deg = np.array([0, 1, 1, 3, 4]), np.bincount(src, w)
    tot = np.bincount(labels, deg, 5)
    nodes, to = louvain.best_moves(src, dst, w, labels, deg, tot, 4.0, 1.0, np.isin(src, [0, 1, 3]))
    assert nodes.tolist() == [0, 3] and to.tolist() == [1, 4]
    # each node's half is its own, whatever array holds it; about half of the nodes move in a round
    half = louvain.movers(np.arange(10_000), 7, 0, 3)
    assert half[[3, 9_999]].tolist() == louvain.movers(np.array([3, 9_999]), 7, 0, 3).tolist()
    assert 4_800 < half.sum() < 5_200 and (half != louvain.movers(np.arange(10_000), 7, 0, 4)).any()


def test_louvain_joins_neighbouring_cliques_of_a_ring_as_modularity_does():
    """A ring of 30 cliques of five (the resolution limit): Louvain's levels join neighbouring cliques, which
    modularity prefers to the cliques alone, and the same edges give the same communities."""
    from tasks.methods.hirag import louvain

    pairs = [(5 * k + i, 5 * k + j) for k in range(30) for i in range(5) for j in range(i + 1, 5)]
    pairs += [(5 * k, (5 * k + 6) % 150) for k in range(30)]
    src, dst, w = _directed(pairs)
    got = louvain.louvain(src, dst, w, 150, seed=1)
    cliques = np.arange(150) // 5
    assert all(len(set(got[cliques == k])) == 1 for k in range(30))  # no clique cut
    assert int(got.max()) + 1 < 30
    assert louvain.modularity(src, dst, w, got) > louvain.modularity(src, dst, w, cliques)
    assert (louvain.louvain(src, dst, w, 150, seed=1) == got).all()


def test_reports_one_per_community_and_bottom_up_when_over_budget():
    ents, rels = _graph()
    comms = [
        {"id": "top", "level": 0, "parent_id": None, "entity_ids": list("abcdef"), "size": 6},
        {"id": "left", "level": 1, "parent_id": "top", "entity_ids": list("abc"), "size": 3},
        {"id": "right", "level": 1, "parent_id": "top", "entity_ids": list("def"), "size": 3},
    ]
    reports, failures = build_reports(comms, ents, rels, budget=20)  # tiny budget: 'top' is built from its children
    assert failures == []
    by = {r["community_id"]: r for r in reports}
    assert set(by) == {"top", "left", "right"}
    assert by["left"]["title"] == "A, B and C"
    assert by["left"]["findings"][0].startswith("A — B:")
    assert by["left"]["summary"] in by["top"]["summary"] or by["left"]["title"] in by["top"]["summary"]
    assert all(0 <= r["rating"] <= 10 for r in reports)
    # the rating says why: three relations of weight 1 inside 'left', as many in the strongest of its level
    assert by["left"]["rating"] == 10.0
    assert by["left"]["rating_reason"] == (
        "its 3 members' relations weigh 3 together, against 3 in the strongest community of level 1: "
        "10 × log(1 + 3) / log(1 + 3)"
    )
    assert by["top"]["rating_reason"].startswith("its 6 members' relations weigh 6.1 together")
    assert by["left"]["full_text"].endswith("Rating 10 of 10: " + by["left"]["rating_reason"])


def test_offline_report_names_named_entities_and_never_repeats_a_sentence():
    shared = "Bob Cratchit, clerk to Ebenezer Scrooge, sat in the tank."
    ents = [
        {"id": "fire", "name": "fire", "type": "concept", "layer": 0, "description": f"{shared} The fire was small."},
        {"id": "bob", "name": "Bob Cratchit", "type": "person", "layer": 0, "description": f"{shared} Mrs. Cratchit cooked."},
        {"id": "xmas", "name": "Christmas Eve", "type": "time", "layer": 0, "description": shared},
        {"id": "scrooge", "name": "Scrooge", "type": "person", "layer": 0, "description": shared},
    ]
    rels = [{"id": f"r{i}", "source_id": a, "target_id": b, "kind": "extracted", "weight": w, "description": d}
            for i, (a, b, w, d) in enumerate([("fire", "bob", 3.0, shared), ("fire", "xmas", 2.0, shared),
                                              ("bob", "scrooge", 1.0, "Scrooge paid Bob fifteen shillings.")])]
    comm = {"id": "c", "level": 0, "parent_id": None, "entity_ids": ["fire", "bob", "xmas", "scrooge"], "size": 4}
    (report,), _ = build_reports([comm], ents, rels, budget=600)
    # fire is the most connected member, but a concept: the named people first, then the time
    assert report["title"] == "Bob Cratchit, Scrooge and Christmas Eve"
    # each member's first sentence not yet said, most central first, round after round: each sentence once
    assert report["summary"] == f"{shared} Mrs. Cratchit cooked. The fire was small."
    assert report["findings"] == ["Bob Cratchit — Scrooge: Scrooge paid Bob fifteen shillings."]
    (small,), _ = build_reports([comm], ents, rels, budget=30)  # 10 tokens: the first sentence, cut at a word
    assert small["summary"] == "Bob Cratchit, clerk to…"  # 9 tokens end inside "Ebenezer": back to its space


def test_a_report_finds_its_statements_first_each_read_from_its_subject():
    """A labelled relation is a finding that says what one member does to another, ahead of stronger relations whose
    ends only co-occur; a summary's membership is never one."""
    ents = [
        {"id": i, "name": n, "type": "person", "layer": 0, "description": f"{n} lived in London."}
        for i, n in [("bob", "Bob Cratchit"), ("scrooge", "Scrooge"), ("fred", "Fred")]
    ]
    rels = [
        {"id": "r1", "source_id": "bob", "target_id": "scrooge", "kind": "extracted", "weight": 1.0,
         "description": "Scrooge paid Bob fifteen shillings.", "label": "paid", "label_from": "scrooge"},
        {"id": "r2", "source_id": "fred", "target_id": "scrooge", "kind": "extracted", "weight": 4.0,
         "description": "Fred and Scrooge dined.", "label": None, "label_from": None},
    ]
    comm = {"id": "c", "level": 0, "parent_id": None, "entity_ids": ["bob", "scrooge", "fred"], "size": 3}
    (report,), _ = build_reports([comm], ents, rels, budget=600)
    assert report["findings"] == [
        "Scrooge paid Bob Cratchit: Scrooge paid Bob fifteen shillings.",
        "Fred — Scrooge: Fred and Scrooge dined.",
    ]


def test_a_report_summary_reads_sentence_by_sentence_without_stray_quotes_fragments_or_bars():
    """What a splitter leaves on the demo book: the opening quote of the next sentence at the end of one, a fragment
    of a sentence already taken (a chunk that starts inside a word), a table's column bar, a quotation cut off, a
    chunk that opens inside a quotation's sentence ("said Bob, …"). A summary has each sentence once, whole or marked
    "…", opens and ends as a sentence."""
    from tasks.methods.reports import central_sentences
    from tasks.query.quality import repeats_or_is_cut

    texts = [
        "I think I shook him yesterday. '",
        "I think I shook him yesterday. \"",  # the same sentence as a reader sees it
        "The coach-houses and sheds were overrun with grass.",
        "ouses and sheds were overrun with grass.",
        "Every One! |Transcriber's note: The Contents were added by the transcriber. |",
        "He stooped down at the keyhole; but, at the first sound of 'God bless you, merry gentleman,",
        "said Bob, with a sudden declension in his high spirits. His active little crutch was heard upon the floor.",
        "growled Scrooge in his accustomed voice.",
    ]
    out = central_sentences(texts, 1000)
    assert out == [
        "I think I shook him yesterday.",
        "The coach-houses and sheds were overrun with grass.",
        "Every One!",
        "He stooped down at the keyhole; but, at the first sound of 'God bless you, merry gentleman…",
        "His active little crutch was heard upon the floor.",  # the text's whole sentence, not its opening fragment
        "… growled Scrooge in his accustomed voice.",  # a text with nothing else: marked as an excerpt
        "|Transcriber's note: The Contents were added by the transcriber.",
    ]
    assert not repeats_or_is_cut(" ".join(out))
    assert repeats_or_is_cut(" ".join(texts[:6]))


def test_copies_of_one_sentence_from_overlapping_chunks_read_once_whole():
    """``whole_texts``: a copy cut at a chunk's end, one cut at the next chunk's start and one whose head starts
    another's tail (the book's "Martha" sentence) read as the whole sentence once, in the first copy's place;
    sentences that only share words in their middle ("was first mapped by …") stay apart; the quality measure
    flags a summary that pastes a copy in, not one that does not."""
    from tasks.query.quality import repeats_or_is_cut
    from tasks.runtime.text import whole_texts

    whole = (
        "Sheets and towels, a little wearing apparel, two old fashioned silver teaspoons, a pair of sugar-tongs, "
        "and a few boots."
    )
    cut = "fashioned silver teaspoons, a pair of sugar-tongs, and a few boots."
    assert whole_texts(["Scrooge went home.", "Sheets and towels, a little wearing apparel, two old", whole]) == [
        "Scrooge went home.",
        whole,
    ]
    assert whole_texts([whole, cut]) == [whole]
    a = "Such a goose! Hurrah! And Martha warn't as late last Christmas Day by half an hour!' 'Here's"
    b = "And Martha warn't as late last Christmas Day by half an hour!' 'Here's Martha, mother!' said a girl."
    assert whole_texts([a, "Bob sat down.", b]) == [
        "Such a goose! Hurrah! And Martha warn't as late last Christmas Day by half an hour!' 'Here's Martha, "
        "mother!' said a girl.",
        "Bob sat down.",
    ]
    mapped = [
        "Mount Ida was first mapped by the United States Geological Survey from surveys.",
        "Mount Hood was first mapped by the United States Geological Survey from surveys.",
    ]
    assert whole_texts(mapped) == mapped and not repeats_or_is_cut(" ".join(mapped))
    assert repeats_or_is_cut(f"{whole} {cut}")  # a copy pasted in
    assert repeats_or_is_cut(f"Sheets and towels, a little wearing apparel, two old {whole}")


def test_a_report_reads_a_long_first_sentence_whole_and_cuts_nothing_inside_a_word():
    """A description whose first sentence runs past the 400 characters a report reads was cut there, inside a
    word ("…to raise the Ghos"): it is read to its end now; and a text over its budget ends at a whole word, marked."""
    from tasks.methods.reports import SENTENCE_PREFIX_CHARS, central_sentences
    from tasks.runtime.tokens import clip_tokens, count_tokens

    long = "Marley was dead, " + ", ".join(f"and the clerk signed it on day {i}" for i in range(40)) + "."
    assert len(long) > SENTENCE_PREFIX_CHARS
    assert central_sentences([f"{long} Scrooge signed it."], 1000) == [long]  # the first 400 characters: one sentence
    assert central_sentences([long], 12) == ["Marley was dead, and the clerk signed it on…"]
    assert clip_tokens("Scrooge signed it.", 50) == "Scrooge signed it."
    clipped = clip_tokens("Scrooge's name was good upon 'Change, for anything he chose to put his hand to.", 9)
    assert clipped == "Scrooge's name was good upon…" and count_tokens(clipped) <= 9


class FakeLLM:
    """A local fake of the LLM client that records concurrency."""

    def __init__(self, answers):
        from schemas.prompts import PromptSet

        self.answers, self.in_flight, self.max_in_flight, self.calls = answers, 0, 0, 0
        self.prompts = PromptSet()

    async def complete(self, messages, *, prompt_version, json_mode=False, parse=None):
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        await asyncio.sleep(0.05)
        self.in_flight -= 1
        self.calls += 1
        text = self.answers(messages)
        return parse(text) if parse else text


def _clusters(n):
    return [Cluster([{"id": f"e{i}", "name": f"thing {i}", "type": "person", "description": f"Thing {i}."}],
                    np.ones((1, 4), np.float32)) for i in range(n)]


def test_llm_summarizer_runs_a_layer_concurrently_and_falls_back_on_garbage():
    def answers(messages):
        body = messages[-1]["content"]
        if "thing 3" in body:
            return "I cannot help with that."
        return "```json\n" + json.dumps({"summary_entities": [{"name": "People", "type": "person", "description": "d"}]}) + "\n```"

    fake = FakeLLM(answers)
    summ = LLMSummarizer(fake, ["person", "concept"])
    out = summ.summarize_layer(1, _clusters(6))
    assert fake.calls == 6 and fake.max_in_flight == 6  # all clusters of the layer at once
    offline = OfflineSummarizer(["person", "concept"]).summarize_layer(1, [_clusters(6)[3]])[0]
    assert [o[0]["name"] for o in out] == ["People"] * 3 + [offline[0]["name"]] + ["People"] * 2
    assert out[3] == offline  # the cluster is summarised offline instead of lost
    assert len(summ.failures) == 1 and "ParseError" in summ.failures[0]["error"]


def test_llm_reports_use_the_answer_and_keep_offline_draft_on_failure():
    ents, rels = _graph()
    comms = [{"id": "x", "level": 0, "parent_id": None, "entity_ids": list("abc"), "size": 3},
             {"id": "y", "level": 0, "parent_id": None, "entity_ids": list("def"), "size": 3}]

    def answers(messages):
        if "A (concept)" in messages[-1]["content"]:
            return json.dumps(
                {"title": "The ABC group", "summary": "s", "rating": 42, "rating_reason": "A  core\ngroup.",
                 "findings": ["f1"]}
            )
        return '{"summary": "no title"}'

    reports, failures = build_reports(comms, ents, rels, budget=500, client=FakeLLM(answers))
    by = {r["community_id"]: r for r in reports}
    assert by["x"]["title"] == "The ABC group" and by["x"]["rating"] == 10.0
    assert by["x"]["rating_reason"] == "A core group."  # the model's own reason, one line
    assert by["y"]["title"] == "D, E and F"  # offline draft kept
    assert by["y"]["rating_reason"].startswith("its 3 members' relations weigh")
    assert [f["item"] for f in failures] == ["y"]


def test_a_summary_reads_each_sentence_once_when_its_pieces_split_differently_side_by_side():
    """Two descriptions cut one quotation at different places (as a parser's sentences do): taken one after the
    other they differ, joined they are one sentence twice. The summary is what a reader splits, each sentence once
    (the book's "Uncle Scrooge" community, reduced)."""
    from tasks.methods.reports import central_sentences
    from tasks.query.quality import repeats_or_is_cut

    texts = [
        'Fred may rail at it. Here is a glass of wine; and I say, "Uncle Scrooge!"\' \'Well! Uncle Scrooge!\' '
        "Uncle Scrooge had become gay.",
        "Scrooge said, 'Bah!' again. The spectre joined in the dirge.",
        'Here is a glass of wine; and I say, "Uncle Scrooge!"\' \'Well!',
        "Uncle Scrooge!' Uncle Scrooge had become gay.",
    ]
    summary = central_sentences(texts, 500)
    assert not repeats_or_is_cut(" ".join(summary))
    assert summary == [
        "Fred may rail at it.",
        "Scrooge said, 'Bah!' again.",
        'Here is a glass of wine; and I say, "Uncle Scrooge!"\' \'Well!',
        "Uncle Scrooge!'",  # the first text's longer copy of the sentence above overlaps it: not taken
        "Uncle Scrooge had become gay.",
        "The spectre joined in the dirge.",
    ]


def test_a_hand_made_communitys_report_read_sentence_by_sentence():
    """Title: its named members; summary: their descriptions' first sentences, each once and ended; findings: what
    members say of each other, a statement first, each with the one sentence that names both ends and says its label
    (not one that only names both, not a summary's membership, not the same sentence pasted twice from two
    overlapping chunks); a rating with its reason."""
    ents = [
        {"id": "s", "name": "Scrooge", "type": "person", "layer": 0,
         "description": "Scrooge was a squeezing, grasping old sinner. He kept the office cold."},
        {"id": "b", "name": "Bob Cratchit", "type": "person", "layer": 0,
         "description": "Bob Cratchit was the clerk in the Tank. Bob Cratchit was the clerk in the Tank."},
        {"id": "o", "name": "office", "type": "concept", "layer": 0, "description": "The office was dismal."},
        {"id": "S", "name": "Scrooge / Bob Cratchit", "type": "person", "layer": 1,
         "description": "Scrooge and Bob Cratchit share an office."},
    ]
    rels = [
        {**_rel("s", "b", 2.0), "label": "employs", "label_from": "s",
         "description": "Marley was dead. Scrooge watched Bob Cratchit. Scrooge employs Bob Cratchit in the office. "
                        "Scrooge employs Bob Cratchit in"},
        _rel("b", "o", 1.0) | {"description": "Bob Cratchit sat in the office by a small fire."},
        _rel("s", "S", kind="summary_of"),
    ]
    comm = {"id": "c", "level": 0, "parent_id": None, "entity_ids": ["s", "b", "o", "S"], "size": 4}
    (report,), failures = build_reports([comm], ents, rels, budget=1000)
    # the most connected first (Bob Cratchit and Scrooge tie at 3: by name), the summary entity last
    assert failures == [] and report["title"] == "Bob Cratchit, Scrooge and office"
    assert split_sentences(report["summary"]) == [
        "Bob Cratchit was the clerk in the Tank.",
        "Scrooge was a squeezing, grasping old sinner.",
        "The office was dismal.",
        "Scrooge and Bob Cratchit share an office.",
        "He kept the office cold.",
    ]
    assert report["findings"] == [
        "Scrooge employs Bob Cratchit: Scrooge employs Bob Cratchit in the office.",
        "Bob Cratchit — office: Bob Cratchit sat in the office by a small fire.",
    ]
    assert report["rating"] == 10.0 and report["rating_reason"].startswith("its 4 members' relations weigh 4 together")


def test_the_quality_measures_on_hand_written_names_and_summaries():
    from tasks.query.quality import lists_names, named_by_members, one_lowercase_word, repeats_or_is_cut, verb_or_noun

    assert verb_or_noun("employs") and verb_or_noun("clerk of") and verb_or_noun("is")
    assert not verb_or_noun("of") and not verb_or_noun("from") and not verb_or_noun(None)

    assert one_lowercase_word("hand") and not one_lowercase_word("Scrooge") and not one_lowercase_word("old man")
    assert named_by_members("Bob Cratchit / Tiny Tim", {"Bob Cratchit", "Tiny Tim", "Scrooge"})
    assert not named_by_members("good / poor", {"Bob Cratchit", "good"})
    assert lists_names("Lord, Roast, Boiled, Wonderful party and 212 more (said, hope, couple).\nShe hurried out.")
    assert lists_names("Cains, Abels, Pharaoh (Cains).\nThere were Cains and Abels.")
    assert not lists_names("Scrooge, a miser, kept a counting-house. Bob Cratchit, his clerk, sat in a cell.")
    assert not lists_names("'Bah!' said Scrooge, 'Humbug.'\nHe went home.")
    assert not repeats_or_is_cut("Scrooge signed it. Marley was dead.")
    assert not repeats_or_is_cut("'Bah!' said Scrooge. He went home, and…")
    assert repeats_or_is_cut("Marley was dead. Scrooge signed it. Marley was dead.")
    assert repeats_or_is_cut("Scrooge signed it. To raise the Ghos")
    assert repeats_or_is_cut("said Bob, with a sudden declension in his high spirits.")
    assert not repeats_or_is_cut("… said Bob, with a sudden declension.") and not repeats_or_is_cut("iPhone sold well.")


def test_only_clusters_and_communities_of_min_members_are_sent_to_the_model():
    """``llm.<stage>.min_members``: a smaller cluster or community gets the offline text, with no call and no failure."""

    def answers(messages):
        if "into a hierarchy" in messages[0]["content"]:
            return json.dumps({"summary_entities": [{"name": "People", "type": "person", "description": "d"}]})
        return json.dumps({"title": "The ABCD group", "summary": "s", "rating": 5, "findings": ["f1"]})

    big = Cluster([{"id": f"b{i}", "name": f"big {i}", "type": "person", "description": f"Big {i}."} for i in range(3)],
                  np.ones((3, 4), np.float32))
    clusters = [*_clusters(2), big]
    fake = FakeLLM(answers)
    summ = LLMSummarizer(fake, ["person", "concept"], min_members=3)
    out = summ.summarize_layer(1, clusters)
    offline = OfflineSummarizer(["person", "concept"]).summarize_layer(1, clusters[:2])
    assert fake.calls == 1 and out[:2] == offline and out[2][0]["name"] == "People" and not summ.failures
    ents, rels = _graph()
    comms = [{"id": "x", "level": 0, "parent_id": None, "entity_ids": list("abcd"), "size": 4},
             {"id": "y", "level": 0, "parent_id": None, "entity_ids": list("ef"), "size": 2}]
    fake = FakeLLM(answers)
    reports, failures = build_reports(comms, ents, rels, budget=500, client=fake, min_members=3)
    by = {r["community_id"]: r for r in reports}
    assert fake.calls == 1 and by["x"]["title"] == "The ABCD group" and not failures
    assert by["y"]["title"] == build_reports(comms[1:], ents, rels, budget=500)[0][0]["title"]  # offline's


def test_a_graph_too_large_for_a_worker_is_refused_before_the_stage_starts(tmp_path):
    from types import SimpleNamespace

    import pytest

    from schemas.config import load_config, parse_overrides
    from schemas.tables import schema_for
    from tasks.errors import TooLargeForTask, exit_code
    from tasks.methods.community_parts import PART_BYTES_PER_NODE, PART_BYTES_PER_RELATION
    from tasks.methods.graph_parts import LEIDEN_BYTES_PER_RELATION, check_task_memory, communities_on_cluster
    from tasks.store.spill import SpilledTable

    class SmallWorkers:
        def __init__(self, room):
            self.room = room

        def task_memory(self):
            return self.room

        def __call__(self, *args, **kwargs):
            raise AssertionError("no task may start")

    def ctx(room=1000 * LEIDEN_BYTES_PER_RELATION, **communities):  # 80 %: 800 relations in one Leiden task
        cfg = load_config(overrides=parse_overrides([f"communities.{k}={v}" for k, v in communities.items()]))
        return SimpleNamespace(cfg=cfg, mapper=SmallWorkers(room), spill_dir=str(tmp_path), version=0)

    graph = SpilledTable([], schema_for("relations", 0), 801)
    with pytest.raises(TooLargeForTask, match="its 801 relations need") as refused:
        communities_on_cluster(ctx(engine="leiden"), ["a"], graph)
    assert exit_code(refused.value) == 5 and "--memory-limit" in str(refused.value)
    assert 'communities.engine = "parts"' in str(refused.value)
    # "auto" takes it over parts instead (the next test), refused too where a part cannot fit: on workers with
    # room for 640 relations a part, the graph's 801 in one part (communities.part_relations: 2M)
    room = 800 * PART_BYTES_PER_RELATION
    assert 801 * PART_BYTES_PER_RELATION + PART_BYTES_PER_NODE > 0.8 * room
    with pytest.raises(TooLargeForTask, match="tasks over parts of 801 relations") as refused:
        communities_on_cluster(ctx(room), ["a"], graph)
    assert "communities.part_relations" in str(refused.value)
    assert not list(tmp_path.iterdir())  # refused before the stage wrote anything
    check_task_memory(800, 1000 * LEIDEN_BYTES_PER_RELATION)  # what fits goes ahead


def test_a_graph_too_large_for_one_leiden_task_is_split_into_parts_that_fit(tmp_path):
    """"auto": a graph one Leiden task cannot hold runs over parts whose tasks fit. A ring of 30 cliques of five,
    each joined to the next by one edge, is modularity's classic resolution limit: level 0 joins neighbouring
    cliques, and the level below cuts each such community back into its cliques; an entity with no relation is a
    community of its own."""
    from types import SimpleNamespace

    import pyarrow as pa

    from schemas.config import load_config, parse_overrides
    from schemas.tables import schema_for
    from tasks.methods.graph_parts import LEIDEN_BYTES_PER_RELATION, communities_on_cluster
    from tasks.runtime.parallel import LocalMapper
    from tasks.store import workfs
    from tasks.store.spill import SpilledTable, write_whole

    cliques = [[f"c{k:02d}-{i}" for i in range(5)] for k in range(30)]
    pairs = [(x, y) for c in cliques for i, x in enumerate(c) for y in c[i + 1 :]]
    pairs += [(c[0], cliques[(k + 1) % 30][1]) for k, c in enumerate(cliques)]
    rows = [{"source_id": s, "target_id": t, "weight": 1.0, "kind": "extracted"} for s, t in pairs]
    schema = schema_for("relations", 0)
    files = []
    for i in range(3):  # three relation files, as a build spills them
        files.append(str(tmp_path / f"rel-{i}.parquet"))
        chunk = rows[i::3]
        write_whole(pa.table({f.name: [r.get(f.name) for r in chunk] for f in schema}, schema=schema), files[-1])

    class Workers(LocalMapper):
        def task_memory(self):
            return 150 * LEIDEN_BYTES_PER_RELATION  # one Leiden task holds 120 relations: not the 330 here

    ids = sorted([x for c in cliques for x in c] + ["z"])
    cfg = load_config(overrides=parse_overrides(["communities.part_relations=100"]))  # four parts
    ctx = SimpleNamespace(cfg=cfg, mapper=Workers(), spill_dir=str(tmp_path / "spill"), version=4)
    out = communities_on_cluster(ctx, ids, SpilledTable(files, schema, len(rows)))
    got = pa.concat_tables([workfs.read_table(f) for f in out.files]).to_pylist()
    assert len(rows) == 330 and len(got) == out.num_rows and len(out.files) == 4
    assert {r["version"] for r in got} == {4}
    of = {x: k for k, c in enumerate(cliques) for x in c}
    level0 = [set(r["entity_ids"]) for r in got if r["level"] == 0]
    assert sorted(x for c in level0 for x in c) == ids  # every entity once
    assert {"z"} in level0
    joined = [c for c in level0 if c != {"z"} and len({of[x] for x in c}) > 1]
    assert joined and all(c == {x for k in {of[x] for x in c} for x in cliques[k]} for c in joined)  # whole cliques
    level1 = [r for r in got if r["level"] == 1]
    by_id = {r["id"]: r for r in got}
    assert sorted(sorted(r["entity_ids"]) for r in level1) == sorted(
        sorted(cliques[k]) for c in joined for k in {of[x] for x in c}
    )  # each joined community cut back into its cliques, a level down
    assert all(set(r["entity_ids"]) <= set(by_id[r["parent_id"]]["entity_ids"]) for r in level1)


def test_a_task_may_use_the_smallest_worker_memory_limit():
    import contextlib

    from schemas.config import load_config
    from tasks.runtime.parallel import DaskPool, LocalMapper
    from tasks.runtime.process import machine_memory

    def pool_of(*limits):
        pool = DaskPool(load_config().dask)
        workers = {f"tcp://w{i}": {"memory_limit": m} for i, m in enumerate(limits)}
        client = type("Client", (), {"scheduler_info": lambda self: {"workers": workers}})()
        pool._open = lambda: (contextlib.ExitStack(), client)  # no real cluster
        return pool

    assert pool_of(3 * 2**30, 2 * 2**30, 0).task_memory() == 2 * 2**30  # 0: a worker without a limit
    assert pool_of(0).task_memory() == machine_memory() == LocalMapper().task_memory() > 2**28
