"""HyGRAG: the hybrid graph's chunk links, Cleora, the LSH buckets' bounds, the layers and the method end to end."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tasks.methods.hygrag import chunk_links, cleora, hybrid_adjacency, lsh_buckets


def test_chunks_sharing_more_than_l_entities_are_linked_by_how_many_they_share():
    # e0..e3 in chunks 0 and 1; e4 in 1 and 2; e5 in all three (a hub at max_chunks=2: it links nothing)
    entity_chunks = [[0, 1], [0, 1], [0, 1], [0, 1], [1, 2], [0, 1, 2]]
    links = chunk_links(entity_chunks, 3, more_than=3, max_chunks=2).toarray()
    assert links.tolist() == [[0, 4, 0], [4, 0, 0], [0, 0, 0]]
    assert chunk_links(entity_chunks, 3, more_than=3, max_chunks=3).toarray()[0, 1] == 5
    assert chunk_links(entity_chunks, 3, more_than=4, max_chunks=2).nnz == 0


def test_hybrid_adjacency_holds_relations_memberships_and_chunk_links_symmetrically():
    links = chunk_links([[0, 1]] * 4, 2, 3, 2)
    adj = hybrid_adjacency(2, [(0, 1, 2.0)], [[0], [0, 1]], links).toarray()
    # nodes: e0, e1, c0, c1
    assert adj.tolist() == [[0, 2, 1, 0], [2, 0, 1, 1], [1, 1, 0, 4], [0, 1, 4, 0]]


def test_cleora_on_five_nodes_matches_the_hand_computation():
    # edges 0-1, 1-2, 0-2 (weight 1) and 2-3 (weight 2); node 4 has none
    import scipy.sparse as sp

    a = np.zeros((5, 5), np.float32)
    for i, j, w in [(0, 1, 1), (1, 2, 1), (0, 2, 1), (2, 3, 2)]:
        a[i, j] = a[j, i] = w
    x = np.array([[1, 0], [0, 1], [1, 0], [0, 1], [1, 1]], np.float32)
    one = cleora(sp.csr_matrix(a), x, 1)
    r = 1 / math.sqrt(2)
    # x0 = (x1 + x2) / 2, x1 = (x0 + x2) / 2, x2 = (x0 + x1 + 2 x3) / 4, x3 = x2; each normalised; x4 kept
    expected = np.array([[r, r], [1, 0], [1 / math.sqrt(10), 3 / math.sqrt(10)], [1, 0], [r, r]])
    assert np.allclose(one, expected, atol=1e-6)
    two = cleora(sp.csr_matrix(a), x, 2)
    n0 = np.array([1 + 1 / math.sqrt(10), 3 / math.sqrt(10)])  # (x1' + x2') / 2, normalised
    assert np.allclose(two[0], n0 / np.linalg.norm(n0), atol=1e-6)
    assert np.allclose(cleora(sp.csr_matrix(a), x, 0), x / np.linalg.norm(x, axis=1, keepdims=True))


@pytest.mark.parametrize("n", [1, 4, 5, 6, 37, 200, 1500])
def test_lsh_buckets_hold_every_node_once_within_the_bounds(n):
    x = np.random.default_rng(n).standard_normal((n, 16)).astype(np.float32)
    buckets = lsh_buckets(x, 16, 5, 50, seed=7)
    flat = np.concatenate(buckets)
    assert sorted(flat.tolist()) == list(range(n))
    sizes = [len(b) for b in buckets]
    if n < 5:
        assert sizes == [n]
    else:
        assert min(sizes) >= 5 and max(sizes) <= 50, sizes
    again = lsh_buckets(x, 16, 5, 50, seed=7)
    assert all(np.array_equal(a, b) for a, b in zip(buckets, again)) and len(again) == len(buckets)


def test_two_tight_opposite_groups_are_two_buckets_and_a_large_one_is_halved():
    rng = np.random.default_rng(0)
    a = np.array([1.0, 0, 0]) + 1e-4 * rng.standard_normal((6, 3))
    b = np.array([-1.0, 0, 0]) + 1e-4 * rng.standard_normal((7, 3))
    buckets = lsh_buckets(np.concatenate([a, b]), 8, 5, 50, seed=1)
    assert sorted(sorted(m.tolist()) for m in buckets) == [list(range(6)), list(range(6, 13))]
    same = np.ones((120, 3)) + 1e-6 * rng.standard_normal((120, 3))  # one code: split 120 -> 60 + 60 -> 4 x 30
    assert sorted(len(m) for m in lsh_buckets(same, 8, 5, 50, seed=1)) == [30, 30, 30, 30]


def test_a_small_bucket_joins_the_nearest_big_one():
    rng = np.random.default_rng(3)
    big_a = np.array([1.0, 0.2, 0]) + 1e-4 * rng.standard_normal((8, 3))
    big_b = np.array([-1.0, 0, 0.2]) + 1e-4 * rng.standard_normal((8, 3))
    stray = np.array([[0.9, 0.3, 0.1], [0.95, 0.25, 0.0]])  # near big_a, too few to stand alone
    buckets = lsh_buckets(np.concatenate([big_a, big_b, stray]), 16, 5, 50, seed=2)
    groups = sorted(sorted(m.tolist()) for m in buckets)
    assert groups == [[*range(8), 16, 17], list(range(8, 16))]


def test_layers_put_every_entity_and_chunk_under_one_summary_with_the_summary_first_in_its_community():

    from schemas.config import HyGRAGConfig
    from tasks.methods.hygrag import build_layers
    from tasks.methods.summarize import OfflineSummarizer
    from tasks.store.rows import relation_table

    rng = np.random.default_rng(5)
    ents = [{"id": f"e{i}", "name": f"Entity {i}", "type": "person", "description": f"Entity {i} did thing {i % 7}.",
             "layer": 0, "source_chunk_ids": [f"c{i % 30}"]} for i in range(90)]
    chunks = [{"id": f"c{j}", "text": f"Chunk {j} tells of entity {j} and entity {j + 30}."} for j in range(30)]
    rels = relation_table([{"id": f"r{i}", "source_id": f"e{i}", "target_id": f"e{(i + 1) % 90}", "kind": "extracted",
                            "description": "", "weight": 1.0, "source_chunk_ids": []} for i in range(90)])

    def embed(texts):
        return np.asarray([np.random.default_rng(abs(hash(t)) % 2**32).standard_normal(8) for t in texts], np.float32)

    out_ents, vecs, out_rels, comms, stats = build_layers(
        ents, rng.standard_normal((90, 8)).astype(np.float32), rels, chunks, rng.standard_normal((30, 8)).astype(np.float32),
        HyGRAGConfig(), 42, OfflineSummarizer(["person", "concept"]), embed)
    layer1 = [e for e in out_ents if e["layer"] == 1]
    by_entity = {r["source_id"] for r in out_rels if r["target_id"] in {e["id"] for e in layer1}}
    assert by_entity == {e["id"] for e in ents}  # every entity under exactly one layer-1 summary ...
    assert sum(len([r for r in out_rels if r["source_id"] == e["id"]]) for e in ents) == 90
    owned = [c for e in layer1 for c in e["source_chunk_ids"]]
    assert sorted(owned) == sorted(c["id"] for c in chunks)  # ... and every chunk
    assert len(vecs) == len(out_ents)
    for c in comms:
        summary = c["entity_ids"][0]
        assert summary in {e["id"] for e in out_ents} and 5 <= c["size"] <= 50
    finest = [c for c in comms if c["level"] == max(c["level"] for c in comms)]  # the buckets of layer 1
    assert sum(c["size"] for c in finest) == 120 and all(c["parent_id"] for c in finest if len(comms) > len(finest))
    assert stats[0]["n_entities"] == 120 and stats[-1]["stopped"]


# ---------------------------------------------------------------------------- the method end to end
@pytest.fixture(scope="module")
def hygrag_index(small_corpus, tmp_path_factory):
    """The small corpus indexed with ``--set index.method=hygrag`` through the CLI."""
    import json as _json

    from typer.testing import CliRunner

    from flows.cli import app
    from tests.conftest import SMALL

    index = tmp_path_factory.mktemp("hy") / "index"
    sets = [x for k, v in {**SMALL["chunking"]}.items() for x in ("--set", f"chunking.{k}={_json.dumps(v)}")]
    res = CliRunner().invoke(app, ["index", str(small_corpus), "--index", str(index), "--quiet", "--set",
                                   "index.method=hygrag", "--set", "extract.batch_size=4", *sets])
    assert res.exit_code == 0, res.output
    return index


def test_a_hygrag_build_publishes_its_layers_and_bounded_communities(hygrag_index):
    import json as _json

    from typer.testing import CliRunner

    from flows.cli import app

    data = _json.loads(CliRunner().invoke(app, ["inspect", "--index", str(hygrag_index), "--json"]).stdout)
    assert data["method"] == "hygrag" and data["problems"] == []
    built = [l for l in data["layers"] if l["stop_reason"] is None]
    assert built and len(built) <= 4
    by_level = {c["level"]: c for c in data["communities"]}
    top = max(layer["layer"] for layer in built)
    for layer in built:  # each layer's buckets: S_min..S_max unless that layer had fewer than S_min nodes
        c = by_level[top - layer["layer"]]
        assert c["count"] == layer["n_clusters"]
        assert c["max_size"] <= 50 and (c["min_size"] >= 5 or layer["n_entities"] < 5), c
    assert data["tables"]["community_reports"] == data["tables"]["communities"]


def test_hygrag_mode_answers_from_communities_entities_relations_and_sources(hygrag_index):
    import json as _json

    from typer.testing import CliRunner

    from flows.cli import app

    runner = CliRunner()
    res = runner.invoke(app, ["query", "Who was Scrooge's clerk?", "--index", str(hygrag_index), "--json"])
    assert res.exit_code == 0, res.output
    data = _json.loads(res.stdout)
    assert data["mode"] == "hygrag" and data["chunks"] and sum(data["tokens"].values()) <= 4000
    # by value (the default) a level item that only repeats the sources gets nothing; with fixed shares every level
    # shows what the method found
    args = ["query", "Who was Scrooge's clerk?", "--index", str(hygrag_index), "--json"]
    shares = _json.loads(runner.invoke(app, [*args, "--set", "retrieval.level_budget=shares"]).stdout)
    assert shares["chunks"] and shares["communities"] and shares["entities"]
    wrong = runner.invoke(app, ["query", "Who was Scrooge's clerk?", "--index", str(hygrag_index), "--mode", "hi"])
    assert wrong.exit_code == 2 and "this hygrag index; it offers hygrag, ppr, hybrid, naive" in wrong.output


def test_hygrag_builds_are_deterministic_and_an_update_attaches(hygrag_index, small_corpus, tmp_path):
    import shutil

    from flows.pipeline import build_index, update_index
    from schemas.config import load_config
    from tasks.index.validate import validate_tables
    from tasks.store.catalog import Catalog
    from tests.conftest import SMALL
    from tests.test_golden_tables import table_digests

    cfg = load_config(overrides={"index": {"method": "hygrag"}, "chunking": SMALL["chunking"], "extract": {"batch_size": 4},
                                 "dask": {"processes": False}})
    build_index(str(small_corpus), Catalog(tmp_path / "again"), cfg)
    assert table_digests(tmp_path / "again", also_drop=("version",)) == table_digests(hygrag_index, also_drop=("version",))
    corpus = tmp_path / "corpus"
    shutil.copytree(small_corpus, corpus)
    (corpus / "notes" / "fezziwig.md").write_text(
        "# Fezziwig\n\nOld Fezziwig was the merchant to whom young Ebenezer Scrooge was apprenticed.\n", encoding="utf-8")
    res = update_index(str(corpus), Catalog(tmp_path / "again"), cfg)
    assert res.status == "published" and "attach" in res.stages
    cat = Catalog(tmp_path / "again")
    snap = cat.require_snapshot()
    from schemas.tables import SNAPSHOT_TABLES

    assert validate_tables({n: cat.read(n, snap=snap) for n in SNAPSHOT_TABLES}, snap["dim"]).success


def test_after_an_update_buckets_are_read_from_the_summaries_and_emptied_ones_go():
    from tasks.methods.common import bucket_communities, without_empty

    summaries = [{"id": "s1", "layer": 1, "source_chunk_ids": ["c1"]}, {"id": "s2", "layer": 1, "source_chunk_ids": ["c2"]},
                 {"id": "s3", "layer": 2, "source_chunk_ids": []}]
    links = [{"source_id": "e1", "target_id": "s1", "kind": "summary_of"},
             {"source_id": "s1", "target_id": "s3", "kind": "summary_of"},
             {"source_id": "s2", "target_id": "s3", "kind": "summary_of"}]
    kept, vectors, kept_links = without_empty(summaries, np.eye(3, dtype=np.float32), links, {"c2"})
    assert [s["id"] for s in kept] == ["s1", "s3"] and vectors.tolist() == [[1, 0, 0], [0, 0, 1]]
    assert [(r["source_id"], r["target_id"]) for r in kept_links] == [("e1", "s1"), ("s1", "s3")]
    c1, c3 = bucket_communities(kept, kept_links)
    assert (c1["level"], c1["entity_ids"], c1["size"], c1["parent_id"]) == (1, ["s1", "e1"], 2, c3["id"])
    assert (c3["level"], c3["entity_ids"], c3["size"], c3["parent_id"]) == (0, ["s3", "s1"], 1, None)
    # the last chunk of s1 goes too, and e1 with it: s1 is empty, then s3
    assert without_empty(kept, vectors, kept_links[1:], {"c1"})[0] == []


def test_with_an_llm_a_bucket_summary_asks_for_a_synthesis_of_its_passages_and_entities():
    from schemas.prompts import PromptSet
    from tasks.methods.hygrag import _synthesis
    from tasks.methods.summarize import Cluster, LLMSummarizer

    seen = []

    class Client:
        prompts = PromptSet()

        async def complete(self, messages, prompt_version, json_mode, parse):
            seen.append((messages, prompt_version))
            return parse('{"summary_entities": [{"name": "Scrooge\'s firm", "type": "organization", '
                         '"description": "Scrooge employs Bob Cratchit in the counting-house the passage describes."}]}')

    members = [{"id": "c1", "name": "Scrooge kept a counting-house", "type": "chunk", "description": "Scrooge kept a "
                "counting-house where Bob Cratchit worked."},
               {"id": "e1", "name": "Bob Cratchit", "type": "person", "description": "Bob Cratchit was Scrooge's clerk."}]
    out = LLMSummarizer(Client(), ["organization", "person"], **_synthesis()).summarize_layer(1, [Cluster(members, np.eye(2))])
    assert out == [[{"name": "Scrooge's firm", "type": "organization",
                     "description": "Scrooge employs Bob Cratchit in the counting-house the passage describes."}]]
    (messages, version), = seen
    assert version == "hygrag-synthesis/1" and "[passage] Scrooge kept" in messages[1]["content"]
    assert "[person] Bob Cratchit" in messages[1]["content"] and "at most 250 tokens" in messages[1]["content"]
