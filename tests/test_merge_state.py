"""Layer 0 from its description state (``merge_state``) and the new mentions equals layer 0 from all the mentions:
hand cases for the cut, then a property test over random corpora, random mention orders and random updates."""

from __future__ import annotations

import random

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tasks.index.delta import Grown, mention_select, recompute_layer0
from tasks.index.merge import graph_from_mentions, mention_frame, mention_rows


def _ent(name, chunk, description, type_="person"):
    return {"name": name, "type": type_, "description": description, "chunk_id": chunk}


def _state_of(table: pa.Table):
    def state(ids):
        return table.filter(pc.is_in(table.column("id"), value_set=pa.array(sorted(ids), pa.string()))).drop(
            ["version"]
        )

    return state


def _update(old_rows, new_rows, order, budget):
    """Layer 0 of ``old_rows`` then updated with ``new_rows`` through the state, and the keys whose old mentions
    the update read."""
    import polars as pl

    entities, relations, state = graph_from_mentions(old_rows, budget, order=order, state=True)
    read: list[str] = []

    old_chunks = sorted({r["chunk_id"] for r in old_rows})

    def select(expr):
        out = mention_select(old_rows + new_rows)(expr)
        read.extend(out.filter(pl.col("chunk_id").is_in(old_chunks)).get_column("key").to_list())
        return out

    keys = {r["key"] for r in new_rows}
    grown = Grown(keys - {""}, mention_frame(new_rows), _state_of(state))
    got = recompute_layer0(entities, relations, select, keys, budget, order, grown)
    return got, state, read


def test_a_sentence_before_the_cut_is_kept_one_after_it_never_is():
    """Budget 8 tokens. Old: "Ann sang." (3) at a0, "Ann danced all night long." (6) at a2: the second passes the
    budget, it is the cut. New "Ann ran." (3) at a1 is kept (3 + 3 <= 8, before the cut); the cut stays. New
    "Ann slept." at a3, after the cut, is never kept."""
    order = {"c0": ("a", 0), "c1": ("a", 1), "c2": ("a", 2), "c3": ("a", 3)}
    old = mention_rows([_ent("Ann", "c0", "Ann sang."), _ent("Ann", "c2", "Ann danced all night long.")], [])
    new = [
        dict(r, id=r["id"] + "n")
        for r in mention_rows([_ent("Ann", "c1", "Ann ran."), _ent("Ann", "c3", "Ann slept.")], [])
    ]
    (entities, _, _, _, _, delta, _), state, read = _update(old, new, order, 8)
    assert [e["description"] for e in entities] == ["Ann sang. Ann ran."]
    assert state.column("cut").to_pylist() == ["Ann danced all night long."]
    [row] = delta.add.to_pylist()
    assert row["kept"] == ["Ann sang.", "Ann ran."] and row["kept_chunks"] == ["c0", "c1"]
    assert row["cut"] == "Ann danced all night long." and row["cut_chunk"] == "c2"
    assert row["names"] == ["Ann"] and row["name_counts"] == [4]
    assert not read  # the old mentions were never read
    full, _, full_state = graph_from_mentions(old + new, 8, order=order, state=True)
    assert entities == [dict(e, degree=0) for e in full] and delta.add.drop(["version"]).equals(
        full_state.drop(["version"])
    )


def test_a_new_mention_of_the_cut_sentence_before_it_moves_the_cut_without_reading_the_mentions():
    """Budget 8. Old: "Ann sang." (3) at c0, "Ann danced all night long." (6) at c2 (the cut), "Ann ate." at c3.
    New: the cut's sentence at c1, before the cut. After "Ann sang." it still passes the budget (3 + 6 > 8), so it
    is the cut again, now at c1: every sentence placed before the old cut is in the state, and nothing after it is
    needed."""
    order = {"c0": ("a", 0), "c1": ("a", 1), "c2": ("a", 2), "c3": ("a", 3)}
    old = mention_rows(
        [
            _ent("Ann", "c0", "Ann sang."),
            _ent("Ann", "c2", "Ann danced all night long."),
            _ent("Ann", "c3", "Ann ate."),
        ],
        [],
    )
    new = [dict(r, id=r["id"] + "n") for r in mention_rows([_ent("Ann", "c1", "Ann danced all night long.")], [])]
    (entities, _, _, _, _, delta, _), _, read = _update(old, new, order, 8)
    assert not read
    full, _, full_state = graph_from_mentions(old + new, 8, order=order, state=True)
    assert [e["description"] for e in entities] == [e["description"] for e in full] == ["Ann sang."]
    [row] = delta.add.to_pylist()
    assert row["cut"] == "Ann danced all night long." and row["cut_chunk"] == "c1"
    assert delta.add.drop(["version"]).equals(full_state.drop(["version"]))


def test_a_sentence_cut_at_a_chunks_edge_reads_once_whole_in_a_build_and_in_an_update():
    """Two overlapping chunks give one sentence twice, one copy cut at the first chunk's end: the description shows
    the whole sentence once (``whole_texts``) while the state keeps both copies, so an update that brings the whole
    one later gives the row a build of everything gives."""
    order = {"c0": ("a", 0), "c1": ("a", 1), "c2": ("a", 2)}
    whole = "Ann looked at the house-fronts, black enough, and the windows blacker, with the white snow."
    cut = "Ann looked at the house-fronts, black enough, and the windows"
    old = mention_rows([_ent("Ann", "c0", "Ann sang."), _ent("Ann", "c1", cut)], [])
    new = [dict(r, id=r["id"] + "n") for r in mention_rows([_ent("Ann", "c2", whole)], [])]
    (entities, _, _, _, _, delta, _), state, _ = _update(old, new, order, 100)
    before, _, _ = graph_from_mentions(old, 100, order=order, state=True)
    assert [e["description"] for e in before] == [f"Ann sang. {cut}"]  # nothing whole to read it from yet
    full, _, full_state = graph_from_mentions(old + new, 100, order=order, state=True)
    assert [e["description"] for e in entities] == [e["description"] for e in full] == [f"Ann sang. {whole}"]
    [row] = delta.add.to_pylist()
    assert row["kept"] == ["Ann sang.", cut, whole]  # the state holds every copy
    assert delta.add.drop(["version"]).equals(full_state.drop(["version"]))


SENTENCES = [
    "{a} met {b}.",
    "{a} wrote a long letter to {b} about the harvest and the weather in the north.",
    "{a} wrote a long letter to {b} about the harvest and",  # the sentence above cut at a chunk's edge
    "letter to {b} about the harvest and the weather in the north.",  # and cut at the next chunk's start
    "{a} is here.",
    "{a} and {b} argued for years over the river, the mill and the old stone bridge.",
    "{a} left.",
    "{a} sold {b} a horse.",
]
NAMES = ["Ann", "ANN", "Bob", "Bob's", "Cal", "Dora", "dora", "Eve"]
TYPES = ["person", "concept", "location"]


def _corpus(rnd: random.Random):
    """Random mentions of 14 chunks at random places, relations labelled or not: (mention rows, chunk order)."""
    chunks = [f"c{i:02d}" for i in range(14)]
    order = {c: (rnd.choice("abcd"), rnd.randrange(6)) for c in chunks}
    ents, rels = [], []
    for c in chunks:
        for _ in range(rnd.randrange(1, 6)):
            a, b = rnd.sample(NAMES, 2)
            text = rnd.choice(SENTENCES).format(a=a, b=b)
            ents.append(_ent(a, c, text, rnd.choice(TYPES)))
            if rnd.random() < 0.6:
                label = rnd.choice([None, None, "employs", "visits"])  # labels that compete, either way round
                rels.append(
                    {"source": a, "target": b, "description": text, "weight": 1.0, "chunk_id": c, "label": label}
                )
    rnd.shuffle(ents)
    rnd.shuffle(rels)
    return mention_rows(ents, rels), order


@pytest.mark.parametrize("seed", range(40))
def test_state_and_new_mentions_give_what_all_mentions_give(seed):
    """Random corpora: mentions with repeated sentences, names, types and relation labels that compete, chunks whose places
    interleave old and new documents; the new chunks only add mentions. Entities, relations and the new state
    equal a full merge of all the mentions, and the update never read the old mentions of an entity."""
    rnd = random.Random(seed)
    rows, order = _corpus(rnd)
    new_chunks = set(rnd.sample(sorted(order), 5))
    old = [r for r in rows if r["chunk_id"] not in new_chunks]
    new = [r for r in rows if r["chunk_id"] in new_chunks]
    budget = rnd.choice([6, 15, 30, 200])
    (entities, relations, added, removed, _, delta, _), state, read = _update(old, new, order, budget)
    want_e, want_r, want_state = graph_from_mentions(rows, budget, order=order, state=True)
    assert entities == sorted(want_e, key=lambda e: e["id"])
    assert relations.sort_by("id").equals(want_r.sort_by("id"))
    assert not removed and added == {e["id"] for e in want_e} - {
        e["id"] for e in graph_from_mentions(old, budget, order)[0]
    }
    kept = state.filter(pc.invert(pc.is_in(state.column("id"), value_set=pa.array(delta.values, pa.string()))))
    after = pa.concat_tables([kept, delta.add]).drop(["version"]).sort_by("id")
    assert after.equals(want_state.drop(["version"]).sort_by("id"))
    grown = {r["key"] for r in new if "|" not in r["key"]}
    assert not set(read) & grown


@pytest.mark.parametrize("seed", range(20))
def test_entities_that_lose_mentions_fold_them_a_share_at_a_time(seed, monkeypatch):
    """Random corpora where chunks go and come: an entity that lost mentions is recomputed from all its mentions,
    which the selection streams two rows at a time and the update folds into its state three rows at a time; the
    entities and the state equal a full merge of the mentions that live."""
    import tasks.index.delta as delta

    monkeypatch.setattr(delta, "FOLD_ROWS", 3)
    rnd = random.Random(seed)
    rows, order = _corpus(rnd)
    gone = set(rnd.sample(sorted(order), 3))
    new_chunks = set(rnd.sample(sorted(set(order) - gone), 3))
    old = [r for r in rows if r["chunk_id"] not in new_chunks]
    new = [r for r in rows if r["chunk_id"] in new_chunks]
    live = [r for r in rows if r["chunk_id"] not in gone]
    budget = rnd.choice([6, 15, 30, 200])
    entities, relations, state = graph_from_mentions(old, budget, order=order, state=True)
    whole = mention_select(live)
    streamed: list[int] = []

    def parts(expr):
        frame = whole(expr)
        streamed.append(frame.height)
        return [frame.slice(i, 2) for i in range(0, frame.height, 2)]

    select = lambda expr: whole(expr)  # noqa: E731
    select.parts = parts  # type: ignore[attr-defined]
    went = {r["key"] for r in old if r["chunk_id"] in gone}
    grown = Grown({r["key"] for r in new} - went - {""}, mention_frame(new), _state_of(state))
    got, _, _, _, _, change, _ = recompute_layer0(
        entities, relations, select, {r["key"] for r in new} | went, budget, order, grown
    )
    want, _, want_state = graph_from_mentions(live, budget, order=order, state=True)
    by_id = lambda es: sorted((dict(e, degree=0) for e in es), key=lambda e: e["id"])  # noqa: E731
    assert by_id(got) == by_id(want) and streamed and streamed[0] > 3
    kept = state.filter(pc.invert(pc.is_in(state.column("id"), value_set=pa.array(change.values, pa.string()))))
    entity_state = lambda t: t.filter(pc.equal(t.column("kind"), "entity")).drop(["version"]).sort_by("id")  # noqa: E731
    assert entity_state(pa.concat_tables([kept, change.add])).equals(entity_state(want_state))
