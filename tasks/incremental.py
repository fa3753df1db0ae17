"""Incremental refresh (HyGRAG §3.4, DESIGN §4): apply a corpus delta to a published index.

* ``diff_documents``: new / changed (same source, new content hash) / deleted / unchanged, scoped to
  one corpus root — an update of one folder never deletes documents that came from another.
* ``recompute_layer0``: layer-0 entities and relations are recomputed exactly, from the stored
  mentions, for the keys the delta touched; the rest are untouched. Ids are content keys, so they
  match a full build.
* ``attach``: new layer-0 entities attach, HyGRAG style, to the most similar summary node of the
  lowest layer whose similarity reaches τ, climbing a layer when none does; only the ancestors
  on the touched paths are re-summarised and re-embedded. Summaries that lost all members go.
* ``place_in_communities``: new nodes join the community most of their neighbours are in (a
  singleton when they have none); communities that lost members shrink; only touched ones get
  new reports.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tasks.catalog import relation_table
from tasks.communities import community_id
from tasks.merge import ChunkOrder, graph_from_mentions


@dataclass
class DocDiff:
    new: list[dict[str, Any]] = field(default_factory=list)
    changed: list[dict[str, Any]] = field(default_factory=list)  # the new versions
    deleted: list[dict[str, Any]] = field(default_factory=list)  # the old rows (deleted or replaced)
    unchanged: list[dict[str, Any]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.new or self.changed or self.deleted)

    def counts(self) -> dict[str, int]:
        replaced = len(self.changed)
        return {"new": len(self.new), "changed": replaced, "deleted": len(self.deleted) - replaced,
                "unchanged": len(self.unchanged)}


def diff_documents(existing: list[dict[str, Any]], incoming: list[dict[str, Any]], root: str) -> DocDiff:
    """Compare by (root, source_id) and content hash. Documents of other roots are never touched."""
    old = {d["source_id"]: d for d in existing if d["root"] == root}
    out = DocDiff()
    seen = set()
    for doc in incoming:
        seen.add(doc["source_id"])
        prev = old.get(doc["source_id"])
        if prev is None:
            out.new.append(doc)
        elif prev["content_hash"] != doc["content_hash"]:
            out.changed.append(doc)
            out.deleted.append(prev)
        else:
            out.unchanged.append(prev)
    out.deleted += [d for sid, d in sorted(old.items()) if sid not in seen]
    return out


MentionSelect = Callable[[Any], Any]  # a polars expression -> the mention rows (with ``a``, ``b``) it keeps


def _with_ends(frame):
    """Mentions with the two ends ``a`` and ``b`` of a relation key "a|b" (null ``b`` for entities), text as strings."""
    import polars as pl

    return (frame.with_columns(pl.col(pl.Categorical).cast(pl.Utf8))
            .with_columns(pl.col("key").str.split_exact("|", 1).struct.rename_fields(["a", "b"]).alias("ab")).unnest("ab"))


def mention_select(mentions: Any) -> MentionSelect:
    """Selection from mentions held in memory (rows, an Arrow table or a polars frame)."""
    from tasks.merge import mention_frame

    return _with_ends(mention_frame(mentions)).filter


def stored_mention_select(batches: Callable[[], Iterable[pa.RecordBatch]], gone: set[str], new: pa.Table) -> MentionSelect:
    """Selection from the previous snapshot's mentions (``batches`` scans them), without those of the ``gone``
    chunks, and the ``new`` ones: each selection reads the stored table batch by batch and holds only the rows
    it keeps, so an update never loads the whole table."""
    import polars as pl

    from tasks.merge import mention_frame

    gone_ids = sorted(gone)

    def select(expr):
        keep, parts = ~pl.col("chunk_id").is_in(gone_ids) & expr, []
        for b in batches():
            batch = pa.Table.from_batches([b])
            mask = _with_ends(mention_frame(batch)).select(keep).to_series().to_arrow()
            # the rows kept are copied out of the batch by Arrow: a polars filter keeps the batch's whole string
            # buffers alive behind them (1 % of 20k chunks' stored mentions held 460 MB, this ~5 MB)
            parts.append(_with_ends(mention_frame(batch.filter(mask))))
        return pl.concat([*parts, _with_ends(mention_frame(new)).filter(expr)])

    return select


def recompute_layer0(
    old_entities: list[dict[str, Any]],
    old_relations: pa.Table | list[dict[str, Any]],
    mentions: Any,
    touched_keys: set[str],
    max_description_tokens: int,
    order: ChunkOrder | None = None,
) -> tuple[list[dict[str, Any]], pa.Table, set[str], set[str], set[str]]:
    """Layer-0 entities/extracted relations after the delta. Returns (entities, relations (a table), added,
    removed, changed ids).

    ``mentions`` are all surviving + new mentions (rows, an Arrow table, a polars frame or a ``MentionSelect``
    over them); ``touched_keys`` the entity keys and relation pair keys that appear in removed or new chunks;
    ``order`` places chunks in corpus order (``graph_from_mentions``)."""
    import polars as pl

    from tasks.merge import entity_id, relation_degrees

    ent_keys = {k for k in touched_keys if "|" not in k}
    pair_keys = {k for k in touched_keys if "|" in k}
    select = mentions if callable(mentions) else mention_select(mentions)
    is_entity, is_relation = pl.col("kind") == "entity", pl.col("kind") == "relation"
    old_by_id = {e["id"]: e for e in old_entities if e["layer"] == 0}
    # the touched entities, recomputed from all their mentions
    new_ents, _ = graph_from_mentions(select(is_entity & pl.col("key").is_in(sorted(ent_keys))).drop("a", "b"),
                                      max_description_tokens, order=order)
    touched_ids = {entity_id(0, k) for k in ent_keys}
    new_by_id = {e["id"]: e for e in new_ents if e["id"] in touched_ids}
    entities = [e for e in old_entities if e["layer"] == 0 and e["id"] not in touched_ids] + list(new_by_id.values())
    added = set(new_by_id) - set(old_by_id)
    removed = (touched_ids & set(old_by_id)) - set(new_by_id)
    changed = {i for i in set(new_by_id) & set(old_by_id)
               if (new_by_id[i]["description"], new_by_id[i]["type"], new_by_id[i]["name"])
               != (old_by_id[i]["description"], old_by_id[i]["type"], old_by_id[i]["name"])}
    # relations recomputed: the touched pairs, and every pair of an entity that came or went (a relation
    # exists only between two entities); those of a touched entity that stays, on untouched pairs, stand
    flipped = sorted(k for k in ent_keys if entity_id(0, k) in added | removed)
    rel = select(is_relation & (pl.col("key").is_in(sorted(pair_keys)) | pl.col("a").is_in(flipped)
                                | pl.col("b").is_in(flipped)))
    named = set(rel.get_column("a").to_list()) | set(rel.get_column("b").to_list())
    live_ids = set(old_by_id) - removed | added
    _, new_rels = graph_from_mentions(rel.drop("a", "b"), max_description_tokens, order=order,
                                      endpoints=[k for k in named if entity_id(0, k) in live_ids])
    redone = {"|".join(sorted(entity_id(0, p) for p in k.split("|"))) for k in
              set(rel.get_column("key").unique().to_list()) | pair_keys}
    old = relation_table(old_relations)
    ends = pa.array(sorted(removed), pa.string())
    gone = pc.or_(pc.or_(pc.is_in(old.column("source_id"), value_set=ends), pc.is_in(old.column("target_id"), value_set=ends)),
                  pc.is_in(pc.binary_join_element_wise(old.column("source_id"), old.column("target_id"), "|"),
                           value_set=pa.array(sorted(redone), pa.string())))
    kept = np.flatnonzero(pc.and_(pc.equal(old.column("kind"), "extracted"), pc.invert(gone)).to_numpy(zero_copy_only=False))
    # the kept rows and the new ones in id order, taken in one copy (the previous relations are the largest
    # table an update holds: a filtered copy and a sorted copy beside them would triple it)
    rows = np.concatenate([kept, np.arange(new_rels.num_rows) + old.num_rows])
    ids = pa.chunked_array([*old.column("id").take(pa.array(kept)).chunks, *new_rels.column("id").chunks], pa.string())
    relations = pa.concat_tables([old, new_rels]).take(pa.array(rows[pc.sort_indices(ids).to_numpy()]))
    degree = relation_degrees(relations)
    entities = [dict(e, degree=degree.get(e["id"], 0)) for e in entities]
    return sorted(entities, key=lambda e: e["id"]), relations, added, removed, changed


def _members(relations: list[dict[str, Any]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = defaultdict(set)
    for r in relations:
        if r["kind"] == "summary_of":
            out[r["target_id"]].add(r["source_id"])
    return out


@dataclass
class AttachResult:
    entities: list[dict[str, Any]]  # summary entities (layers >= 1) after the update
    vectors: np.ndarray  # their vectors, aligned
    relations: list[dict[str, Any]]  # summary_of relations after the update
    attached: dict[str, str]  # new entity id -> summary id it joined
    refreshed: set[str]  # summary ids re-summarised
    removed: set[str]  # summary ids dropped (no members left)
    operations: int  # summaries recomputed (LLM calls on the LLM path)


def attach(
    layer0: list[dict[str, Any]],
    summaries: list[dict[str, Any]],
    summary_relations: list[dict[str, Any]],
    vectors: dict[str, np.ndarray],
    added: set[str],
    removed: set[str],
    changed: set[str],
    tau: float,
    summarize: Callable[[int, list[list[dict[str, Any]]], list[np.ndarray]], list[dict[str, Any]]],
    embed: Callable[[list[dict[str, Any]]], np.ndarray],
    refresh_staleness: float = 0.0,
) -> AttachResult:
    """HyGRAG attachment of ``added`` layer-0 entities; refresh of the summaries on the touched paths.

    ``vectors`` maps every layer-0 and summary id to its vector.
    ``summarize(layer, member_lists, member_vectors)`` returns one summary dict per member list;
    ``embed(entities)`` returns their vectors. A summary that lost members is always re-summarised;
    one that only gained or changed members accumulates ``staleness`` (changes / members) and is
    re-summarised once that reaches ``refresh_staleness`` (0: on every change). Only a re-summarised
    or dropped summary touches its own parents."""
    from tasks.merge import relation_id

    by_id = {e["id"]: e for e in list(layer0) + list(summaries)}
    vec = dict(vectors)
    rels = [dict(r) for r in summary_relations if r["source_id"] not in removed]
    top = max((s["layer"] for s in summaries), default=0)
    layers = {l: [s for s in summaries if s["layer"] == l] for l in range(1, top + 1)}
    mats = {l: np.stack([vec[s["id"]] for s in ss]).astype(np.float32) for l, ss in layers.items() if ss}
    attached: dict[str, str] = {}
    changes: Counter = Counter()  # summary id -> members added, changed or re-summarised this update
    lost: set[str] = set()  # summaries that lost members: always re-summarised
    for eid in sorted(added):
        if not mats:
            break
        v = np.asarray(vec[eid], dtype=np.float32)
        target = None
        for l in range(1, top + 1):  # lowest layer whose best node passes tau; climb when none does
            if l not in mats:
                continue
            sims = mats[l] @ v
            j = int(np.argmax(sims))
            if sims[j] >= tau:
                target = layers[l][j]["id"]
                break
        if target is None:  # nothing passes anywhere: join the closest node of layer 1
            l = min(mats)
            target = layers[l][int(np.argmax(mats[l] @ v))]["id"]
        attached[eid] = target
        changes[target] += 1
        rels.append({"id": relation_id(eid, target, "summary_of"), "source_id": eid, "target_id": target,
                     "kind": "summary_of", "description": f"{by_id[eid]['name']} belongs to {by_id[target]['name']}",
                     "weight": 1.0, "source_chunk_ids": []})
    members = _members(rels)
    parents: dict[str, set[str]] = defaultdict(set)
    for r in rels:
        parents[r["source_id"]].add(r["target_id"])
    for eid in sorted(changed):
        for p in parents.get(eid, set()):
            changes[p] += 1
    lost |= {r["target_id"] for r in summary_relations if r["source_id"] in removed}
    # walk up layer by layer: a re-summarised or dropped summary touches its parents in turn
    dropped: set[str] = set()
    refreshed: set[str] = set()
    operations = 0
    frontier = {t for t in set(changes) | lost if t in by_id}
    while frontier:
        layer = min(by_id[t]["layer"] for t in frontier)
        now = sorted(t for t in frontier if by_id[t]["layer"] == layer)
        frontier -= set(now)
        alive = []
        for sid in now:
            live = sorted(m for m in members.get(sid, set()) if m in by_id and m not in dropped)
            if len(live) < len(members.get(sid, ())):  # a member summary was dropped
                lost.add(sid)
            staleness = float(by_id[sid].get("staleness") or 0.0) + changes[sid] / max(1, len(live))
            if not live:
                dropped.add(sid)  # its parents see it missing from their members: they count as lost
            elif sid in lost or staleness >= refresh_staleness:
                alive.append((sid, live))
            else:  # text still stands for its members: keep it, remember how far it has drifted
                by_id[sid] = dict(by_id[sid], degree=len(live), staleness=staleness)
        if alive:
            lists = [[by_id[m] for m in live] for _, live in alive]
            vecs = [np.stack([vec[m] for m in live]).astype(np.float32) for _, live in alive]
            new = summarize(layer, lists, vecs)
            operations += len(alive)
            refreshed_rows = []
            for (sid, _), s in zip(alive, new):
                row = dict(by_id[sid], name=s["name"], type=s["type"], description=s["description"], staleness=0.0)
                row["degree"] = len(members.get(sid, ()))
                by_id[sid] = row
                refreshed_rows.append(row)
                refreshed.add(sid)
            for row, v in zip(refreshed_rows, embed(refreshed_rows)):
                vec[row["id"]] = v
            for sid, _ in alive:
                for p in parents.get(sid, set()):
                    changes[p] += 1
                    frontier.add(p)
        frontier |= {p for sid in now if sid in dropped for p in parents.get(sid, set())}
    rels = [r for r in rels if r["source_id"] not in dropped and r["target_id"] not in dropped]
    # member names appear in summary_of descriptions: keep them current
    for r in rels:
        if r["source_id"] in changed or r["source_id"] in refreshed or r["target_id"] in refreshed:
            r["description"] = f"{by_id[r['source_id']]['name']} belongs to {by_id[r['target_id']]['name']}"
    out = [by_id[s["id"]] for s in summaries if s["id"] not in dropped]
    dim = next(iter(vec.values())).shape[0] if vec else 0
    matrix = np.stack([vec[e["id"]] for e in out]).astype(np.float32) if out else np.zeros((0, dim), np.float32)
    return AttachResult(out, matrix, sorted(rels, key=lambda r: r["id"]), attached, refreshed, dropped, operations)


def place_in_communities(
    communities: list[dict[str, Any]],
    entity_ids: set[str],
    relations: pa.Table | list[dict[str, Any]],
    new_ids: set[str],
) -> tuple[list[dict[str, Any]], Counter, set[str]]:
    """Keep community ids; drop gone members, add new nodes by neighbour majority, level by level down.

    Returns (communities, members added per community, communities whose report must be rewritten:
    new ones, ones that lost members and ones whose parent disappeared)."""
    comms = [dict(c, entity_ids=list(c["entity_ids"])) for c in communities]
    forced: set[str] = set()
    for c in comms:
        kept = [m for m in c["entity_ids"] if m in entity_ids]
        if len(kept) != len(c["entity_ids"]):
            forced.add(c["id"])
        c["entity_ids"] = kept
    neighbours: dict[str, list[str]] = defaultdict(list)  # of the new nodes
    rels = relation_table(relations)
    new = pa.array(sorted(new_ids), pa.string())
    rels = rels.filter(pc.or_(pc.is_in(rels.column("source_id"), value_set=new), pc.is_in(rels.column("target_id"), value_set=new)))
    for a, b in zip(rels.column("source_id").to_pylist(), rels.column("target_id").to_pylist()):
        neighbours[a].append(b)
        neighbours[b].append(a)
    top_of: dict[str, list[str]] = defaultdict(list)  # entity -> its top-level (level 0) communities
    for c in comms:
        if c["level"] == 0:
            for m in c["entity_ids"]:
                top_of[m].append(c["id"])
    index = {c["id"]: c for c in comms}
    children: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for c in comms:
        if c["parent_id"]:
            children[c["parent_id"]].append(c)
    member_sets = {c["id"]: set(c["entity_ids"]) for c in comms}
    grown: Counter = Counter()
    added_rows = []
    for eid in sorted(new_ids):
        votes = Counter(cid for n in neighbours.get(eid, []) for cid in top_of.get(n, []))
        if not votes:
            row = {"id": community_id(0, [eid]), "level": 0, "parent_id": None, "entity_ids": [eid], "size": 1}
            added_rows.append(row)
            forced.add(row["id"])
            continue
        cid = min(votes, key=lambda c: (-votes[c], c))
        while True:  # join it, then the child community where most of its neighbours are
            index[cid]["entity_ids"].append(eid)
            member_sets[cid].add(eid)
            grown[cid] += 1
            kid_votes = Counter(k["id"] for k in children.get(cid, []) for n in neighbours.get(eid, [])
                                if n in member_sets[k["id"]])
            if not kid_votes:
                break
            cid = min(kid_votes, key=lambda c: (-kid_votes[c], c))
    out = []
    for c in comms + added_rows:
        if not c["entity_ids"]:
            forced.discard(c["id"])
            grown.pop(c["id"], None)
            continue
        c["entity_ids"] = sorted(set(c["entity_ids"]))
        c["size"] = len(c["entity_ids"])
        out.append(c)
    ids = {c["id"] for c in out}
    for c in out:  # a parent that disappeared leaves its children at the top
        if c["parent_id"] and c["parent_id"] not in ids:
            c["parent_id"] = None
            forced.add(c["id"])
    return sorted(out, key=lambda c: (c["level"], c["id"])), grown, forced


def reports_to_rewrite(
    communities: list[dict[str, Any]],
    old_reports: dict[str, dict[str, Any]],
    grown: Counter,
    forced: set[str],
    refresh_staleness: float,
) -> tuple[set[str], dict[str, float]]:
    """Which communities get a new report, and the staleness of the reports that stay.

    A community without a report, in ``forced`` (new, lost members, re-parented) is rewritten; one
    that only gained members accumulates ``staleness`` (members added / size) and is rewritten once
    that reaches ``refresh_staleness`` (0: on every change)."""
    redo: set[str] = set()
    staleness: dict[str, float] = {}
    for c in communities:
        cid = c["id"]
        old = old_reports.get(cid)
        if old is None or cid in forced:
            redo.add(cid)
        elif grown.get(cid):
            value = float(old.get("staleness") or 0.0) + grown[cid] / max(1, c["size"])
            if value >= refresh_staleness:
                redo.add(cid)
            else:
                staleness[cid] = value
    return redo, staleness
