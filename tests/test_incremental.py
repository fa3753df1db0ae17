"""Incremental refresh: diff by content hash, exact layer 0, HyGRAG attachment, local communities."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from typer.testing import CliRunner

from flows.cli import app
from flows.pipeline import build_index, update_index
from schemas.config import load_config
from schemas.tables import SNAPSHOT_TABLES
from tasks.index.delta import diff_documents
from tasks.index.validate import validate_tables
from tasks.methods.attach import Change, Layer0Rows, Rewrite, attach
from tasks.methods.hirag.placement import place_in_communities, reports_to_rewrite
from tasks.store.catalog import Catalog
from tests.conftest import SMALL


def _doc(sid, h, root="/r"):
    return {"id": f"doc-{sid}-{h}", "source_id": sid, "content_hash": h, "root": root}


def test_diff_by_content_hash_scoped_to_root():
    existing = [_doc("a", "1"), _doc("b", "1"), _doc("c", "1"), _doc("z", "1", root="/other")]
    incoming = [_doc("a", "1"), _doc("b", "2"), _doc("d", "1")]
    d = diff_documents(existing, incoming, "/r")
    assert [x["source_id"] for x in d.new] == ["d"]
    assert [x["source_id"] for x in d.changed] == ["b"]
    assert sorted(x["id"] for x in d.deleted) == ["doc-b-1", "doc-c-1"]  # the replaced version and the deleted one
    assert [x["source_id"] for x in d.unchanged] == ["a"]
    assert d.counts() == {"new": 1, "changed": 1, "deleted": 1, "unchanged": 1}
    assert diff_documents(existing, [_doc("a", "1"), _doc("b", "1"), _doc("c", "1")], "/r").empty


def test_a_quarantined_file_or_record_keeps_what_the_index_held_of_it():
    """A file that grew past the size limit (or turned unreadable), or a record now invalid, is quarantined: its
    documents stay as indexed; a file that is gone deletes its documents."""
    existing = [
        dict(_doc("big.txt", "1"), uri="/r/big.txt"),
        dict(_doc("a", "1"), uri="/r/c.jsonl#a"),
        dict(_doc("b", "1"), uri="/r/c.jsonl#b"),
        dict(_doc("x", "1"), uri="/r/d.jsonl#x"),
        dict(_doc("gone.txt", "1"), uri="/r/gone.txt"),
    ]
    d = diff_documents(existing, [], "/r", held={"/r/big.txt", "/r/c.jsonl", "/r/d.jsonl#x"})
    assert sorted(x["source_id"] for x in d.unchanged) == ["a", "b", "big.txt", "x"]
    assert [x["source_id"] for x in d.deleted] == ["gone.txt"]


def _e(i, layer, v):
    v = np.asarray(v, dtype=np.float32)
    return {"id": i, "name": i, "type": "concept", "description": f"{i}.", "layer": layer, "degree": 0,
            "source_chunk_ids": [], "vector": v / np.linalg.norm(v)}


def _vecs(rows):
    return {r["id"]: r["vector"] for r in rows}


def _so(a, b):
    return {"id": f"{a}>{b}", "source_id": a, "target_id": b, "kind": "summary_of", "description": "", "weight": 1.0,
            "source_chunk_ids": []}


def ONES(rows):  # noqa: N802 - an embedder for tests: every vector the same
    return np.ones((len(rows), 3), np.float32)


def test_attach_lowest_layer_passing_tau_climbs_and_refreshes_ancestors():
    l0 = [_e("a", 0, [1, 0, 0]), _e("b", 0, [0, 1, 0]), _e("gone", 0, [0, 0, 1]),
          _e("new1", 0, [0.95, 0.1, 0]), _e("new2", 0, [0.5, 0.5, 0.1])]
    summaries = [_e("S1", 1, [1, 0, 0]), _e("S2", 1, [0, 1, 0]), _e("S3", 1, [0, 0, 1]), _e("T", 2, [0.6, 0.6, 0])]
    rels = [_so("a", "S1"), _so("b", "S2"), _so("gone", "S3"), _so("S1", "T"), _so("S2", "T"), _so("S3", "T")]
    calls = []

    def summarize(layer, member_lists, vecs):
        calls.append((layer, [[m["id"] for m in ms] for ms in member_lists]))
        return [{"name": "+".join(m["id"] for m in ms), "type": "concept", "description": "d"} for ms in member_lists]

    res = attach(Layer0Rows(l0[:2] + l0[3:], _vecs(l0 + summaries)), summaries, rels,
                 Change(added={"new1", "new2"}, removed={"gone"}), 0.65, Rewrite(summarize, ONES))
    # new1 is .99 similar to S1, new2 .70 (>= tau): both join layer 1
    assert res.attached == {"new1": "S1", "new2": "S1"}
    assert res.removed == {"S3"}  # lost its only member
    assert "S1" in res.refreshed and "T" in res.refreshed and "S2" not in res.refreshed
    assert calls[0][0] == 1 and calls[-1][0] == 2  # bottom-up: layer 1 before its ancestor
    names = {e["id"]: e["name"] for e in res.entities}
    assert names["S1"] == "a+new1+new2"  # re-summarised over its current members
    assert {r["target_id"] for r in res.relations} <= {"S1", "S2", "T"}
    assert all(r["source_id"] != "S3" for r in res.relations)


def test_attach_reads_the_vectors_of_kept_members_only_for_the_summaries_it_rewrites():
    """An update hands attach the summaries' vectors and those it embedded; the kept members' come from
    ``more_vectors`` when a summary over them is re-summarised, and the result is the one with every vector."""
    l0 = [_e("a", 0, [1, 0, 0]), _e("b", 0, [0, 1, 0]), _e("c", 0, [0, 0.2, 1]), _e("new", 0, [0.95, 0.1, 0])]
    summaries = [_e("S1", 1, [1, 0, 0]), _e("S2", 1, [0, 1, 0]), _e("T", 2, [0.6, 0.6, 0])]
    rels = [_so("a", "S1"), _so("b", "S2"), _so("c", "S2"), _so("S1", "T"), _so("S2", "T")]
    seen = []

    def summarize(layer, member_lists, vecs):
        seen.append([v.tolist() for v in vecs])
        return [{"name": "+".join(m["id"] for m in ms), "type": "concept", "description": "d"} for ms in member_lists]

    def run(vectors, more=None):
        seen.clear()
        res = attach(Layer0Rows(l0, vectors, more_vectors=more), summaries, rels, Change(added={"new"}), 0.65,
                     Rewrite(summarize, ONES))
        return res, list(seen)

    asked = []

    def more(ids):
        asked.append(ids)
        return {i: _vecs(l0)[i] for i in ids}

    whole, whole_seen = run(_vecs(l0 + summaries))
    lazy, lazy_seen = run(_vecs([l0[3], *summaries]), more)
    assert asked == [["a"]]  # S1 is rewritten over a and new; S2's members b and c are never read
    assert lazy_seen == whole_seen and lazy.attached == whole.attached == {"new": "S1"}
    assert [e["name"] for e in lazy.entities] == [e["name"] for e in whole.entities]
    assert np.array_equal(lazy.vectors, whole.vectors)


def test_attach_climbs_when_no_lower_node_passes_tau():
    l0 = [_e("a", 0, [1, 0, 0]), _e("new", 0, [0.1, 0.1, 1])]
    summaries = [_e("S1", 1, [1, 0, 0]), _e("T", 2, [0, 0, 1])]
    res = attach(Layer0Rows(l0, _vecs(l0 + summaries)), summaries, [_so("a", "S1"), _so("S1", "T")],
                 Change(added={"new"}), 0.65,
                 Rewrite(lambda l, ms, vs: [{"name": "x", "type": "concept", "description": "d"} for _ in ms], ONES))
    assert res.attached == {"new": "T"}  # layer-1 best is .10 < tau, layer 2 passes
    assert res.refreshed == {"T"} and res.operations == 1  # only the node on the path


def test_place_in_communities_by_neighbour_majority():
    comms = [{"id": "c1", "level": 0, "parent_id": None, "entity_ids": ["a", "b"], "size": 2},
             {"id": "c2", "level": 0, "parent_id": None, "entity_ids": ["c", "gone"], "size": 2},
             {"id": "c1x", "level": 1, "parent_id": "c1", "entity_ids": ["a"], "size": 1}]
    rels = [{"source_id": "n", "target_id": "a"}, {"source_id": "n", "target_id": "b"}, {"source_id": "n", "target_id": "c"}]
    out, grown, forced = place_in_communities(comms, {"a", "b", "c", "n", "lonely"}, rels, {"n", "lonely"})
    by = {c["id"]: c for c in out}
    assert by["c1"]["entity_ids"] == ["a", "b", "n"] and by["c1x"]["entity_ids"] == ["a", "n"]
    assert by["c2"]["entity_ids"] == ["c"]
    singles = [c for c in out if c["entity_ids"] == ["lonely"]]
    assert len(singles) == 1 and singles[0]["level"] == 0
    assert grown == {"c1": 1, "c1x": 1}
    assert forced == {"c2", singles[0]["id"]}  # lost a member; new


def test_reports_to_rewrite_by_staleness():
    comms = [{"id": c, "size": n} for c, n in (("big", 20), ("small", 2), ("lost", 5), ("fresh", 1), ("quiet", 4))]
    old = {"big": {"staleness": 0.05}, "small": {"staleness": 0.0}, "lost": {"staleness": 0.0}, "quiet": {"staleness": 0.2}}
    grown = {"big": 1, "small": 1}
    redo, staleness = reports_to_rewrite(comms, old, grown, {"lost"}, 0.15)
    # big: 0.05 + 1/20 = 0.10 < 0.15 kept; small: 1/2 = 0.5 rewritten; lost: forced; fresh: no report yet
    assert redo == {"small", "lost", "fresh"}
    assert staleness == {"big": pytest.approx(0.10)}  # quiet: untouched, keeps its own value
    assert reports_to_rewrite(comms, old, grown, set(), 0.0)[0] == {"big", "small", "fresh"}


def test_attach_accumulates_staleness_below_threshold():
    l0 = [_e(f"m{i}", 0, [1, 0, 0]) for i in range(9)] + [_e("new", 0, [1, 0.05, 0]), _e("c", 0, [0, 1, 0])]
    summaries = [dict(_e("S1", 1, [1, 0, 0]), staleness=0.05), _e("S2", 1, [0, 1, 0]), _e("T", 2, [0.7, 0.7, 0])]
    rels = [_so(f"m{i}", "S1") for i in range(9)] + [_so("c", "S2"), _so("S1", "T"), _so("S2", "T")]
    summarize = lambda l, ms, vs: [{"name": "x", "type": "concept", "description": "d"} for _ in ms]  # noqa: E731
    embed = lambda rows: np.ones((len(rows), 3), np.float32)  # noqa: E731
    res = attach(Layer0Rows(l0, _vecs(l0 + summaries)), summaries, rels, Change(added={"new"}), 0.65,
                 Rewrite(summarize, embed, 0.2))
    by = {e["id"]: e for e in res.entities}
    # S1 gained 1 member of 10: 0.05 + 0.1 = 0.15 < 0.2, kept; its parent is not touched
    assert res.attached == {"new": "S1"} and res.refreshed == set() and res.operations == 0
    assert by["S1"]["staleness"] == pytest.approx(0.15) and by["S1"]["degree"] == 10 and by["S1"]["name"] == "S1"
    # a changed member of S2 (1 of 1) passes the threshold: S2 is re-summarised, then its parent T (1 of 2 = 0.5)
    res = attach(Layer0Rows(l0, _vecs(l0 + summaries)), summaries, rels, Change(changed={"c"}), 0.65,
                 Rewrite(summarize, embed, 0.2))
    assert res.refreshed == {"S2", "T"} and {e["id"]: e for e in res.entities}["S2"]["staleness"] == 0.0



def test_shows_gone_reads_the_summary_text_for_what_a_member_no_longer_says():
    from tasks.methods.attach import shows_gone

    summary = {"name": "Railroad / Turner", "description": "railroad, Turner: Turner, Omaha. Omaha is a city. Turner built the line."}
    # a member that went: shown by its name or a sentence of its description, else not
    assert shows_gone(summary, {"name": "Turner", "description": "Turner was an engineer."}, None)
    assert shows_gone(summary, {"name": "T. Turner", "description": "Turner built the line."}, None)
    assert not shows_gone(summary, {"name": "Lincoln", "description": "Lincoln is a city."}, None)
    assert shows_gone(summary, None, None)  # its former text unknown: counted as shown
    # a changed member: only a sentence it no longer has, quoted by the summary, counts
    old = {"name": "Omaha", "description": "Omaha is a city. Omaha had a fort."}
    assert shows_gone(summary, old, {"name": "Omaha", "description": "Omaha had a fort."})
    assert not shows_gone(summary, old, {"name": "Omaha", "description": "Omaha is a city."})
    assert not shows_gone(summary, None, {"name": "Omaha", "description": "Omaha had a fort."})


def test_attach_rewrites_a_summary_now_only_when_its_text_shows_what_is_gone():
    """A removed member the summary's text never showed adds to its staleness like any change; one it names, or a
    changed member's dropped sentence it quotes, has it re-summarised at once (what a deleted document said leaves
    the hierarchy with it)."""
    l0 = [_e(f"m{i}", 0, [1, 0, 0]) for i in range(10)]
    shown = dict(_e("S1", 1, [1, 0, 0]), description="m0, m1: m0 is here. m5 was seen in 1850.")
    summaries = [shown, _e("T", 2, [1, 0, 0])]
    rels = [_so(f"m{i}", "S1") for i in range(10)] + [_so("S1", "T")]
    summarize = lambda l, ms, vs: [{"name": "x", "type": "concept", "description": "d"} for _ in ms]  # noqa: E731
    embed = lambda rows: np.ones((len(rows), 3), np.float32)  # noqa: E731
    before = {f"m{i}": {"id": f"m{i}", "name": f"m{i}", "description": f"m{i}."} for i in range(10)}
    before["m5"]["description"] = "m5 was seen in 1850. m5 sailed."

    def run(removed, changed, rows=l0):
        return attach(Layer0Rows([r for r in rows if r["id"] not in removed], _vecs(l0 + summaries)), summaries, rels,
                      Change(removed=removed, changed=changed, before=before), 0.65, Rewrite(summarize, embed, 0.5))

    res = run({"m9"}, set())  # not in the summary's text: 1 of 9 members, below 0.5
    assert res.refreshed == set() and {e["id"]: e for e in res.entities}["S1"]["staleness"] == pytest.approx(1 / 9)
    assert run({"m1"}, set()).refreshed == {"S1", "T"}  # named in its text
    edited = [dict(r, description="m5 sailed.") if r["id"] == "m5" else r for r in l0]
    assert run(set(), {"m5"}, edited).refreshed == {"S1", "T"}  # its dropped sentence is quoted
    kept = [dict(r, description="m5 was seen in 1850.") if r["id"] == "m5" else r for r in l0]
    assert run(set(), {"m5"}, kept).refreshed == set()  # what the summary quotes still stands
    # without the former rows (``before``), a removed member counts as shown, as before
    res = attach(Layer0Rows(l0[:9], _vecs(l0 + summaries)), summaries, rels, Change(removed={"m9"}), 0.65,
                 Rewrite(summarize, embed, 0.5))
    assert res.refreshed == {"S1", "T"}

# ------------------------------------------------------------------------------------------ end to end
CFG = load_config(overrides={"chunking": SMALL["chunking"], "extract": SMALL["extract"]})


def _layer0(cat):
    ents = cat.read("entities").to_pylist()
    rels = cat.read("relations").to_pylist()
    l0 = {e["id"]: (e["name"], e["type"], e["description"], tuple(e["source_chunk_ids"]), e["degree"], tuple(e["aliases"] or ())) for e in ents if e["layer"] == 0}
    r0 = {r["id"]: (r["description"], r["weight"], tuple(r["source_chunk_ids"])) for r in rels if r["kind"] == "extracted"}
    return l0, r0


def _valid(cat):
    snap = cat.snapshot()
    report = validate_tables({n: cat.read(n, snap=snap) for n in SNAPSHOT_TABLES}, snap["dim"])
    assert report.success, report.failures


@pytest.fixture(scope="module")
def corpus_copy(small_corpus, tmp_path_factory):
    root = tmp_path_factory.mktemp("inc") / "corpus"
    shutil.copytree(small_corpus, root)
    return root


def test_add_edit_delete_match_a_full_rebuild(corpus_copy, tmp_path):
    index = tmp_path / "index"
    extra = corpus_copy / "notes" / "scrooge.md"
    saved = extra.read_text()
    extra.unlink()
    build_index(str(corpus_copy), Catalog(index), CFG)
    cat = Catalog(index)
    n_docs, n_chunks = cat.read("documents").num_rows, cat.read("chunks").num_rows

    # idempotence: nothing changed, nothing published
    res = update_index(str(corpus_copy), cat, CFG)
    assert res.status == "nothing-to-do" and Catalog(index).snapshot()["version"] == 1

    # add
    extra.write_text(saved)
    res = update_index(str(corpus_copy), Catalog(index), CFG)
    cat = Catalog(index)
    assert res.status == "published" and cat.snapshot()["version"] == 2 and cat.snapshot()["kind"] == "incremental"
    assert cat.read("documents").num_rows == n_docs + 1
    new_doc = [d for d in cat.read("documents").to_pylist() if d["source_id"].endswith("scrooge.md")][0]
    added_chunks = [c for c in cat.read("chunks").to_pylist() if c["document_id"] == new_doc["id"]]
    assert len(added_chunks) >= 1 and cat.read("chunks").num_rows == n_chunks + len(added_chunks)
    _valid(cat)
    full = tmp_path / "full"
    build_index(str(corpus_copy), Catalog(full), CFG)
    assert _layer0(cat) == _layer0(Catalog(full))  # layer 0 is exactly what a full build gives
    scrooge = next(e for e in cat.read("entities").to_pylist() if e["name"] == "Ebenezer Scrooge")
    assert "Scrooge" in scrooge["aliases"]  # the new document's aliases merged, as the full build merged them
    summary_links = [r for r in cat.read("relations").to_pylist() if r["kind"] == "summary_of"]
    new_l0 = {e["id"] for e in cat.read("entities").to_pylist() if e["layer"] == 0}
    assert new_l0 <= {r["source_id"] for r in summary_links}  # every entity, old or new, sits in the hierarchy
    assert res.stages["attach"]["attached"] > 0

    # edit
    extra.write_text(saved.replace("Bob Cratchit was Scrooge's clerk.", "Fred was Scrooge's nephew in London."))
    res = update_index(str(corpus_copy), Catalog(index), CFG)
    cat = Catalog(index)
    assert res.stages["diff"]["changed"] == 1 and cat.read("documents").num_rows == n_docs + 1
    assert new_doc["id"] not in set(cat.read("documents").column("id").to_pylist())
    assert not {c["id"] for c in added_chunks} & set(cat.read("chunks").column("id").to_pylist())
    names = {e["name"] for e in cat.read("entities").to_pylist() if e["layer"] == 0}
    assert "Fred" in names
    _valid(cat)
    edited = tmp_path / "edited"
    build_index(str(corpus_copy), Catalog(edited), CFG)
    assert _layer0(cat) == _layer0(Catalog(edited))  # old mentions gone, new ones in, exactly

    # delete
    extra.unlink()
    res = update_index(str(corpus_copy), Catalog(index), CFG)
    cat = Catalog(index)
    assert res.stages["diff"]["deleted"] == 1
    assert cat.read("documents").num_rows == n_docs and cat.read("chunks").num_rows == n_chunks
    _valid(cat)
    full2 = tmp_path / "full2"
    build_index(str(corpus_copy), Catalog(full2), CFG)
    assert _layer0(cat) == _layer0(Catalog(full2))
    assert [s["version"] for s in cat.snapshots()] == [1, 2, 3, 4]
    assert cat.read("documents", as_of=1).num_rows == n_docs  # older snapshots stay readable
    extra.write_text(saved)


def test_update_of_another_root_deletes_nothing_here(corpus_copy, tmp_path):
    index = tmp_path / "index"
    build_index(str(corpus_copy), Catalog(index), CFG)
    n = Catalog(index).read("documents").num_rows
    other = tmp_path / "other"
    other.mkdir()
    (other / "x.txt").write_text("Ada Lovelace wrote about the Analytical Engine of Charles Babbage.")
    res = CliRunner().invoke(app, ["update", str(other), "--index", str(index), "--quiet", "--set", "dask.processes=false",
                                   "--set", "chunking.size=200", "--set", "chunking.overlap=20"])
    assert res.exit_code == 0, res.output
    assert Catalog(index).read("documents").num_rows == n + 1
    res = CliRunner().invoke(app, ["update", str(other), "--index", str(index), "--set", "dask.processes=false",
                                   "--set", "chunking.size=200", "--set", "chunking.overlap=20"])
    assert res.exit_code == 0 and "nothing changed" in res.output


def test_a_corpus_file_grown_past_the_size_limit_is_quarantined_not_deleted(tmp_path):
    folder = _folder(tmp_path / "c", [{"id": f"d{i}", "title": f"Doc {i}", "text": TEXTS[i]} for i in range(2)])
    index, sets = tmp_path / "index", ["--set", "dask.processes=false", "--set", "chunking.size=200"]
    res = CliRunner().invoke(app, ["index", str(folder), "--index", str(index), "--quiet", *sets])
    assert res.exit_code == 0, res.output
    before = Catalog(index).read("documents").num_rows
    with (folder / "d1.txt").open("a") as fh:
        fh.write("Ada Lovelace wrote the first program for the Analytical Engine.\n" * 20)
    limit = (folder / "d1.txt").stat().st_size - 1
    res = CliRunner().invoke(
        app, ["update", str(folder), "--index", str(index), *sets, "--set", f"corpus.max_file_bytes={limit}"]
    )
    assert res.exit_code == 0, res.output
    assert Catalog(index).read("documents").num_rows == before  # d1's indexed version stays
    assert "1 quarantined" in res.output and "deleted 0" in res.output


TEXTS = [
    "Charles Babbage designed the Analytical Engine in London. Ada Lovelace described its programs.",
    "Alan Turing worked at Bletchley Park. He wrote about computable numbers in Cambridge.",
]


# ------------------------------------------------------------------------------------------ document identity
def _folder(root, rows):
    root.mkdir(parents=True, exist_ok=True)
    for r in rows:
        (root / f"{r['id']}.txt").write_text(f"# {r['title']}\n\n{r['text']}\n")
    return root


def test_a_copy_under_another_root_is_a_new_root_unless_replaced(tmp_path):
    from tests.conftest import musique_passages

    rows = musique_passages(10)
    a = _folder(tmp_path / "exports" / "2026-01-01", rows[:8])
    b = _folder(tmp_path / "exports" / "2026-01-02", rows)  # the same 8 files and 2 more, in a new folder
    cfg = load_config(overrides={"dask": {"processes": False}})
    build_index(str(a), Catalog(tmp_path / "second"), cfg)
    shutil.copytree(tmp_path / "second", tmp_path / "moved")
    # without the flag: a second root, every document new, ids distinct, publish accepted
    res = update_index(str(b), Catalog(tmp_path / "second"), cfg)
    assert res.status == "published" and res.stages["diff"]["new_root"] == 1 and res.stages["diff"]["new"] == 10
    docs = Catalog(tmp_path / "second").read("documents").to_pylist()
    assert len(docs) == 18 and len({d["id"] for d in docs}) == 18
    # with the flag: b is the new place of a: exactly the 2 new files are new, the 8 others keep their ids
    before = {d["source_id"]: d["id"] for d in Catalog(tmp_path / "moved").read("documents").to_pylist()}
    res = update_index(str(b), Catalog(tmp_path / "moved"), cfg, replace_root=str(a))
    assert res.stages["diff"]["new"] == 2 and res.stages["diff"]["unchanged"] == 8 and not res.stages["diff"]["new_root"]
    after = {d["source_id"]: d["id"] for d in Catalog(tmp_path / "moved").read("documents").to_pylist()}
    assert len(after) == 10 and all(after[k] == v for k, v in before.items())
    # remembered: the next refresh of b needs no flag and has nothing to do
    assert update_index(str(b), Catalog(tmp_path / "moved"), cfg).status == "nothing-to-do"
    with pytest.raises(ValueError, match="no indexed documents come from"):
        update_index(str(b), Catalog(tmp_path / "moved"), cfg, replace_root=str(tmp_path / "elsewhere"))


def test_backfill_partitions_holding_the_same_file_publish(tmp_path):
    from tests.conftest import musique_passages

    rows = musique_passages(4)
    cfg = load_config(overrides={"dask": {"processes": False}})
    cat = Catalog(tmp_path / "index")
    for i, part in enumerate((rows[:2], rows[2:])):
        folder = _folder(tmp_path / f"day-{i}", part)
        (folder / "README.txt").write_text("Exported nightly from the archive of the Journal of Glorpology.\n")
        assert update_index(str(folder), cat, cfg).status == "published"
    docs = cat.read("documents").to_pylist()
    assert [d["source_id"] for d in docs].count("README.txt") == 2 and len({d["id"] for d in docs}) == len(docs)


def test_recompute_touches_only_the_delta_yet_equals_a_full_merge():
    """An entity that comes into being revives an old relation naming it (an LLM may relate a name it did not
    extract as an entity); a hub touched by the delta keeps its other relations without their mentions being read."""
    from tasks.index.delta import recompute_layer0
    from tasks.index.merge import graph_from_mentions, mention_rows

    def ent(name, chunk):
        return {"name": name, "type": "person", "description": f"{name} in {chunk}.", "chunk_id": chunk}

    def rel(a, b, chunk):
        return {"source": a, "target": b, "description": f"{a} and {b} in {chunk}.", "weight": 1.0, "chunk_id": chunk}

    old_e = [ent("Hub", "c1"), ent("Ann", "c1"), ent("Hub", "c2"), ent("Cal", "c2")]
    old_r = [rel("Hub", "Ann", "c1"), rel("Hub", "Cal", "c2"), rel("Ann", "Bob", "c1")]  # Bob: not an entity yet
    new_e = [ent("Bob", "c3"), ent("Hub", "c3")]
    new_r = [rel("Hub", "Bob", "c3")]
    order = {"c1": ("a", 0), "c2": ("b", 0), "c3": ("c", 0)}
    old_rows = mention_rows(old_e, old_r)
    new_rows = [dict(r, id=r["id"] + "n") for r in mention_rows(new_e, new_r)]
    entities, relations = graph_from_mentions(old_rows, 100, order=order)
    read = []

    def select(expr):  # what the update reads, recorded
        import polars as pl

        from tasks.index.delta import mention_select

        out = mention_select(old_rows + new_rows)(expr)
        read.extend(out.filter(pl.col("kind") == "relation").get_column("key").to_list())
        return out

    touched = {r["key"] for r in new_rows}
    got_e, got_r, added, removed, changed, *_ = recompute_layer0(entities, relations, select, touched, 100, order)
    want_e, want_r = graph_from_mentions(old_rows + new_rows, 100, order=order)
    assert got_e == sorted(want_e, key=lambda e: e["id"]) and got_r.sort_by("id").equals(want_r.sort_by("id"))
    assert "ann|bob" in read and "cal|hub" not in read  # Bob's old relation revived; Hub's others never read
    assert len(added) == 1 and not removed and len(changed) == 1


def test_an_update_validates_the_rows_it_changes_and_a_bad_one_stops_it(corpus_copy, tmp_path, monkeypatch):
    """An update's tables reach validation as changes of the snapshot (``as_changes``): the rows checked are the
    changed ones, not the whole tables; a bad row among them still fails the run, and nothing is published. The
    relations it keeps are read only in the graph's columns (``GRAPH_COLUMNS``, a batch at a time), never whole."""
    import pyarrow as pa

    from flows import publish_steps
    from flows.run import PipelineRun, SnapshotReads
    from tasks.index import validate as validate_module
    from tasks.index.validate import ValidationFailed
    from tasks.store.rows import GRAPH_COLUMNS, TableDelta

    index = tmp_path / "index"
    extra = corpus_copy / "notes" / "scrooge.md"
    saved = extra.read_text()
    extra.unlink()
    try:
        build_index(str(corpus_copy), Catalog(index), CFG)
        checked: dict[str, int] = {}
        original = validate_module.validate_tables

        def recording(tables, *args, **kwargs):
            checked.update({k: t.num_rows for k, t in tables.items()})
            return original(tables, *args, **kwargs)

        monkeypatch.setattr(validate_module, "validate_tables", recording)
        reads: list[tuple] = []
        previous = PipelineRun.previous

        def read(run, name, columns=None, where=None):
            reads.append((name, columns, where))
            return previous(run, name, columns, where)

        monkeypatch.setattr(PipelineRun, "previous", read)
        snapshot_read = SnapshotReads.read

        def merge_read(reads_, name, columns, where=None):  # the merge's reads (``update_layer0``)
            reads.append((name, columns, where))
            return snapshot_read(reads_, name, columns, where)

        monkeypatch.setattr(SnapshotReads, "read", merge_read)
        snapshot_batches = SnapshotReads.batches

        def merge_batches(reads_, name, columns):  # a scan, a batch at a time
            reads.append((name, tuple(columns), "batches"))
            return snapshot_batches(reads_, name, columns)

        monkeypatch.setattr(SnapshotReads, "batches", merge_batches)
        extra.write_text(saved)
        assert update_index(str(corpus_copy), Catalog(index), CFG).status == "published"
        whole = [  # reads of every column of layer 0's relations
            r
            for r in reads
            if r[0] == "relations" and not set(r[1] or ()) <= set(GRAPH_COLUMNS) and "summary_of" not in (r[2] or "")
            and r[2] != "kind != 'extracted'"
        ]
        assert ("relations", GRAPH_COLUMNS, "batches") in reads and not whole, reads
        cat = Catalog(index)
        _valid(cat)
        assert checked["documents"] == 1  # the added document, not the kept ones
        for name in ("entities", "relations"):
            assert 0 < checked[name] < cat.read(name).num_rows / 2, (name, checked[name])

        real = publish_steps.as_changes

        def with_a_bad_row(run, tables):
            out = real(run, tables)
            change = out["entities"]
            assert isinstance(change, TableDelta) and change.add.num_rows
            vectors = change.add.column("vector").to_pylist()
            vectors[0] = [float("nan")] * len(vectors[0])
            at = change.add.schema.get_field_index("vector")
            add = change.add.set_column(at, change.add.schema.field(at), pa.array(vectors, change.add.schema.field(at).type))
            return dict(out, entities=TableDelta(change.column, change.values, add))

        monkeypatch.setattr(publish_steps, "as_changes", with_a_bad_row)
        extra.write_text(saved.replace("Bob Cratchit was Scrooge's clerk.", "Fred was Scrooge's nephew in London."))
        with pytest.raises(ValidationFailed, match="entities"):
            update_index(str(corpus_copy), Catalog(index), CFG)
        assert Catalog(index).snapshot()["version"] == 2  # the previous snapshot stays the published one
    finally:
        extra.write_text(saved)
