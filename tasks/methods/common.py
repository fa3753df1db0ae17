"""What the index methods share above layer 0: the summariser, the reports stage of a build and of an update,
the attachment stage of an update, and the summary trees (one community per summary node) that HyGRAG and
ArchRAG build and update alike."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import numpy as np
import pyarrow as pa

from schemas.tables import CommunityRow, QuarantineRow
from tasks.methods.base import Hierarchy, MethodContext, UpdateLayer0
from tasks.store.ids import make_id, quarantine_row
from tasks.store.rows import REPORT_COLUMNS, plain_rows, relation_table, vector_matrix
from tasks.store.spill import SpilledTable

SUMMARY_FALLBACK = "LLM summary unusable, offline summary used: "
REPORT_FALLBACK = "LLM report unusable, offline report used: "


def unit(x: np.ndarray) -> np.ndarray:
    """Rows scaled to length 1 (zero rows stay zero), float32."""
    x = np.asarray(x, dtype=np.float32).reshape(len(x), -1)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norms == 0, 1.0, norms)


def summarizer_for(ctx: MethodContext, per_cluster: int, **llm_prompt: Any):
    """The offline summariser, or the LLM one (``llm_prompt``: its ``prompt``, a name of ``CLUSTER_PROMPTS``)."""
    from tasks.methods.summarize import LLMSummarizer, OfflineSummarizer

    cfg = ctx.cfg
    client = ctx.llm_for("summaries")
    if client is not None:
        return LLMSummarizer(
            client,
            cfg.hierarchy.meta_entities,
            per_cluster,
            cfg.extract.max_description_tokens,
            min_members=cfg.llm.summaries.min_members,
            **llm_prompt,
        )
    return OfflineSummarizer(cfg.hierarchy.meta_entities, cfg.extract.max_description_tokens)


def fallbacks(summarizer: Any, report_failures: list[dict[str, str]]) -> list[QuarantineRow]:
    """Quarantine rows for LLM summaries and reports that fell back to the offline ones."""
    return [quarantine_row(f["item"], "hierarchy", SUMMARY_FALLBACK + f["error"]) for f in summarizer.failures] + [
        quarantine_row(f["item"], "reports", REPORT_FALLBACK + f["error"]) for f in report_failures
    ]


def report_vectors(ctx: MethodContext, st, reports: list[dict[str, Any]]) -> np.ndarray:
    from tasks.index.embed import report_text

    return st.run(ctx.embed, [report_text(r["title"], r["summary"]) for r in reports])


def write_reports(ctx: MethodContext, communities, entities: list[dict[str, Any]], relations, layer0=None):
    """Stage ``reports`` of a build: a report per community, and its vector. Returns (reports, their vectors,
    LLM failures). Over spilled ``relations`` (a build's, ``tasks.methods.graph_parts``) and spilled
    ``communities`` the reports are made by tasks over parts on the run's cluster (``report_parts``), which
    read ``layer0``'s entity parts (a ``SpilledTable``), when given: the entities are then those parts' and ``entities``; the reports then
    come back as the ``community_reports`` table's parts with their vectors (and no separate vectors)."""
    from tasks.methods.report_parts import reports_on_cluster
    from tasks.methods.reports import build_reports

    with ctx.stage(
        "reports", communities.num_rows if isinstance(communities, SpilledTable) else len(communities)
    ) as st:
        if isinstance(relations, SpilledTable):
            reports, failures = st.run(reports_on_cluster, ctx, communities, entities, relations, layer0, st.advance)
            vectors = np.zeros((0, 0), np.float32)
        else:
            reports, failures = st.run(
                build_reports,
                communities,
                entities,
                relations,
                ctx.cfg.communities.report_max_tokens,
                ctx.llm_for("reports"),
                min_members=ctx.cfg.llm.reports.min_members,
            )
            vectors = report_vectors(ctx, st, reports)
            st.advance(len(reports))
        n = reports.num_rows if isinstance(reports, SpilledTable) else len(reports)
        st.done(f"{n} reports", reports=n)
    return reports, vectors, failures


def summary_pairs(links: pa.Table) -> list[tuple[str, str]]:
    """The (member id, summary id) pairs of the ``summary_of`` rows of ``links`` (a relations table)."""
    import pyarrow.compute as pc

    of = links.filter(pc.equal(links.column("kind"), "summary_of"))
    return list(zip(of.column("source_id").to_pylist(), of.column("target_id").to_pylist()))


def update_graph(layer0: UpdateLayer0, above: list[dict[str, Any]] | pa.Table) -> pa.Table:
    """The relation rows an update made, whole (``REPORT_COLUMNS``): layer 0's recomputed ones
    (``UpdateLayer0.relation_change``) and the method's ``above``. The rest of the graph is the snapshot's, not read: an
    added entity's relations are all among these (``place_in_communities`` needs no others), and
    ``report_relations`` reads the kept ones among the members of the reports it rewrites."""
    mine = relation_table(above).select(REPORT_COLUMNS)
    made = layer0.relation_change.add.select(REPORT_COLUMNS).cast(mine.schema)
    return pa.concat_tables([made, mine])


def report_relations(ctx: MethodContext, made: pa.Table, replaced: list[str], members: set[str]) -> pa.Table:
    """The relations between ``members`` (of the communities whose report is rewritten), with their descriptions:
    those of ``made`` (``update_graph``), then the snapshot's extracted ones it keeps (all but ``replaced``: the
    ids of its rows the update removed or recomputed), read with the filter pushed down to the snapshot."""
    import pyarrow.compute as pc

    among = pa.array(sorted(members), pa.string())
    here = made.filter(
        pc.and_(
            pc.is_in(made.column("source_id"), value_set=among), pc.is_in(made.column("target_id"), value_set=among)
        )
    )
    there = ctx.previous_in("relations", "source_id", sorted(members), tuple(REPORT_COLUMNS), also="target_id")
    skip = pa.array(sorted(set(replaced) | set(here.column("id").to_pylist())), pa.string())
    there = there.filter(
        pc.and_(pc.equal(there.column("kind"), "extracted"), pc.invert(pc.is_in(there.column("id"), value_set=skip)))
    )
    return pa.concat_tables([here, there.cast(here.schema)])


def rewrite_reports(
    ctx: MethodContext,
    comms: list[CommunityRow],
    entities: Callable[[set[str]], list[dict[str, Any]]],
    made: pa.Table,
    replaced: list[str],
    decide: Callable[[dict[str, dict[str, Any]]], tuple[set[str], dict[str, float]]],
):
    """Stage ``reports`` of an update: ``decide(previous reports by community id)`` names the communities whose
    report is written again and the staleness of the others, which are kept. Returns (reports, their vectors,
    LLM failures). ``entities(ids)``: the rows of those entities (the members of the reports written);
    ``made`` and ``replaced``: ``report_relations``'."""
    from tasks.methods.reports import build_reports

    with ctx.stage("reports") as st:
        previous = ctx.previous("community_reports")
        old_reports = {r["community_id"]: r for r in plain_rows(previous)}
        rewrite, staleness = decide(old_reports)
        members = {m for c in comms if c["id"] in rewrite for m in c["entity_ids"]}
        relations = report_relations(ctx, made, replaced, members)
        old_vectors = dict(zip(previous.column("community_id").to_pylist(), vector_matrix(previous)))
        existing = {
            cid: dict(r, staleness=staleness.get(cid, r.get("staleness")))
            for cid, r in old_reports.items()
            if cid not in rewrite
        }
        written = {m for c in comms if c["id"] in rewrite or c["id"] not in existing for m in c["entity_ids"]}
        reports, failures = st.run(
            build_reports,
            comms,
            entities(written),
            relations,
            ctx.cfg.communities.report_max_tokens,
            ctx.llm_for("reports"),
            rewrite,
            existing,
            min_members=ctx.cfg.llm.reports.min_members,
        )
        redo = [r for r in reports if r["community_id"] in rewrite]
        fresh = dict(zip([r["community_id"] for r in redo], report_vectors(ctx, st, redo)))
        dim = previous.schema.field("vector").type.list_size
        # a report not rewritten is kept, and so is the vector the previous snapshot holds for it
        each = cast(
            "list[np.ndarray]", [fresh.get(r["community_id"], old_vectors.get(r["community_id"])) for r in reports]
        )
        vectors = np.stack(each) if reports else np.zeros((0, dim), np.float32)
        st.done(f"{len(redo)} reports rewritten", reports_rewritten=len(redo))
    return reports, vectors, failures


def entity_rows(
    ctx: MethodContext, layer0: UpdateLayer0, summaries: list[dict[str, Any]], ids: set[str]
) -> list[dict[str, Any]]:
    """The rows of entities ``ids`` after an update: layer 0's (``UpdateLayer0.rows_of``), then the summaries'."""
    return [*cast("list[dict[str, Any]]", layer0.rows_of(ctx, ids)), *(s for s in summaries if s["id"] in ids)]


def previous_rows(ctx: MethodContext, name: str, ids: list[str], columns: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """The previous snapshot's rows of table ``name`` with the given ids (``columns`` only), by id."""
    return {r["id"]: r for r in plain_rows(ctx.previous_in(name, "id", ids, columns))}


def attach_stage(ctx: MethodContext, layer0: UpdateLayer0, **llm_prompt: Any):
    """HyGRAG attachment (stage ``attach``): new layer-0 entities join the summary nodes they are closest to
    (τ), the summaries on touched paths are rewritten. Returns the ``AttachResult`` and the summarizer used."""
    from tasks.index.embed import entity_text
    from tasks.methods.attach import Change, Layer0Rows, Rewrite, attach
    from tasks.methods.summarize import Cluster

    cfg = ctx.cfg
    with ctx.stage("attach") as st:
        summarizer = summarizer_for(ctx, 1, **llm_prompt)

        def summarize(layer, member_lists, vecs):
            return [
                s[0] for s in summarizer.summarize_layer(layer, [Cluster(m, v) for m, v in zip(member_lists, vecs)])
            ]

        def embed_rows(rows):
            return ctx.embed([entity_text(r["name"], r["type"], r["description"]) for r in rows])

        upper = ctx.previous("entities", where="layer > 0")
        summaries = plain_rows(upper)
        # the summaries' vectors and those this run embedded; a re-summarised summary's other members' are read
        fresh = (
            layer0.fresh if layer0.fresh is not None else dict(zip([e["id"] for e in layer0.entities], layer0.vectors))
        )
        vectors = dict(fresh)
        vectors.update(zip([s["id"] for s in summaries], vector_matrix(upper)))
        links = plain_rows(ctx.previous("relations", where="kind = 'summary_of'"))
        before = previous_rows(ctx, "entities", sorted(layer0.removed | layer0.changed), ("id", "name", "description"))
        rows = Layer0Rows(
            cast("list[dict[str, Any]]", layer0.entities),
            vectors,
            layer0.kept,
            lambda ids: cast("list[dict[str, Any]]", layer0.rows_of(ctx, ids)),
            lambda ids: dict(zip(ids, layer0.vectors_of(ctx, ids))),
        )
        change = Change(layer0.added, layer0.removed, layer0.changed, before)
        rewrite = Rewrite(summarize, embed_rows, cfg.incremental.refresh_staleness)
        att = st.run(attach, rows, summaries, links, change, cfg.incremental.tau, rewrite)
        st.done(
            f"{len(att.attached)} attached, {len(att.refreshed)} summaries refreshed",
            attached=len(att.attached),
            refreshed=len(att.refreshed),
            dropped=len(att.removed),
            summary_operations=att.operations,
        )
    return att, summarizer


# ---------------------------------------------------------------------------- summary trees
def bucket_communities(summaries: list[dict[str, Any]], relations: list[dict[str, Any]]) -> list[CommunityRow]:
    """One community per summary node (its bucket): the summary first, then its members (the ``summary_of``
    sources), sized by its members and its chunks; its parent is the community of the summary above it. Levels
    count down from the top as for every community (the top layer's buckets are level 0)."""
    members: dict[str, list[str]] = {}
    above: dict[str, str] = {}
    for r in relations:
        if r["kind"] == "summary_of":
            members.setdefault(r["target_id"], []).append(r["source_id"])
            above[r["source_id"]] = r["target_id"]
    cid = {s["id"]: make_id("comm", "hygrag", s["layer"], s["id"]) for s in summaries}
    top = max((s["layer"] for s in summaries), default=0)
    return [
        {
            "id": cid[s["id"]],
            "level": top - s["layer"],
            "parent_id": cid.get(above.get(s["id"], "")),
            "entity_ids": [s["id"], *sorted(members.get(s["id"], []))],
            "size": len(members.get(s["id"], [])) + len(s["source_chunk_ids"] or []),
        }
        for s in summaries
    ]


def without_empty(
    summaries: list[dict[str, Any]], vectors: np.ndarray, links: list[dict[str, Any]], gone_chunks: set[str]
):
    """Summaries after an update without the chunks that went, and without those left with neither chunks nor
    members (then their links to the summaries above them go, which may empty those in turn)."""
    summaries = [
        dict(e, source_chunk_ids=[c for c in e["source_chunk_ids"] or [] if c not in gone_chunks]) for e in summaries
    ]
    while True:
        fed = {r["target_id"] for r in links}
        empty = {e["id"] for e in summaries if not e["source_chunk_ids"] and e["id"] not in fed}
        if not empty:
            break
        keep = [i for i, e in enumerate(summaries) if e["id"] not in empty]
        summaries, vectors = [summaries[i] for i in keep], vectors[keep]
        links = [r for r in links if r["source_id"] not in empty]
    return summaries, vectors, links


def update_tree(
    ctx: MethodContext,
    layer0: UpdateLayer0,
    llm_prompt: dict[str, Any],
    more_links: Callable[[list[dict[str, Any]], np.ndarray], list[dict[str, Any]]] | None = None,
) -> Hierarchy:
    """The update of a summary tree: HiRAG's attachment (new entities join the summary nodes they are closest to,
    touched summaries are rewritten), summaries left empty go, the communities are read again from the summaries
    and the reports of those that changed are rewritten. ``more_links(summaries, vectors)``: method relations
    computed again over the updated nodes (ArchRAG's C-HNSW)."""
    from tasks.methods.hirag.hierarchy import restate_layers

    att, summarizer = attach_stage(ctx, layer0, **llm_prompt)
    summaries, vectors, links = without_empty(att.entities, att.vectors, att.relations, layer0.gone_chunks)
    with ctx.stage("communities") as st:
        comms = bucket_communities(summaries, links)
        before = {c["id"]: c["entity_ids"] for c in plain_rows(ctx.previous("communities"))}
        changed = {
            c["id"] for c in comms if before.get(c["id"]) != c["entity_ids"] or c["entity_ids"][0] in att.refreshed
        }
        extra = more_links(summaries, vectors) if more_links else []
        st.done(
            f"{len(comms)} communities, {len(changed)} changed" + (f", {len(extra)} links recomputed" if extra else ""),
            communities=len(comms),
            grown=len(changed),
        )
    reports, vecs, failures = rewrite_reports(
        ctx,
        comms,
        lambda ids: entity_rows(ctx, layer0, summaries, ids),
        update_graph(layer0, links),
        layer0.relation_change.values,
        lambda old: (changed | (set(c["id"] for c in comms) - set(old)), {}),
    )
    layers = restate_layers(
        plain_rows(ctx.previous("layers")),
        layer0.layer_of(summaries),
        [(r["source_id"], r["target_id"]) for r in links if r["kind"] == "summary_of"],
    )
    return Hierarchy(summaries, vectors, links + extra, comms, reports, vecs, layers, fallbacks(summarizer, failures))


def represented(view, i: int) -> int | None:
    """The community summary node ``i`` stands for (the one that lists it first)."""
    for c in view.ent_communities.get(i, []):
        if view.communities[c]["members"][:1] == [i]:
            return c
    return None


def below(view, i: int, limit: int) -> set[int]:
    """Layer-0 entities under summary node ``i`` (down its summary_of links), at most ``limit``."""
    out: set[int] = set()
    stack = [i]
    while stack and len(out) < limit:
        node = stack.pop()
        for m in sorted(view.graph.adj[node]):
            if view.ent_layer[m] < view.ent_layer[node]:
                if view.ent_layer[m] == 0:
                    out.add(m)
                else:
                    stack.append(m)
    return out
