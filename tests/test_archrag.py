"""ArchRAG's building blocks: KNN augmentation, attributed Leiden groups, C-HNSW links, top-down search."""

from __future__ import annotations

import numpy as np

from tasks.methods.archrag import attributed_edges, chnsw_links, knn_edges, leiden_groups
from tasks.methods.archrag_search import hierarchical_search, search_layer


def _unit(rows) -> np.ndarray:
    x = np.asarray(rows, dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_knn_edges_join_each_node_to_its_nearest_when_similar_enough():
    x = _unit([[1, 0], [0.9, 0.1], [0, 1], [-1, 0.05]])
    # nearest of 0 is 1 (and of 1 is 0); of 2 is 1 (cos 0.11) and of 3 is 2 (cos 0.05): under the threshold
    assert [(a, b) for a, b, _ in knn_edges(x, 1, 0.5)] == [(0, 1)]
    assert knn_edges(x, 1, 0.5)[0][2] == np.float32(x[0] @ x[1])
    assert [(a, b) for a, b, _ in knn_edges(x, 1, -1.0)] == [(0, 1), (1, 2), (2, 3)]


def test_attributed_edges_weight_relations_and_knn_edges_by_similarity():
    x = _unit([[1, 0], [0.9, 0.1], [0, 1], [-1, 0.05]])
    edges = attributed_edges(x, [(3, 0), (2, 2)], k=1, threshold=0.5)
    assert [(a, b) for a, b, _ in edges] == [(0, 1), (0, 3)]  # a relation, a KNN edge; no self loop
    assert edges[1][2] == 1e-3  # opposite ends: the floor


def test_leiden_groups_cover_every_node_once_isolated_ones_alone():
    edges = [(0, 1, 1.0), (1, 2, 1.0), (0, 2, 1.0), (3, 4, 1.0), (4, 5, 1.0), (3, 5, 1.0), (2, 3, 0.01)]
    groups = leiden_groups(7, edges, 1.0, seed=1)
    assert [g.tolist() for g in groups] == [[0, 1, 2], [3, 4, 5], [6]]
    assert [g.tolist() for g in leiden_groups(7, edges, 1.0, seed=1)] == [g.tolist() for g in groups]


def test_leiden_groups_are_graspologic_natives_leiden_over_the_same_edges():
    import graspologic_native as gn

    rng = np.random.default_rng(5)
    ends = rng.integers(0, 300, (2000, 2))
    ends[: len(ends) * 4 // 5, 1] = ends[: len(ends) * 4 // 5, 0] // 20 * 20 + rng.integers(0, 20, len(ends) * 4 // 5)
    pairs = sorted({(int(min(a, b)), int(max(a, b))) for a, b in ends if a != b})
    edges = [(a, b, float(w)) for (a, b), w in zip(pairs, rng.random(len(pairs)) + 1e-3)]
    _, theirs = gn.leiden(edges=[(str(a), str(b), w) for a, b, w in edges], resolution=1.0, seed=7)
    groups: dict[int, list[int]] = {}
    for node, c in sorted(theirs.items(), key=lambda kv: int(kv[0])):
        groups.setdefault(c, []).append(int(node))
    ours = [g.tolist() for g in leiden_groups(300, edges, 1.0, seed=7) if str(int(g[0])) in theirs]
    assert ours == sorted(groups.values())


def test_chnsw_links_point_within_a_layer_and_down_to_the_nearest():
    bottom = _unit([[1, 0], [0.95, 0.05], [0, 1], [0.05, 0.95]])
    top = _unit([[1, 0.02], [0.02, 1]])
    intra, inter = chnsw_links([bottom, top], m=1)
    assert intra[0] == [[1], [0], [3], [2]] and intra[1] == [[1], [0]]
    assert inter[0].tolist() == [] and inter[1].tolist() == [0, 2]
    # links go both ways: nobody's nearest, c still gets a link from b (its nearest), after b's own nearest
    line = _unit([[1, 0], [0.9, 0.1], [0.5, 0.5]])  # b·a .994 > b·c .781 > a·c .707
    assert chnsw_links([line], m=1)[0][0] == [[1], [0, 2], [1]]


def test_search_reaches_a_part_of_layer_zero_only_through_the_inter_layer_links():
    rng = np.random.default_rng(0)
    a = _unit(np.array([1.0, 0, 0]) + 0.05 * rng.standard_normal((20, 3)))
    b = _unit(np.array([0, 1.0, 0]) + 0.05 * rng.standard_normal((20, 3)))
    bottom = np.concatenate([a, b])
    top = _unit([[1, 0, 0], [0, 1, 0]])
    intra, inter = chnsw_links([bottom, top], m=4)
    assert all(nb < 20 for i in range(20) for nb in intra[0][i])  # the two halves of layer 0 are not linked
    q = _unit([[0.1, 1, 0.05]])[0]
    stuck = search_layer(q, bottom, intra[0], [0], ef=5)  # entered in the wrong half: never leaves it
    assert all(i < 20 for i in stuck)
    found = hierarchical_search(q, [bottom, top], intra, inter, k=5)
    exact = [int(i) for i in np.lexsort((np.arange(40), -(bottom @ q)))[:5]]
    assert found[1] == [1, 0] and found[0] == exact
    # a layer small enough is scanned, not walked: exact whatever its links
    scanned = hierarchical_search(q, [bottom, top], [[[] for _ in bottom], [[], []]], inter, k=5, scan_max=40)
    assert scanned[0] == exact and scanned[1] == [1, 0]


def test_an_archrag_index_builds_searches_top_down_and_updates(small_corpus, tmp_path):
    import json
    import shutil

    from typer.testing import CliRunner

    from flows.cli import app
    from flows.pipeline import build_index, update_index
    from schemas.config import load_config
    from schemas.tables import SNAPSHOT_TABLES
    from tasks.index.validate import validate_tables
    from tasks.methods.registry import relation_kinds
    from tasks.store.catalog import Catalog
    from tests.conftest import SMALL

    cfg = load_config(overrides={"index": {"method": "archrag"}, "chunking": SMALL["chunking"], "extract": {"batch_size": 4},
                                 "dask": {"processes": False}})
    corpus = tmp_path / "corpus"
    shutil.copytree(small_corpus, corpus)
    res = build_index(str(corpus), Catalog(tmp_path / "index"), cfg)
    assert res.status == "published"
    runner = CliRunner()
    data = json.loads(runner.invoke(app, ["inspect", "--index", str(tmp_path / "index"), "--json"]).stdout)
    assert data["method"] == "archrag" and data["problems"] == []
    built = [l for l in data["layers"] if l["stop_reason"] is None]
    assert built and data["communities"]
    n_entities = data["tables"]["entities"]
    assert data["relations_by_kind"]["chnsw"] >= n_entities  # every node links to its nearest of its layer ...
    assert data["relations_by_kind"]["chnsw_down"] == n_entities - built[0]["n_entities"]  # ... and above 0, down
    per_layer = {n["layer"]: n for n in data["nodes"]}
    assert sum(n["nodes"] for n in data["nodes"]) == n_entities and per_layer[0]["chnsw_down"] == 0
    assert all(n["chnsw"] >= n["nodes"] for n in data["nodes"] if n["nodes"] > 1)  # each node links within its layer
    assert all(n["chnsw_down"] == n["nodes"] for layer, n in per_layer.items() if layer > 0)  # and, above 0, down
    assert sum(n["chnsw"] for n in data["nodes"]) == data["relations_by_kind"]["chnsw"]
    # fixed shares: the method's level shows even where its items only repeat the sources (by value they get nothing)
    query = ["query", "Who was Scrooge's clerk?", "--index", str(tmp_path / "index"), "--set", "retrieval.level_budget=shares"]
    out = runner.invoke(app, [*query, "--json"])
    assert out.exit_code == 0, out.output
    answer = json.loads(out.stdout)
    assert answer["mode"] == "archrag" and answer["entities"] and answer["chunks"]
    out = runner.invoke(app, [*query, "--answer"])
    assert out.exit_code == 0 and out.stdout.strip() == answer["answer"]["text"], out.output  # the answer alone
    assert "Bob Cratchit" in out.stdout and len(out.stdout.split()) <= 60 + 2 * 3  # two sentences, their sources
    (corpus / "notes" / "fezziwig.md").write_text(
        "# Fezziwig\n\nOld Fezziwig was the merchant to whom young Ebenezer Scrooge was apprenticed.\n", encoding="utf-8")
    (corpus / "carol_2.txt").unlink()
    assert update_index(str(corpus), Catalog(tmp_path / "index"), cfg).status == "published"
    cat = Catalog(tmp_path / "index")
    snap = cat.require_snapshot()
    tables = {n: cat.read(n, snap=snap) for n in SNAPSHOT_TABLES}
    assert validate_tables(tables, snap["dim"], relation_kinds=relation_kinds()).success


def test_with_an_llm_the_map_step_drops_useless_pieces_and_orders_the_rest():
    from schemas.prompts import DEFAULT_PROMPTS, PromptSet
    from tasks.query.answer import answer
    from tasks.retrieval.context import Context

    calls, seen = [], {}
    MAP_VERSION = DEFAULT_PROMPTS["archrag_filter"].version

    class Client:
        prompts = PromptSet()

        async def complete(self, messages, prompt_version, json_mode=False, parse=None):
            calls.append(prompt_version)
            if prompt_version == MAP_VERSION:
                assert "1. - Bob" in messages[1]["content"] and "3. - [Firm]" in messages[1]["content"]
                return parse('{"scores": [9, 1, 6, 8]}')
            seen["context"] = messages[1]["content"]
            return "Scrooge employed Bob."

    ctx = Context("Who employed Bob?", "archrag", 1,
                  entities=[{"text": "- Bob (person): a clerk"}, {"text": "- Fog (concept): weather"}],
                  communities=[{"text": "- [Firm] Scrooge and Marley"}],
                  bridge=[{"text": "- Scrooge — Bob: Scrooge employed Bob"}],
                  chunks=[{"text": "Bob worked for Scrooge."}])
    out = answer(ctx, Client())
    assert out == {"kind": "llm", "text": "Scrooge employed Bob."} and calls == [MAP_VERSION, "answer/1"]
    assert "Fog" not in seen["context"] and "Bob (person)" in seen["context"] and "[Firm]" in seen["context"]

    class Broken(Client):
        async def complete(self, messages, prompt_version, json_mode=False, parse=None):
            if prompt_version == MAP_VERSION:
                return parse('{"scores": [1]}')
            return "An answer."

    kept = answer(ctx, Broken())
    assert kept["text"] == "An answer." and "archrag context refinement failed" in kept["note"]
