"""Evaluation measures on hand-made views and contexts (no index, no model)."""

from __future__ import annotations

import csv
import json
from types import SimpleNamespace

import numpy as np
import pytest
from typer.testing import CliRunner

from tasks.query.evaluate import (
    ModeResult,
    exact_match,
    paired_bootstrap,
    ranked_passages,
    recall_at_k,
    retrieved_passages,
    token_f1,
)


def make_view():
    """p1: one document of two chunks; p2, p3, p4: one chunk each; p5: two documents of one chunk each."""
    chunk_doc = ["d1", "d1", "d2", "d3", "d4", "d5a", "d5b"]
    chunk_ids = ["c1a", "c1b", "c2", "c3", "c4", "c5a", "c5b"]
    return SimpleNamespace(
        chunk_ids=chunk_ids, chunk_doc=chunk_doc, chunk_index={c: i for i, c in enumerate(chunk_ids)},
        doc_source={"d1": "p1", "d2": "p2", "d3": "p3", "d4": "p4", "d5a": "p5", "d5b": "p5"},
    )


def chunk(cid: str, view, truncated: bool = False) -> dict:
    item = {"id": cid, "source_id": view.doc_source[view.chunk_doc[view.chunk_index[cid]]], "text": cid}
    return item | {"truncated": True} if truncated else item


def test_paired_bootstrap_counts_and_mean():
    r = paired_bootstrap(np.array([1, 1, 0.5, 0]), np.array([0.5, 1, 0.5, 0.5]))
    assert (r["wins"], r["losses"], r["ties"], r["n"]) == (1, 1, 2, 4)
    assert r["mean_diff"] == 0.0
    assert r["ci_low"] <= 0.0 <= r["ci_high"] and r["ci_low"] >= -0.5 and r["ci_high"] <= 0.5
    assert paired_bootstrap(np.array([1, 1, 0.5, 0]), np.array([0.5, 1, 0.5, 0.5])) == r  # seeded


def test_paired_bootstrap_constant_difference_and_empty():
    r = paired_bootstrap(np.full(7, 1.0), np.full(7, 0.5))
    assert (r["mean_diff"], r["ci_low"], r["ci_high"]) == (0.5, 0.5, 0.5)
    assert (r["wins"], r["losses"], r["ties"]) == (7, 0, 0)
    empty = paired_bootstrap(np.array([]), np.array([]))
    assert empty["n"] == 0 and np.isnan(empty["mean_diff"])


def test_retrieved_passages_needs_whole_untruncated_passages():
    view = make_view()
    ctx = SimpleNamespace(chunks=[chunk("c1a", view), chunk("c2", view), chunk("c3", view, truncated=True),
                                  chunk("c4", view), chunk("c5a", view)])
    # p1 lacks c1b, p3 is cut, p5 lacks its second document's chunk
    assert retrieved_passages(ctx, view) == {"p2", "p4"}
    ctx.chunks += [chunk("c1b", view), chunk("c5b", view)]
    assert retrieved_passages(ctx, view) == {"p1", "p2", "p4", "p5"}


def test_retrieved_passages_cache_follows_the_view():
    a, b = make_view(), make_view()
    b.chunk_doc = b.chunk_doc[:1] + b.chunk_doc[2:]  # in b, p1 has a single chunk
    b.chunk_index = {c: i for i, c in enumerate(["c1a", "c2", "c3", "c4", "c5a", "c5b"])}
    ctx = SimpleNamespace(chunks=[{"id": "c1a", "source_id": "p1", "text": ""}])
    assert retrieved_passages(ctx, a) == set()
    assert retrieved_passages(ctx, b) == {"p1"}
    assert retrieved_passages(ctx, a) == set()


def test_recall_at_k_uses_distinct_passages_in_rank_order():
    view = make_view()
    # ranking: p1, p1 (again), p3, unknown chunk, p5, p2, p4
    ctx = SimpleNamespace(chunks=[], ranked_chunk_ids=["c1b", "c1a", "c3", "zz", "c5b", "c2", "c4"])
    ranked = ranked_passages(ctx, view, 10)
    assert ranked == ["p1", "p3", "p5", "p2", "p4"]
    assert ranked_passages(ctx, view, 2) == ["p1", "p3"]
    supporting = ["p2", "p3"]
    assert recall_at_k(supporting, ranked, 2) == 0.5
    assert recall_at_k(supporting, ranked, 5) == 1.0
    assert np.isnan(recall_at_k([], ranked, 5))


def test_recall_at_k_falls_back_to_context_order():
    view = make_view()
    ctx = SimpleNamespace(chunks=[chunk("c4", view), chunk("c2", view, truncated=True), chunk("c1a", view)], ranked_chunk_ids=[])
    assert ranked_passages(ctx, view, 10) == ["p4", "p2", "p1"]
    assert recall_at_k(["p1"], ranked_passages(ctx, view, 10), 2) == 0.0


def _result(mode: str, budget: int, recall: float, vs_naive=None) -> ModeResult:
    return ModeResult(mode=mode, token_budget=budget, n_queries=2, passage_recall=recall, recall_at_2=0.5,
                      recall_at_5=0.75, recall_at_10=1.0, answer_in_context=0.5, answer_in_extractive=0.5, n_answerable=2,
                      mean_context_tokens=900.0, latency_p50_ms=1.0, latency_p95_ms=2.0, vs_naive=vs_naive)


def test_eval_cli_rejects_small_budget(tmp_path):
    from flows.cli import app

    r = CliRunner().invoke(app, ["eval", "-d", str(tmp_path), "-i", str(tmp_path / "idx"), "-b", "1000", "-b", "50"])
    assert r.exit_code == 2
    assert "at least 100 tokens" in r.output


def test_eval_cli_writes_every_budget(tmp_path, monkeypatch):
    """The command with evaluate() and the index stubbed: files, results.json shape and the tables."""
    from rich.console import Console

    import flows.cli.evaluate
    import tasks.query.evaluate
    import tasks.query.reader
    import tasks.store.catalog
    from flows.cli import app

    (tmp_path / "queries.jsonl").write_text(json.dumps({"id": "q1", "question": "?", "supporting_passage_ids": ["p1"]}))
    seen = {}

    def fake_evaluate(view, embed, queries, modes, cfg, budgets=None, client=None):
        seen["budgets"] = budgets
        vs = {"mean_diff": 0.052, "ci_low": 0.021, "ci_high": 0.083, "wins": 31, "losses": 9, "ties": 60, "n": 100}
        results = [_result(m, b, 0.8, None if m == "naive" else vs) for b in budgets for m in modes]
        rows = [{"mode": r.mode, "token_budget": r.token_budget, "query_id": "q1", "passage_recall": 1.0,
                 "recall_at_2": 1.0, "recall_at_5": 1.0, "recall_at_10": 1.0} for r in results]
        return results, rows

    catalog = SimpleNamespace(snapshot=lambda: {}, root=None, uri="mem://x")
    view = SimpleNamespace(version=3, dim=4, method="hirag")
    monkeypatch.setattr(tasks.query.evaluate, "evaluate", fake_evaluate)
    monkeypatch.setattr(tasks.store.catalog, "Catalog", lambda uri, **_k: catalog)
    monkeypatch.setattr(tasks.query.reader, "open_reader", lambda *a, **k: tasks.query.reader.Reader(
        None, catalog, view, SimpleNamespace(embed=None), None))
    monkeypatch.setattr(flows.cli.evaluate, "out", Console(width=250))  # one line per table row
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["eval", "-d", str(tmp_path), "-i", "mem://x", "-m", "hi", "-m", "naive",
                                 "-b", "1000", "-b", "4000", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert seen["budgets"] == [1000, 4000]
    summary = json.loads((out / "results.json").read_text())
    assert summary["token_budget"] == 1000 and [m["mode"] for m in summary["modes"]] == ["hi", "naive"]
    assert [b["token_budget"] for b in summary["budgets"]] == [1000, 4000]
    assert summary["modes"][0]["vs_naive"]["wins"] == 31 and summary["modes"][1]["vs_naive"] is None
    with (out / "per_query.csv").open() as fh:
        header = next(csv.reader(fh))
    assert {"token_budget", "recall_at_2", "recall_at_5", "recall_at_10"} <= set(header)
    assert (out / "recall-1000.png").is_file() and (out / "recall-4000.png").is_file()
    assert "budget 1000 tokens" in r.output and "budget 4000 tokens" in r.output
    assert "+0.052 [+0.021, +0.083]" in r.output and "31/9" in r.output


@pytest.mark.parametrize("budgets", [None, [500]])
def test_evaluate_budgets_and_vs_naive(monkeypatch, budgets):
    """evaluate() with retrieve() stubbed: one result per (budget, mode), naive pairing, row fields."""
    import tasks.query.evaluate as ev

    view = make_view()
    # naive finds p2 whole; "hi" finds p1 whole at budgets >= 1000 and only half of it below
    def fake_retrieve(view_, question, vec, mode, cfg):
        if mode == "naive":
            chunks = [chunk("c2", view)]
        else:
            chunks = [chunk("c1a", view)] + ([chunk("c1b", view)] if cfg.token_budget >= 1000 else [])
        from tasks.retrieval.context import Context

        chunks = [dict(c, text=f"{c['id']}: the city they named is Paris.") for c in chunks]
        return Context(question=question, mode=mode, version=1, chunks=chunks, tokens={"chunks": 10 * len(chunks)},
                       query_vector=vec)

    monkeypatch.setattr(ev, "retrieve", fake_retrieve)
    from schemas.config import RetrievalConfig

    cfg = RetrievalConfig(token_budget=2000)
    queries = [{"id": "q1", "question": "Which city?", "answer": "Paris", "supporting_passage_ids": ["p1"]},
               {"id": "q2", "question": "b", "supporting_passage_ids": ["p1", "p2"]},
               {"id": "q3", "question": "c", "supporting_passage_ids": []}]
    results, rows = ev.evaluate(view, lambda texts: np.ones((len(texts), 4)), queries, ["hi", "naive"], cfg, budgets)
    expect_budget = 2000 if budgets is None else 500
    assert [(r.mode, r.token_budget) for r in results] == [("hi", expect_budget), ("naive", expect_budget)]
    hi, naive = results
    assert naive.vs_naive is None and hi.vs_naive["n"] == 2
    if budgets is None:  # hi: [1, 0.5] vs naive [0, 0.5]
        assert (hi.passage_recall, naive.passage_recall) == (0.75, 0.25)
        assert (hi.vs_naive["wins"], hi.vs_naive["ties"], hi.vs_naive["mean_diff"]) == (1, 1, 0.5)
    else:  # hi has only half of p1: recall 0, but its ranking still starts with p1
        assert hi.passage_recall == 0.0 and hi.recall_at_2 == 0.75
        assert hi.vs_naive["losses"] == 1
    assert hi.answer_in_context == 1.0 and hi.n_answerable == 1
    assert hi.answer_in_extractive == 1.0  # the source sentence, which names Paris
    assert {r["token_budget"] for r in rows} == {expect_budget} and len(rows) == 6
    assert np.isnan(rows[2]["passage_recall"]) and np.isnan(rows[2]["recall_at_5"])


def test_exact_match_and_token_f1_as_squad_computes_them():
    assert exact_match("The Eiffel Tower!", ["Eiffel tower"]) == 1.0  # case, article and punctuation aside
    assert exact_match("Eiffel Tower in Paris", ["Eiffel Tower"]) == 0.0
    assert token_f1("Eiffel Tower in Paris", ["Eiffel Tower"]) == pytest.approx(2 * 0.5 * 1.0 / 1.5)  # P 2/4, R 2/2
    assert token_f1("Paris", ["London", "Paris, France"]) == pytest.approx(2 * 1.0 * 0.5 / 1.5)  # the best alias
    assert token_f1("", ["Paris"]) == 0.0 and token_f1("the", ["Paris"]) == 0.0


def test_evaluate_scores_the_answer_models_answers(monkeypatch):
    """With an answer model, each mode's generated answers get exact match and F1, and F1 its paired interval."""
    import tasks.query.evaluate as ev
    from schemas.config import RetrievalConfig
    from schemas.prompts import PromptSet
    from tasks.retrieval.context import Context

    view = make_view()
    monkeypatch.setattr(ev, "retrieve", lambda view_, q, vec, mode, cfg: Context(
        question=q, mode=mode, version=1, chunks=[dict(chunk("c2", view), text="Paris is in France.")],
        tokens={"chunks": 5}, query_vector=vec))

    class Model:  # answers like a model that reads "hi" contexts well and "naive" ones badly
        prompts = PromptSet()

        async def complete(self, messages, prompt_version, **kw):
            return "Paris" if "mode hi" in messages[-1]["content"] else "the city of Paris, France"

    monkeypatch.setattr(Context, "text", lambda self: f"mode {self.mode}")
    queries = [{"id": "q1", "question": "Which city?", "answer": "Paris", "supporting_passage_ids": ["p2"]},
               {"id": "q2", "question": "No answer given", "supporting_passage_ids": ["p2"]}]
    results, rows = ev.evaluate(view, lambda t: np.ones((len(t), 4)), queries, ["hi", "naive"],
                                RetrievalConfig(), [1000], client=Model())
    hi, naive = results
    assert (hi.exact_match, hi.f1) == (1.0, 1.0)
    assert naive.exact_match == 0.0 and naive.f1 == pytest.approx(2 * (1 / 4) * 1.0 / (1 / 4 + 1.0))
    assert hi.f1_vs_naive["n"] == 1 and hi.f1_vs_naive["wins"] == 1 and naive.f1_vs_naive is None
    assert [r.get("answer") for r in rows] == ["Paris", None, "the city of Paris, France", None]
    offline, _ = ev.evaluate(view, lambda t: np.ones((len(t), 4)), queries, ["hi"], RetrievalConfig(), [1000])
    assert np.isnan(offline[0].f1) and offline[0].f1_vs_naive is None  # no answer model: not measured


def test_several_values_after_one_flag():
    from flows.cli import spread_multi_values

    assert spread_multi_values(["eval", "-d", "x", "--budgets", "1000", "4000", "--modes", "hi", "naive", "--json"]) == [
        "eval", "-d", "x", "--budgets", "1000", "--budgets", "4000", "--modes", "hi", "--modes", "naive", "--json"]
    assert spread_multi_values(["query", "who?", "--mode", "hi"]) == ["query", "who?", "--mode", "hi"]


def test_query_input_errors_exit_2_with_one_line(tmp_path):
    from typer.testing import CliRunner

    from flows.cli import app

    index = str(tmp_path / "none")
    for args, says in ((["query", "   ", "--index", index], "the question is empty"),
                       (["query", "Who?", "--index", index, "--mode", "fast"], "unknown mode 'fast'"),
                       (["query", "Who?", "--index", index, "--set", "retrieval.token_budget=50"], "token_budget")):
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2 and says in res.output, res.output
