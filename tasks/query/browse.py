"""Browsing a snapshot's view (the explorer's graph, communities and documents): small pure functions over an
``IndexView``, each answering one page or panel with plain data.

A graph is ``{"nodes": [...], "edges": [...]}``: an entity node ``{id, label, kind: "entity", type, layer}``, a
source node ``{id, label, kind: "chunk", document_id}``; an edge ``{source, target, kind, text}`` (a relation's kind
and description, or ``"source"`` from an entity to a chunk that mentions it), with ``label`` where the relation has
one, read from ``source`` to ``target``."""

from __future__ import annotations

from typing import Any

from tasks.errors import NotFoundError
from tasks.retrieval.view import IndexView
from tasks.store.rows import reading_order

#: neighbours a node opens with (the best connected first); the explorer asks again for more
NEIGHBOURS = 25
SOURCES_SHOWN = 12


def entity_index(view: IndexView, entity_id: str) -> int:
    i = view.ent_index.get(entity_id)
    if i is None:
        raise NotFoundError(f"no entity {entity_id!r} in snapshot v{view.version}")
    return i


def entity_node(view: IndexView, i: int) -> dict[str, Any]:
    return {
        "id": view.ent_ids[i],
        "label": view.ent_name[i],
        "kind": "entity",
        "type": view.ent_type[i],
        "layer": int(view.ent_layer[i]),
    }


def chunk_node(view: IndexView, j: int) -> dict[str, Any]:
    doc = view.chunk_doc[j]
    number, of = chunk_place(view, j)
    return {
        "id": view.chunk_ids[j],
        "label": f"{view.doc_title.get(doc) or view.doc_source.get(doc, doc)} · chunk {number} of {of}",
        "kind": "chunk",
        "document_id": doc,
        "chunk_number": number,
        "document_chunks": of,
    }


def chunk_place(view: IndexView, j: int) -> tuple[int, int]:
    """Where chunk ``j`` sits in its document: (its number from 1, the document's chunks), numbered in the view's
    order as ``document_card`` lists them; counted once per view."""

    def build() -> tuple[list[int], dict[str, int]]:
        numbers, seen = [], dict[str, int]()
        for doc in view.chunk_doc:
            seen[doc] = seen.get(doc, 0) + 1
            numbers.append(seen[doc])
        return numbers, seen

    numbers, counts = view._once("chunk_places", build)
    return numbers[j], counts[view.chunk_doc[j]]


def _edges(view: IndexView, members: set[int]) -> list[dict[str, Any]]:
    out = []
    for a in sorted(members):
        for b in sorted(view.graph.adj[a]):
            if a < b and b in members:
                for k in view.edge_rel.get((a, b), []):
                    r = view.rel_rows[k]
                    source, target = reading_order(r)
                    out.append(
                        {
                            "source": source,
                            "target": target,
                            "kind": r["kind"],
                            "text": r["description"] or r["kind"].replace("_", " "),
                            # only where it has one: the explorer draws an edge with a label as an arrow
                            **({"label": r["label"]} if r.get("label") else {}),
                        }
                    )
    return out


def neighbourhood(view: IndexView, entity_id: str, limit: int = NEIGHBOURS) -> dict[str, Any]:
    """An entity, its ``limit`` best-connected neighbours (any layer: summaries link their members), and every
    relation among them."""
    i = entity_index(view, entity_id)
    around = sorted(view.graph.adj[i], key=lambda n: (-view.graph.degree(n), view.ent_ids[n]))[:limit]
    members = {i, *around}
    return {"nodes": [entity_node(view, n) for n in [i, *around]], "edges": _edges(view, members)}


def context_graph(view: IndexView, entity_ids: list[str], chunk_ids: list[str]) -> dict[str, Any]:
    """What a query's context holds as a graph: its entities, the relations among them, its sources, and an edge
    from each entity to each of those sources that mentions it."""
    ents = [view.ent_index[e] for e in dict.fromkeys(entity_ids) if e in view.ent_index]
    chunks = [view.chunk_index[c] for c in dict.fromkeys(chunk_ids) if c in view.chunk_index]
    shown = {view.chunk_ids[j] for j in chunks}
    mentions = [
        {"source": view.ent_ids[i], "target": c, "kind": "source", "text": ""}
        for i in ents
        for c in dict.fromkeys(view.ent_chunks[i] or [])
        if c in shown
    ]
    return {
        "nodes": [entity_node(view, i) for i in ents] + [chunk_node(view, j) for j in chunks],
        "edges": _edges(view, set(ents)) + mentions,
    }


def entity_card(view: IndexView, entity_id: str) -> dict[str, Any]:
    """What a node's panel shows: the names merged into it (``aliases``), its description, the sources that mention
    it (a summary entity's: its members' sources, ``sources_of`` says which; the first ``SOURCES_SHOWN``) and the
    communities it belongs to."""
    i = entity_index(view, entity_id)
    mentioned = dict.fromkeys(c for m in _layer0_members(view, i) for c in view.ent_chunks[m] or [])
    sources = [c for c in mentioned if c in view.chunk_index]
    return entity_node(view, i) | {
        "aliases": view.ent_aliases[i] or [],
        "description": view.ent_desc[i],
        "degree": int(view.graph.degree(i)),
        "n_sources": len(sources),
        "sources_of": "entity" if view.ent_layer[i] == 0 else "members",
        "sources": [chunk_node(view, view.chunk_index[c]) for c in sources[:SOURCES_SHOWN]],
        "communities": [community_summary(view, view.communities[c]) for c in view.ent_communities.get(i, [])],
    }


def _layer0_members(view: IndexView, i: int) -> list[int]:
    """The layer-0 entities under ``i`` (itself at layer 0): a summary's members through its ``summary_of``
    links, layer by layer down, in graph order (best connected first, then id): a summary entity mentions no
    source itself, its members do."""
    found, frontier = [i], [i]
    while frontier and view.ent_layer[frontier[0]] > 0:
        below: dict[int, None] = {}
        for a in frontier:
            under = [
                n
                for n in view.graph.adj[a]
                if view.ent_layer[n] == view.ent_layer[a] - 1
                and any(view.rel_rows[k]["kind"] == "summary_of" for k in view.edge_rel.get((min(a, n), max(a, n)), []))
            ]
            below.update(dict.fromkeys(sorted(under, key=lambda n: (-view.graph.degree(n), view.ent_ids[n]))))
        frontier = found = list(below)
    return found


def search_entities(view: IndexView, text: str, limit: int = 20) -> list[dict[str, Any]]:
    """Entities whose name or an alias holds ``text`` (any case): exact names first, then the best connected."""
    needle = text.strip().lower()
    if not needle:
        return []

    def names(i: int) -> list[str]:
        return [view.ent_name[i].lower(), *(a.lower() for a in view.ent_aliases[i] or ())]

    found = [i for i in range(len(view.ent_name)) if any(needle in n for n in names(i))]
    found.sort(key=lambda i: (needle not in names(i), -view.graph.degree(i), view.ent_ids[i]))
    return [entity_node(view, i) for i in found[:limit]]


def community_summary(view: IndexView, comm: dict[str, Any]) -> dict[str, Any]:
    report = view.reports.get(comm["id"], {})
    return {
        "id": comm["id"],
        "level": int(comm["level"]),
        "size": int(comm["size"]),
        "title": report.get("title", ""),
        "rating": float(report.get("rating", 0.0)),
        "parent_id": comm.get("parent_id"),
    }


def communities(view: IndexView, level: int | None = None) -> list[dict[str, Any]]:
    """Every community of a level (all levels when None), the highest rated first."""
    rows = [community_summary(view, c) for c in view.communities if level is None or c["level"] == level]
    return sorted(rows, key=lambda c: (c["level"], -c["rating"], c["id"]))


def community_card(view: IndexView, community_id: str, limit: int = 200) -> dict[str, Any]:
    """A community's report and its member entities (the first ``limit``, best connected first)."""
    comm = next((c for c in view.communities if c["id"] == community_id), None)
    if comm is None:
        raise NotFoundError(f"no community {community_id!r} in snapshot v{view.version}")
    report = view.reports.get(community_id, {})
    members = sorted(comm["members"], key=lambda i: (-view.graph.degree(i), view.ent_ids[i]))
    return community_summary(view, comm) | {
        "summary": report.get("summary", ""),
        "rating_reason": report.get("rating_reason"),
        "findings": list(report.get("findings") or []),
        "members": [entity_node(view, i) for i in members[:limit]],
        "children": [community_summary(view, c) for c in view.communities if c.get("parent_id") == community_id],
    }


def documents(view: IndexView, quarantine: list[dict[str, Any]]) -> dict[str, Any]:
    """The indexed documents (title, source id, chunks) and the quarantine: what was not indexed, and why."""
    chunks: dict[str, int] = {}
    for doc in view.chunk_doc:
        chunks[doc] = chunks.get(doc, 0) + 1
    docs = [
        {"id": d, "source_id": view.doc_source[d], "title": view.doc_title.get(d) or "", "chunks": chunks.get(d, 0)}
        for d in view.doc_source
    ]
    docs.sort(key=lambda d: (d["source_id"], d["id"]))
    return {
        "documents": docs,
        "quarantine": [{k: str(q.get(k) or "") for k in ("item", "stage", "error")} for q in quarantine],
    }


def document_card(view: IndexView, document_id: str) -> dict[str, Any]:
    """A document's chunks, in order, with their texts."""
    if document_id not in view.doc_source:
        raise NotFoundError(f"no document {document_id!r} in snapshot v{view.version}")
    parts = [j for j, d in enumerate(view.chunk_doc) if d == document_id]
    return {
        "id": document_id,
        "source_id": view.doc_source[document_id],
        "title": view.doc_title.get(document_id) or "",
        "chunks": [{"id": view.chunk_ids[j], "text": view.chunk_text[j]} for j in parts],
    }
