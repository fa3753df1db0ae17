"""Invariants under any sequence of updates (hypothesis): random add / edit / delete / no-op steps over a
small real corpus; after every step layer 0 equals a full build of the corpus as it is now, every id a table
references exists, the recorded cluster sparsity of each built layer equals the one recomputed from the
published ``summary_of`` links, and a no-op publishes nothing."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from flows.pipeline import build_index, update_index
from schemas.config import load_config
from tasks.store.catalog import Catalog
from tests.conftest import CAROL, SMALL, musique_passages
from tests.helpers import assert_layers_match_membership
from tests.test_incremental import _layer0

pytestmark = pytest.mark.slow

CFG = load_config(overrides={"chunking": SMALL["chunking"], "extract": SMALL["extract"], "dask": {"processes": False}})
POOL = musique_passages(20)
SENTENCES = [s.strip() + "." for s in CAROL.read_text(encoding="utf-8")[20000:26000].split(".") if len(s.split()) > 6][:40]
STEPS = st.lists(st.tuples(st.sampled_from(["add", "edit", "delete", "noop"]), st.integers(0, 999)), min_size=2, max_size=4)


def apply(root: Path, op: str, k: int) -> bool:
    """One step on the corpus folder; False when it changes nothing (a no-op, or nothing left to delete)."""
    present = sorted(p.name for p in root.iterdir())
    absent = [i for i in range(len(POOL)) if f"p{i}.txt" not in present]
    if op == "add" and absent:
        i = absent[k % len(absent)]
        (root / f"p{i}.txt").write_text(f"# {POOL[i]['title']}\n\n{POOL[i]['text']}\n", encoding="utf-8")
        return True
    if op == "edit":
        path = root / present[k % len(present)]
        path.write_text(path.read_text(encoding="utf-8") + " " + SENTENCES[k % len(SENTENCES)] + "\n", encoding="utf-8")
        return True
    if op == "delete" and len(present) > 2:
        (root / present[k % len(present)]).unlink()
        return True
    return False


def check_references(cat: Catalog) -> None:
    tables = {n: cat.read(n) for n in ("documents", "chunks", "mentions", "entities", "relations", "communities",
                                       "community_reports")}
    ids = {n: set(t.column("id").to_pylist()) for n, t in tables.items()}
    rels, ents = tables["relations"].to_pylist(), tables["entities"].to_pylist()
    assert set(tables["chunks"].column("document_id").to_pylist()) <= ids["documents"]
    assert set(tables["mentions"].column("chunk_id").to_pylist()) <= ids["chunks"]
    assert {r["source_id"] for r in rels} | {r["target_id"] for r in rels} <= ids["entities"]
    assert {c for e in ents if e["layer"] == 0 for c in e["source_chunk_ids"]} <= ids["chunks"]
    assert {m for c in tables["communities"].to_pylist() for m in c["entity_ids"]} <= ids["entities"]
    assert set(tables["community_reports"].column("community_id").to_pylist()) == ids["communities"]
    # recorded CS of every built layer = CS recomputed from the published membership
    assert_layers_match_membership(ents, rels, [r for r in cat.read("layers").to_pylist() if not r["stopped"]])


@settings(max_examples=3, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(steps=STEPS)
@example(steps=[("delete", 3), ("add", 5), ("delete", 0), ("noop", 0)])  # always: deletes, one right after an add
def test_any_sequence_of_updates_keeps_the_invariants(steps):
    work = Path(tempfile.mkdtemp(prefix="strata-inv-"))
    try:
        corpus = work / "corpus"
        corpus.mkdir()
        for _ in range(5):
            apply(corpus, "add", 0)
        index = work / "index"
        build_index(str(corpus), Catalog(index), CFG)
        for n, (op, k) in enumerate(steps):
            version = Catalog(index).snapshot()["version"]
            changed = apply(corpus, op, k)
            res = update_index(str(corpus), Catalog(index), CFG)
            cat = Catalog(index)
            if not changed:
                assert res.status == "nothing-to-do" and cat.snapshot()["version"] == version
                continue
            assert res.status == "published" and cat.snapshot()["version"] == version + 1, (op, res.status)
            full = work / f"full-{n}"
            build_index(str(corpus), Catalog(full), CFG)
            assert _layer0(cat) == _layer0(Catalog(full)), f"layer 0 after step {n} ({op}) differs from a full build"
            check_references(cat)
            shutil.rmtree(full)
    finally:
        shutil.rmtree(work, ignore_errors=True)
