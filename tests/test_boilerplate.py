"""Boilerplate: paragraphs repeated across the corpus are left out of the chunks, decided on the whole corpus by
every run, so an update that makes a paragraph boilerplate re-chunks the documents that hold it."""

from __future__ import annotations

from pathlib import Path

from flows.pipeline import build_index, update_index
from schemas.config import ChunkingConfig, load_config
from tasks.index.boilerplate import paragraphs, repeated, segments, spans
from tasks.index.chunk import chunk_document
from tasks.store.catalog import Catalog
from tests.conftest import SMALL, musique_passages
from tests.test_incremental import _layer0

FOOTER = (
    "This text is distributed under the Example Licence, version {v}. Copyright {y} the Example Archive "
    "Foundation; see its web site for the terms of use."
)


def test_a_paragraph_is_keyed_by_its_words_and_never_takes_a_whole_document():
    text = "Scrooge was a squeezing, wrenching, grasping old sinner.\n\n  " + FOOTER.format(v=2, y=2019) + "\n"
    (s0, e0, k0), (s1, e1, k1) = paragraphs(text)
    assert text[s0:e0].startswith("Scrooge") and text[s1:e1] == FOOTER.format(v=2, y=2019)
    assert paragraphs(FOOTER.format(v=3, y=2020).upper() + " ")[0][2] == k1  # case, digits, punctuation aside
    assert paragraphs("Chapter I\n\nChapter II") == []  # too short to be boilerplate
    # templated text that differs in more numbers than a footer holds is content: distinct keys
    note = "Firm {0} was founded by Person {0} in Oslo. It supplies sensors to Firm {1}, whose engineer is Person {1}."
    assert paragraphs(note.format(1, 2))[0][2] != paragraphs(note.format(2, 3))[0][2]
    assert spans(text, {k1}) == [s1, e1] and segments(len(text), [s1, e1]) == [(0, s1), (e1, len(text))]
    assert spans(FOOTER.format(v=1, y=1) + "\n", {paragraphs(FOOTER.format(v=1, y=1))[0][2]}) == []  # all of it
    assert repeated([[k0, k1], [k1], [k1]], 3) == {k1: 3} and repeated([[k0], [k0]], 0) == {}


def test_a_document_is_chunked_between_its_boilerplate_spans():
    body = " ".join(f"Sentence {i} of the body tells of Marley." for i in range(60))
    text = FOOTER.format(v=1, y=2001) + "\n\n" + body + "\n\n" + FOOTER.format(v=1, y=2002)
    (s0, e0, _), _, (s2, e2, _) = paragraphs(text)
    doc = {"id": "doc-1", "text": text, "boilerplate": [s0, e0, s2, e2]}
    chunks, n = chunk_document(doc, ChunkingConfig(size=120, overlap=10))
    assert len(chunks) > 1 and [c["chunk_index"] for c in chunks] == list(range(len(chunks)))
    assert all(text[c["start"] : c["end"]] == c["text"] and "Licence" not in c["text"] for c in chunks)
    assert chunks[0]["text"].lstrip().startswith("Sentence 0") and chunks[-1]["text"].rstrip().endswith("Marley.")
    whole, n_whole = chunk_document({"id": "doc-1", "text": text}, ChunkingConfig(size=120, overlap=10))
    assert n < n_whole and any("Licence" in c["text"] for c in whole)


def _corpus(root: Path, n: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i, row in enumerate(musique_passages(n)):
        (root / f"p{i:02d}.txt").write_text(f"{row['text']}\n\n{FOOTER.format(v=i % 3, y=2000 + i)}\n", encoding="utf-8")
    return root


def test_a_shared_footer_never_reaches_the_index_and_an_update_that_makes_it_shared_rechunks(tmp_path):
    cfg = load_config(
        overrides={"chunking": SMALL["chunking"], "extract": SMALL["extract"], "corpus": {"boilerplate_min_documents": 5}}
    )
    corpus, index = _corpus(tmp_path / "corpus", 4), tmp_path / "index"
    build_index(str(corpus), Catalog(index), cfg)
    chunks = Catalog(index).read("chunks").column("text").to_pylist()
    assert sum("Example Licence" in c for c in chunks) == 4  # in 4 documents: below the threshold, indexed

    _corpus(corpus, 6)  # two more documents with the footer: now boilerplate in all six
    update_index(str(corpus), Catalog(index), cfg)
    cat = Catalog(index)
    texts = cat.read("chunks").column("text").to_pylist()
    assert not any("Licence" in t or "Example Archive" in t for t in texts)
    assert not any("Example" in e for e in cat.read("entities").column("name").to_pylist())
    rows = [q for q in cat.read("quarantine").to_pylist() if q["error"].startswith("boilerplate")]
    assert len(rows) == 1 and "found in 6 documents" in rows[0]["error"] and rows[0]["item"].endswith("#boilerplate")
    full = tmp_path / "full"
    build_index(str(corpus), Catalog(full), cfg)
    assert _layer0(cat) == _layer0(Catalog(full))  # the four documents it re-chunked are what a full build gives
    assert sorted(cat.read("documents").column("id").to_pylist()) == sorted(
        Catalog(full).read("documents").column("id").to_pylist()
    )
