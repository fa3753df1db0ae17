"""HiRAG's communities under an update: new nodes join the community most of their neighbours are in (a
singleton when they have none); communities that lost members shrink; only touched ones get new reports.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tasks.methods.hirag.communities import community_id
from tasks.store.rows import relation_table


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
    rels = rels.filter(
        pc.or_(pc.is_in(rels.column("source_id"), value_set=new), pc.is_in(rels.column("target_id"), value_set=new))
    )
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
            row: dict[str, Any] = {
                "id": community_id(0, [eid]),
                "level": 0,
                "parent_id": None,
                "entity_ids": [eid],
                "size": 1,
            }
            added_rows.append(row)
            forced.add(row["id"])
            continue
        cid = min(votes, key=lambda c: (-votes[c], c))
        while True:  # join it, then the child community where most of its neighbours are
            index[cid]["entity_ids"].append(eid)
            member_sets[cid].add(eid)
            grown[cid] += 1
            kid_votes = Counter(
                k["id"] for k in children.get(cid, []) for n in neighbours.get(eid, []) if n in member_sets[k["id"]]
            )
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
