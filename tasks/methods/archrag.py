"""ArchRAG (seeds 002 and 004): attributed communities layer by layer, and C-HNSW, a hierarchical
nearest-neighbour index over every layer that is searched top down instead of scanned.

* **Attributed communities** (§3.1.2): the layer's graph (its relations) is augmented with KNN edges between
  nodes whose vectors are similar; every edge is weighted by the cosine of its two ends; weighted Leiden
  (graspologic-native) partitions it. Each community becomes a node of the next layer.
* **C-HNSW** (§3.1.3): per layer a nearest-neighbour graph of its nodes (intra-layer links) and, from every
  node of a layer above 0, a link to its nearest node of the layer below (inter-layer links).
* **Hierarchical search** (§3.2.1, Algorithm 2): greedy best-first search for the k nearest nodes in the top
  layer, entered from its best node; the nodes found lead through their inter-layer links to the entry points
  of the layer below, searched the same way, down to layer 0.
"""

from __future__ import annotations

import numpy as np

from tasks.methods.archrag_search import adaptive_filter, fill_archrag
from tasks.methods.base import BuildLayer0, Hierarchy, MethodContext, UpdateLayer0
from tasks.methods.common import (
    bucket_communities,
    fallbacks,
    summarizer_for,
    unit,
    update_tree,
    write_reports,
)
from tasks.methods.hirag.communities import leiden_arrays
from tasks.store.ids import relation_id
from tasks.store.rows import relation_table


def _nearest(x: np.ndarray, k: int, batch: int = 4096):
    """Per batch of rows of ``x`` (unit vectors): (row numbers, their ``k`` nearest other rows best first, ties by
    index, and those cosines)."""
    import torch  # its top-k is ~30x faster than numpy's argpartition over wide rows

    n = len(x)
    for start in range(0, n, batch):
        sims = x[start : start + batch] @ x.T
        rows = np.arange(start, min(n, start + batch))
        sims[rows - start, rows] = -np.inf  # not itself
        s, best = (t.numpy() for t in torch.topk(torch.from_numpy(sims), k, dim=1))
        order = np.lexsort((best, -s), axis=1)
        yield rows, np.take_along_axis(best, order, axis=1), np.take_along_axis(s, order, axis=1)


def knn_edges(x: np.ndarray, k: int, threshold: float, batch: int = 4096) -> list[tuple[int, int, float]]:
    """(i, j, cosine) with i < j for every pair where one is among the other's ``k`` nearest neighbours by
    cosine and their cosine is at least ``threshold``; rows of ``x`` are unit vectors. Sorted, no repeats."""
    n = len(x)
    if n < 2 or k < 1:
        return []
    found = []
    for rows, best, s in _nearest(x, min(k, n - 1), batch):
        keep = s >= threshold
        r = np.broadcast_to(rows[:, None], best.shape)[keep]
        c = best[keep]
        found.append(np.stack([np.minimum(r, c), np.maximum(r, c)], axis=1))
    pairs = np.unique(np.concatenate(found), axis=0) if found else np.zeros((0, 2), dtype=np.int64)
    if not len(pairs):
        return []
    sims = np.einsum("ij,ij->i", x[pairs[:, 0]], x[pairs[:, 1]])
    return list(zip(pairs[:, 0].tolist(), pairs[:, 1].tolist(), sims.tolist()))


def attributed_edges(
    x: np.ndarray, relations: list[tuple[int, int]], k: int, threshold: float
) -> list[tuple[int, int, float]]:
    """The layer's relation edges plus its KNN edges, each weighted by the cosine of its ends (at least 1e-3,
    so that an edge between dissimilar nodes still counts a little)."""
    pairs = {(min(a, b), max(a, b)) for a, b in relations if a != b}
    pairs |= {(a, b) for a, b, _ in knn_edges(x, k, threshold)}
    return [(a, b, max(1e-3, float(x[a] @ x[b]))) for a, b in sorted(pairs)]


def leiden_groups(n: int, edges: list[tuple[int, int, float]], resolution: float, seed: int) -> list[np.ndarray]:
    """Weighted Leiden (graspologic-native) over ``n`` nodes; a node without edges is a group of its own.
    Groups are ordered by their smallest node."""
    group = np.arange(n) + n  # isolated nodes: ids past every Leiden community
    if edges:
        lo, hi, w = (np.asarray(column) for column in zip(*edges))
        nodes, found = leiden_arrays(lo.astype(np.int64), hi.astype(np.int64), w.astype(np.float64), seed, resolution)
        group[nodes] = found
    out: dict[int, list[int]] = {}
    for i, g in enumerate(group.tolist()):
        out.setdefault(g, []).append(i)
    return sorted((np.asarray(m, dtype=np.int64) for m in out.values()), key=lambda m: int(m[0]))


def chnsw_links(layers: list[np.ndarray], m: int) -> tuple[list[list[list[int]]], list[np.ndarray]]:
    """C-HNSW over the unit vectors of each layer (``layers[0]`` the bottom): per layer, each node's intra-layer
    links, best first: its ``m`` nearest nodes of its layer and the nodes that have it among theirs (links go
    both ways, as in HNSW, or a search cannot reach the nodes nobody chose), at most ``2 m``; per layer above 0,
    each node's nearest node of the layer below (inter; ``inter[0]`` is empty)."""
    intra, inter = [], [np.zeros(0, dtype=np.int64)]
    for li, x in enumerate(layers):
        links: list[list[int]] = [[] for _ in range(len(x))]
        if len(x) > 1:
            chosen = [
                np.stack([np.broadcast_to(rows[:, None], best.shape).ravel(), best.ravel()], axis=1)
                for rows, best, _ in _nearest(x, min(m, len(x) - 1))
            ]
            pairs = np.concatenate(chosen)
            pairs = np.unique(np.concatenate([pairs, pairs[:, ::-1]]), axis=0)  # both ways
            sims = np.einsum("ij,ij->i", x[pairs[:, 0]], x[pairs[:, 1]])
            pairs = pairs[np.lexsort((pairs[:, 1], -sims, pairs[:, 0]))]  # per node: best first, ties by index
            starts = np.searchsorted(pairs[:, 0], np.arange(len(x) + 1))
            for node in range(len(x)):
                links[node] = pairs[starts[node] : min(starts[node + 1], starts[node] + 2 * m), 1].tolist()
        intra.append(links)
        if li > 0:
            below = layers[li - 1]
            down = np.zeros(len(x), dtype=np.int64)
            if len(below):
                for start in range(0, len(x), 4096):
                    down[start : start + 4096] = np.argmax(x[start : start + 4096] @ below.T, axis=1)
            inter.append(down)
    return intra, inter


# ---------------------------------------------------------------------------- the method
def build_layers(
    entities: list[dict], vectors: np.ndarray, relations, cfg, seed: int, summarizer, embed, on_layer=None
):
    """Attributed-community layers over the layer-0 entities: summary entities (text vectors), their ``summary_of``
    links, one statistic per layer tried (``schemas.tables.LayerRow``) and every layer's unit vectors."""
    from tasks.methods.hirag.hierarchy import summary_layers

    index = {e["id"]: i for i, e in enumerate(entities)}
    pairs = [
        (index.get(a), index.get(b))
        for a, b in zip(relations.column("source_id").to_pylist(), relations.column("target_id").to_pylist())
    ]
    graph = {"pairs": [(a, b) for a, b in pairs if a is not None and b is not None]}  # the relations of the layer

    def cluster(x: np.ndarray, s: int) -> list[np.ndarray]:
        groups = leiden_groups(
            len(x), attributed_edges(x, graph["pairs"], cfg.knn_k, cfg.knn_threshold), cfg.resolution, s
        )
        group_of = np.empty(len(x), dtype=np.int64)
        for gi, g in enumerate(groups):
            group_of[g] = gi
        graph["pairs"] = sorted(
            {
                (min(group_of[a], group_of[b]), max(group_of[a], group_of[b]))
                for a, b in graph["pairs"]
                if group_of[a] != group_of[b]
            }
        )  # the next layer's: communities a relation joins
        return groups

    def not_shrinking(groups, n, _cs, _rate):
        return "not_shrinking" if len(groups) > (1 - cfg.min_shrink) * n else None

    x = unit(vectors) if len(entities) else np.zeros((0, vectors.shape[-1] if vectors.ndim > 1 else 0), np.float32)
    ents, matrix, rels, stats, layers = summary_layers(
        entities,
        x,
        cfg.max_layers,
        cfg.min_nodes,
        seed,
        cluster,
        summarizer,
        embed,
        stop=not_shrinking,
        next_features=unit,
        on_layer=on_layer,
    )
    return ents, matrix, rels, stats, [x] + [layer.features for layer in layers]


def link_rows(layer_ids: list[list[str]], layers: list[np.ndarray], m: int) -> list[dict]:
    """C-HNSW as ``relations`` rows: ``chnsw`` from a node to each of its M nearest of its layer (weight: cosine),
    ``chnsw_down`` from a node to its nearest node of the layer below."""

    intra, inter = chnsw_links(layers, m)
    rows = []
    for li, ids in enumerate(layer_ids):
        for i, links in enumerate(intra[li]):
            for j in links:
                rows.append(
                    {
                        "id": relation_id(ids[i], layer_ids[li][j], "chnsw"),
                        "source_id": ids[i],
                        "target_id": layer_ids[li][j],
                        "kind": "chnsw",
                        "description": "",
                        "weight": max(1e-3, float(layers[li][i] @ layers[li][j])),
                        "source_chunk_ids": [],
                    }
                )
        if li > 0:
            for i, j in enumerate(inter[li].tolist()):
                rows.append(
                    {
                        "id": relation_id(ids[i], layer_ids[li - 1][j], "chnsw_down"),
                        "source_id": ids[i],
                        "target_id": layer_ids[li - 1][j],
                        "kind": "chnsw_down",
                        "description": "",
                        "weight": max(1e-3, float(layers[li][i] @ layers[li - 1][j])),
                        "source_chunk_ids": [],
                    }
                )
    return rows


class ArchRAG:
    name = "archrag"
    reads_parts = False  # a build is handed layer 0 whole
    whole_bytes_per_entity = 64_000  # its build in the run process, measured, with room (docs/benchmarks.md)
    vectors_by_id = True  # an update reads the vectors of the layer-0 entities it needs (``UpdateLayer0.vectors_of``)
    modes = {"archrag": ("entities", "communities", "bridge")}
    relation_kinds = ("chnsw", "chnsw_down")  # C-HNSW: within a layer, and from a layer to the one below

    def refine(self, ctx, client):
        """ArchRAG's adaptive filtering: the LLM rates the retrieved pieces before the answer is written."""
        return adaptive_filter(ctx, client)

    def build(self, ctx: MethodContext, layer0: BuildLayer0) -> Hierarchy:
        import pyarrow as pa

        cfg = ctx.cfg
        base = relation_table(layer0.relations)  # read whole: this method clusters over the whole graph at once
        with ctx.stage("hierarchy") as st:
            summarizer = summarizer_for(ctx, 1)
            ents, vecs, rels, stats, layers = st.run(
                build_layers,
                layer0.entities,
                layer0.vectors,
                base,
                cfg.archrag,
                cfg.seed,
                summarizer,
                ctx.embed,
                on_layer=lambda _s: st.advance(1),
            )
            ids = [[e["id"] for e in layer0.entities]] + [
                [e["id"] for e in ents if e["layer"] == li] for li in range(1, len(layers))
            ]
            links = st.run(link_rows, ids, layers, cfg.archrag.hnsw_m)
            st.done(
                f"{len(layers) - 1} layers, {len(ents)} communities, {len(links)} C-HNSW links",
                summary_entities=len(ents),
                chnsw_links=len(links),
            )
        communities = bucket_communities(ents, rels)
        entities, relations = layer0.entities + ents, pa.concat_tables([base, relation_table(rels)])
        reports, report_vecs, failures = write_reports(ctx, communities, entities, relations)
        return Hierarchy(
            ents, vecs, rels + links, communities, reports, report_vecs, stats, fallbacks(summarizer, failures)
        )

    def update(self, ctx: MethodContext, layer0: UpdateLayer0) -> Hierarchy:
        """The summary-tree update (``common.update_tree``: new entities attach to their nearest summary per layer,
        τ; communities are read again from the summaries, changed ones get new reports); the C-HNSW links are
        computed again over the updated layers."""

        def chnsw(summaries, vectors):
            top = max((s["layer"] for s in summaries), default=0)
            ids = [sorted(layer0.ids())] + [
                [s["id"] for s in summaries if s["layer"] == li] for li in range(1, top + 1)
            ]
            vec = dict(zip([s["id"] for s in summaries], vectors))
            below = layer0.vectors_of(ctx, ids[0])  # every layer-0 vector: the links are computed again over all
            dim = below.shape[1]
            layers = [unit(below)] + [
                unit(np.stack([vec[i] for i in layer])) if layer else np.zeros((0, dim), np.float32)
                for layer in ids[1:]
            ]
            return link_rows(ids, layers, ctx.cfg.archrag.hnsw_m)

        return update_tree(ctx, layer0, {}, chnsw)

    def levels(self, view, ctx, scores: np.ndarray, budgets: dict[str, int], cfg) -> None:
        fill_archrag(view, ctx, budgets, cfg)
