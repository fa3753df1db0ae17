"""An update's summaries and reports estimated on the index it updates (HiRAG's update; ``strata update
--estimate``). A ratio per name of the delta cannot say which summaries and communities a few new chunks reach, nor
how large they are (a novel's clusters are several times an encyclopedia's), so the estimate walks the
update's own rules on the snapshot, with clients that count each prompt and answer none (``CountingClient``):

* layer 0's change: each thing a new chunk names changes the entity of its key where the snapshot holds one, else
  is added — its description the sentence that names it (a model's) or the offline extractor's, its vector
  embedded — and relates to the thing named next (a model's) or as the offline extractor relates it
  (``layer0_delta``);
* summaries: HyGRAG's attachment and the staleness rule (``tasks.methods.attach.attach``) pick the summaries
  rewritten, each prompt built from its members' rows;
* reports: neighbour majority and the staleness rule (``placement``) pick the communities whose report is
  rewritten, each prompt built from the members' rows and relations (``build_reports``).

What documents an update removes or replaces is not walked (their entities' summaries rewrite where their text shows
what is gone): the estimate counts what the incoming chunks cause. Nothing is written."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from schemas.config import StrataConfig
from tasks.index.embed import entity_text
from tasks.methods.attach import Change, Layer0Rows, Rewrite, attach
from tasks.methods.base import MethodContext
from tasks.methods.common import report_relations
from tasks.methods.hirag.placement import place_in_communities, reports_to_rewrite
from tasks.methods.reports import build_reports
from tasks.methods.summarize import Cluster, LLMSummarizer, OfflineSummarizer
from tasks.runtime.text import text_key
from tasks.runtime.tokens import clip_tokens, count_tokens
from tasks.store.ids import entity_id, relation_id
from tasks.store.rows import REPORT_COLUMNS, plain_rows, relation_table, vector_matrix

#: a new entity's description as a model writes it: the sentence that names it, cut at this many tokens
DESCRIPTION_TOKENS = 40
ENTITY_COLUMNS = ("id", "name", "type", "description", "layer", "staleness", "degree")


@dataclass
class Delta:
    """Layer 0's change as the walk sees it: ``rows`` of the entities the chunks name (the snapshot's row of one it
    holds, a new row of one it does not), ``added`` and ``changed`` ids, and ``made``, the relations between what a
    chunk names (``layer0_delta``)."""

    rows: list[dict[str, Any]]
    added: set[str]
    changed: set[str]
    made: pa.Table


def layer0_delta(
    ctx: MethodContext,
    mentions: list[list[tuple[str, str, str]]],
    max_description_tokens: int,
    pairs: list[tuple[str, str]] | None = None,
    first: bool = True,
) -> Delta:
    """The change the new chunks make to layer 0 (``Delta``); ``mentions``: per chunk, what it names in order, each
    as (resolution key, name, description): ``estimate_names.model_mentions`` or ``offline_mentions``; a held
    entity's description grows within ``max_description_tokens`` (``extract.max_description_tokens``), after its held
    sentences or, ``first``, where the new chunks may come before them in corpus order, before them. The relations
    are ``pairs`` of keys (the offline extractor's own), else each thing's to the next its chunk names (a model's)."""
    order: list[list[tuple[str, str, str]]] = []  # per chunk: (id, name, description), each id once
    said_of: dict[str, list[str]] = {}  # per id: what the new chunks say of it, in chunk order
    for found in mentions:
        seen: dict[str, tuple[str, str, str]] = {}
        for key, name, said in found:
            if not key:
                continue
            said_of.setdefault(eid := entity_id(0, key), []).append(said)
            if eid not in seen:
                seen[eid] = (eid, name, clip_tokens(said, DESCRIPTION_TOKENS))
        order.append(list(seen.values()))
    ids = sorted({eid for chunk in order for eid, _, _ in chunk})
    held = plain_rows(ctx.previous_in("entities", "id", ids, ENTITY_COLUMNS)) if ids else []
    held_rows = {r["id"]: r for r in held if r["layer"] == 0}
    rows, added = dict(held_rows), set(ids) - set(held_rows)
    changed = set()
    for eid, row in held_rows.items():  # a held entity changes where the merge folds something new into it
        folded = _folded(row["description"] or "", said_of[eid], max_description_tokens, first)
        if folded is not None:
            rows[eid] = {**row, "description": folded}
            changed.add(eid)
    for chunk in order:
        for eid, name, said in chunk:
            if eid not in rows:
                rows[eid] = {"id": eid, "name": name, "type": "concept", "description": said, "layer": 0}
    if pairs is None:
        ends = [(a, b) for chunk in order for (a, _, _), (b, _, _) in zip(chunk, chunk[1:])]
    else:
        ends = sorted({(entity_id(0, a), entity_id(0, b)) for a, b in pairs if a and b and a != b})
    return Delta([rows[i] for i in ids], added, changed, _relations(ends, "extracted"))


def _folded(description: str, said: list[str], budget: int, first: bool) -> str | None:
    """A held entity's ``description`` with what the new chunks ``said`` of it, as the run's merge folds one
    (``merge_state.budgeted``: its distinct sentences in corpus order while they fit ``budget`` tokens); None where
    it does not change: every sentence already held (the same document indexed again from a new root), or, the new
    chunks after the held ones, the first new sentence past the budget (nothing after it is kept either).
    ``first``: the new chunks may come before the held ones in corpus order (a document whose source sorts before
    one held): a new sentence then opens the description and the held ones make room."""
    held = text_key(description)
    fresh = list(dict.fromkeys(s for s in said if text_key(s) not in held))
    if first:
        return clip_tokens(" ".join([*fresh, description]), budget) if fresh else None
    out, used = [description], count_tokens(description)
    for sentence in fresh:
        used += count_tokens(sentence)
        if used > budget:
            break
        out.append(sentence)
    return " ".join(out) if len(out) > 1 else None


def _relations(ends: list[tuple[str, str]], kind: str) -> pa.Table:
    """Relations of ``kind`` between the (source, target) ids ``ends``, in ``REPORT_COLUMNS``."""
    rows = [
        {
            "id": relation_id(a, b, kind),
            "source_id": a,
            "target_id": b,
            "kind": kind,
            "description": "",
            "weight": 1.0,
            "source_chunk_ids": [],
        }
        for a, b in ends
    ]
    return relation_table(rows).select(REPORT_COLUMNS)


def walk_summaries(
    ctx: MethodContext, delta: Delta, embed: Callable[[list[str]], np.ndarray], client: Any, cfg: StrataConfig
) -> dict[str, str]:
    """The summaries HyGRAG's attachment rewrites for ``delta``, each asked of ``client`` (None: the stage is
    offline, its summaries written offline); ``embed``: the index's embedding model (an added entity joins the
    summary closest to its vector). Returns where each added entity attached (its summary's id)."""
    upper = ctx.previous("entities", where="layer > 0")
    summaries = plain_rows(upper)
    if not summaries:
        return {}
    new = [r for r in delta.rows if r["id"] in delta.added]
    known: dict[str, np.ndarray] = {}
    if new:
        found = embed([entity_text(r["name"], r["type"], r["description"]) for r in new])
        known.update((r["id"], np.asarray(v, np.float32)) for r, v in zip(new, found))
    known.update(zip([s["id"] for s in summaries], vector_matrix(upper)))
    links = plain_rows(ctx.previous("relations", where="kind = 'summary_of'"))
    written = {r["id"] for r in delta.rows}
    kept = {r["source_id"] for r in links} - written  # every member the update leaves as it is

    def rows_of(ids: list[str]) -> list[dict[str, Any]]:
        return plain_rows(ctx.previous_in("entities", "id", ids, ENTITY_COLUMNS))

    def vectors_of(ids: list[str]) -> dict[str, np.ndarray]:
        table = ctx.previous_in("entities", "id", ids, ("id", "vector"))
        return dict(zip(table.column("id").to_pylist(), vector_matrix(table)))

    meta, most = cfg.hierarchy.meta_entities, cfg.extract.max_description_tokens
    summarizer: Any = (
        OfflineSummarizer(meta, most)
        if client is None
        else LLMSummarizer(client, meta, 1, most, min_members=cfg.llm.summaries.min_members)
    )

    def summarize(layer: int, lists: list[list[dict[str, Any]]], vecs: list[np.ndarray]) -> list[dict[str, Any]]:
        return [s[0] for s in summarizer.summarize_layer(layer, [Cluster(m, v) for m, v in zip(lists, vecs)])]

    dim = next(iter(known.values())).shape[0]
    return attach(
        Layer0Rows(delta.rows, known, kept, rows_of, vectors_of),
        summaries,
        links,
        Change(delta.added, set(), delta.changed, {}),
        cfg.incremental.tau,
        Rewrite(summarize, lambda rows: np.zeros((len(rows), dim), np.float32), cfg.incremental.refresh_staleness),
    ).attached


def walk_reports(ctx: MethodContext, delta: Delta, attached: dict[str, str], client: Any, cfg: StrataConfig) -> None:
    """The community reports HiRAG's placement rewrites for ``delta``, each asked of ``client``; ``attached``: the
    summary each added entity joined (``walk_summaries``), one of its neighbours there as in the run's graph."""
    communities = plain_rows(ctx.previous("communities"))
    if not communities:
        return
    members = {m for c in communities for m in c["entity_ids"]} | delta.added
    made = pa.concat_tables([delta.made, _relations(sorted(attached.items()), "summary_of")])
    comms, grown, forced = place_in_communities(communities, members, made, delta.added)
    old = {r["community_id"]: r for r in plain_rows(ctx.previous("community_reports"))}
    redo, _staleness = reports_to_rewrite(comms, old, grown, forced, cfg.incremental.refresh_staleness)
    needed = {m for c in comms if c["id"] in redo for m in c["entity_ids"]}
    mine = {r["id"]: r for r in delta.rows}
    held = plain_rows(ctx.previous_in("entities", "id", sorted(needed - set(mine)), ENTITY_COLUMNS))
    build_reports(
        comms,
        [*held, *(mine[m] for m in needed if m in mine)],
        report_relations(ctx, made, [], needed),
        cfg.communities.report_max_tokens,
        client,
        redo,
        {cid: r for cid, r in old.items() if cid not in redo},
        min_members=cfg.llm.reports.min_members,
    )
