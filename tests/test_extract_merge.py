from schemas.config import ExtractConfig
from tasks.index.extract import extract_batch
from tasks.index.merge import merge_graph


def test_extract_finds_typed_entities_and_sentence_relations():
    text = (
        "Ebenezer Scrooge worked in London with Jacob Marley. "
        "The Journal of Mathematical Physics is published by the American Institute of Physics."
    )
    out = extract_batch([{"id": "c1", "text": text}], ExtractConfig())
    assert out.ok == ["c1"] and out.quarantine == []
    types = {e["name"]: e["type"] for e in out.entities}
    assert types["Ebenezer Scrooge"] == "person"
    assert types["London"] == "location"
    assert types["Jacob Marley"] == "person"
    pairs = {(r["source"], r["target"]) for r in out.relations}
    assert ("Ebenezer Scrooge", "London") in pairs
    # relations never cross sentences
    assert not any(
        {r["source"], r["target"]} == {"Jacob Marley", "American Institute of Physics"} for r in out.relations
    )
    marley = next(e for e in out.entities if e["name"] == "Jacob Marley")
    assert marley["description"] == "Ebenezer Scrooge worked in London with Jacob Marley."


def test_extract_quarantines_a_failing_chunk_and_keeps_the_rest():
    out = extract_batch(
        [{"id": "good", "text": "Scrooge lived in London."}, {"id": "bad", "text": None}], ExtractConfig()
    )
    assert out.ok == ["good"]
    assert [q["item"] for q in out.quarantine] == ["bad"]


def test_merge_resolves_by_normalised_name():
    ents = [
        {"name": "Scrooge", "type": "person", "description": "S1.", "chunk_id": "c1"},
        {"name": "SCROOGE", "type": "organization", "description": "S2.", "chunk_id": "c2"},
        {"name": "Scrooge's", "type": "person", "description": "S1.", "chunk_id": "c2"},
        {"name": "London", "type": "location", "description": "L1.", "chunk_id": "c1"},
    ]
    rels = [
        {"source": "Scrooge", "target": "London", "description": "S1.", "weight": 1.0, "chunk_id": "c1"},
        {"source": "London", "target": "scrooge", "description": "S3.", "weight": 1.0, "chunk_id": "c2"},
        {"source": "London", "target": "london", "description": "self", "weight": 1.0, "chunk_id": "c2"},
    ]
    entities, relations = merge_graph(ents, rels, max_description_tokens=100)
    by_name = {e["name"]: e for e in entities}
    assert set(by_name) == {"Scrooge", "London"}
    s = by_name["Scrooge"]
    assert s["type"] == "person"  # 2 of 3 mentions
    assert s["description"] == "S1. S2."  # distinct, in order
    assert s["source_chunk_ids"] == ["c1", "c2"]
    assert s["degree"] == 1
    assert relations.num_rows == 1  # both directions merged, self-loop dropped (relations stay an Arrow table)
    r = relations.to_pylist()[0]
    assert r["weight"] == 2.0 and r["source_chunk_ids"] == ["c1", "c2"]
    assert {r["source_id"], r["target_id"]} == {s["id"], by_name["London"]["id"]}
    again, _ = merge_graph(ents, rels, max_description_tokens=100)
    assert [e["id"] for e in again] == [e["id"] for e in entities]


def test_descriptions_stay_within_budget():
    parts = ["one two three.", "four five six.", "one two three.", "seven eight nine."]  # 4 tokens each
    ents = [{"name": "X", "type": "concept", "description": p, "chunk_id": f"c{i}"} for i, p in enumerate(parts)]
    (x,), _ = merge_graph(ents, [], max_description_tokens=8)
    assert x["description"] == "one two three. four five six."  # distinct, in order, stops before the budget
    (x,), _ = merge_graph(ents, [], max_description_tokens=1)
    assert x["description"] == "one two three."  # at least one part


def test_descriptions_follow_corpus_order_not_chunk_ids():
    from tasks.index.merge import graph_from_mentions, mention_rows

    def mention(chunk, sentence):
        return {"name": "Scrooge", "type": "person", "description": sentence, "chunk_id": chunk}

    # chunk ids are hashes: "c-zz" sorts last but is the first chunk of the first source
    order = {"c-zz": ("a.md", 0), "c-aa": ("a.md", 1), "c-mm": ("b.md", 0)}
    rows = mention_rows([mention("c-mm", "Three."), mention("c-aa", "Two."), mention("c-zz", "One.")], [])
    (ent,), _ = graph_from_mentions(rows, 100, order=order)
    assert ent["description"] == "One. Two. Three."
    # a source appended later (sorting after the others) leaves a full description as it was
    (full,), _ = graph_from_mentions(rows, 4, order=order)
    more = rows + mention_rows([mention("c-new", "Four.")], [])
    (again,), _ = graph_from_mentions(more, 4, order={**order, "c-new": ("c.md", 0)})
    assert full["description"] == again["description"] == "One. Two."


def test_merge_in_parts_equals_merge_whole(tmp_path):
    """Spilled mentions are merged part by part (split by key); the graph is the same as merged at once."""
    import random

    from tasks.index.merge import dictionary_encoded, graph_from_mentions, in_chunk_order, mention_rows
    from tasks.runtime.parallel import LocalMapper
    from tasks.store.rows import to_table
    from tasks.store.spill import gather, write_split

    rnd = random.Random(3)
    names = ["Scrooge", "scrooge", "Marley", "Bob Cratchit", "London", "Fezziwig", "Belle", "Tiny Tim", "Fred"]
    types = ["person", "location", "concept"]
    ents, rels = [], []
    for _ in range(40):
        chunk = f"c{rnd.randrange(10**6):06d}"
        for _ in range(rnd.randrange(1, 6)):
            ents.append(
                {
                    "name": rnd.choice(names),
                    "type": rnd.choice(types),
                    "chunk_id": chunk,
                    "description": f"Sentence {rnd.randrange(30)}.",
                }
            )
        for _ in range(rnd.randrange(0, 4)):
            a, b = rnd.sample(names, 2)
            rels.append(
                {
                    "source": a,
                    "target": b,
                    "chunk_id": chunk,
                    "description": f"Link {rnd.randrange(20)}.",
                    "weight": 1.0,
                }
            )
    rows = mention_rows(ents, rels)
    order = {r["chunk_id"]: (f"doc{i % 7}.md", i) for i, r in enumerate(rows)}
    table = dictionary_encoded(to_table("mentions", rows, 0, 1))
    files = [str(tmp_path / f"task-{start:05d}.parquet") for start in range(0, table.num_rows, 30)]
    for start, f in zip(range(0, table.num_rows, 30), files):
        write_split(table.slice(start, 30), "key", 6, f)
    spilled = gather(LocalMapper(), files, table.schema, 6, tmp_path / "parts", in_chunk_order)
    assert len(spilled.files) > 2
    whole_entities, whole_relations = graph_from_mentions(table, 12, order)
    part_entities, part_relations = graph_from_mentions(spilled, 12, order)
    assert len(whole_entities) > 5 and whole_relations.num_rows > 5
    assert part_entities == whole_entities
    assert part_relations.equals(whole_relations)
    # as tasks (merge_parts): the relations come back as ranges of source ids, sorted within each, that the run
    # process never reads; in order they are the whole table
    import polars as pl

    from tasks.index.merge_parts import merge_spilled, range_bounds

    task_entities, task_relations, _ = merge_spilled(LocalMapper(), spilled, 12, order, tmp_path / "work", 0, 4)
    assert len(task_relations.files) == len(spilled.files) and task_relations.num_rows == whole_relations.num_rows
    assert task_relations.read_all().equals(whole_relations)
    # the entities too stay in parts (ranges of keys, about 4 rows each): in order they are the whole table's rows
    assert len(task_entities.files) == -(-len(whole_entities) // 4) > 1 and task_entities.num_rows == len(
        whole_entities
    )
    assert task_entities.read_all().to_pylist() == [dict(e, staleness=0.0) for e in whole_entities]
    assert range_bounds(pl.Series(list("jihgfedcba")), 3) == ["d", "g"]
    assert range_bounds(pl.Series(["x", "x", "x"]), 3) == ["x"] and range_bounds(pl.Series([], dtype=pl.Utf8), 4) == []


def test_page_furniture_is_blanked_in_place_and_never_named():
    """``furniture.blank``: figure markers, page references after a run of spaces (a paragraph that ends in one, a
    caption or a list entry, whole), heading lines and italics underscores become spaces, the text keeps its length
    and its line breaks (every offset holds); a chunk all in capitals keeps its words, a table row its cells.
    The extractor then names no heading and glues no page number or caption to a sentence."""
    from tasks.index.furniture import blank

    page = (
        "STAVE ONE\n\n[Illustration: Marley's face,\n  in the knocker]\n\nMARLEY'S GHOST\n\n"
        "  Bob Cratchit went down a slide on\n    Cornhill, in honour of Christmas Eve          16\n\n"
        "  Nobody was under the bed.                             xi\n  Scrooge met Bob Cratchit in London.\n\n"
        "  _December, 1843._\n1962, 1964, 1966\n| ACME | 12 |\nnot_a_marker stays."
    )
    out = blank(page)
    assert len(out) == len(page) and out.count("\n") == page.count("\n")
    assert " ".join(out.split()) == (
        "Nobody was under the bed. Scrooge met Bob Cratchit in London. December, 1843. ACME 12 not_a_marker stays."
    )  # a table row keeps its cells, not its bars
    assert blank("NASA AND ESA\n\nJOINT MISSION 2024") == "NASA AND ESA\n\nJOINT MISSION 2024"  # no prose: kept
    assert blank("Revenue rose in 2023 to 16") == "Revenue rose in 2023 to 16"  # one space: not a page reference
    # a Markdown heading is its own line, not the first words of the sentence under it; "#tag" is no heading
    assert blank("# Note 1\n\nFirm 1 was founded in Oslo.") == " " * 8 + "\n\nFirm 1 was founded in Oslo."
    assert blank("# Only a heading") == "# Only a heading"
    assert blank("#tag\nmore") == "#tag\nmore"
    res = extract_batch([{"id": "c1", "text": "# Note 1\n\nFirm 1 was founded by Ann Lee in Oslo."}], ExtractConfig())
    assert {e["description"] for e in res.entities} == {"Firm 1 was founded by Ann Lee in Oslo."}

    res = extract_batch([{"id": "c1", "text": page}], ExtractConfig())
    names = {e["name"] for e in res.entities}
    assert {"Bob Cratchit", "London"} <= names and not any(w in n for n in names for w in ("STAVE", "GHOST", "Ill"))
    descriptions = {e["description"] for e in res.entities}
    assert any(d.startswith("Scrooge met Bob Cratchit in London.") for d in descriptions)
    assert not any(w in d for d in descriptions for w in ("xi", "Cornhill", "Illustration"))


BUSINESS = """# Q3 2026 Quarterly Review

## Revenue by segment
| Segment | Q3 2025 | Q3 2026 |
|---|---:|---:|
| Last-mile delivery | $7.7M | $9.5M |

## Risks
- The agreement with the dock workers' union in Rotterdam expires on 31 January 2027.
- Helios Pharma accounts for 14% of last-mile revenue.

Action items:
1. Priya Raman to circulate the volume analysis by 15 November.
2. Grace Chen to update the privacy register.

From: Lena Fischer
Date: 3 September 2026
Omar, thanks for the logger files from Utrecht.
> We found the door seal
> of the van was damaged.
"""


def test_layout_blocks_end_sentences_and_lose_their_marks():
    """``block_starts``/``split_sentences``: a heading, a table row, a list item, a "Key: value" line and a quotation
    are blocks no sentence runs across, read without their bullets, numbers and quote marks (a table row as its cells
    after their column's heading); prose wrapped at a line's end, even onto a word and a colon, stays one sentence. The extractor parses
    the same blocks: no name holds a table's bar, no description glues two list items."""
    from tasks.runtime.text import block_starts, split_sentences

    assert split_sentences(BUSINESS) == [
        "# Q3 2026 Quarterly Review",
        "## Revenue by segment",
        "Segment: Last-mile delivery; Q3 2025: $7.7M; Q3 2026: $9.5M",
        "## Risks",
        "The agreement with the dock workers' union in Rotterdam expires on 31 January 2027.",
        "Helios Pharma accounts for 14% of last-mile revenue.",
        "Action items:",
        "Priya Raman to circulate the volume analysis by 15 November.",
        "Grace Chen to update the privacy register.",
        "From: Lena Fischer",
        "Date: 3 September 2026",
        "Omar, thanks for the logger files from Utrecht.",
        "We found the door seal of the van was damaged.",
    ]
    assert split_sentences(BUSINESS.replace("\n", "\r\n")) == split_sentences(BUSINESS)  # CRLF line ends alike
    wrapped = "a dowerless girl--you who weigh everything by\nGain: or, choosing her, if you were\n12. false to it."
    assert block_starts(wrapped) == [] and split_sentences(wrapped) == [" ".join(wrapped.split())]
    assert split_sentences("He left.\n\n* * *\n\nShe stayed.") == ["He left.", "She stayed."]
    assert split_sentences("| a | b |\n| c | d |") == ["a | b", "c | d"]  # no rule row: no heading

    res = extract_batch([{"id": "c1", "text": BUSINESS}], ExtractConfig())
    assert not any(mark in e["name"] for e in res.entities for mark in "|#>")
    assert {"Helios Pharma", "Priya Raman", "Lena Fischer"} <= {e["name"] for e in res.entities}
    descriptions = {e["description"] for e in res.entities}
    assert "Helios Pharma accounts for 14% of last-mile revenue." in descriptions
    assert not any("2027. Helios" in d or "November. Grace" in d or "Fischer Date" in d for d in descriptions)


def test_no_name_runs_across_a_clause_break():
    """A span the parser joined across a dash, an exclamation or a list (``extract._pieces``) becomes its pieces, each
    kept only where it is a noun phrase itself; a named entity keeps its quotes (and its commas, colons, en dashes)."""
    text = (
        "\"Much!'--Marley's voice, all the time.\" A comfortable, oily, rich, fat, jovial voice called out. "
        "He spoke with great excitement--and left. "
        'Star Wars: Episode IV was filmed in Tunisia. Dwayne "The Rock" Johnson lives in Washington, D.C.'
    )
    names = {e["name"] for e in extract_batch([{"id": "c1", "text": text}], ExtractConfig()).entities}
    assert not any(mark in n for n in names for mark in ("--", "!", ","))
    assert {"jovial voice", "great excitement", "Episode IV", "Tunisia", 'Dwayne "The Rock" Johnson'} <= names
    # a span the parser cut inside a parenthesis: the bracket without its partner is a break too
    text = "It lies south of Felipe Solo (Graham Land). The CGTU (United General Confederation of Labor was founded."
    names = {e["name"] for e in extract_batch([{"id": "c1", "text": text}], ExtractConfig()).entities}
    assert {"Felipe Solo", "CGTU"} <= names and not any(b in n for n in names for b in "()")
    names = {e["name"] for e in extract_batch([{"id": "c1", "text": "Frank Mallory (1862–1941) was a pathologist."}], ExtractConfig()).entities}
    assert "Frank Mallory" in names


def test_a_name_is_written_without_the_possessive_the_parser_took_into_it():
    """spaCy's entity span sometimes holds the possessive ("Dolly Parton's"): the name drops it, as its key does."""
    text = "Jolene is Dolly Parton's third album. Scrooge never painted out Old Marley's name."
    names = {e["name"] for e in extract_batch([{"id": "c1", "text": text}], ExtractConfig()).entities}
    assert {"Dolly Parton", "Old Marley"} <= names
    assert not any(n.endswith("'s") for n in names)


def test_single_common_nouns_are_entities_only_where_asked_for():
    """Common nouns ("hand", "door") are words, not names; a phrase of them, a named entity and a proper noun are
    entities."""
    text = "Scrooge put his hand on the door. The old man saw the Spirit by the cold fire in London."
    cfg = ExtractConfig(single_nouns=False)
    names = {e["name"] for e in extract_batch([{"id": "c1", "text": text}], cfg).entities}
    assert not names & {"hand", "door", "fire"}
    assert {"Scrooge", "old man", "Spirit", "cold fire", "London"} <= names
    every = {e["name"] for e in extract_batch([{"id": "c1", "text": text}], ExtractConfig()).entities}
    assert {"hand", "door"} <= every  # the default keeps them (narrative questions ask about them)


def test_a_single_common_noun_relates_only_by_a_statement_where_asked_for():
    """With ``single_noun_cooccurrence`` off (the default), "door" (a common noun) keeps its labelled statement
    and loses the unlabelled neighbours of its sentence; the two names keep theirs."""
    text = "Scrooge opened the door and Marley waited in London."
    cfg = ExtractConfig()
    pairs = {(r["source"], r["label"], r["target"]) for r in extract_batch([{"id": "c1", "text": text}], cfg).relations}
    assert ("Scrooge", "opened", "door") in pairs
    assert not any("door" in (s, o) and label is None for s, label, o in pairs)
    assert any({s, o} == {"Scrooge", "Marley"} for s, _, o in pairs)
    every = extract_batch([{"id": "c1", "text": text}], ExtractConfig(single_noun_cooccurrence=True)).relations
    assert any("door" in (r["source"], r["target"]) and not r["label"] for r in every)


def _statements(text: str) -> set[tuple[str, str, str]]:
    out = extract_batch([{"id": "c1", "text": text}], ExtractConfig())
    return {(r["source"], r["label"], r["target"]) for r in out.relations if r["label"]}


def test_relations_are_labelled_by_what_the_sentence_says():
    """Subject-verb-object (a preposition or a passive's agent joins the verb, a negation leads it), a copula's noun
    with its preposition, an appositive, a participle and a relative clause, conjoined ends; hand-parsed."""
    assert ("Scrooge", "employs", "Bob Cratchit") in _statements("Scrooge employs Bob Cratchit in a dismal office.")
    assert ("Bob Cratchit", "clerk of", "Ebenezer Scrooge") in _statements(
        "Bob Cratchit is the clerk of Ebenezer Scrooge."
    )
    said = _statements("The Eiffel Tower, designed by Gustave Eiffel, opened in Paris in 1889.")
    assert {("Eiffel Tower", "designed by", "Gustave Eiffel"), ("Eiffel Tower", "opened in", "Paris")} <= said
    said = _statements("Alice and Bob founded Acme, which later acquired Globex.")
    assert {("Alice", "founded", "Acme"), ("Bob", "founded", "Acme"), ("Acme", "acquired", "Globex")} <= said
    assert ("Scrooge", "not pay", "Bob Cratchit") in _statements("Scrooge did not pay Bob Cratchit well.")
    assert ("Paris", "capital of", "France") in _statements("Paris is the capital of France.")
    # a copula's or an appositive's noun with a participle or a relative clause: said of the subject too
    said = _statements("Meehan is an unincorporated community located in Plover.")
    assert {("Meehan", "community located in", "Plover"), ("unincorporated community", "located in", "Plover")} <= said
    assert ("Alien", "film directed by", "Ridley Scott") in _statements("Alien is a horror film directed by Ridley Scott.")
    assert ("Acme", "firm making", "radar sensor") in _statements("Acme, a firm making radar sensors, grew.")
    assert ("Jane Doe", "starred in", "Alien") in _statements("Jane Doe is an American actress who starred in Alien.")
    assert ("Bob", "works for", "Scrooge") in _statements("Bob, a clerk who works for Scrooge, is poor.")
    said = _statements("The current editor is Jan Philip Solovej from the University of Copenhagen.")
    assert ("Jan Philip Solovej", "from", "University of Copenhagen") in said  # a noun and its preposition
    assert not any(label.startswith("Jan") for _, label, _ in said)  # a name is no role
    # a pronoun names no mention: no statement, the pair still co-occurs unlabelled
    out = extract_batch([{"id": "c1", "text": "It supplies radar sensors to Norsk Hydro."}], ExtractConfig())
    assert out.relations and not any(r["label"] for r in out.relations)


def test_a_relation_takes_its_most_frequent_label_read_from_its_subject():
    """Labels compete by count (then code point order), whichever way round the mentions name the ends; the label
    reads from the end that is its subject (``label_from``); a co-occurring pair has none, nor a pair whose
    statement is a small share of its sentences."""
    ents = [
        {"name": n, "type": "person", "description": "x.", "chunk_id": "c1"}
        for n in ("Scrooge", "Bob Cratchit", "Fred")
    ]

    def rel(source, target, label, chunk):
        return {
            "source": source,
            "target": target,
            "description": chunk,
            "weight": 1.0,
            "chunk_id": chunk,
            "label": label,
        }

    rels = [
        rel("Bob Cratchit", "Scrooge", "clerk of", "c1"),
        rel("Scrooge", "Bob Cratchit", "employs", "c2"),
        rel("Scrooge", "Bob Cratchit", "employs", "c3"),
        rel("Scrooge", "Fred", None, "c1"),
    ]
    entities, relations = merge_graph(ents, rels, max_description_tokens=100)
    ids = {e["name"]: e["id"] for e in entities}
    by_pair = {frozenset((r["source_id"], r["target_id"])): r for r in relations.to_pylist()}
    employs = by_pair[frozenset((ids["Scrooge"], ids["Bob Cratchit"]))]
    assert (employs["label"], employs["label_from"], employs["weight"]) == ("employs", ids["Scrooge"], 3.0)
    plain = by_pair[frozenset((ids["Scrooge"], ids["Fred"]))]
    assert plain["label"] is None and plain["label_from"] is None
    # a statement that one of four distinct sentences makes is not the relation's label (``LABEL_SHARE``)
    rare = rels[:1] + [rel("Scrooge", "Bob Cratchit", None, c) for c in ("c4", "c5", "c6")]
    rarely = merge_graph(ents, rare, max_description_tokens=100)[1].to_pylist()[0]
    assert rarely["weight"] == 4.0 and rarely["label"] is None and rarely["label_from"] is None
    tie = merge_graph(ents, rels[:2], max_description_tokens=100)[1].to_pylist()[0]
    assert (tie["label"], tie["label_from"]) == ("clerk of", ids["Bob Cratchit"])  # 1 to 1: "clerk of" < "employs"


def test_aliases_resolve_within_a_unit_by_the_one_full_name_they_are_part_of():
    from tasks.index.aliases import resolve

    def ms(chunk, *names):
        return [(chunk, n, "person") for n in names]

    got = resolve(
        ms("c1", "ebenezer scrooge", "scrooge", "mr. scrooge", "bob cratchit", "bob", "cratchit")
        + ms("c2", "ebenezer", "ebenezer scrooge", "martha cratchit", "mr. ebenezer scrooge")
        + ms("c3", "joe", "queen", "queen victoria")
        + ms("c4", "joe miller", "dracula", "satanic rites of dracula")
        + [("c1", "scrooge", "organization"), ("c1", "london", "location")]
    )
    assert got == {
        "scrooge": "ebenezer scrooge",  # a surname: typed person in most of its mentions
        "mr. scrooge": "ebenezer scrooge",  # a title dropped, then a surname
        "ebenezer": "ebenezer scrooge",  # a first name
        "mr. ebenezer scrooge": "ebenezer scrooge",  # a title dropped
        "bob": "bob cratchit",
    }
    # two people sharing a surname leave it alone ("cratchit"); "joe" and "joe miller" are never named together; a
    # rank alone ("queen") names no one person; a name with a function word ("... of dracula") is a work's, no person's


def test_an_alias_merge_makes_one_entity_that_lists_the_names_it_was_written_with():
    from tasks.index.merge import graph_from_mentions, mention_rows

    def ent(name, chunk):
        return {"name": name, "type": "person", "description": f"{name} in {chunk}.", "chunk_id": chunk}

    def rel(a, b, chunk):
        return {"source": a, "target": b, "description": f"{a}, {b}.", "weight": 1.0, "chunk_id": chunk}

    ents = [ent("Scrooge", "c1"), ent("Ebenezer Scrooge", "c1"), ent("Scrooge", "c2"), ent("Bob Cratchit", "c2")]
    ents += [ent("Mr. Scrooge", "c2"), ent("Scrooge", "c3")]
    rels = [
        rel("Scrooge", "Ebenezer Scrooge", "c1"),
        rel("Scrooge", "Bob Cratchit", "c2"),
        rel("Scrooge", "Bob Cratchit", "c3"),
    ]
    resolved = {"scrooge": "ebenezer scrooge", "mr. scrooge": "ebenezer scrooge"}
    rows = mention_rows(ents, rels, {"c1": resolved, "c2": resolved})  # c3: another document's chunk
    order = {"c1": ("a", 0), "c2": ("a", 1), "c3": ("b", 0)}
    entities, relations = graph_from_mentions(rows, 100, order=order)
    by_name = {e["name"]: e for e in entities}
    assert sorted(by_name) == ["Bob Cratchit", "Ebenezer Scrooge", "Scrooge"]
    assert by_name["Ebenezer Scrooge"]["aliases"] == ["Scrooge", "Mr. Scrooge"]  # most frequent first
    assert by_name["Ebenezer Scrooge"]["source_chunk_ids"] == ["c1", "c2"]
    assert by_name["Scrooge"]["aliases"] == [] and by_name["Scrooge"]["source_chunk_ids"] == ["c3"]
    ends = {frozenset((r["source_id"], r["target_id"])) for r in relations.to_pylist()}
    ids = {e["name"]: e["id"] for e in entities}
    # the two names of one person named together relate nothing; each Scrooge relates to Bob in its own chunks
    assert ends == {
        frozenset((ids["Ebenezer Scrooge"], ids["Bob Cratchit"])),
        frozenset((ids["Scrooge"], ids["Bob Cratchit"])),
    }


def test_extraction_tasks_hold_whole_alias_units(tmp_path):
    import pyarrow as pa

    from tasks.index.aliases import UNIT_CHUNKS
    from tasks.index.chunk import CHUNK_PART_SCHEMA, regroup
    from tasks.store.spill import PartWriter
    from tasks.store.workfs import parquet_file

    sizes = {"d1": 3, "d2": 1, "d3": UNIT_CHUNKS + 6, "d4": 2}
    rows = [
        {"id": f"{d}-{i}", "document_id": d, "chunk_index": i, "text": "x", "n_tokens": 1, "start": 0, "end": 1}
        for d, n in sizes.items()
        for i in range(n)
    ]
    raw = PartWriter(tmp_path / "raw", CHUNK_PART_SCHEMA, 7)  # parts and batches that cut documents
    for s in range(0, len(rows), 5):
        raw.write(pa.Table.from_pylist(rows[s : s + 5], CHUNK_PART_SCHEMA))
    parts = regroup(raw.close(), str(tmp_path / "parts"), 50, lambda n: 2)
    groups = [
        parquet_file(f).read_row_group(g, columns=["id"]).column("id").to_pylist()
        for f in parts.files
        for g in range(parquet_file(f).num_row_groups)
    ]
    assert [i for g in groups for i in g] == [r["id"] for r in rows]  # nothing lost, in order
    firsts = [g[0] for g in groups]
    assert firsts == ["d1-0", "d2-0", "d3-0", f"d3-{UNIT_CHUNKS}", "d4-0"]  # a unit is never cut, a group closes
    assert parts.num_rows == len(rows)
