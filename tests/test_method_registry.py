"""An index method is added in one place: a fourth, minimal method registered in one line is built, queried and
inspected like the built-in ones, and everything that lists methods, modes or relation kinds sees it."""

from __future__ import annotations

import json

import numpy as np
from typer.testing import CliRunner

from flows.cli import app
from flows.pipeline import build_index
from schemas.config import load_config
from tasks.methods.base import BuildLayer0, Hierarchy
from tasks.methods.registry import all_methods, all_modes, get_method, index_modes, register, relation_kinds
from tasks.retrieval.context import fill, top_k
from tasks.store.catalog import Catalog
from tasks.store.rows import relation_table
from tests.conftest import SMALL


class NearestOnly:
    """Nothing above layer 0; its mode adds the entities nearest the question to the graph-ranked sources, and
    it links each entity to its nearest other one (a relation kind of its own)."""

    name = "nearest"
    modes = {"nearest": ("entities",)}
    relation_kinds = ("nearest_to",)
    reads_parts = vectors_by_id = False  # handed layer 0 whole, every vector
    whole_bytes_per_entity = 0  # not stated: not checked

    def build(self, ctx, layer0: BuildLayer0) -> Hierarchy:
        vecs = layer0.vectors
        sims = vecs @ vecs.T - 2 * np.eye(len(vecs), dtype=np.float32)
        links = [{"id": f"near-{e['id']}", "source_id": e["id"], "target_id": layer0.entities[int(j)]["id"],
                  "kind": "nearest_to", "description": "", "weight": float(sims[i, j]), "source_chunk_ids": []}
                 for i, (e, j) in enumerate(zip(layer0.entities, sims.argmax(axis=1)))]
        empty = np.zeros((0, vecs.shape[1]), np.float32)
        return Hierarchy([], empty, relation_table(links), [], [], empty, [])

    update = build

    def levels(self, view, ctx, scores, budgets, cfg) -> None:
        items = [{"id": view.ent_ids[i], "score": float(scores[i]), "text": f"- {view.ent_name[i]}: {view.ent_desc[i]}"}
                 for i in top_k(scores, cfg.top_n)]
        ctx.entities, ctx.tokens["entities"] = fill(items, budgets["entities"])

    def refine(self, ctx, client):
        return ctx


def test_a_fourth_method_registered_in_one_line_builds_queries_and_inspects(small_corpus, tmp_path, monkeypatch):
    from tasks.methods import registry

    all_methods()  # the built-in ones loaded; the fourth leaves with the test
    monkeypatch.setattr(registry, "_METHODS", dict(registry._METHODS))
    register(NearestOnly())  # the one line

    assert get_method("nearest").name == "nearest" and "nearest" in all_modes()
    assert index_modes("nearest") == ("nearest", "ppr", "hybrid", "naive")
    assert "nearest_to" in relation_kinds()
    index = tmp_path / "index"
    cfg = load_config(overrides={**SMALL, "index": {"method": "nearest"}, "dask": {"processes": False}})
    build_index(str(small_corpus), Catalog(index), cfg)  # validation accepts its relation kind

    runner = CliRunner()
    # fixed shares: the method's level shows even where its items only repeat the sources (by value they get nothing)
    query = ["query", "Who was Scrooge's clerk?", "--index", str(index), "--json", "--set", "retrieval.level_budget=shares"]
    res = runner.invoke(app, query)
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["mode"] == "nearest" and data["entities"] and data["chunks"]
    res = runner.invoke(app, ["inspect", "--index", str(index), "--json"])
    info = json.loads(res.output)
    assert res.exit_code == 0 and info["method"] == "nearest"
    assert info["relations_by_kind"]["nearest_to"] == info["tables"]["entities"]
    assert info["nodes"][0]["nearest_to"] == info["tables"]["entities"]  # counted per layer, as ArchRAG's links
    assert runner.invoke(app, ["validate", "--index", str(index)]).exit_code == 0


def test_a_method_handed_layer_0_whole_is_refused_before_its_build_where_it_cannot_fit(small_corpus, tmp_path,
                                                                                         monkeypatch):
    """``check_whole_memory``: entities × the method's stated bytes against 80 % of the machine; in a run, the
    build is refused before its hierarchy starts (exit 5), nothing published."""
    import pytest

    from tasks.errors import TooLargeForTask, exit_code
    from tasks.methods.base import check_whole_memory
    from tasks.runtime import process

    archrag = get_method("archrag")
    assert archrag.whole_bytes_per_entity > 0 and get_method("hygrag").whole_bytes_per_entity > 0
    room = 1000 * archrag.whole_bytes_per_entity  # 80 %: room for 800 entities
    check_whole_memory(archrag, 800, room)  # what fits goes ahead
    with pytest.raises(TooLargeForTask, match="its 801 entities need") as refused:
        check_whole_memory(archrag, 801, room)
    assert exit_code(refused.value) == 5 and 'index.method = "hirag"' in str(refused.value)
    check_whole_memory(get_method("hirag"), 10**9, 1)  # hirag is never handed layer 0 whole: no bound here

    monkeypatch.setattr(process, "machine_memory", lambda: 10 * archrag.whole_bytes_per_entity)
    index = tmp_path / "index"
    cfg = load_config(overrides={**SMALL, "index": {"method": "archrag"}})
    with pytest.raises(TooLargeForTask, match="the archrag method builds its hierarchy"):
        build_index(str(small_corpus), Catalog(index), cfg)
    assert Catalog(index).snapshot() is None  # refused before anything was published
    runs = Catalog(index).runs()
    assert runs and runs[-1]["status"] != "published" and "hierarchy" not in json.loads(runs[-1]["stage_counts"])
