"""An update's summaries and reports estimated by walking HiRAG's update rules on the index (``--estimate``), on a
hand-made snapshot whose rewrites are worked out by hand below."""

from __future__ import annotations

from typing import cast

import numpy as np
import pyarrow as pa

from schemas.config import StrataConfig
from schemas.llm import LLMConfig
from schemas.prompts import PromptSet
from tasks.index.estimate_names import model_mentions, named, names_in
from tasks.index.llm_estimate import CountingClient, StageEstimate, prompt_tokens
from tasks.methods.base import MethodContext
from tasks.methods.summarize import summary_prompt
from tasks.methods.update_estimate import layer0_delta, walk_reports, walk_summaries
from tasks.runtime.llm import run_sync
from tasks.runtime.llm_client import ResponseCache, cache_key, request_params
from tasks.store.ids import entity_id, relation_id

LLM = LLMConfig(model="openai/fake")


def _entity(key: str, layer: int, vector: list[float], staleness: float = 0.0) -> dict:
    eid = entity_id(0, key) if layer == 0 else f"summary-{key}"
    return {"id": eid, "name": key.title(), "type": "person", "description": f"{key.title()} is a sailor.",
            "layer": layer, "staleness": staleness, "degree": 1, "vector": vector}


class Snapshot:
    """The two reads a method context offers, over hand-made tables."""

    def __init__(self, tables: dict[str, list[dict]]):
        self.tables = tables

    def previous(self, name, columns=None, where=None):
        rows = self.tables[name]
        if where == "layer > 0":
            rows = [r for r in rows if r["layer"] > 0]
        elif where == "kind = 'summary_of'":
            rows = [r for r in rows if r["kind"] == "summary_of"]
        return pa.Table.from_pylist(rows)

    def previous_in(self, name, column, values, columns=None, also=None):
        rows = [r for r in self.tables[name] if r[column] in values or (also and r[also] in values)]
        table = pa.Table.from_pylist(rows) if rows else pa.table({c: pa.array([], pa.string()) for c in columns})
        return table.select(list(columns)) if columns else table


def snapshot() -> Snapshot:
    """Summary A over five sailors (a1..a5), summary B over twenty (b1..b20); community CA holds A and its members,
    CB B and its; every member relates to the next in its group."""
    a, b = [1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]
    small = [_entity(f"a{i}", 0, a) for i in range(1, 6)]
    large = [_entity(f"b{i}", 0, b) for i in range(1, 21)]
    tops = [_entity("A", 1, a), _entity("B", 1, b)]
    links = [{"id": relation_id(e["id"], top["id"], "summary_of"), "source_id": e["id"], "target_id": top["id"],
              "kind": "summary_of", "description": "", "weight": 1.0, "label": None, "label_from": None}
             for group, top in ((small, tops[0]), (large, tops[1])) for e in group]
    chains = [{"id": relation_id(x["id"], y["id"], "extracted"), "source_id": x["id"], "target_id": y["id"],
               "kind": "extracted", "description": f"{x['name']} sails with {y['name']}.", "weight": 1.0,
               "label": "sails with", "label_from": "verb"}
              for group in (small, large) for x, y in zip(group, group[1:])]
    comms = [{"id": cid, "level": 0, "parent_id": None, "entity_ids": [e["id"] for e in group], "size": len(group)}
             for cid, group in (("CA", [*small, tops[0]]), ("CB", [*large, tops[1]]))]
    reports = [{"community_id": c["id"], "id": f"r-{c['id']}", "level": 0, "title": c["id"], "summary": "Sailors.",
                "rating": 5.0, "rating_reason": "", "findings": [], "full_text": "", "staleness": 0.0}
               for c in comms]
    return Snapshot({"entities": small + large + tops, "relations": links + chains, "communities": comms,
                     "community_reports": reports})


def walked(mentions: list[list[tuple[str, str, str]]], cache=None) -> tuple[StageEstimate, StageEstimate]:
    ctx, cfg = cast(MethodContext, snapshot()), StrataConfig()  # the walk reads only ``previous``, ``previous_in``
    delta = layer0_delta(ctx, mentions, cfg.extract.max_description_tokens)
    summaries, reports = StageEstimate("summaries", LLM.model), StageEstimate("reports", LLM.model)
    # an added sailor's vector is summary A's: it joins A (cosine 1 ≥ τ)
    attached = walk_summaries(ctx, delta, lambda texts: np.tile([1.0, 0.0, 0.0, 0.0], (len(texts), 1)),
                              CountingClient(LLM, cache, summaries, 0.1), cfg)
    walk_reports(ctx, delta, attached, CountingClient(LLM, None, reports, 0.5), cfg)
    return summaries, reports


def test_the_walk_rewrites_what_the_staleness_rule_rewrites():
    # b3 changed: 1 of B's 20 members (0.05 < refresh_staleness 0.1): B keeps its summary; no member added to a
    # community, none lost: no report rewritten
    summaries, reports = walked([[("b3", "B3", "B3 sailed again.")]])
    assert (summaries.calls, reports.calls, summaries.input_tokens) == (0, 0, 0)
    # a2 changed, Nora and Zed added (their vectors are A's): A's members change by 3 of 7 (0.43): A is rewritten,
    # one prompt listing its seven members; both join CA, Nora through a2 and A, Zed — related to Nora, new too —
    # through A, the summary he joined (2 of 8): CA's report is rewritten, in one prompt
    mentions = [[("a2", "A2", "A2 met Nora."), ("nora", "Nora", "A2 met Nora."), ("zed", "Zed", "Nora hailed Zed.")]]
    summaries, reports = walked(mentions)
    assert (summaries.calls, reports.calls) == (1, 1)
    members = [r for r in snapshot().tables["entities"] if r["id"] in {entity_id(0, f"a{i}") for i in range(1, 6)}]
    members = [{**r, "description": "A2 is a sailor. A2 met Nora."} if r["name"] == "A2" else r for r in members]
    added = [{"id": entity_id(0, key), "name": name, "type": "concept", "description": said}
             for key, name, said in mentions[0][1:]]
    cfg = StrataConfig()
    asked = summary_prompt([*members, *added], cfg.hierarchy.meta_entities, 1, cfg.extract.max_description_tokens,
                           PromptSet(LLM.prompts))
    # A's members as the walk lists them: a2's description with the sentence the new chunk says of it, as the merge
    # folds it
    assert summaries.input_tokens == prompt_tokens(LLM.model, asked)
    assert summaries.output_tokens == round(summaries.input_tokens * 0.1)
    assert reports.input_tokens > 0 and reports.output_tokens == round(reports.input_tokens * 0.5)
    # joined to no summary, Zed relates to no community: one of his own, with a report of its own
    ctx, alone = cast(MethodContext, snapshot()), StageEstimate("reports", LLM.model)
    walk_reports(ctx, layer0_delta(ctx, mentions, cfg.extract.max_description_tokens), {}, CountingClient(LLM, None, alone, 0.5), cfg)
    assert alone.calls == 2


def test_a_held_entity_changes_only_where_the_merge_folds_something_new_into_its_description():
    ctx, a2 = cast(MethodContext, snapshot()), entity_id(0, "a2")
    # what it already says (the same document from a new root): unchanged, nothing to rewrite
    assert layer0_delta(ctx, [[("a2", "A2", "a2 is  a sailor.")]], 100).changed == set()
    # the new chunks after the held ones: a new sentence within the budget is folded in after those held
    delta = layer0_delta(ctx, [[("a2", "A2", "A2 is a sailor."), ("a2", "A2", "A2 met Nora.")]], 100, first=False)
    assert delta.changed == {a2} and delta.rows[0]["description"] == "A2 is a sailor. A2 met Nora."
    # "A2 is a sailor." is 6 tokens, "Hi." 2: a sentence past the budget is not kept, and nothing after it either
    assert layer0_delta(ctx, [[("a2", "A2", "A2 met Nora."), ("a2", "A2", "Hi.")]], 8, first=False).changed == set()
    after = layer0_delta(ctx, [[("a2", "A2", "Hi."), ("a2", "A2", "A2 met Nora.")]], 8, first=False)
    assert after.rows[0]["description"] == "A2 is a sailor. Hi."
    # the new chunks possibly first in corpus order: a new sentence opens the description, the held ones make room
    before = layer0_delta(ctx, [[("a2", "A2", "A2 met Nora.")]], 8)
    assert before.changed == {a2} and before.rows[0]["description"] == "A2 met Nora. A2…"


def test_a_prompt_the_cache_answers_is_counted_as_cached(tmp_path):
    cache = ResponseCache(tmp_path / "llm_cache.sqlite")
    messages = [{"role": "user", "content": "Summarise these sailors."}]
    version = PromptSet(LLM.prompts)["summary"].version
    cache.put(cache_key(LLM.model, messages, request_params(LLM, json_mode=True), version), '{"ok": true}')
    est = StageEstimate("summaries", LLM.model)
    client = CountingClient(LLM, cache, est, 0.1)
    for asked in (messages, [{"role": "user", "content": "Summarise these whalers."}]):
        try:
            run_sync(client.complete(asked, prompt_version=version, json_mode=True))
        except Exception as exc:  # noqa: BLE001 - an estimate answers nothing: the caller falls back
            assert "estimate" in str(exc)
    assert (est.cached, est.calls) == (1, 1)


def test_a_model_s_mentions_are_the_names_in_order_with_their_sentence():
    text = "Captain Olav Berg met Ingrid Dahl in Bergen. The ferry left for Svalbard."
    assert model_mentions(text) == [
        # "Captain" opens the sentence and is capitalised nowhere else: dropped from the head of the run
        ("olav berg", "Olav Berg", "Captain Olav Berg met Ingrid Dahl in Bergen."),
        ("ingrid dahl", "Ingrid Dahl", "Captain Olav Berg met Ingrid Dahl in Bergen."),
        ("bergen", "Bergen", "Captain Olav Berg met Ingrid Dahl in Bergen."),
        ("svalbard", "Svalbard", "The ferry left for Svalbard."),
    ]
    # a word capitalised only where a sentence or an item opens is no name, nor a single letter; one capitalised
    # inside a sentence elsewhere is, an acronym too
    text = "While Scrooge slept, Marley came. Scrooge woke. Please read the LLM notes of plan B for the Royal Navy.\n"
    text += "- Adding one."
    assert named(text) == ["Scrooge", "Marley", "LLM", "Royal Navy"]
    assert names_in(text) >= {"while scrooge", "please", "adding", "b"}  # the unit of the stated ratios counts all
