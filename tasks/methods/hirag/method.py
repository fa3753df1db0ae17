"""HiRAG (HiRAG §4): GMM summary layers stopped by the cluster-sparsity rule, Leiden communities over all
layers and bottom-up reports; updates attach new entities HyGRAG-style and refresh only touched paths."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pyarrow as pa

from tasks.methods.base import BuildLayer0, Hierarchy, MethodContext, UpdateLayer0
from tasks.methods.common import (
    attach_stage,
    entity_rows,
    fallbacks,
    rewrite_reports,
    summarizer_for,
    summary_pairs,
    update_graph,
    write_reports,
)
from tasks.store.rows import plain_rows, relation_table
from tasks.store.workfs import join


class HiRAG:
    name = "hirag"
    #: retrieval modes and the sections each adds to the shared graph-ranked sources
    modes = {
        "hi": ("entities", "communities", "bridge"),
        "hi-nobridge": ("entities", "communities"),
        "flat": ("entities", "communities", "bridge"),
    }
    relation_kinds: tuple[str, ...] = ()
    reads_parts = True  # a build's layer 0 stays in parts (``graph_parts``): the pipeline does not read it whole
    whole_bytes_per_entity = 0  # never handed layer 0 whole (its communities' bound: ``graph_parts.check_task_memory``)
    vectors_by_id = True  # an update reads the vectors of the layer-0 entities it needs (``UpdateLayer0.vectors_of``)

    def refine(self, ctx, client):
        return ctx

    def levels(self, view, ctx, scores: np.ndarray, budgets: dict[str, int], cfg) -> None:
        """HiRetrieval's local, global and bridge sections (``flat``: over layer 0 only)."""
        from tasks.methods.hirag.retrieval import fill_levels

        fill_levels(view, ctx, scores, budgets, cfg)

    def build(self, ctx: MethodContext, layer0: BuildLayer0) -> Hierarchy:
        """A build over layer 0's parts: layer 1 (every layer-0 entity clustered and summarised), Leiden and the
        reports are tasks on the run's cluster that read the parts; this process holds the summary entities."""
        from tasks.methods.graph_parts import find_communities, hierarchy_on_cluster, with_above

        cfg, parts = ctx.cfg, layer0.entity_parts
        assert parts is not None, "a build's layer 0 is in parts (flows.merge_steps.merge)"
        with ctx.stage("hierarchy") as st:
            per_cluster = cfg.hierarchy.summaries_per_cluster
            summarizer = summarizer_for(ctx, per_cluster)
            detail: dict[str, int] = {}
            ents, vecs, rels, layers = st.run(
                hierarchy_on_cluster, ctx, parts, summarizer, per_cluster, lambda _s: st.advance(1), detail
            )
            built = [r for r in layers if not r["stopped"]]
            st.done(
                f"{len(built)} layers, {len(ents)} summary entities, "
                f"stop: {layers[-1]['stop_reason'] if layers else 'disabled'}",
                layers=len(built),
                summary_entities=len(ents),
                **detail,
            )
        # a build's relations stay spilled, the summary_of links too (360k at 100k chunks: ~80 MB as Arrow): Leiden
        # and the reports are tasks on the cluster that read them
        relations = with_above(layer0.relations, rels, join(ctx.spill_dir, "relations-above.parquet"), ctx.version)
        with ctx.stage("communities") as st:
            ids = pa.chunked_array([*parts.column("id").chunks, pa.array([e["id"] for e in ents], pa.string())])
            communities = st.run(find_communities, ctx, ids, relations)  # spilled, as the relations are
            levels = len(set(communities.column("level").to_pylist()))
            st.done(f"{communities.num_rows} communities", communities=communities.num_rows, levels=levels)
            del ids
        reports, report_vecs, failures = write_reports(ctx, communities, ents, relations, parts)
        return Hierarchy(
            ents, vecs, rels, communities, reports, report_vecs, layers, fallbacks(summarizer, failures), relations
        )

    def update(self, ctx: MethodContext, layer0: UpdateLayer0) -> Hierarchy:
        from tasks.methods.hirag.hierarchy import restate_layers
        from tasks.methods.hirag.placement import place_in_communities, reports_to_rewrite

        cfg = ctx.cfg
        att, summarizer = attach_stage(ctx, layer0)
        # the summary links as a table from here on (358k at 100k chunks: 254 MB as rows, 45 MB as a table)
        links = relation_table(att.relations)
        att = replace(att, relations=[])
        layer_of = layer0.layer_of(att.entities)
        made = update_graph(layer0, links)  # with the snapshot's kept rows, the graph after the update
        with ctx.stage("communities") as st:
            comms, grown, forced = st.run(
                place_in_communities,
                plain_rows(ctx.previous("communities")),
                set(layer_of),
                made,  # every relation of an added entity is one this update made
                layer0.added,
            )
            st.done(f"{len(comms)} communities, {len(grown)} grown", communities=len(comms), grown=len(grown))
        reports, report_vecs, failures = rewrite_reports(
            ctx,
            comms,
            lambda ids: entity_rows(ctx, layer0, att.entities, ids),
            made,
            layer0.relation_change.values,
            lambda old: reports_to_rewrite(comms, old, grown, forced, cfg.incremental.refresh_staleness),
        )
        layers = restate_layers(
            plain_rows(ctx.previous("layers")),
            layer_of,
            summary_pairs(links),
        )
        return Hierarchy(
            att.entities,
            att.vectors,
            links,
            comms,
            reports,
            report_vecs,
            layers,
            fallbacks(summarizer, failures),
        )
