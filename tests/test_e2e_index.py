"""End to end: the CLI through the Prefect flow with Dask, on a small real corpus."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import lancedb
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from flows.cli import app
from flows.pipeline import build_index
from schemas.config import load_config
from tasks.store.catalog import Catalog
from tests.conftest import SMALL
from tests.helpers import assert_layers_match_membership, run_killed_during_publish

runner = CliRunner()


def _sets(overrides: dict) -> list[str]:
    out = []
    for section, values in overrides.items():
        for key, value in values.items():
            out += ["--set", f"{section}.{key}={json.dumps(value)}"]
    return out


@pytest.fixture(scope="module")
def built(small_corpus, tmp_path_factory) -> Path:
    """The small corpus indexed through the CLI (no Prefect API configured: in its process; a Dask local cluster of
    processes)."""
    index = tmp_path_factory.mktemp("idx") / "index"
    # default Dask: 2 worker processes; dask.min_chunks=0: the small corpus would run in the CLI's process otherwise
    overrides = {"chunking": SMALL["chunking"], "extract": SMALL["extract"], "dask": {"min_chunks": 0}}
    res = runner.invoke(app, ["index", str(small_corpus), "--index", str(index), "--quiet", *_sets(overrides)])
    assert res.exit_code == 0, res.output
    assert "published snapshot v1" in res.output
    return index


def test_inspect_json_contract(built):
    res = runner.invoke(app, ["inspect", "--index", str(built), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["version"] == 1
    for table in ("documents", "chunks", "entities", "relations"):
        assert data["tables"][table] > 0, table
    assert data["tables"]["documents"] == 15  # 2 txt + 1 md + 12 JSONL passages
    assert data["tables"]["quarantine"] == 0
    assert data["runs"][-1]["status"] == "published" and data["runs"][-1]["snapshot_version"] == 1


def test_inspect_quality_measures_the_published_graph(built):
    """``inspect --quality``: each measure recounted here from the tables it reads."""
    from tasks.query.quality import (
        across_a_break,
        has_furniture,
        lists_names,
        one_lowercase_word,
        repeats_or_is_cut,
        verb_or_noun,
    )

    data = json.loads(runner.invoke(app, ["inspect", "--index", str(built), "--json", "--quality"]).output)
    q = data["quality"]
    cat = Catalog(built)
    ents = cat.read("entities").to_pylist()
    top = sorted((e for e in ents if e["layer"] == 0), key=lambda e: (-e["degree"], e["id"]))[:100]
    assert q["top_entities"] == len(top) > 0
    assert q["top_entities_one_lowercase_word"] == round(sum(one_lowercase_word(e["name"]) for e in top) / len(top), 4)
    assert q["summary_entities"] == sum(e["layer"] > 0 for e in ents)
    assert q["summaries_listing_names"] == 0 == sum(lists_names(e["description"]) for e in ents if e["layer"] > 0)
    assert q["reports"] == data["tables"]["community_reports"]
    summaries = cat.read("community_reports").column("summary").to_pylist()
    assert q["reports_repeating_or_cut"] == sum(repeats_or_is_cut(s) for s in summaries)
    base = [e for e in ents if e["layer"] == 0]
    assert q["layer0_entities"] == len(base)
    assert q["descriptions_with_furniture"] == sum(has_furniture(e["description"]) for e in base)
    assert q["names_across_a_break"] == sum(across_a_break(e["name"], e["type"]) for e in base) == 0
    assert q["alias_merges"] == sum(bool(e["aliases"]) for e in base)
    # page furniture: a page number glued between two sentences' words, a figure marker; a date is none
    assert has_furniture("on Christmas Eve 16 Nobody came") and has_furniture("[Illustration: a bell]")
    assert not has_furniture("Malta adopted the Euro currency on 1 January 2008.")
    # a name across a break: a dash, a list's comma in a lowercase phrase, a bracket without its partner
    assert across_a_break("Much!'--Marley", "person") and across_a_break("oily, rich, fat voice", "concept")
    assert across_a_break("Felipe Solo (", "person") and across_a_break("500) Days of Summer", "work")
    assert not across_a_break("Indianola, Iowa", "concept") and not across_a_break("Sing (2016 film)", "work")
    rels = cat.read("relations").to_pylist()
    layer = {e["id"]: e["layer"] for e in ents}
    flat = [r for r in rels if layer[r["source_id"]] == 0 and layer[r["target_id"]] == 0]
    assert q["layer0_relations"] == len(flat) and 0 < q["labelled_relations"] < 1
    assert q["labelled_relations"] == round(sum(r["label"] is not None for r in flat) / len(flat), 4)
    assert q["verb_or_noun_relations"] == round(sum(verb_or_noun(r["label"]) for r in flat) / len(flat), 4)
    # a label reads from one of its relation's ends; the most used labels are listed with their counts
    assert all(r["label_from"] in (r["source_id"], r["target_id"]) for r in rels if r["label"])
    assert all((r["label"] is None) == (r["label_from"] is None) for r in rels)
    labels = data["relation_labels"]
    assert labels and data["relations_labelled"] == sum(r["label"] is not None for r in rels)
    assert all(labels[k] == sum(r["label"] == k for r in rels) for k in labels)
    assert "quality" not in json.loads(runner.invoke(app, ["inspect", "--index", str(built), "--json"]).output)


def test_hierarchy_layers_communities_and_reports_are_published(built):
    data = json.loads(runner.invoke(app, ["inspect", "--index", str(built), "--json"]).output)
    layers = data["layers"]
    assert layers and set(layers[0]) == {"layer", "n_entities", "n_clusters", "cluster_sparsity", "change_rate", "stop_reason"}
    built_layers = [l for l in layers if l["stop_reason"] is None]
    assert len(built_layers) >= 1 and layers[-1]["stop_reason"]
    cat = Catalog(built)
    ents = cat.read("entities").to_pylist()
    rels = cat.read("relations").to_pylist()
    layer_of = {e["id"]: e["layer"] for e in ents}
    # CS recomputed from the published membership (summary_of relations) equals the recorded value
    assert_layers_match_membership(ents, rels, built_layers)
    comms = cat.read("communities").to_pylist()
    level0 = [m for c in comms if c["level"] == 0 for m in c["entity_ids"]]
    assert sorted(level0) == sorted(layer_of)  # every node of G_k, every layer, exactly once at level 0
    assert {layer_of[m] for c in comms for m in c["entity_ids"]} == set(layer_of.values())
    reports = cat.read("community_reports").to_pylist()
    assert sorted(r["community_id"] for r in reports) == sorted(c["id"] for c in comms)
    assert (built / "reports" / "layers-v1.png").stat().st_size > 1000


def test_export_parquet_has_design_columns(built, tmp_path):
    res = runner.invoke(app, ["export", "--index", str(built), "--format", "parquet", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    ents = pq.read_table(tmp_path / "entities.parquet")
    rels = pq.read_table(tmp_path / "relations.parquet")
    chunks = pq.read_table(tmp_path / "chunks.parquet")
    docs = pq.read_table(tmp_path / "documents.parquet")
    assert {"id", "name", "type", "description", "layer", "source_chunk_ids", "degree", "vector"} <= set(ents.column_names)
    assert {"id", "source_id", "target_id", "kind", "description", "weight", "source_chunk_ids"} <= set(rels.column_names)
    assert {"id", "document_id", "text", "n_tokens", "start", "end", "vector"} <= set(chunks.column_names)
    assert {"id", "uri", "title", "text", "content_hash", "n_tokens", "ingested_at"} <= set(docs.column_names)
    assert (tmp_path / "runs.parquet").exists() and (tmp_path / "quarantine.parquet").exists()
    # offsets are real: the chunk text is the document slice
    text = dict(zip(docs.column("id").to_pylist(), docs.column("text").to_pylist()))
    for c in chunks.to_pylist()[:20]:
        assert text[c["document_id"]][c["start"] : c["end"]] == c["text"]
    # relation endpoints exist
    ids = set(ents.column("id").to_pylist())
    assert set(rels.column("source_id").to_pylist()) | set(rels.column("target_id").to_pylist()) <= ids


def test_validate_command_passes(built):
    res = runner.invoke(app, ["validate", "--index", str(built)])
    assert res.exit_code == 0, res.output
    assert "all expectations passed" in res.output


def test_same_corpus_gives_identical_tables(built, small_corpus, tmp_path, monkeypatch):
    """A second build (direct runner, no Prefect, no Dask, and the embedding model in a child process as a large
    run has it) gives the same ids and the same tables. The child ends when Leiden begins, a new one embeds the
    reports, and it ends when validation begins."""
    from tasks.runtime.parallel import ProcessMapper

    live_at_release, release = [], ProcessMapper.release
    monkeypatch.setattr("tasks.index.embed.EMBED_IN_CHILD_TEXTS", 0)
    monkeypatch.setattr(ProcessMapper, "release", lambda self, **kw: (live_at_release.append(self.started), release(self, **kw)))
    cfg = load_config(overrides={"chunking": SMALL["chunking"], "extract": SMALL["extract"]})
    build_index(str(small_corpus), Catalog(tmp_path / "again"), cfg)
    assert live_at_release.count(True) == 2
    a, b = Catalog(built), Catalog(tmp_path / "again")
    for table in ("documents", "chunks", "entities", "relations", "quarantine"):
        ta, tb = a.read(table), b.read(table)
        if "ingested_at" in ta.column_names:
            ta, tb = ta.drop(["ingested_at"]), tb.drop(["ingested_at"])
        assert ta.column("id").to_pylist() == tb.column("id").to_pylist(), table
        assert ta.equals(tb), f"{table} differs between runs"


def test_hostile_folder_does_not_crash_and_is_quarantined(tmp_path):
    corpus = tmp_path / "hostile"
    corpus.mkdir()
    (corpus / "good.txt").write_text("Jacob Marley was the business partner of Ebenezer Scrooge in London.")
    (corpus / "empty.txt").write_bytes(b"")
    (corpus / "binary.md").write_bytes(os.urandom(256) + b"\x00")
    (corpus / "latin1.txt").write_bytes("na\xefve caf\xe9".encode("latin-1"))
    (corpus / "big.txt").write_text("word " * 5000)
    (corpus / "broken.jsonl").write_text('{"id": 1, "text": "Bob Cratchit was a clerk."}\n{oops\n')
    index = tmp_path / "index"
    res = runner.invoke(
        app,
        ["index", str(corpus), "--index", str(index), "--quiet", "--set", "corpus.max_file_bytes=10000",
         "--set", "dask.processes=false"],
    )
    assert res.exit_code == 0, res.output
    cat = Catalog(index)
    q = {Path(r["item"]).name: r["error"] for r in cat.read("quarantine").to_pylist()}
    assert q["empty.txt"] == "empty file"
    assert q["binary.md"].startswith("binary content")
    assert q["latin1.txt"].startswith("invalid UTF-8")
    assert q["big.txt"].startswith("file too large")
    assert q["broken.jsonl#L2"].startswith("line 2: invalid JSON")
    assert cat.read("documents").num_rows == 2


def test_nothing_readable_is_a_clear_error_and_publishes_nothing(tmp_path):
    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / "empty.txt").write_bytes(b"")
    res = runner.invoke(app, ["index", str(corpus), "--index", str(tmp_path / "i"), "--quiet", "--set", "dask.processes=false"])
    assert res.exit_code == 3  # not found: nothing to index
    assert "no readable documents" in res.output
    assert Catalog(tmp_path / "i").snapshot() is None


def test_bad_config_exits_2_before_any_work(small_corpus, tmp_path):
    res = runner.invoke(app, ["index", str(small_corpus), "--index", str(tmp_path / "i"), "--set", "chunking.overlap=5000"])
    assert res.exit_code == 2
    assert "overlap (5000) must be smaller than size" in res.output


def test_killed_run_leaves_previous_snapshot_and_rerun_completes(built, small_corpus, tmp_path):
    index = tmp_path / "index"
    cfg_over = {"chunking": SMALL["chunking"], "extract": SMALL["extract"]}
    build_index(str(small_corpus), Catalog(index), load_config(overrides=cfg_over))
    before = {t: Catalog(index).read(t).drop(["ingested_at"] if t == "documents" else []) for t in ("documents", "entities")}
    # add a document, then kill the next run in the middle of its publish
    extra = tmp_path / "corpus"
    subprocess.run(["cp", "-r", str(small_corpus), str(extra)], check=True)
    (extra / "new.txt").write_text("Fred, the nephew of Scrooge, invited him to Christmas dinner in London.")
    proc = run_killed_during_publish("build_index", extra, index, cfg_over, after=3)
    assert proc.returncode == -9, proc.stderr[-2000:]
    # the lance tables did get new versions, but readers still resolve snapshot v1
    db = lancedb.connect(str(index / "lance"))
    assert db.open_table("documents").version > Catalog(index).snapshot()["tables"]["documents"]
    cat = Catalog(index)
    assert cat.snapshot()["version"] == 1
    for t, tbl in before.items():
        now = cat.read(t).drop(["ingested_at"] if t == "documents" else [])
        assert now.equals(tbl), t
    assert [r["status"] for r in cat.runs()] == ["published", "running"]  # the killed run is visible as such
    # a re-run completes and publishes v2 including the new document
    res = runner.invoke(app, ["index", str(extra), "--index", str(index), "--quiet", *_sets({**cfg_over, "dask": {"processes": False}})])
    assert res.exit_code == 0, res.output
    cat = Catalog(index)
    assert cat.snapshot()["version"] == 2
    assert cat.read("documents").num_rows == before["documents"].num_rows + 1
    assert runner.invoke(app, ["validate", "--index", str(index)]).exit_code == 0


def test_corrupted_table_on_disk_fails_validation(built, tmp_path):
    """Corrupt a published table behind Strata's back: `strata validate` catches it."""
    import shutil

    import pyarrow as pa

    index = tmp_path / "copy"
    shutil.copytree(built, index)
    cat = Catalog(index)
    snap = cat.snapshot()
    ents = cat.read("entities", snap=snap)
    rels = cat.read("relations", snap=snap)
    gone = set(rels.column("source_id").to_pylist()[:5])
    kept = ents.filter(pa.array([i not in gone for i in ents.column("id").to_pylist()]))
    cat.publish({"entities": kept}, "run-corrupt", "manual", snap["dim"])  # relations now point at missing entities
    res = runner.invoke(app, ["validate", "--index", str(index)])
    assert res.exit_code == 4  # damaged: failing expectations
    assert "relations: expect_column_values_to_be_null(source_id_dangling)" in res.output  # names the missing ids


@pytest.mark.parametrize("damage", ["delete", "truncate"])
def test_a_damaged_table_file_is_named_with_its_version_not_a_stack_trace(built, tmp_path, damage):
    import shutil

    index = tmp_path / "copy"
    shutil.copytree(built, index)
    data = sorted((index / "lance" / "entities.lance" / "data").glob("*.lance"))[0]
    if damage == "delete":
        data.unlink()
    else:
        data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    version = Catalog(index).snapshot()["version"]
    for command in ("inspect", "validate"):
        res = runner.invoke(app, [command, "--index", str(index)])
        assert res.exit_code == 4, res.output  # damaged
        text = " ".join(res.output.split())
        assert "table entities (version" in text and f"of snapshot v{version}) cannot be read" in text, res.output
        assert "Traceback" not in res.output and "strata rollback --to" in text


def test_the_readme_snippet_reads_a_pinned_snapshot_without_strata(built, tmp_path):
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    section = readme.split("### Reading the index without Strata", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    script = tmp_path / "snippet.py"
    script.write_text(code.replace('"index/lance"', repr(str(built / "lance"))), encoding="utf-8")
    out = subprocess.run([os.sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "name" in out.stdout and "layer" in out.stdout and "shape: (5, 4)" in out.stdout


def test_the_shell_answers_switches_modes_rejects_bad_input_and_picks_up_a_new_snapshot(built, small_corpus, tmp_path):
    """Driven through a pseudo-terminal, as a person types."""
    import shutil
    import sys

    import pexpect

    index = tmp_path / "index"
    shutil.copytree(built, index)
    corpus = tmp_path / "corpus"
    shutil.copytree(small_corpus, corpus)
    env = dict(os.environ, HOME=str(tmp_path), PYTHONUNBUFFERED="1", COLUMNS="200", TERM="dumb")
    strata = str(Path(sys.executable).parent / "strata")
    sh = pexpect.spawn(strata, ["shell", "--index", str(index)], env=env, encoding="utf-8", timeout=120)
    sh.expect("snapshot v1 .*mode hi, budget 4000")
    sh.expect_exact("strata> ")
    sh.sendline("Who was Scrooge's clerk?")
    sh.expect(r"answer \(extractive; mode hi, snapshot v1, (\d+) ms")
    assert int(sh.match.group(1)) < 5000
    sh.expect_exact("strata> ")
    for typed, says in ((":mode naive", "mode naive"), (":mode fast", "unknown mode 'fast'"),
                        (":budget 50", "at least 100 tokens"), (":budget 1000", "budget 1000 tokens"),
                        (":sources", "sources on"), (":nonsense", "unknown command :nonsense")):
        sh.sendline(typed)
        sh.expect_exact(says)
        sh.expect_exact("strata> ")
    (corpus / "fezziwig.md").write_text("# Fezziwig\n\nOld Fezziwig was the merchant to whom young Ebenezer Scrooge "
                                        "was apprenticed.\n", encoding="utf-8")
    res = runner.invoke(app, ["update", str(corpus), "--index", str(index), "--replace-root", str(small_corpus), "--quiet", *_sets(
        {"chunking": SMALL["chunking"], "extract": SMALL["extract"], "dask": {"processes": False}})])
    assert res.exit_code == 0, res.output
    sh.sendline("Who was apprenticed to Fezziwig?")
    sh.expect_exact("snapshot v2 loaded")
    sh.expect(r"answer \(extractive; mode naive, snapshot v2")
    sh.expect_exact("Fezziwig")
    sh.expect_exact("strata> ")
    sh.sendline(":json")
    sh.expect_exact("json on")
    sh.sendline("Who was Scrooge's clerk?")
    sh.expect(r'\{"question": "Who was Scrooge\'s clerk\?", "mode": "naive", "version": 2')
    sh.expect_exact("strata> ")
    sh.sendline(":quit")
    sh.expect(pexpect.EOF)
    sh.close()
    assert sh.exitstatus == 0 and "Fezziwig" in (tmp_path / ".strata_history").read_text()
