"""A model per LLM stage (``[llm.<stage>]``) and the run's hard cost cap (``llm.max_cost_usd``, ``--max-cost``),
against local OpenAI-compatible servers (``tests.fake_llm_server``)."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from flows.cli import app
from schemas.config import LLMConfig, load_config
from tasks.errors import CostCapReached
from tasks.runtime.llm_cost import CostCap
from tasks.store.catalog import Catalog
from tests.fake_llm_server import FakeLLM

SMALL = ["--set", "chunking.size=300", "--set", "chunking.overlap=30", "--set", "dask.processes=false",
         "--set", "llm.backoff_base_s=0.05"]


def test_a_stage_inherits_the_llm_model_runs_offline_or_names_its_own():
    cfg = LLMConfig(model="openai/base", api_base="http://base/v1", api_key="sk-base", input_cost_per_mtok=1.0,
                    extraction={"model": "offline"},
                    reports={"model": "anthropic/strong", "output_cost_per_mtok": 9.0},
                    answers={"api_base": "http://answers/v1"})
    assert cfg.stage("extraction") is None
    summaries = cfg.stage("summaries")
    assert summaries is not None and (summaries.model, summaries.api_base) == ("openai/base", "http://base/v1")
    assert summaries.api_key is not None and summaries.input_cost_per_mtok == 1.0
    reports = cfg.stage("reports")  # its own model: not the [llm] endpoint, key or prices
    assert reports is not None and (reports.model, reports.api_base, reports.api_key) == ("anthropic/strong", "", None)
    assert (reports.input_cost_per_mtok, reports.output_cost_per_mtok) == (None, 9.0)
    answers = cfg.stage("answers")
    assert answers is not None and (answers.model, answers.api_base) == ("openai/base", "http://answers/v1")
    assert LLMConfig().stage("reports") is None  # offline by default
    assert LLMConfig(reports={"model": "openai/only-reports"}).stage("reports") is not None
    # every stage's subsection round-trips through TOML and the environment
    env = {"STRATA_LLM__REPORTS__MODEL": "openai/r", "STRATA_LLM__EXTRACTION__MODEL": "offline"}
    loaded = load_config(environ=env)
    assert loaded.llm.stage("reports").model == "openai/r" and loaded.llm.stage("extraction") is None


def test_the_cap_never_lets_spending_pass_it():
    cap = CostCap(1.0, spent_usd=0.25)
    cap.reserve(0.5)
    with pytest.raises(CostCapReached):
        cap.reserve(0.3)  # 0.25 spent + 0.5 in flight + 0.3 > 1.0: not sent
    cap.settle(0.5, 0.1)  # the call cost less than its worst case: the rest is free again
    cap.reserve(0.6)
    assert cap.spent == pytest.approx(0.35) and cap.reserved == pytest.approx(0.6) and cap.refused == 1


AUDITORS = "You write concise, factual reports about communities of a knowledge graph, for auditors. JSON only."


def test_offline_extraction_with_llm_summaries_and_reports_each_on_its_own_endpoint(tmp_path, small_corpus,
                                                                                     monkeypatch):
    """GraphRAG's "fast" mix: offline entities, LLM summaries on one server, LLM reports on another."""
    summaries, reports = FakeLLM().start(), FakeLLM().start()
    try:
        monkeypatch.setenv("OPENAI_API_KEY", "sk-fake")
        index, corpus = tmp_path / "index", tmp_path / "corpus"
        shutil.copytree(small_corpus, corpus)
        mix = [
            "--set", "llm.model=openai/fake-reports", "--set", f"llm.api_base={reports.url}",
            "--set", "llm.extraction.model=offline",
            "--set", "llm.summaries.model=openai/fake-summaries", "--set", f"llm.summaries.api_base={summaries.url}",
            "--set", f"llm.prompts.report.system={AUDITORS}",  # a prompt replaced from the config, on every worker
        ]
        # the estimate of this mix scales the model's stages by the offline graph it finds: the build's own
        est = estimate("index", corpus, index, [*SMALL, *mix])
        assert [s["basis"] for s in est["stages"]] == ["default, per entity"] * 2 and not summaries.systems
        res = CliRunner().invoke(app, ["index", str(corpus), "--index", str(index), "--quiet", *SMALL, *mix])
        assert res.exit_code == 0, res.output
        assert reports.systems and all(s == AUDITORS for s in reports.systems)
        assert summaries.systems and all("into a hierarchy" in s for s in summaries.systems)
        cat = Catalog(index)
        layer0 = [e for e in cat.read("entities").to_pylist() if e["layer"] == 0]
        assert layer0 and not any("appears in the text" in e["description"] for e in layer0)  # spaCy's, not the LLM's
        assert est["entities"] == len(layer0)
        assert any(e["name"].startswith("Theme of ") for e in cat.read("entities").to_pylist() if e["layer"] > 0)
        assert any(r["title"].startswith("Community of ") for r in cat.read("community_reports").to_pylist())
        # the run says which stage used which model, and what each stage's calls were
        run = cat.runs()[-1]
        stages = json.loads(run["stage_counts"])
        assert stages["reports"]["llm_calls"] == len(reports.systems)
        assert stages["hierarchy"]["llm_calls"] == len(summaries.systems) and stages["extract"].get("llm_calls", 0) == 0
        assert run["llm_calls"] == len(reports.systems) + len(summaries.systems)
        res = CliRunner().invoke(app, ["inspect", "--index", str(index), "--json"])
        models = json.loads(res.output)["runs"][-1]["llm"]
        assert models == {"extraction": "offline", "summaries": "openai/fake-summaries",
                          "reports": "openai/fake-reports", "answers": "openai/fake-reports"}
        # an update's estimate walks the update's rules on the index with the offline extractor's own mentions
        (corpus / "harbour.md").write_text(
            "# Harbour\n\nThe harbour master Ingrid Dahl of Tromsø Port Authority met Captain Olav Berg of the "
            "Nordlys Line in Bergen to discuss the new ferry route to Svalbard with Scrooge and Marley.\n")
        est = estimate("update", corpus, index, [*SMALL, *mix])
        assert {s["stage"]: s["basis"] for s in est["stages"]} == {"summaries": "walked on the index",
                                                                  "reports": "walked on the index"}
        asked = len(summaries.systems), len(reports.systems)
        res = CliRunner().invoke(app, ["update", str(corpus), "--index", str(index), "--quiet", *SMALL, *mix])
        assert res.exit_code == 0, res.output
        assert stage_of(est, "summaries")["calls"] == len(summaries.systems) - asked[0] > 0
        assert stage_of(est, "reports")["calls"] == len(reports.systems) - asked[1] > 0
        # the same documents from a new root and one more: each one new beside its old copy, and what an entity says
        # unchanged but where the new one says more
        moved = tmp_path / "moved"
        shutil.copytree(corpus, moved)
        (moved / "fjord.md").write_text(
            "# Fjord\n\nCaptain Olav Berg of the Nordlys Line sailed from Bergen to Svalbard with Ingrid Dahl.\n")
        est = estimate("update", moved, index, [*SMALL, *mix])
        asked = len(summaries.systems), len(reports.systems)
        res = CliRunner().invoke(app, ["update", str(moved), "--index", str(index), "--quiet", *SMALL, *mix])
        assert res.exit_code == 0, res.output
        assert stage_of(est, "summaries")["calls"] == len(summaries.systems) - asked[0] > 0
        assert stage_of(est, "reports")["calls"] == len(reports.systems) - asked[1]
        paid = json.loads(Catalog(index).runs()[-1]["stage_counts"])["attach"]["llm_prompt_tokens"]
        assert abs(stage_of(est, "summaries")["input_tokens"] / paid - 1) <= 0.15  # the changed members as folded
    finally:
        summaries.stop()
        reports.stop()


def test_a_capped_update_stops_before_the_cap_and_a_higher_cap_resumes_without_paying_twice(tmp_path, small_corpus,
                                                                                              monkeypatch):
    fake = FakeLLM().start()
    try:
        monkeypatch.setenv("OPENAI_API_KEY", "sk-fake")
        corpus = tmp_path / "corpus"
        shutil.copytree(small_corpus, corpus)
        sets = [*SMALL, "--set", "llm.model=openai/fake", "--set", f"llm.api_base={fake.url}",
                "--set", "llm.input_cost_per_mtok=1000", "--set", "llm.output_cost_per_mtok=1000",
                "--set", "llm.max_tokens=400", "--set", "llm.max_concurrency=4"]
        index = tmp_path / "index"
        res = CliRunner().invoke(app, ["index", str(corpus), "--index", str(index), "--quiet", *sets])
        assert res.exit_code == 0, res.output
        cat = Catalog(index)
        built = cat.snapshot()["version"]
        for i in range(4):  # new documents for the update to extract
            (corpus / f"new_{i}.md").write_text(
                f"# Harbour {i}\n\nThe harbour master Ingrid Dahl{i} of Tromsø Port Authority met Captain Olav "
                f"Berg{i} of the Nordlys Line in Bergen to discuss the new ferry route to Svalbard.\n")
        before = estimate("update", corpus, index, sets)
        assert estimate("update", corpus, index, sets) == before  # the same figures twice
        assert Catalog(index).runs()[-1]["version"] == built  # an estimate runs nothing: no run, no snapshot
        extraction = stage_of(before, "extraction")
        assert extraction["calls"] >= 8 and extraction["cached"] == 0 and before["documents"] == 4
        assert {r["stage"] for r in before["stages"]} == {"extraction", "summaries", "reports"}
        asked_before = len(fake.answered)
        res = CliRunner().invoke(app, ["update", str(corpus), "--index", str(index), "--quiet", *sets,
                                       "--max-cost", "0.9"])
        assert res.exit_code == 5, res.output
        assert "cost cap" in res.output and "nothing was published" in res.output
        cat = Catalog(index)
        assert cat.snapshot()["version"] == built  # the previous snapshot is still the published one
        failed = cat.runs()[-1]
        assert failed["status"] == "failed" and 0 < failed["llm_cost_usd"] <= 0.9
        first = set(fake.answered[asked_before:])
        assert first
        rest = estimate("update", corpus, index, sets)  # what the capped run paid for is cached: the remainder
        assert stage_of(rest, "extraction")["cached"] > 0
        systems_before = len(fake.systems)
        res = CliRunner().invoke(app, ["update", str(corpus), "--index", str(index), "--quiet", *sets,
                                       "--max-cost", "1000"])
        assert res.exit_code == 0, res.output
        second = fake.answered[asked_before + len(first):]
        assert second and not first & set(second)  # no answer paid for twice
        assert Catalog(index).snapshot()["version"] == built + 1
        extracted = sum("knowledge graph from text" in s for s in fake.systems[systems_before:])
        assert stage_of(rest, "extraction")["calls"] == extracted  # counted at the server
        run = json.loads(Catalog(index).runs()[-1]["stage_counts"])["extract"]
        if extracted:
            assert stage_of(rest, "extraction")["input_tokens"] == pytest.approx(run["llm_prompt_tokens"], rel=0.15)
        assert estimate("update", corpus, index, sets)["stages"] == []  # nothing left to do
    finally:
        fake.stop()


def estimate(command: str, corpus, index, sets: list[str]) -> dict:
    res = CliRunner().invoke(app, [command, str(corpus), "--index", str(index), *sets, "--estimate", "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output[res.output.index("{"):])


def stage_of(est: dict, stage: str) -> dict:
    return next(r for r in est["stages"] if r["stage"] == stage)


def test_eval_scores_the_answer_models_answers_by_exact_match_and_f1(tmp_path, small_corpus, monkeypatch):
    """`strata eval` with an answer model on the local server: its answers are scored against known answers (the
    server's answer to every question is the same sentence)."""
    index, dataset = tmp_path / "index", tmp_path / "dataset"
    res = CliRunner().invoke(app, ["index", str(small_corpus), "--index", str(index), "--quiet", *SMALL])
    assert res.exit_code == 0, res.output
    dataset.mkdir()
    questions = [
        {"id": "q1", "question": "Who was Scrooge's partner?", "answer": "An answer drawn from the context."},
        {"id": "q2", "question": "Who was Scrooge's clerk?", "answer": "an answer", "answer_aliases": ["Bob"]},
        {"id": "q3", "question": "Who is Fezziwig?", "answer": "Bob Cratchit"},
    ]
    (dataset / "queries.jsonl").write_text("\n".join(json.dumps(q) for q in questions))
    fake = FakeLLM().start()
    try:
        monkeypatch.setenv("OPENAI_API_KEY", "sk-fake")
        res = CliRunner().invoke(app, [
            "eval", "--dataset", str(dataset), "--index", str(index), "--modes", "ppr", "--modes", "naive", "--json",
            "--set", "llm.model=openai/fake", "--set", f"llm.api_base={fake.url}",
            "--set", "llm.extraction.model=offline"])
        assert res.exit_code == 0, res.output
    finally:
        fake.stop()
    modes = {m["mode"]: m for m in json.loads(res.output[res.output.index("{"):])["modes"]}
    # normalised, the server says "answer drawn from context": q1 exact; q2's "answer" is one of those four words
    # (P 1/4, R 1/1); q3 nothing in common
    f1 = (1.0 + 2 * 0.25 * 1.0 / 1.25 + 0.0) / 3
    for m in ("ppr", "naive"):
        assert modes[m]["exact_match"] == pytest.approx(1 / 3) and modes[m]["f1"] == pytest.approx(f1)
    assert modes["ppr"]["f1_vs_naive"]["ties"] == 3


def test_the_estimate_counts_extraction_prompts_and_what_the_cache_answers(tmp_path):
    """Two chunks naming two and three things, nothing cached: an entity and a relation call each, the prompts
    counted as sent (the relation prompt with a line per thing named), answers of a model's length per entity and
    relation; the first chunk's entity answer cached with one entity (no relation pass follows): the second's two."""
    from schemas.prompts import PromptSet
    from tasks.index.estimate_names import names_in
    from tasks.index.extract_llm import entity_messages, relation_messages
    from tasks.index.llm_estimate import extraction_estimate, prompt_tokens
    from tasks.runtime.llm_client import ResponseCache, cache_key

    llm = LLMConfig(model="openai/fake", input_cost_per_mtok=1.0, output_cost_per_mtok=2.0)
    texts = ["Marley was dead, to begin with. Scrooge signed it.",
             "Scrooge's name was good upon 'Change, and Bob Cratchit knew it."]
    assert [len(names_in(t)) for t in texts] == [2, 3]
    est = extraction_estimate([texts], llm, 0, None)
    assert (est.calls, est.cached) == (4, 0)
    said = PromptSet()
    prompts = sum(prompt_tokens(llm.model, entity_messages(t, said))
                  + prompt_tokens(llm.model, relation_messages(t, [], said)) for t in texts)
    assert est.input_tokens == prompts + (2 + 3) * 8
    assert est.output_tokens == (2 * 45 + 40) + (3 * 45 + 2 * 40)
    assert est.cost_usd == pytest.approx((est.input_tokens + 2 * est.output_tokens) / 1e6)
    cache = ResponseCache(tmp_path / "llm_cache.sqlite")
    params = {"temperature": 0.0, "max_tokens": 2000, "response_format": {"type": "json_object"}}
    key = cache_key(llm.model, entity_messages(texts[0], said), params, said["extract_entities"].version)
    cache.put(key, json.dumps({"entities": [{"name": "Marley", "type": "person", "description": "Dead."}]}))
    rest = extraction_estimate([texts], llm, 0, cache)
    assert (rest.calls, rest.cached) == (2, 1)
    assert rest.input_tokens == extraction_estimate([texts[1:]], llm, 0, None).input_tokens


def test_the_estimate_learns_a_stage_from_the_index_s_last_run_of_its_kind():
    from tasks.index.llm_estimate import DEFAULT_RATIOS, learned_ratios, stage_ratios

    def run(version: int, stages: dict) -> dict:
        return {"status": "published", "version": version, "stage_counts": json.dumps(stages)}

    build = {"chunk": {"tokens": 1000}, "hierarchy": {"llm_calls": 4, "llm_prompt_tokens": 800,
                                                      "llm_completion_tokens": 80}}
    update = {"diff": {}, "chunk": {"tokens": 100}, "attach": {"llm_calls": 2, "llm_prompt_tokens": 300,
                                                              "llm_completion_tokens": 60},
              "reports": {"llm_calls": 5, "llm_prompt_tokens": 1000, "llm_completion_tokens": 100}}
    runs = [run(1, build), run(2, update)]
    learned = learned_ratios(runs, "build")
    assert set(learned) == {"summaries"}
    assert (learned["summaries"].calls, learned["summaries"].prompt, learned["summaries"].output) == (0.004, 0.8, 0.1)
    assert learned["summaries"].basis == "learned from run v1"
    upd = learned_ratios(runs, "update")
    assert (upd["summaries"].prompt, upd["reports"].prompt, upd["reports"].calls) == (3.0, 10.0, 0.05)
    assert stage_ratios("reports", "nlp", "build", learned) == DEFAULT_RATIOS["reports/nlp/build"]  # none recorded


def test_the_estimate_learns_a_stage_only_from_a_run_with_its_settings():
    """A run that sent every community to the model (``min_members`` 0) says nothing of one that sends only the
    large ones: its reports' ratios are not learned; its summaries' are where their settings did not change."""
    from schemas.config import StrataConfig
    from tasks.index.llm_estimate import learned_ratios

    before = StrataConfig.model_validate({"llm": {"model": "openai/m"}}).fingerprint()
    now = StrataConfig.model_validate({"llm": {"model": "openai/m", "reports": {"min_members": 10}}}).fingerprint()
    stages = {"chunk": {"tokens": 1000}, "hierarchy": {"llm_calls": 4, "llm_prompt_tokens": 800},
              "reports": {"llm_calls": 5, "llm_prompt_tokens": 1000, "llm_completion_tokens": 100}}
    runs = [{"status": "published", "version": 1, "stage_counts": json.dumps(stages),
             "parameters": json.dumps({"config": before})}]
    assert set(learned_ratios(runs, "build", before)) == {"summaries", "reports"}
    assert set(learned_ratios(runs, "build", now)) == {"summaries"}
    other_model = StrataConfig.model_validate({"llm": {"model": "openai/other"}}).fingerprint()
    assert learned_ratios(runs, "build", other_model) == {}  # both stages inherit the [llm] model


def test_a_stated_ratio_grows_with_the_names_and_a_packed_graph_falls_back_to_the_model_s():
    """Per name at ``at`` names, times (N / at) ** grow: a larger graph's deeper hierarchy lists its members again."""
    from schemas.llm import LLMConfig
    from tasks.index.llm_estimate import DEFAULT_RATIOS, Ratios, scaled_estimate, stage_ratios

    llm = LLMConfig(model="openai/m", input_cost_per_mtok=1.0, output_cost_per_mtok=2.0)
    ratios = Ratios(0.1, 10.0, 0.5, "default", "name", at=100, grow=0.5)
    grown = scaled_estimate("summaries", llm, {"name": 400}, ratios)  # (400 / 100) ** 0.5 = 2 per name
    assert (grown.calls, grown.input_tokens, grown.output_tokens) == (80, 8000, 4000)
    assert scaled_estimate("summaries", llm, {"name": 100}, ratios).input_tokens == 1000
    assert stage_ratios("reports", "packed", "build", {}) is DEFAULT_RATIOS["reports/packed/build"]
    assert stage_ratios("reports", "packed", "update", {}) is DEFAULT_RATIOS["reports/llm/update"]


def test_the_estimate_of_a_build_with_min_members_counts_only_the_large_communities():
    """``min_members`` K: a build's stated ratios (every community sent) become about c · N / K calls of p tokens
    each (``llm_estimate.SENT``); K between the measured points is interpolated in log K; an update, and ratios
    learned from a run with the same settings, are left as they are."""
    from schemas.llm import LLMConfig
    from tasks.index.llm_estimate import DEFAULT_RATIOS, Ratios, scaled_estimate, sent_per_entity

    llm = LLMConfig(model="openai/m", input_cost_per_mtok=1.0, output_cost_per_mtok=2.0)
    units = {"entity": 2000}
    ratios = DEFAULT_RATIOS["reports/nlp/build"]  # 0.290 calls and 229.1 prompt tokens an entity
    every = scaled_estimate("reports", llm, units, ratios)
    assert (every.calls, every.input_tokens) == (580, 458200)
    top = scaled_estimate("reports", llm, units, ratios, min_members=100)
    assert (top.calls, top.input_tokens) == (7, 7 * 1547)  # 0.345 · 2000 / 100 calls of 1,547 tokens
    assert top.output_tokens == round(7 * 1547 * ratios.output) and top.basis.endswith("of 100+ members")
    ten = scaled_estimate("reports", llm, units, ratios, min_members=10)
    assert (ten.calls, ten.input_tokens) == (140, 140 * 1174)
    c, p = sent_per_entity("reports", 10**1.5)  # halfway between 10 and 100 in log K
    assert (round(c, 4), round(p, 1)) == (0.5225, 1360.5)
    assert sent_per_entity("summaries", 1000) == sent_per_entity("summaries", 100)  # held outside
    update = scaled_estimate("reports", llm, units, DEFAULT_RATIOS["reports/nlp/update"], 100, kind="update")
    assert update.calls == round(2000 * DEFAULT_RATIOS["reports/nlp/update"].calls)
    learned = Ratios(0.01, 50.0, 0.5, "learned from run v1", "entity")
    assert scaled_estimate("reports", llm, units, learned, min_members=100).calls == 20
