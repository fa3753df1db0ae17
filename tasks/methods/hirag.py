"""HiRAG (HiRAG §4): GMM summary layers stopped by the cluster-sparsity rule, Leiden communities over all
layers and bottom-up reports; updates attach new entities HyGRAG-style and refresh only touched paths."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tasks.catalog import plain_rows, relation_table, vector_matrix
from tasks.ids import quarantine_row
from tasks.methods import Hierarchy, Layer0, MethodContext

SUMMARY_FALLBACK = "LLM summary unusable, offline summary used: "
REPORT_FALLBACK = "LLM report unusable, offline report used: "


def summarizer_for(ctx: MethodContext, per_cluster: int, **llm_prompt: Any):
    """The offline summariser, or the LLM one (``llm_prompt``: its ``prompt`` and ``prompt_version``)."""
    from tasks.summarize import LLMSummarizer, OfflineSummarizer

    cfg = ctx.cfg
    if ctx.llm is not None:
        return LLMSummarizer(ctx.llm, cfg.hierarchy.meta_entities, per_cluster, cfg.extract.max_description_tokens,
                             **llm_prompt)
    return OfflineSummarizer(cfg.hierarchy.meta_entities, cfg.extract.max_description_tokens)


def _failed(failures: list[dict[str, str]], stage: str, why: str) -> list[dict[str, str]]:
    return [quarantine_row(f["item"], stage, why + f["error"]) for f in failures]


def _report_vectors(ctx: MethodContext, st, reports: list[dict[str, Any]]) -> np.ndarray:
    from tasks.embed import report_text

    return st.run(ctx.embed, [report_text(r["title"], r["summary"]) for r in reports])


class HiRAG:
    name = "hirag"
    #: retrieval modes and the sections each adds to the shared graph-ranked sources
    modes = {"hi": ("entities", "communities", "bridge"), "hi-nobridge": ("entities", "communities"),
             "flat": ("entities", "communities", "bridge")}

    def levels(self, view, ctx, scores: np.ndarray, budgets: dict[str, int], cfg) -> None:
        """HiRetrieval's local, global and bridge sections (``flat``: over layer 0 only)."""
        from tasks.methods.hirag_retrieval import fill_levels

        fill_levels(view, ctx, scores, budgets, cfg)

    def build(self, ctx: MethodContext, layer0: Layer0) -> Hierarchy:
        from tasks.communities import detect_communities
        from tasks.hierarchy import build_hierarchy, stat_rows
        from tasks.reports import build_reports

        cfg = ctx.cfg
        with ctx.stage("hierarchy") as st:
            summarizer = summarizer_for(ctx, cfg.hierarchy.summaries_per_cluster)
            ents, vecs, rels, stats = st.run(build_hierarchy, layer0.entities, layer0.vectors, cfg.hierarchy, cfg.seed,
                                             summarizer, ctx.embed, on_layer=lambda _s: st.advance(1))
            layers = stat_rows(stats)
            built = [r for r in layers if not r["stopped"]]
            st.done(f"{len(built)} layers, {len(ents)} summary entities, "
                    f"stop: {layers[-1]['stop_reason'] if layers else 'disabled'}", layers=len(built), summary_entities=len(ents))
        entities, relations = layer0.entities + ents, pa.concat_tables([layer0.relations, relation_table(rels)])
        with ctx.stage("communities") as st:
            communities = st.run(detect_communities, [e["id"] for e in entities], relations,
                                 cfg.communities.max_cluster_size, cfg.seed, cfg.communities.resolution)
            st.done(f"{len(communities)} communities", communities=len(communities),
                    levels=len({c["level"] for c in communities}))
        with ctx.stage("reports", len(communities)) as st:
            reports, failures = st.run(build_reports, communities, entities, relations,
                                       cfg.communities.report_max_tokens, ctx.llm)
            report_vecs = _report_vectors(ctx, st, reports)
            st.advance(len(reports))
            st.done(f"{len(reports)} reports", reports=len(reports))
        return Hierarchy(ents, vecs, rels, communities, reports, report_vecs, layers,
                         _failed(summarizer.failures, "hierarchy", SUMMARY_FALLBACK) + _failed(failures, "reports", REPORT_FALLBACK))

    def update(self, ctx: MethodContext, layer0: Layer0) -> Hierarchy:
        from tasks.hierarchy import restate_layers
        from tasks.incremental import place_in_communities, reports_to_rewrite

        cfg = ctx.cfg
        att, summarizer = attach_stage(ctx, layer0)
        entities = layer0.entities + att.entities
        relations = pa.concat_tables([layer0.relations, relation_table(att.relations)])
        with ctx.stage("communities") as st:
            comms, grown, forced = st.run(place_in_communities, plain_rows(ctx.previous("communities")),
                                          {e["id"] for e in entities}, relations, layer0.added)
            st.done(f"{len(comms)} communities, {len(grown)} grown", communities=len(comms), grown=len(grown))
        reports, report_vecs, failures = rewrite_reports(
            ctx, comms, entities, relations,
            lambda old: reports_to_rewrite(comms, old, grown, forced, cfg.incremental.refresh_staleness))
        layers = restate_layers(plain_rows(ctx.previous("layers")), {e["id"]: e["layer"] for e in entities},
                                [(r["source_id"], r["target_id"]) for r in att.relations if r["kind"] == "summary_of"])
        return Hierarchy(att.entities, att.vectors, att.relations, comms, reports, report_vecs, layers,
                         _failed(summarizer.failures, "hierarchy", SUMMARY_FALLBACK) + _failed(failures, "reports", REPORT_FALLBACK))


def attach_stage(ctx: MethodContext, layer0: Layer0, **llm_prompt: Any):
    """HyGRAG attachment (stage ``attach``): new layer-0 entities join the summary nodes they are closest to
    (τ), the summaries on touched paths are rewritten. Returns the ``AttachResult`` and the summarizer used."""
    from tasks.embed import entity_text
    from tasks.incremental import attach
    from tasks.summarize import Cluster

    cfg = ctx.cfg
    with ctx.stage("attach") as st:
        summarizer = summarizer_for(ctx, 1, **llm_prompt)

        def summarize(layer, member_lists, vecs):
            return [s[0] for s in summarizer.summarize_layer(layer, [Cluster(m, v) for m, v in zip(member_lists, vecs)])]

        def embed_rows(rows):
            return ctx.embed([entity_text(r["name"], r["type"], r["description"]) for r in rows])

        old = ctx.previous("entities")
        upper = np.flatnonzero(np.asarray(old.column("layer").to_pylist()) > 0)
        summaries = plain_rows(old.take(upper))
        vectors = dict(zip([e["id"] for e in layer0.entities], layer0.vectors))
        vectors.update(zip([s["id"] for s in summaries], vector_matrix(old.take(upper))))
        previous = ctx.previous("relations")
        links = plain_rows(previous.filter(pc.equal(previous.column("kind"), "summary_of")))
        att = st.run(attach, layer0.entities, summaries, links, vectors, layer0.added, layer0.removed,
                     layer0.changed, cfg.incremental.tau, summarize, embed_rows, cfg.incremental.refresh_staleness)
        st.done(f"{len(att.attached)} attached, {len(att.refreshed)} summaries refreshed", attached=len(att.attached),
                refreshed=len(att.refreshed), dropped=len(att.removed), summary_operations=att.operations)
    return att, summarizer


def rewrite_reports(ctx: MethodContext, comms: list[dict[str, Any]], entities: list[dict[str, Any]], relations: pa.Table,
                    decide: Callable[[dict[str, dict[str, Any]]], tuple[set[str], dict[str, float]]]):
    """Stage ``reports`` of an update: ``decide(previous reports by community id)`` names the communities whose
    report is written again and the staleness of the others, which are kept. Returns (reports, their vectors,
    LLM failures)."""
    from tasks.reports import build_reports

    with ctx.stage("reports") as st:
        previous = ctx.previous("community_reports")
        old_reports = {r["community_id"]: r for r in plain_rows(previous)}
        rewrite, staleness = decide(old_reports)
        old_vectors = dict(zip(previous.column("community_id").to_pylist(), vector_matrix(previous)))
        existing = {cid: dict(r, staleness=staleness.get(cid, r.get("staleness")))
                    for cid, r in old_reports.items() if cid not in rewrite}
        reports, failures = st.run(build_reports, comms, entities, relations, ctx.cfg.communities.report_max_tokens,
                                   ctx.llm, rewrite, existing)
        redo = [r for r in reports if r["community_id"] in rewrite]
        fresh = dict(zip([r["community_id"] for r in redo], _report_vectors(ctx, st, redo)))
        dim = previous.schema.field("vector").type.list_size
        report_vecs = (np.stack([fresh.get(r["community_id"], old_vectors.get(r["community_id"])) for r in reports])
                       if reports else np.zeros((0, dim), np.float32))
        st.done(f"{len(redo)} reports rewritten", reports_rewritten=len(redo))
    return reports, report_vecs, failures
