"""ArchRAG's retrieval (§3.2): the C-HNSW searched top down for the question's nearest entities and communities
(``hierarchical_search``), the mode's sections filled from what it finds (``fill_archrag``), and with an LLM the
adaptive filtering of the context before the answer (``adaptive_filter``).
"""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np

from schemas.prompts import PromptSet
from tasks.methods.common import represented, unit


def search_layer(q: np.ndarray, x: np.ndarray, links: list[list[int]], entries: list[int], ef: int) -> list[int]:
    """Greedy best-first search (HNSW's SEARCH-LAYER): from ``entries``, follow links while a candidate is closer
    than the worst of the ``ef`` best found; returns those, best first (ties by index)."""
    if not len(x) or not entries:
        return []
    visited = set(entries)
    sims = {e: float(x[e] @ q) for e in entries}
    candidates = [(-sims[e], e) for e in entries]
    heapq.heapify(candidates)
    best = [(sims[e], -e) for e in entries]  # min-heap of the ef best: the worst on top
    heapq.heapify(best)
    while len(best) > ef:
        heapq.heappop(best)
    while candidates:
        s, c = heapq.heappop(candidates)
        if -s < best[0][0] and len(best) >= ef:
            break
        for nb in links[c]:
            if nb in visited:
                continue
            visited.add(nb)
            sn = float(x[nb] @ q)
            if len(best) < ef or sn > best[0][0]:
                heapq.heappush(candidates, (-sn, nb))
                heapq.heappush(best, (sn, -nb))
                if len(best) > ef:
                    heapq.heappop(best)
    return [-i for _, i in sorted(best, key=lambda t: (-t[0], -t[1]))]


def hierarchical_search(
    q: np.ndarray,
    layers: list[np.ndarray],
    intra: list[list[list[int]]],
    inter: list[np.ndarray],
    k: int,
    ef: int | None = None,
    scan_max: int = 0,
) -> list[list[int]]:
    """ArchRAG's Algorithm 2 over C-HNSW: the ``k`` nodes nearest to ``q`` in every layer (``[layer 0, layer 1,
    ...]``, best first), found top down: the top layer from its best node, each lower layer from the nodes its
    upper neighbours link down to. A layer of at most ``scan_max`` nodes is scanned instead (exact, and cheaper
    than a walk over so few nodes); its ``ef`` best still lead down."""
    from tasks.retrieval.context import top_k

    ef = max(k, ef or k)
    found: list[list[int]] = [[] for _ in layers]
    entries: list[int] = []
    for li in range(len(layers) - 1, -1, -1):
        x = layers[li]
        if not len(x):
            continue
        if len(x) <= scan_max:
            hits = [int(i) for i in top_k(x @ q, ef)]
        else:
            if li == len(layers) - 1 or not entries:
                entries = [int(np.argmax(x @ q))]
            hits = search_layer(q, x, intra[li], entries, ef)
        found[li] = hits[:k]
        entries = sorted({int(inter[li][h]) for h in hits}) if li > 0 else []
    return found


#: ArchRAG's map step: pieces the LLM rates under this (0-10) are left out of the answer's context
MIN_USEFUL = 3


def map_messages(question: str, pieces: list[str], prompts: PromptSet) -> list[dict[str, str]]:
    listing = "\n".join(f"{i}. {p}" for i, p in enumerate(pieces, 1))
    return prompts["archrag_filter"].messages(question=question, pieces=listing)


def adaptive_filter(ctx: Any, client: Any) -> Any:
    """ArchRAG's adaptive filtering with an LLM (§3.2.2): the map step rates every retrieved entity, community
    report and relation in one call; those under ``MIN_USEFUL`` are dropped and the rest ordered by rating
    (the reduce step answers from what is left)."""
    from dataclasses import replace

    from tasks.runtime.llm import ParseError, parse_json, run_sync

    sections = ("entities", "communities", "bridge")
    pieces = [(name, item) for name in sections for item in getattr(ctx, name)]
    if not pieces:
        return ctx

    def parse(text: str) -> list[float]:
        data = parse_json(text)
        scores = data.get("scores") if isinstance(data, dict) else data
        if not isinstance(scores, list) or len(scores) != len(pieces):
            raise ParseError(f"{len(pieces)} scores expected")
        return [float(x) for x in scores]

    scores = run_sync(
        client.complete(
            map_messages(ctx.question, [item["text"] for _, item in pieces], client.prompts),
            prompt_version=client.prompts["archrag_filter"].version,
            json_mode=True,
            parse=parse,
        )
    )
    kept = {
        name: [it for (n, it), sc in sorted(zip(pieces, scores), key=lambda p: -p[1]) if n == name and sc >= MIN_USEFUL]
        for name in sections
    }
    return replace(ctx, **kept)


def view_chnsw(view):
    """The snapshot's C-HNSW (per layer: entity indices, unit vectors, intra links; inter links), built once."""

    def build():
        top = int(view.ent_layer.max()) if len(view.ent_layer) else 0
        members = [np.flatnonzero(view.ent_layer == li) for li in range(top + 1)]
        pos = {int(e): (li, p) for li, m in enumerate(members) for p, e in enumerate(m)}
        vecs = view.ent_vecs if view.ent_vecs is not None else np.zeros((len(view.ent_ids), view.dim), np.float32)
        layers = [unit(vecs[m]) if len(m) else np.zeros((0, view.dim), np.float32) for m in members]
        intra = [[[] for _ in m] for m in members]
        inter = [np.zeros(len(m), dtype=np.int64) for m in members]
        for r in view.rel_rows:
            if r["kind"] not in ("chnsw", "chnsw_down"):
                continue
            a, b = view.ent_index.get(r["source_id"]), view.ent_index.get(r["target_id"])
            if a is None or b is None:
                continue
            (la, pa_), (_, pb) = pos[a], pos[b]
            if r["kind"] == "chnsw":
                intra[la][pa_].append(pb)
            else:
                inter[la][pa_] = pb
        for li, links in enumerate(intra):  # best first, as built
            for p, nbs in enumerate(links):
                nbs.sort(key=lambda q: (-float(layers[li][p] @ layers[li][q]), q))
        return members, layers, intra, inter

    return view._once("chnsw", build)


def fill_archrag(view, ctx, budgets: dict[str, int], cfg) -> None:
    """ArchRAG's sections: hierarchical search over C-HNSW, then adaptive filtering (offline: each piece scored by
    its similarity to the question and the question words it shares, the best kept within the budgets)."""
    from tasks.methods.hirag.retrieval import repeats, report_item
    from tasks.retrieval.context import fill

    if not len(view.ent_ids) or view.ent_vecs is None:  # past retrieval.ann_min_vectors: not yet searched here
        return
    members, layers, intra, inter = view_chnsw(view)
    q = np.asarray(ctx.query_vector, dtype=np.float32)
    found = hierarchical_search(q, layers, intra, inter, cfg.top_n, cfg.search_ef, cfg.search_scan_max)
    sources = "\n".join(c["text"] for c in ctx.chunks)
    words = _words(ctx.question)

    def useful(text: str, sim: float) -> float:  # the map step: usefulness of one piece
        return sim + 0.05 * len(words & _words(text))

    local = [int(members[0][p]) for p in found[0]]
    ents = [
        {
            "id": view.ent_ids[i],
            "name": view.ent_name[i],
            "type": view.ent_type[i],
            "layer": 0,
            "score": round(float(layers[0][p] @ q), 4),
            "text": f"- {view.ent_name[i]} ({view.ent_type[i]}): {view.ent_desc[i]}",
        }
        for p, i in zip(found[0], local)
        if not repeats(view.ent_desc[i], sources)
    ]
    comms = []
    for li in range(1, len(found)):
        for p in found[li]:
            c = represented(view, int(members[li][p]))
            item = report_item(view, c) if c is not None else None
            if item is not None:
                comms.append(item | {"score": round(float(layers[li][p] @ q), 4)})
    related = set(local)
    rels = []
    for a in sorted(related):
        for b in view.flat_graph.adj[a] if a in view.flat_graph else ():
            if b in related and a < b:
                for k in view.edge_rel.get((a, b), []):
                    r = view.rel_rows[k]
                    if r["kind"] == "extracted" and not repeats(r["description"], sources):
                        sim = (float(view.ent_vecs[a] @ q) + float(view.ent_vecs[b] @ q)) / 2
                        rels.append(
                            {
                                "source": r["source_id"],
                                "target": r["target_id"],
                                "kind": r["kind"],
                                "score": sim,
                                "text": f"- {view.statement(r, kind=False)}: {r['description']}",
                            }
                        )
    # the reduce step: the most useful pieces of each kind first, within the section budgets
    for items in (ents, comms, rels):
        items.sort(key=lambda it: -useful(it["text"], it["score"]))
    ctx.entities, ctx.tokens["entities"] = fill(ents, budgets["entities"])
    ctx.communities, ctx.tokens["communities"] = fill(comms, budgets["communities"])
    if "bridge" in budgets:
        ctx.bridge, ctx.tokens["bridge"] = fill(rels, budgets["bridge"])


def _words(text: str) -> set[str]:
    import re

    return {w for w in re.findall(r"[a-z0-9]+", text.lower()) if len(w) > 2}
