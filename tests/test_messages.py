"""Every message true and one line: usage errors, ``-q``, gc's freed bytes, ``eval --build``, the quarantine's
reasons, the comments ``strata init`` writes and the answer when the budget left no source."""

from __future__ import annotations

import json
import re
import time
import tomllib
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from flows.cli import app
from schemas.config import RetrievalConfig, default_toml
from tasks.errors import EXIT_CODES
from tasks.query.answer import NOT_FOUND, extractive_answer
from tasks.query.retrieve import retrieve
from tasks.retrieval.view import IndexView
from tasks.store.catalog import Catalog
from tasks.store.rows import TableDelta
from tests.helpers import DIM, _to_table, tiny_tables, vec

runner = CliRunner()


# ---------------------------------------------------------------------------- usage errors
@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["query", "Who?", "--index", "IDX", "--budget", "50"], "'--budget'"),
        (["serve", "--index", "IDX", "--port", "99999"], "'--port'"),
        (["gc", "--index", "IDX", "--keep", "1", "--bogus"], "--bogus"),
        (["index", "CORPUS", "--index", "IDX", "--frobnicate"], "--frobnicate"),
        (["inspect"], "--index"),
        (["frob"], "frob"),
    ],
)
def test_a_usage_error_of_any_command_is_one_error_line_with_exit_2(tmp_path, args, says):
    args = [a.replace("IDX", str(tmp_path / "idx")).replace("CORPUS", str(tmp_path)) for a in args]
    res = runner.invoke(app, args)
    assert res.exit_code == EXIT_CODES["usage"], res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], res.output
    assert "--help)" in lines[0] and not (tmp_path / "idx").exists()


def test_help_is_still_typers_own():
    res = runner.invoke(app, ["query", "--help"])
    assert res.exit_code == 0 and "Usage:" in res.output and "error:" not in res.output
    res = runner.invoke(app, [])
    assert "Usage:" in res.output and "error:" not in res.output


# ---------------------------------------------------------------------------- -q
def test_quiet_prints_one_line_per_stage(monkeypatch, tmp_path):
    """``-q``: no progress bars, one line per stage (name, what it did, seconds), from the run's own stages."""
    import flows.index_flow as index_flows
    from tasks.runtime.progress import reporter
    from tasks.runtime.stages import Stages

    def fake_flow(corpus, index, config_path, overrides, *rest):
        stages = Stages(reporter())
        with stages("ingest", total=3) as st:
            st.done("3 documents, 0 quarantined")
        with stages("embed", total=7):
            pass
        return {"version": 1, "stages": stages.log, "counts": {}, "status": "published"}

    fake_flow.fn = fake_flow  # the flow's function, as a flow run calls it
    monkeypatch.setattr(index_flows, "index_flow", fake_flow)
    monkeypatch.setattr("flows.cli.build.print_quarantine", lambda *a: None, raising=False)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.txt").write_text("Scrooge ran the counting-house.")
    res = runner.invoke(app, ["index", str(tmp_path / "c"), "--index", str(tmp_path / "idx"), "-q"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert re.fullmatch(r"ingest: 3 documents, 0 quarantined \(\d+\.\d s\)", lines[0]), lines
    assert re.fullmatch(r"embed: 7 items \(\d+\.\d s\)", lines[1]), lines


# ---------------------------------------------------------------------------- gc
def _files(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


def test_gc_says_what_it_deleted_and_frees_what_the_index_lost(tmp_path):
    """Updates write each table as a change of the version before (rows deleted and appended); gc --keep 1 then
    removes the old versions. The bytes it reports are the bytes the index's files lost."""
    root = tmp_path / "idx"
    cat = Catalog(root)
    cat.publish(tiny_tables(1), "run-1", "full", DIM)
    for v in range(2, 5):  # three updates: entities replaced by a delta, the other tables kept
        time.sleep(1.1)
        new = tiny_tables(v, suffix=f"-{v}")["entities"]
        cat.publish({"entities": TableDelta("id", ["ent-a", "ent-b"], new)}, f"run-{v}", "incremental", DIM)
    with cat.writer_lock():  # its file is part of the index from the first writing command on
        pass
    before = _files(root)
    res = runner.invoke(app, ["gc", "--index", str(root), "--keep", "1"])
    assert res.exit_code == 0, res.output
    lost = before - _files(root)
    assert lost > 0
    from flows.cli.admin import size

    text = " ".join(res.output.split())
    assert f"freed {size(lost)} (the index: {size(before)} -> {size(before - lost)})" in text, text
    assert re.search(r"table versions removed: [1-9]\d*; files deleted: \d+ manifests", text), text
    assert Catalog(root).read("entities").column("name").to_pylist()[0] == "Scrooge-4"
    # the figure itself, in bytes: a second gc with nothing to drop frees what the files lost again (nothing)
    cat = Catalog(root)
    before = _files(root)
    with cat.writer_lock():
        done = cat.gc(1)
    assert done["bytes_removed"] == before - _files(root)


def test_gc_freed_bytes_are_measured_not_lances_figure(tmp_path):
    root = tmp_path / "idx"
    cat = Catalog(root)
    for v in range(1, 4):
        cat.publish(tiny_tables(v, suffix=f"-{v}"), f"run-{v}", "full", DIM)
    with cat.writer_lock():
        before = _files(root)
        done = cat.gc(1)
        after = _files(root)
    assert done["bytes_removed"] == before - after and done["files_removed"]["data files"] > 0


# ---------------------------------------------------------------------------- eval
def test_eval_builds_a_missing_index_only_with_build(tmp_path, monkeypatch):
    import flows.index_flow

    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "queries.jsonl").write_text('{"question": "Who?"}\n')
    index = tmp_path / "idx"
    # questions without their corpus (a narrative check of a book indexed apart): a clear error, not an internal one
    res = runner.invoke(app, ["eval", "--dataset", str(tmp_path / "ds"), "--index", str(index), "--build"])
    assert res.exit_code == EXIT_CODES["not_found"] and "is not there to build one from" in res.output, res.output
    assert "internal error" not in res.output and not index.exists()
    (tmp_path / "ds" / "corpus.jsonl").write_text('{"id": "p1", "title": "A", "text": "Scrooge."}\n')
    res = runner.invoke(app, ["eval", "--dataset", str(tmp_path / "ds"), "--index", str(index)])
    assert res.exit_code == EXIT_CODES["not_found"] and "no index at" in res.output and not index.exists()
    built = []

    def fake_build(corpus, index, *rest):  # a build publishes the corpus: here a hand-built snapshot
        built.append(corpus)
        Catalog(index).publish(tiny_tables(1), "run-1", "full", DIM)

    fake_build.fn = fake_build
    monkeypatch.setattr(flows.index_flow, "index_flow", fake_build)
    res = runner.invoke(app, ["eval", "--dataset", str(tmp_path / "ds"), "--index", str(index), "--build"])
    assert built == [str(tmp_path / "ds" / "corpus.jsonl")] and "--build: no index at" in res.output, res.output
    help_text = " ".join(runner.invoke(app, ["eval", "--help"]).output.replace("│", " ").split())
    assert "never created by this command, unless --build" in help_text


# ---------------------------------------------------------------------------- quarantine
def _quarantined(tmp_path, n: int) -> Catalog:
    cat = Catalog(tmp_path / "idx")
    tables = tiny_tables(1)
    rows = [{"id": f"q-{i:02d}", "item": f"/c/bad_{i:02d}.bin", "stage": "ingest", "error": f"binary file\n{i}"}
            for i in range(n)]
    tables["quarantine"] = _to_table("quarantine", rows, DIM, 1)
    cat.publish(tables, "run-1", "full", DIM)
    return cat


def test_inspect_lists_the_quarantine_bounded(tmp_path):
    from tasks.query.inspect import QUARANTINE_SHOWN, quarantine_lines

    cat = _quarantined(tmp_path, QUARANTINE_SHOWN + 3)
    lines = quarantine_lines(cat, cat.require_snapshot())
    assert lines[0] == f"quarantined ({QUARANTINE_SHOWN + 3}):"
    assert lines[1] == "  /c/bad_00.bin [ingest]: binary file 0"
    assert lines[-1] == "  … and 3 more: strata export --table quarantine" and len(lines) == QUARANTINE_SHOWN + 2
    res = runner.invoke(app, ["inspect", "--index", str(tmp_path / "idx")])
    assert res.exit_code == 0 and "/c/bad_09.bin [ingest]: binary file 9" in res.output, res.output
    assert "/c/bad_10.bin" not in res.output and "and 3 more" in res.output
    # --json: the same rows, the reasons whole, and the count of all of them
    res = runner.invoke(app, ["inspect", "--index", str(tmp_path / "idx"), "--json"])
    listed = json.loads(res.output)["quarantine"]
    assert listed["count"] == QUARANTINE_SHOWN + 3 and len(listed["rows"]) == QUARANTINE_SHOWN
    assert listed["rows"][0] == {"item": "/c/bad_00.bin", "place": "/c/bad_00.bin", "stage": "ingest",
                                 "reason": "binary file\n0"}


def test_index_lists_what_it_quarantined(tmp_path, monkeypatch):
    """``strata index`` (and ``update``) print the published snapshot's quarantine with its reasons."""
    import flows.index_flow as index_flows

    def fake_flow(corpus, index, *rest):
        _quarantined(tmp_path, 2)
        return {"version": 1, "stages": {}, "counts": {}, "status": "published"}

    fake_flow.fn = fake_flow
    monkeypatch.setattr(index_flows, "index_flow", fake_flow)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.txt").write_text("Scrooge ran the counting-house.")
    res = runner.invoke(app, ["index", str(tmp_path / "c"), "--index", str(tmp_path / "idx"), "-q"])
    assert res.exit_code == 0, res.output
    assert "quarantined (2):" in res.output and "/c/bad_01.bin [ingest]: binary file 1" in res.output


# ---------------------------------------------------------------------------- init
def test_every_setting_strata_init_writes_has_a_comment(tmp_path):
    res = runner.invoke(app, ["init", str(tmp_path / "strata.toml")])
    assert res.exit_code == 0, res.output
    text = (tmp_path / "strata.toml").read_text()
    assert text == default_toml()
    tomllib.loads(text)
    setting = re.compile(r"^(?:# )?([A-Za-z_][\w.]*) = ")
    section, bare, seen = "", [], 0
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("["):
            section = line.strip("[]") + "."
        elif m := setting.match(line):
            seen += 1
            above = lines[i - 1]
            if not above.startswith("# ") or setting.match(above):
                bare.append(section + m.group(1))
    assert seen > 100 and bare == []


# ---------------------------------------------------------------------------- a small budget
def _long_source_index(tmp_path) -> IndexView:
    """One document whose only chunk is long (~400 tokens), its sentence naming what the question asks."""
    now = datetime(2026, 1, 1, tzinfo=UTC)
    text = "Alpha met Beta in Paris in 1843. " + "The fog came down on the counting-house all day. " * 40
    docs = [{"id": "doc1", "uri": "/c/a.txt", "root": "/c", "source_id": "a.txt", "title": "Doc 1", "text": text,
             "content_hash": "0" * 64, "n_tokens": 400, "ingested_at": now}]
    chunks = [{"id": "ch1", "document_id": "doc1", "chunk_index": 0, "text": text, "n_tokens": 400, "start": 0,
               "end": len(text), "status": "extracted", "vector": vec(0)}]
    ents = [{"id": n, "name": n, "type": "person", "description": f"{n} met someone in Paris.", "layer": 0,
             "source_chunk_ids": ["ch1"], "degree": 1, "vector": vec(0)} for n in ("Alpha", "Beta")]
    rels = [{"id": "r1", "source_id": "Alpha", "target_id": "Beta", "kind": "extracted", "description": "met",
             "weight": 1.0, "source_chunk_ids": ["ch1"]}]
    tables = {"documents": _to_table("documents", docs, DIM, 1), "chunks": _to_table("chunks", chunks, DIM, 1),
              "entities": _to_table("entities", ents, DIM, 1), "relations": _to_table("relations", rels, DIM, 1)}
    cat = Catalog(tmp_path / "idx")
    cat.publish(tables, "run", "full", DIM)
    return IndexView.load(cat)


def test_a_budget_that_left_no_source_is_named_as_the_cause(tmp_path):
    view = _long_source_index(tmp_path)
    q = np.asarray(vec(0))
    small = retrieve(view, "Whom did Alpha meet?", q, "hi", RetrievalConfig(token_budget=300))
    assert small.entities and not small.chunks  # the entities fit, the one source (456 tokens) does not
    answer = extractive_answer(small)
    assert answer != NOT_FOUND and "token budget of 300" in answer and "--budget" in small.message, answer
    wide = retrieve(view, "Whom did Alpha meet?", q, "hi", RetrievalConfig(token_budget=4000))
    assert wide.chunks and wide.message == ""
    assert extractive_answer(wide).startswith("Alpha met Beta in Paris in 1843.")
