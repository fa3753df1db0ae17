import json

import pyarrow as pa
import pyarrow.parquet as pq

from schemas.config import ChunkingConfig, CorpusConfig
from tasks.index.chunk import chunk_document, token_windows
from tasks.index.ingest import ingest_corpus
from tasks.runtime.tokens import count_tokens, get_encoding
from tasks.store.ids import normalize_name
from tests.conftest import CAROL


def test_ingest_formats_and_ids(tmp_path):
    (tmp_path / "a.txt").write_text("Plain text about Scrooge.")
    (tmp_path / "b.md").write_text("# The Title\n\nBody text.")
    (tmp_path / "c.jsonl").write_text(json.dumps({"id": "p1", "title": "T1", "text": "one"}) + "\n")
    pq.write_table(pa.table({"id": ["q1"], "title": ["T2"], "text": ["two"]}), tmp_path / "d.parquet")
    res = ingest_corpus(tmp_path, CorpusConfig())
    assert res.quarantine == []
    by_source = {d["source_id"]: d for d in res.documents}
    assert set(by_source) == {"a.txt", "b.md", "p1", "q1"}
    assert by_source["b.md"]["title"] == "The Title"
    assert by_source["p1"]["title"] == "T1" and by_source["q1"]["text"] == "two"
    again = ingest_corpus(tmp_path, CorpusConfig())
    assert [d["id"] for d in again.documents] == [d["id"] for d in res.documents]
    assert all(d["root"] == str(tmp_path.resolve()) for d in res.documents)


def test_hostile_files_are_quarantined_with_reasons(tmp_path):
    (tmp_path / "ok.txt").write_text("fine")
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "blank.md").write_text("   \n\n")
    (tmp_path / "binary.txt").write_bytes(b"\x89PNG\x00\x00\x01\x02")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (tmp_path / "huge.txt").write_text("x" * 2000)
    (tmp_path / "image.png").write_bytes(b"\x89PNG")
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 not really")
    (tmp_path / "bad.jsonl").write_text(
        '{"id": "1", "text": "good"}\n{not json}\n["list"]\n{"id": "2"}\n{"id": "1", "text": "dup"}\n'
    )
    res = ingest_corpus(tmp_path, CorpusConfig(max_file_bytes=1000))
    reasons = {q["item"].rsplit("/", 1)[-1]: q["error"] for q in res.quarantine}
    assert reasons["empty.txt"] == "empty file"
    assert reasons["blank.md"] == "empty text"
    assert reasons["binary.txt"].startswith("binary content")
    assert reasons["latin1.txt"] == "invalid UTF-8 at byte 3"
    assert reasons["huge.txt"].startswith("file too large")
    assert reasons["image.png"] == "unsupported file type .png"
    assert "broken.parquet" in reasons
    assert reasons["bad.jsonl#L2"].startswith("line 2: invalid JSON")
    assert reasons["bad.jsonl#L3"] == "line 3: not a JSON object"
    assert reasons["bad.jsonl#2"] == "text is NoneType, not a string"
    assert reasons["bad.jsonl#1"].startswith("duplicate id")
    assert sorted(d["source_id"] for d in res.documents) == ["1", "ok.txt"]


def test_token_windows_hand_computed():
    assert token_windows(0, 10, 2) == []
    assert token_windows(5, 10, 2) == [(0, 5)]
    assert token_windows(10, 10, 2) == [(0, 10)]
    assert token_windows(25, 10, 2) == [(0, 10), (8, 18), (16, 25)]


def test_chunk_offsets_point_into_the_document():
    text = "Marley was dead: to begin with. Ünïcödé — “quotes” and emoji 🎄 here. " * 60
    doc = {"id": "doc-1", "text": text}
    chunks, n = chunk_document(doc, ChunkingConfig(size=50, overlap=10))
    assert n == len(get_encoding().encode_ordinary(text))
    assert chunks[0]["start"] == 0 and chunks[-1]["end"] == len(text)
    for c in chunks:
        assert c["text"] == text[c["start"] : c["end"]]
        assert c["n_tokens"] <= 50
    for a, b in zip(chunks, chunks[1:]):
        assert b["start"] < a["end"]  # overlap
    assert len({c["id"] for c in chunks}) == len(chunks)
    assert count_tokens("hello world") == 2


def test_normalize_name():
    assert normalize_name("The  Ghost of Christmas Past") == "ghost of christmas past"
    assert normalize_name("Scrooge's") == normalize_name("SCROOGE") == "scrooge"
    assert normalize_name("AT&T") == "at&t"


def test_non_prose_documents_are_quarantined_with_the_measured_values(tmp_path):
    import base64
    import random

    from tasks.index.ingest import ingest_corpus, not_prose

    rng = random.Random(0)
    (tmp_path / "blob.txt").write_text(base64.b64encode(bytes(rng.getrandbits(8) for _ in range(300_000))).decode())
    (tmp_path / "app.log").write_text(
        "\n".join(
            f"2026-01-0{i % 9} 12:00:{i % 60:02d} INFO worker-{i % 7} processed batch {i} in {i * 3 % 97} ms status=ok"
            for i in range(3000)
        )
    )
    (tmp_path / "table.txt").write_text("\n".join(",".join(str(i * j % 1000) for j in range(12)) for i in range(2000)))
    (tmp_path / "story.txt").write_text(CAROL.read_text(encoding="utf-8")[5000:40000])
    cfg = CorpusConfig(extensions=[".txt", ".log"])
    out = ingest_corpus(tmp_path, cfg)
    assert [d["source_id"] for d in out.documents] == ["story.txt"]
    why = {q["item"].rsplit("/", 1)[-1]: q["error"] for q in out.quarantine}
    assert why["blob.txt"].startswith("not prose: 0% of tokens are words") and "mean token length" in why["blob.txt"]
    assert "compresses to" in why["app.log"]
    assert "of tokens are words" in why["table.txt"]
    assert not_prose("Scrooge kept a counting-house in London. " * 3, cfg) is None  # short prose is prose
    assert ingest_corpus(tmp_path, CorpusConfig(extensions=[".txt", ".log"], screen_prose=False)).quarantine == []


def test_a_document_past_max_tokens_is_cut_and_the_rest_quarantined():
    from tasks.index.chunk import chunk_documents

    doc = {"id": "doc-1", "uri": "/c/long.txt", "text": CAROL.read_text(encoding="utf-8")[:20000]}
    chunks, tokens, cut = chunk_documents([doc], ChunkingConfig(size=100, overlap=10), max_tokens=500)
    assert tokens["doc-1"] > 500 and chunks[-1]["end"] < len(doc["text"])
    assert sum(c["n_tokens"] for c in chunks) - 10 * (len(chunks) - 1) == 500  # exactly the first 500 tokens
    assert [q["item"] for q in cut] == ["/c/long.txt"] and "are not indexed (corpus.max_document_tokens 500)" in cut[0][
        "error"
    ]
    assert chunk_documents([doc], ChunkingConfig(size=100, overlap=10))[2] == []


def test_a_strataignore_leaves_out_what_it_names_in_gitignore_syntax(tmp_path):
    (tmp_path / "notes").mkdir()
    for rel in ("keep.txt", "README.md", "notes/a.md", "notes/keep.md", "drafts.txt"):
        (tmp_path / rel).write_text(f"Prose about Scrooge in {rel}.")
    (tmp_path / ".strataignore").write_text("# our own files\nREADME.md\nnotes/*.md\n!notes/keep.md\ndraft*\n")
    res = ingest_corpus(tmp_path, CorpusConfig())
    assert sorted(d["source_id"] for d in res.documents) == ["keep.txt", "notes/keep.md"]
    assert res.ignored == 3 and res.files_seen == 2 and res.quarantine == []
    assert len(ingest_corpus(tmp_path / "README.md", CorpusConfig()).documents) == 1  # a file named directly is read


def test_the_demo_corpus_is_the_book_only():
    from tests.conftest import REPO

    res = ingest_corpus(REPO / "data", CorpusConfig())
    assert [d["source_id"] for d in res.documents] == ["a_christmas_carol.txt"] and res.ignored == 1


def test_a_jsonl_corpus_is_read_a_line_at_a_time_and_screened_as_a_whole_file_would_be(tmp_path):
    """JSONL is read a line at a time (a corpus can be one file); the file is still quarantined whole for bad
    UTF-8 (at the same byte), NUL bytes or control characters, and a bad line's row comes before the records'."""
    from tasks.index.ingest import _decode, _screen

    cases = {
        "ok.jsonl": "\ufeff"
        + json.dumps({"id": "a", "text": "Alpha text."})
        + "\r\n"
        + json.dumps({"id": "b", "text": "Beta text."})
        + "\n",
        "nul.jsonl": '{"id": "a", "text": "x\x00y"}\n',
        "ctl.jsonl": '{"id": "a", "text": "' + "\x01" * 40 + '"}\n',
    }
    for name, text in cases.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    (tmp_path / "bad.jsonl").write_bytes(b'{"id": "a", "text": "ok"}\n' + b"x" * 70_000 + b"\xe2\x82\n")
    for f in sorted(tmp_path.iterdir()):
        assert _screen(f, block=1000) == _decode(f.read_bytes())[1], f.name
    assert _screen(tmp_path / "bad.jsonl", block=1000) == "invalid UTF-8 at byte 70026"
    (tmp_path / "lines.jsonl").write_text('{"id": "c", "text": "Gamma text."}\nnot json\n[1]\n')
    res = ingest_corpus(tmp_path, CorpusConfig(min_chars=1, screen_prose=False))
    assert sorted(d["source_id"] for d in res.documents) == ["a", "b", "c"]
    reasons = [q["error"] for q in res.quarantine]
    assert any("invalid UTF-8 at byte 70026" in r for r in reasons)
    assert [r for r in reasons if r.startswith("line")] == [
        "line 2: invalid JSON (Expecting value)",
        "line 3: not a JSON object",
    ]
