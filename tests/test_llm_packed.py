"""Extraction in one pass over packs of short chunks (``llm.extraction.pack_tokens``): the packs, the answer read
passage by passage, a failed pack asked chunk by chunk, and a run against the local server that makes the same graph
with fewer calls and is estimated as it runs."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from flows.cli import app
from schemas.config import ExtractConfig, LLMConfig
from schemas.prompts import PromptSet
from tasks.index.extract_llm import extract_batch_llm, grounded_rows, packed_messages, packs, parse_packed
from tasks.runtime.llm import ParseError
from tasks.runtime.tokens import count_tokens
from tasks.store.catalog import Catalog
from tests.fake_llm_server import FakeLLM, answer_for

SMALL = ["--set", "chunking.size=300", "--set", "chunking.overlap=30", "--set", "dask.processes=false",
         "--set", "llm.backoff_base_s=0.05"]


def test_packs_take_consecutive_chunks_while_their_text_fits_and_a_longer_chunk_alone():
    texts = ["Marley was dead.", "Scrooge signed it.", "Bob Cratchit kept the door of his dismal little cell open.",
             "Fred came."]
    sizes = [count_tokens(t) for t in texts]
    chunks = [{"id": str(i), "text": t} for i, t in enumerate(texts)]
    budget = sizes[0] + sizes[1]  # the first two fit together; the third is longer than the budget: alone
    assert sizes[2] > budget
    assert [[c["id"] for c in p] for p in packs(chunks, budget)] == [["0", "1"], ["2"], ["3"]]
    assert [[c["id"] for c in p] for p in packs(chunks, sum(sizes))] == [["0", "1", "2", "3"]]
    assert [[c["id"] for c in p] for p in packs(chunks, 1)] == [["0"], ["1"], ["2"], ["3"]]


def test_a_packed_answer_is_read_passage_by_passage():
    answer = json.dumps({
        "entities": [
            {"passage": 1, "name": "Marley", "type": "person", "description": "Dead."},
            {"passage": "2", "name": "Scrooge", "type": "person"},
            {"passage": 2, "name": "Bob Cratchit", "type": "clerk"},  # not a type: concept
            {"passage": 3, "name": "Fred"},  # no such passage: dropped
            {"name": "Fan"},  # no passage: dropped
        ],
        "relations": [
            {"passage": 2, "source": "Scrooge", "target": "Bob Cratchit", "label": "Employs", "strength": 8},
            {"passage": 2, "source": "Bob Cratchit", "target": "Scrooge", "label": "is the one clerk who works for"},
            {"passage": 1, "source": "Marley", "target": "Scrooge"},  # Scrooge is passage 2's: dropped
            {"passage": 2, "source": "Scrooge", "target": "Scrooge"},  # no self-relation
        ],
    })
    (ents1, rels1), (ents2, rels2) = parse_packed(2)(answer)
    assert [(e["name"], e["type"], e["description"]) for e in ents1] == [("Marley", "person", "Dead.")]
    assert [(e["name"], e["type"]) for e in ents2] == [("Scrooge", "person"), ("Bob Cratchit", "concept")]
    assert rels1 == [] and [(r["source"], r["target"], r["weight"], r["label"]) for r in rels2] == [
        ("Scrooge", "Bob Cratchit", 8.0, "employs"), ("Bob Cratchit", "Scrooge", 1.0, None)]  # six words: no label
    # one passage: an item without a number is that passage's
    [(ents, _)] = parse_packed(1)(json.dumps({"entities": [{"name": "Fan"}]}))
    assert [e["name"] for e in ents] == ["Fan"]
    # entities none of which says its passage: unusable (asked again, then chunk by chunk)
    with pytest.raises(ParseError):
        parse_packed(2)(json.dumps({"entities": [{"name": "Fan"}, {"name": "Fred"}]}))
    with pytest.raises(ParseError):
        parse_packed(2)(json.dumps({"relations": []}))
    assert parse_packed(2)(json.dumps({"entities": []})) == [([], []), ([], [])]  # nothing named: nothing found


def test_a_packed_answer_in_the_prompt_s_shape_lists_each_passage_s_items_by_position():
    answer = json.dumps({"passages": [
        {"passage": 1, "entities": [["Marley", "person"], "Fan", ["", "person"]], "relations": [["Marley", "x", "Fan"]]},
        {"passage": "2", "entities": [["Scrooge", "person"], ["Bob Cratchit", "clerk"]],
         "relations": [["Scrooge", "Employs", "Bob Cratchit", 8], ["Marley", "knew", "Scrooge"], "Scrooge"]},
        {"passage": 3, "entities": [["Fred", "person"]]},  # no such passage: dropped
        "not a passage",
    ]})
    (ents1, rels1), (ents2, rels2) = parse_packed(2)(answer)
    assert [(e["name"], e["type"]) for e in ents1] == [("Marley", "person"), ("Fan", "concept")]  # "" names nothing
    assert [(r["source"], r["target"], r["weight"], r["label"]) for r in rels1] == [("Marley", "Fan", 1.0, "x")]
    assert [(e["name"], e["type"]) for e in ents2] == [("Scrooge", "person"), ("Bob Cratchit", "concept")]
    assert [(r["source"], r["target"], r["weight"], r["label"]) for r in rels2] == [
        ("Scrooge", "Bob Cratchit", 8.0, "employs")]  # Marley is passage 1's; a bare name is no relation
    # one passage: a block without its number is that passage's
    [(ents, _)] = parse_packed(1)(json.dumps({"passages": [{"entities": [["Fan", "person"]]}]}))
    assert [(e["name"], e["type"]) for e in ents] == [("Fan", "person")]
    assert parse_packed(2)(json.dumps({"passages": []})) == [([], []), ([], [])]
    with pytest.raises(ParseError):
        parse_packed(2)(json.dumps({"passages": "none"}))


def test_a_packed_answer_is_described_by_the_chunk_s_own_sentences():
    chunk = {"id": "c", "text": "Marley was dead: to begin with.\nScrooge signed it. Old\n  Marley was as dead as a "
                                "door-nail. Nobody else came."}
    found = ([{"name": "Marley", "type": "person", "description": ""},
              {"name": "Old Marley", "type": "person", "description": ""},
              {"name": "Fan", "type": "person", "description": ""}],
             [{"source": "Scrooge", "target": "Marley", "label": "signed for", "weight": 5.0, "description": ""},
              {"source": "Fan", "target": "Scrooge", "label": None, "weight": 1.0, "description": ""}])
    ents, rels = grounded_rows(chunk, found, 40)
    assert [(e["name"], e["description"]) for e in ents] == [
        ("Marley", "Marley was dead: to begin with."),  # a mention a sentence that names it
        ("Marley", "Old Marley was as dead as a door-nail."),
        ("Old Marley", "Old Marley was as dead as a door-nail."),  # across a line break
        ("Fan", "Fan"),  # named by no sentence: its name
    ]
    assert [(r["description"], r["label"]) for r in rels] == [
        ("Scrooge signed for Marley.", "signed for"),  # no sentence names both: the statement
        ("Fan and Scrooge.", None),
    ]
    assert {e["chunk_id"] for e in ents} | {r["chunk_id"] for r in rels} == {"c"}
    assert grounded_rows(chunk, found, 20)[0][1]["description"] == "Old Marley was as d…"  # clipped as offline


class _Client:
    """A client whose answer to a prompt of several passages stays unusable; one passage is answered."""

    def __init__(self):
        self.prompts = PromptSet()
        self.asked: list[int] = []

    async def complete(self, messages, *, prompt_version, json_mode, parse):
        n = messages[-1]["content"].count("Passage ")
        self.asked.append(n)
        if n > 1:
            raise ParseError("no 'entities' list")
        return parse(answer_for(messages))


def test_a_pack_whose_answer_stays_unusable_is_asked_chunk_by_chunk_and_nothing_is_lost():
    chunks = [{"id": f"c{i}", "text": t} for i, t in enumerate(
        ["Marley was dead. Scrooge signed it.", "Bob Cratchit worked for Scrooge.", "Fred visited Scrooge."])]
    client = _Client()
    res = extract_batch_llm(chunks, ExtractConfig(), LLMConfig(model="openai/fake"), "", client=client,
                            pack_tokens=1000)
    assert client.asked == [3, 1, 1, 1]  # the pack once (the client's own retry is inside), then each chunk
    assert res.ok == ["c0", "c1", "c2"] and not res.quarantine
    assert {(e["chunk_id"], e["name"]) for e in res.entities} == {
        ("c0", "Marley"), ("c0", "Scrooge"), ("c1", "Bob Cratchit"), ("c1", "Scrooge"), ("c2", "Fred"),
        ("c2", "Scrooge")}
    assert {(r["chunk_id"], r["source"], r["target"]) for r in res.relations} == {
        ("c0", "Marley", "Scrooge"), ("c1", "Bob Cratchit", "Scrooge"), ("c2", "Fred", "Scrooge")}


def test_packed_messages_quote_each_passage_under_its_number():
    user = packed_messages(["One.", "Two."], PromptSet())[-1]["content"]
    assert 'Passage 1:\n"""\nOne.\n"""\n\nPassage 2:\n"""\nTwo.\n"""' in user


def test_a_packed_run_makes_the_graph_of_the_two_passes_with_fewer_calls_and_is_estimated_as_it_runs(
        tmp_path, small_corpus, monkeypatch):
    """The local server names the same things of a chunk whichever prompt asks, so the two ways must give the same
    layer 0; the packed one in fewer calls and prompt tokens, and ``--estimate`` counts its prompts."""
    fake = FakeLLM().start()
    try:
        monkeypatch.setenv("OPENAI_API_KEY", "sk-fake")
        base = [*SMALL, "--set", "llm.model=openai/fake", "--set", f"llm.api_base={fake.url}",
                "--set", "llm.summaries.model=offline", "--set", "llm.reports.model=offline"]
        graphs, extract = [], []
        for way, sets in (("two", []), ("packed", ["--set", "llm.extraction.pack_tokens=1200"])):
            index = tmp_path / way
            if way == "packed":
                est = CliRunner().invoke(app, ["index", str(small_corpus), "--index", str(index), *base, *sets,
                                               "--estimate", "--json"])
                assert est.exit_code == 0, est.output
                [stage] = [s for s in json.loads(est.output)["stages"] if s["stage"] == "extraction"]
            res = CliRunner().invoke(app, ["index", str(small_corpus), "--index", str(index), "--quiet", *base, *sets])
            assert res.exit_code == 0, res.output
            cat = Catalog(index)
            layer0 = [e for e in cat.read("entities").to_pylist() if e["layer"] == 0]
            names = {e["id"]: e["name"] for e in layer0}
            extracted = [r for r in cat.read("relations").to_pylist() if r["kind"] == "extracted"]
            graphs.append((sorted((e["name"], e["type"]) for e in layer0),
                           sorted((names[r["source_id"]], names[r["target_id"]]) for r in extracted)))
            extract.append(json.loads(cat.runs()[-1]["stage_counts"])["extract"])
        assert graphs[0][0] and graphs[0][1] and graphs[0] == graphs[1]  # the same things named, the same pairs
        # the packed run's descriptions are the chunks' sentences, its relations labelled by the model
        texts = " ".join(" ".join(c["text"].split()) for c in cat.read("chunks").to_pylist())
        assert all(e["description"].split(" ")[0] in texts for e in layer0)
        assert not any("appears in the text" in e["description"] for e in layer0)
        assert sum(bool(r["label"]) for r in extracted) > len(extracted) / 2
        two, packed = extract
        assert packed["llm_calls"] * 4 <= two["llm_calls"]  # several chunks a call, one pass instead of two
        assert packed["llm_prompt_tokens"] < 0.6 * two["llm_prompt_tokens"]
        assert stage["calls"] == packed["llm_calls"]
        assert stage["input_tokens"] == pytest.approx(packed["llm_prompt_tokens"], rel=0.05)
    finally:
        fake.stop()


def test_a_name_describes_by_the_sentences_that_name_it_as_whole_words():
    chunk = {"id": "c", "text": "Al was there. Alas, also nobody. The US team won. Thus it ended."}
    found = ([{"name": "Al", "type": "person", "description": ""}, {"name": "US", "type": "location",
                                                                      "description": ""}], [])
    ents, _ = grounded_rows(chunk, found, 100)
    assert [(e["name"], e["description"]) for e in ents] == [("Al", "Al was there."), ("US", "The US team won.")]


def test_the_estimate_asks_a_pack_remembered_as_unparseable_chunk_by_chunk(tmp_path):
    """The client refuses a prompt remembered as unparseable, so extraction asks that pack's chunks one by one: the
    estimate counts those prompts, and none for a chunk alone that is remembered so too (it is quarantined)."""
    from tasks.index.llm_estimate import extraction_estimate
    from tasks.runtime.llm_client import ResponseCache, cache_key

    llm = LLMConfig(model="openai/fake")
    texts = ["Marley was dead.", "Scrooge signed it."]
    said = PromptSet()
    params = {"temperature": 0.0, "max_tokens": 2000, "response_format": {"type": "json_object"}}
    version = said["extract_packed"].version
    cache = ResponseCache(tmp_path / "llm_cache.sqlite")
    cache.put_failure(cache_key(llm.model, packed_messages(texts, said), params, version), "no 'entities' list")
    alone = [extraction_estimate([[t]], llm, 0, None, 1000) for t in texts]
    est = extraction_estimate([texts], llm, 0, cache, 1000)
    assert (est.calls, est.cached) == (2, 1)
    assert est.input_tokens == sum(a.input_tokens for a in alone)
    cache.put_failure(cache_key(llm.model, packed_messages(texts[:1], said), params, version), "no 'entities' list")
    assert extraction_estimate([texts[:1]], llm, 0, cache, 1000).calls == 0
