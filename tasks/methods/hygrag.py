"""HyGRAG (the HyGRAG paper, §3.1-3.3, Algorithms 1-2, Table 8): chunks in the hierarchy.

* **Hybrid graph** (§3.1): chunk nodes and entity nodes; entity–entity relation edges (their weights),
  entity–chunk membership edges, and chunk–chunk edges where two chunks share more than ``l`` entities
  (entities found in more than ``max_entity_chunks`` of the chunks link nothing: a hub links everything).
* **Structure-aware vectors** (§3.2): Cleora over that graph — each step multiplies the row-normalised
  adjacency with the node vectors and L2-normalises the rows — initialised from the text vectors (the
  paper starts from random ±1 vectors; starting from the text keeps content and structure in one space).
  A layer-0 node is bucketed by ``unit(text + cleora)``. The published entity vectors stay the text ones:
  questions are compared with text.
* **LSH hierarchy** (Algorithm 1): ``k`` seeded random hyperplanes hash each node to a ``k``-bit code; nodes
  of one code form a bucket. Buckets under ``S_min`` merge with their nearest neighbour bucket — the
  buckets that share the longest code prefix with them, the nearest centroid among those — and buckets over
  ``S_max`` are split in halves along a seeded random direction, so every bucket holds ``S_min``..``S_max``
  nodes unless the layer has fewer than ``S_min``. Each bucket is a community with one summary node; the
  summary nodes are the next layer's nodes (text vectors: there is no graph among them); at most ``L``
  layers. A summary's entity members are linked ``summary_of``; its chunk members are its
  ``source_chunk_ids``. Each community lists its summary node first, then its members (level 0: the top layer).
* **Bi-level retrieval** (§3.3), mode ``hygrag``: context-aware — communities by the similarity of their
  summary node to the question, layer-0 entities by their own, the shared graph-ranked sources — then
  relation-aware: the layer-0 entities under the retrieved communities with the context entities, and the
  relations among them ranked by the similarity of their two ends to the question.
* **Updates** are HiRAG's attachment (τ, ancestor re-summarisation) over the same ``summary_of`` links.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import scipy.sparse as sp

from schemas.config import HyGRAGConfig
from tasks.methods.base import BuildLayer0, Hierarchy, MethodContext, UpdateLayer0
from tasks.methods.common import (
    below,
    bucket_communities,
    fallbacks,
    represented,
    summarizer_for,
    unit,
    update_tree,
    write_reports,
)
from tasks.store.rows import relation_table

CHUNK_TYPE = "chunk"


def _synthesis() -> dict[str, Any]:
    """With an LLM, a bucket's summary node is a synthesis of the context its passages share and of the relations
    among its entities (prompt ``hygrag_synthesis``), within ``extract.max_description_tokens``."""
    return {"prompt": "hygrag_synthesis"}


# ---------------------------------------------------------------------------- the hybrid graph
def chunk_links(entity_chunks: list[list[int]], n_chunks: int, more_than: int, max_chunks: int) -> sp.csr_matrix:
    """Chunk–chunk adjacency: the number of entities two chunks share, where it is more than ``more_than``
    (entities in more than ``max_chunks`` chunks are left out)."""
    rows, cols = [], []
    for e, chunks in enumerate(entity_chunks):
        if 0 < len(chunks) <= max_chunks:
            rows += [e] * len(chunks)
            cols += chunks
    incidence = sp.csr_matrix((np.ones(len(rows), np.float32), (rows, cols)), shape=(len(entity_chunks), n_chunks))
    shared = (incidence.T @ incidence).tocsr()
    shared.setdiag(0)
    shared.data[shared.data <= more_than] = 0
    shared.eliminate_zeros()
    return shared


def hybrid_adjacency(
    n_entities: int, relations: list[tuple[int, int, float]], entity_chunks: list[list[int]], links: sp.csr_matrix
) -> sp.csr_matrix:
    """The symmetric adjacency of entities (first) and chunks (after them): relation weights, membership 1,
    chunk links by shared entities."""
    n_chunks = links.shape[0]
    a = [r[0] for r in relations] + [e for e, cs in enumerate(entity_chunks) for _ in cs]
    b = [r[1] for r in relations] + [n_entities + c for cs in entity_chunks for c in cs]
    w = [r[2] for r in relations] + [1.0] * (len(a) - len(relations))
    n = n_entities + n_chunks
    upper = sp.csr_matrix((np.asarray(w, np.float32), (a, b)), shape=(n, n))
    coo = sp.triu(links, k=1).tocoo()  # symmetric already: each pair once
    upper = upper + sp.csr_matrix((coo.data, (coo.row + n_entities, coo.col + n_entities)), shape=(n, n))
    adj = upper + upper.T
    adj.sum_duplicates()
    return adj.tocsr()


def cleora(adjacency: sp.csr_matrix, init: np.ndarray, iterations: int) -> np.ndarray:
    """Cleora: ``iterations`` times X <- rownorm(D^-1 A X); a node without edges keeps its (normalised) vector."""
    x = unit(np.asarray(init, dtype=np.float32))
    degree = np.asarray(adjacency.sum(axis=1)).ravel()
    isolated = degree == 0
    walk = sp.diags(np.where(isolated, 0.0, 1.0 / np.where(isolated, 1.0, degree))) @ adjacency
    for _ in range(iterations):
        nxt = walk @ x
        nxt[isolated] = x[isolated]
        x = unit(nxt)
    return x


# ---------------------------------------------------------------------------- LSH buckets
def lsh_buckets(x: np.ndarray, bits: int, s_min: int, s_max: int, seed: int) -> list[np.ndarray]:
    """Row indices of ``x`` in buckets of ``s_min``..``s_max`` (all rows in one bucket when there are fewer than
    ``s_min``); every row in exactly one bucket; the same buckets for the same input and seed."""
    n = len(x)
    if n == 0:
        return []
    rng = np.random.default_rng(seed)
    planes = rng.standard_normal((x.shape[1], bits))
    code = ((x @ planes) > 0).astype(np.int64) @ (1 << np.arange(bits - 1, -1, -1, dtype=np.int64))
    order = np.lexsort((np.arange(n), code))
    cuts = np.flatnonzero(np.diff(code[order])) + 1
    groups = [(int(code[order[s]]), order[s:e]) for s, e in zip([0, *cuts], [*cuts, n])]
    for depth in range(bits - 1, -1, -1):  # buckets under one prefix of ``depth`` bits are neighbours
        shift, merged, i = bits - depth, [], 0
        while i < len(groups):
            j = i
            while j < len(groups) and groups[j][0] >> shift == groups[i][0] >> shift:
                j += 1
            merged += _merge_small(groups[i:j], x, s_min, (groups[i][0] >> shift) << shift)
            i = j
        groups = merged
    out: list[np.ndarray] = []
    for _, members in groups:
        out += _split(np.sort(members), x, s_max, rng)
    return out


def _merge_small(siblings: list[tuple[int, np.ndarray]], x: np.ndarray, s_min: int, code: int):
    """Siblings under one prefix: the small ones pooled; a pool still under ``s_min`` joins the big sibling
    with the nearest centroid, or waits for the next shorter prefix when there is none."""
    small = [m for _, m in siblings if len(m) < s_min]
    if not small:
        return siblings
    big = [(c, m) for c, m in siblings if len(m) >= s_min]
    pool = np.concatenate(small)
    if len(pool) >= s_min or not big:
        return [*big, (code, pool)]
    centroid = x[pool].mean(axis=0)
    sims = [float(unit(x[m].mean(axis=0, keepdims=True))[0] @ centroid) for _, m in big]
    k = int(np.argmax(sims))  # the first of equals
    big[k] = (big[k][0], np.concatenate([big[k][1], pool]))
    return big


def _split(members: np.ndarray, x: np.ndarray, s_max: int, rng: np.random.Generator) -> list[np.ndarray]:
    """A bucket over ``s_max`` cut in two equal halves along a random direction, recursively."""
    if len(members) <= s_max:
        return [members]
    projection = x[members] @ rng.standard_normal(x.shape[1])
    order = np.lexsort((members, projection))
    half = len(members) // 2
    return _split(np.sort(members[order[:half]]), x, s_max, rng) + _split(np.sort(members[order[half:]]), x, s_max, rng)


# ---------------------------------------------------------------------------- the layers
def build_layers(
    entities: list[dict[str, Any]],
    vectors: np.ndarray,
    relations: pa.Table,
    chunks: list[dict[str, Any]],
    chunk_vectors: np.ndarray,
    cfg: HyGRAGConfig,
    seed: int,
    summarizer,
    embed,
    on_layer=None,
):
    """Summary entities (with text vectors), their ``summary_of`` relations, one community per bucket and the
    layer statistics (``schemas.tables.LayerRow``). Layer 1 buckets entities and chunks by their Cleora vectors,
    the layers above bucket summaries by their text vectors."""
    from tasks.methods.hirag.hierarchy import summary_layers

    dim = vectors.shape[1] if vectors.size else (chunk_vectors.shape[1] if chunk_vectors.size else 0)
    index = {e["id"]: i for i, e in enumerate(entities)}
    chunk_at = {c["id"]: j for j, c in enumerate(chunks)}
    entity_chunks = [[chunk_at[c] for c in e["source_chunk_ids"] if c in chunk_at] for e in entities]
    links = chunk_links(
        entity_chunks, len(chunks), cfg.shared_entities, max(1, int(cfg.max_entity_chunks * len(chunks)))
    )
    pairs = [
        (index.get(a), index.get(b), float(w))
        for a, b, w in zip(
            relations.column("source_id").to_pylist(),
            relations.column("target_id").to_pylist(),
            relations.column("weight").to_pylist(),
        )
    ]
    adj = hybrid_adjacency(
        len(entities), [(a, b, w) for a, b, w in pairs if a is not None and b is not None], entity_chunks, links
    )
    text = np.concatenate([vectors.reshape(-1, dim), chunk_vectors.reshape(-1, dim)]).astype(np.float32)
    nodes = [
        *entities,
        *(
            {"id": c["id"], "name": " ".join(c["text"].split()[:8]), "type": CHUNK_TYPE, "description": c["text"]}
            for c in chunks
        ),
    ]
    x = unit(unit(text) + cleora(adj, text, cfg.cleora_iterations))
    ents, matrix, rels, stats, _ = summary_layers(
        nodes,
        x,
        cfg.max_layers,
        cfg.min_bucket,
        seed,
        lambda z, s: lsh_buckets(z, cfg.lsh_bits, cfg.min_bucket, cfg.max_bucket, s),
        summarizer,
        embed,
        next_features=unit,
        on_layer=on_layer,
    )
    owned: dict[str, list[str]] = {}  # a summary's chunk members are its source chunks, not summary_of links
    for r in rels:
        if r["source_id"] in chunk_at:
            owned.setdefault(r["target_id"], []).append(r["source_id"])
    for e in ents:
        e["source_chunk_ids"] = sorted(owned.get(e["id"], []))
    rels = [r for r in rels if r["source_id"] not in chunk_at]
    return ents, matrix, rels, bucket_communities(ents, rels), stats


class HyGRAG:
    name = "hygrag"
    reads_parts = False  # a build is handed layer 0 whole
    whole_bytes_per_entity = 20_000  # its build in the run process, measured, with room (docs/benchmarks.md)
    vectors_by_id = True  # an update reads the vectors of the layer-0 entities it needs (``UpdateLayer0.vectors_of``)
    modes = {"hygrag": ("entities", "communities", "bridge")}
    relation_kinds: tuple[str, ...] = ()

    def refine(self, ctx, client):
        return ctx

    def build(self, ctx: MethodContext, layer0: BuildLayer0) -> Hierarchy:
        cfg = ctx.cfg
        base = relation_table(layer0.relations)  # read whole: this method clusters over the whole graph at once
        with ctx.stage("hierarchy") as st:
            summarizer = summarizer_for(ctx, 1, **_synthesis())
            chunks, chunk_vectors = layer0.chunk_rows()
            ents, vecs, rels, communities, layers = st.run(
                build_layers,
                layer0.entities,
                layer0.vectors,
                base,
                chunks,
                chunk_vectors,
                cfg.hygrag,
                cfg.seed,
                summarizer,
                ctx.embed,
                on_layer=lambda _s: st.advance(1),
            )
            st.done(
                f"{len([r for r in layers if not r['stopped']])} layers, {len(ents)} summary nodes, "
                f"{len(communities)} buckets",
                summary_entities=len(ents),
                communities=len(communities),
            )
        rels = relation_table(rels)
        entities, relations = layer0.entities + ents, pa.concat_tables([base, rels])
        reports, report_vecs, failures = write_reports(ctx, communities, entities, relations)
        return Hierarchy(ents, vecs, rels, communities, reports, report_vecs, layers, fallbacks(summarizer, failures))

    def update(self, ctx: MethodContext, layer0: UpdateLayer0) -> Hierarchy:
        """The summary-tree update (``common.update_tree``). New chunks reach the hierarchy through their entities."""
        return update_tree(ctx, layer0, _synthesis())

    def levels(self, view, ctx, scores: np.ndarray, budgets: dict[str, int], cfg) -> None:
        fill_bilevel(view, ctx, scores, budgets, cfg)


# ---------------------------------------------------------------------------- bi-level retrieval
def fill_bilevel(view, ctx, scores: np.ndarray, budgets: dict[str, int], cfg) -> None:
    """Context-aware then relation-aware sections of ``ctx`` (``scores``: similarity of every entity)."""
    from tasks.methods.hirag.retrieval import repeats, report_item
    from tasks.retrieval.context import fill, top_k

    if not len(view.ent_ids):
        return
    sources = "\n".join(c["text"] for c in ctx.chunks)
    layer0 = np.flatnonzero(view.ent_layer == 0)
    local = [i for i in top_k(scores, cfg.top_n, layer0) if scores[i] >= cfg.min_similarity]
    ctx.entities, ctx.tokens["entities"] = fill(
        [
            {
                "id": view.ent_ids[i],
                "name": view.ent_name[i],
                "type": view.ent_type[i],
                "layer": 0,
                "score": round(float(scores[i]), 4),
                "text": f"- {view.ent_name[i]} ({view.ent_type[i]}): {view.ent_desc[i]}",
            }
            for i in local
            if not repeats(view.ent_desc[i], sources)
        ],
        budgets["entities"],
    )
    summaries = [
        i
        for i in top_k(scores, cfg.max_communities, np.flatnonzero(view.ent_layer > 0))
        if scores[i] >= cfg.min_similarity
    ]
    comms = [c for c in (represented(view, i) for i in summaries) if c is not None]
    items = [item for item in (report_item(view, c) for c in comms) if item is not None]
    ctx.communities, ctx.tokens["communities"] = fill(items, budgets["communities"])
    if "bridge" not in budgets:
        return
    related = set(local)
    for i in summaries:
        related |= below(view, i, limit=200)
    ranked = []
    for a in sorted(related):
        for b in view.flat_graph.adj[a] if a in view.flat_graph else ():
            if b in related and a < b:
                for k in view.edge_rel.get((a, b), []):
                    ranked.append((-(float(scores[a]) + float(scores[b])) / 2, k))
    rows = []
    for _, k in sorted(ranked):
        r = view.rel_rows[k]
        if r["kind"] != "extracted" or repeats(r["description"], sources):
            continue
        rows.append(
            {
                "source": r["source_id"],
                "target": r["target_id"],
                "kind": r["kind"],
                "text": f"- {view.statement(r, kind=False)}: {r['description']}",
            }
        )
    ctx.bridge, ctx.tokens["bridge"] = fill(rows, budgets["bridge"])
