"""HyGRAG-style attachment (HyGRAG §3.4), shared by every method's update: new layer-0 entities attach to the
most similar summary node of the lowest layer whose similarity reaches τ, climbing a layer when none does; only
the ancestors on the touched paths are re-summarised and re-embedded. Summaries that lost all members go.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from tasks.store.ids import relation_id

#: where a description's sentences end (an extractive description joins whole sentences)
SENTENCE_END = re.compile(r"(?<=[.!?…])\s+")


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in SENTENCE_END.split(text or "") if s.strip()]


def shows_gone(summary: dict[str, Any], old: dict[str, Any] | None, new: dict[str, Any] | None) -> bool:
    """Whether a summary's text still says what its member no longer does: a member that went (``new`` None)
    whose name or a sentence of its description is in the summary's name or description, or a changed member
    whose former description had a sentence, now gone from it, that the summary quotes. ``old``: the member's
    row before the update (None: not known — a member that went then counts as shown)."""
    text = f"{summary.get('name', '')}\n{summary.get('description', '')}"
    if old is None:
        return new is None
    gone = _sentences(old.get("description", ""))
    if new is None:
        return (bool(old.get("name")) and old["name"] in text) or any(s in text for s in gone)
    now = new.get("description", "")
    return any(s not in now and s in text for s in gone)


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
    before: dict[str, dict[str, Any]] | None = None,
    more_vectors: Callable[[list[str]], dict[str, np.ndarray]] | None = None,
    kept: set[str] | frozenset[str] = frozenset(),
    more_rows: Callable[[list[str]], list[dict[str, Any]]] | None = None,
) -> AttachResult:
    """HyGRAG attachment of ``added`` layer-0 entities; refresh of the summaries on the touched paths.

    ``vectors`` maps every layer-0 and summary id to its vector, or, with ``more_vectors(ids)``, the summaries'
    and the added entities', the others read from it when a re-summarised summary's members need them; likewise
    ``layer0`` holds every layer-0 row, or those the update wrote, with ``kept`` the ids of the others, whose rows
    ``more_rows(ids)`` reads.
    ``summarize(layer, member_lists, member_vectors)`` returns one summary dict per member list;
    ``embed(entities)`` returns their vectors. A summary whose text still says what a member no longer
    does (``shows_gone``: a removed member's name or sentences, a changed member's former sentences; ``before``
    holds the removed and changed members' rows before the update) is re-summarised now, as is one that lost a
    member summary; any other change (a member added, changed or removed without a trace in its text) adds to its
    ``staleness`` (changes / members), and it is re-summarised once that reaches ``refresh_staleness`` (0: on
    every change). Only a re-summarised or dropped summary touches its own parents."""

    by_id = {e["id"]: e for e in list(layer0) + list(summaries)}
    vec = dict(vectors)
    rels = [r for r in summary_relations if r["source_id"] not in removed]  # never changed: not copied
    top = max((s["layer"] for s in summaries), default=0)
    layers = {l: [s for s in summaries if s["layer"] == l] for l in range(1, top + 1)}
    mats = {l: np.stack([vec[s["id"]] for s in ss]).astype(np.float32) for l, ss in layers.items() if ss}
    attached: dict[str, str] = {}
    changes: Counter = Counter()  # summary id -> members added, changed or re-summarised this update
    lost: set[str] = set()  # summaries whose text says what is gone: re-summarised now
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
        rels.append(
            {
                "id": relation_id(eid, target, "summary_of"),
                "source_id": eid,
                "target_id": target,
                "kind": "summary_of",
                "description": "",
                "weight": 1.0,
                "source_chunk_ids": [],
            }
        )
    members = _members(rels)
    parents: dict[str, set[str]] = defaultdict(set)
    for r in rels:
        parents[r["source_id"]].add(r["target_id"])
    was_under: dict[str, set[str]] = defaultdict(set)  # parents before the update (a removed entity has no link now)
    for r in summary_relations:
        if r["kind"] == "summary_of":
            was_under[r["source_id"]].add(r["target_id"])
    for eid in sorted(changed | removed):
        now_row = None if eid in removed else by_id.get(eid)
        for p in sorted(was_under.get(eid, set())):
            if p not in by_id:
                continue
            if shows_gone(by_id[p], (before or {}).get(eid), now_row):
                lost.add(p)
            else:
                changes[p] += 1
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
            live = sorted(m for m in members.get(sid, set()) if (m in by_id or m in kept) and m not in dropped)
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
            if more_rows is not None and (unread := sorted({m for _, live in alive for m in live} - set(by_id))):
                by_id.update((r["id"], r) for r in more_rows(unread))
            if more_vectors is not None and (unread := sorted({m for _, live in alive for m in live} - set(vec))):
                vec.update(more_vectors(unread))
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
    out = [by_id[s["id"]] for s in summaries if s["id"] not in dropped]
    dim = next(iter(vec.values())).shape[0] if vec else 0
    matrix = np.stack([vec[e["id"]] for e in out]).astype(np.float32) if out else np.zeros((0, dim), np.float32)
    return AttachResult(out, matrix, sorted(rels, key=lambda r: r["id"]), attached, refreshed, dropped, operations)
