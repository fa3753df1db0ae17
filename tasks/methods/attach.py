"""HyGRAG-style attachment (HyGRAG §3.4), shared by every method's update: new layer-0 entities attach to the
most similar summary node of the lowest layer whose similarity reaches τ, climbing a layer when none does; only
the ancestors on the touched paths are re-summarised and re-embedded. Summaries that lost all members go.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
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


@dataclass(frozen=True)
class Layer0Rows:
    """Layer 0 as attach reads it: ``rows``, every layer-0 row or those the update wrote (``kept``: the ids of the
    others); ``vectors``, every layer-0 and summary id's vector, or the summaries' and the added entities'; and, when
    a re-summarised summary's members are among those left out, how to read them (``more_rows(ids)``,
    ``more_vectors(ids)``)."""

    rows: list[dict[str, Any]]
    vectors: dict[str, np.ndarray]
    kept: set[str] | frozenset[str] = frozenset()
    more_rows: Callable[[list[str]], list[dict[str, Any]]] | None = None
    more_vectors: Callable[[list[str]], dict[str, np.ndarray]] | None = None


@dataclass(frozen=True)
class Change:
    """What an update did to layer 0: the ids ``added``, ``removed`` and ``changed``, and ``before``, the removed and
    changed members' rows before it (their name and description: what ``shows_gone`` looks for)."""

    added: set[str] = field(default_factory=set)
    removed: set[str] = field(default_factory=set)
    changed: set[str] = field(default_factory=set)
    before: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class Rewrite:
    """How a touched summary is rewritten: ``summarize(layer, member_lists, member_vectors)`` gives one summary dict
    per member list, ``embed(rows)`` their vectors; a summary whose text still stands is rewritten once its
    staleness (changes / members) reaches ``staleness`` (0: on every change)."""

    summarize: Callable[[int, list[list[dict[str, Any]]], list[np.ndarray]], list[dict[str, Any]]]
    embed: Callable[[list[dict[str, Any]]], np.ndarray]
    staleness: float = 0.0


def attach(
    layer0: Layer0Rows,
    summaries: list[dict[str, Any]],
    summary_relations: list[dict[str, Any]],
    change: Change,
    tau: float,
    rewrite: Rewrite,
) -> AttachResult:
    """HyGRAG attachment of ``change.added`` layer-0 entities (``place``); refresh of the summaries on the touched
    paths. A summary whose text still says what a member no longer does (``shows_gone``: a removed member's name or
    sentences, a changed member's former sentences) is re-summarised now, as is one that lost a member summary; any
    other change (a member added, changed or removed without a trace in its text) adds to its ``staleness``, and it
    is re-summarised once that reaches ``rewrite.staleness``. Only a re-summarised or dropped summary touches its own
    parents (``_rewrite_upwards``)."""
    by_id = {e["id"]: e for e in list(layer0.rows) + list(summaries)}
    vectors = dict(layer0.vectors)
    links = [r for r in summary_relations if r["source_id"] not in change.removed]  # never changed: not copied
    attached = place(sorted(change.added), summaries, vectors, tau)
    links += [_link(eid, target) for eid, target in attached.items()]
    changes: Counter = Counter(attached.values())  # summary id -> members added, changed or re-summarised
    lost = _touched(change, summary_relations, by_id, changes)  # summaries whose text says what is gone
    refreshed, dropped, operations = _rewrite_upwards(by_id, vectors, links, changes, lost, layer0, rewrite)
    links = [r for r in links if r["source_id"] not in dropped and r["target_id"] not in dropped]
    out = [by_id[s["id"]] for s in summaries if s["id"] not in dropped]
    dim = next(iter(vectors.values())).shape[0] if vectors else 0
    matrix = np.stack([vectors[e["id"]] for e in out]).astype(np.float32) if out else np.zeros((0, dim), np.float32)
    return AttachResult(out, matrix, sorted(links, key=lambda r: r["id"]), attached, refreshed, dropped, operations)


def place(
    added: list[str], summaries: list[dict[str, Any]], vectors: dict[str, np.ndarray], tau: float
) -> dict[str, str]:
    """Each of ``added`` (in order) -> the summary it joins: the most similar node of the lowest layer whose best
    similarity reaches ``tau``, climbing a layer when none does; the closest node of the lowest layer when no layer
    passes. Empty when there are no summaries."""
    top = max((s["layer"] for s in summaries), default=0)
    layers = {l: [s for s in summaries if s["layer"] == l] for l in range(1, top + 1)}
    mats = {l: np.stack([vectors[s["id"]] for s in ss]).astype(np.float32) for l, ss in layers.items() if ss}
    attached: dict[str, str] = {}
    for eid in added if mats else ():
        v = np.asarray(vectors[eid], dtype=np.float32)
        target = None
        for l, mat in sorted(mats.items()):
            sims = mat @ v
            j = int(np.argmax(sims))
            if sims[j] >= tau:
                target = layers[l][j]["id"]
                break
        if target is None:  # nothing passes anywhere: join the closest node of the lowest layer
            l = min(mats)
            target = layers[l][int(np.argmax(mats[l] @ v))]["id"]
        attached[eid] = target
    return attached


def _link(member: str, summary: str) -> dict[str, Any]:
    return {
        "id": relation_id(member, summary, "summary_of"),
        "source_id": member,
        "target_id": summary,
        "kind": "summary_of",
        "description": "",
        "weight": 1.0,
        "source_chunk_ids": [],
    }


def _touched(
    change: Change, summary_relations: list[dict[str, Any]], by_id: dict[str, dict[str, Any]], changes: Counter
) -> set[str]:
    """The summaries above a changed or removed member: those whose text shows what is gone (returned: rewritten
    now), the others counted in ``changes``."""
    was_under: dict[str, set[str]] = defaultdict(set)  # parents before the update (a removed entity has no link now)
    for r in summary_relations:
        if r["kind"] == "summary_of":
            was_under[r["source_id"]].add(r["target_id"])
    lost: set[str] = set()
    for eid in sorted(change.changed | change.removed):
        now_row = None if eid in change.removed else by_id.get(eid)
        for p in sorted(was_under.get(eid, set())):
            if p not in by_id:
                continue
            if shows_gone(by_id[p], change.before.get(eid), now_row):
                lost.add(p)
            else:
                changes[p] += 1
    return lost


def _rewrite_upwards(
    by_id: dict[str, dict[str, Any]],
    vectors: dict[str, np.ndarray],
    links: list[dict[str, Any]],
    changes: Counter,
    lost: set[str],
    layer0: Layer0Rows,
    rewrite: Rewrite,
) -> tuple[set[str], set[str], int]:
    """The touched summaries, layer by layer from the lowest: each re-summarised (its row in ``by_id`` and vector in
    ``vectors`` replaced), kept with its staleness grown, or dropped when no member is left; a re-summarised or
    dropped one touches its parents in turn. Returns (re-summarised, dropped, summaries recomputed)."""
    members = _members(links)
    parents: dict[str, set[str]] = defaultdict(set)
    for r in links:
        parents[r["source_id"]].add(r["target_id"])
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
            live = sorted(m for m in members.get(sid, set()) if (m in by_id or m in layer0.kept) and m not in dropped)
            if len(live) < len(members.get(sid, ())):  # a member summary was dropped
                lost.add(sid)
            staleness = float(by_id[sid].get("staleness") or 0.0) + changes[sid] / max(1, len(live))
            if not live:
                dropped.add(sid)  # its parents see it missing from their members: they count as lost
            elif sid in lost or staleness >= rewrite.staleness:
                alive.append((sid, live))
            else:  # text still stands for its members: keep it, remember how far it has drifted
                by_id[sid] = dict(by_id[sid], degree=len(live), staleness=staleness)
        if alive:
            needed = sorted({m for _, live in alive for m in live})
            if layer0.more_rows is not None and (unread := [m for m in needed if m not in by_id]):
                by_id.update((r["id"], r) for r in layer0.more_rows(unread))
            if layer0.more_vectors is not None and (unread := [m for m in needed if m not in vectors]):
                vectors.update(layer0.more_vectors(unread))
            lists = [[by_id[m] for m in live] for _, live in alive]
            vecs = [np.stack([vectors[m] for m in live]).astype(np.float32) for _, live in alive]
            new = rewrite.summarize(layer, lists, vecs)
            operations += len(alive)
            rows = []
            for (sid, _), s in zip(alive, new):
                row = dict(by_id[sid], name=s["name"], type=s["type"], description=s["description"], staleness=0.0)
                row["degree"] = len(members.get(sid, ()))
                by_id[sid] = row
                rows.append(row)
                refreshed.add(sid)
            for row, v in zip(rows, rewrite.embed(rows)):
                vectors[row["id"]] = v
            for sid, _ in alive:
                for p in parents.get(sid, set()):
                    changes[p] += 1
                    frontier.add(p)
        frontier |= {p for sid in now if sid in dropped for p in parents.get(sid, set())}
    return refreshed, dropped, operations
