"""Layer 1 of a build's hierarchy as tasks over layer 0's parts: ``hirag.hierarchy``'s layer loop with
``gmm_clusters`` and the summaries spread over tasks, so no task holds every layer-0 entity and the run holds
the clusters' sizes and the summary entities only. Entities are numbered in part order (``g``).

1. ``moments_task`` per part: its rows, the sum of their vectors and their Gram matrix; the run adds them up in
   part order into the PCA (``pca_from_moments``: the covariance's eigenvectors, scikit-learn's PCA up to rounding).
   Each also saves its rows of the global GMM's seeded sample.
2. ``fit_task``: the sample projected and the BIC sweep (UMAP: fitted on the sample, the other rows transformed);
   the model is written to the work folder.
3. ``assign_task`` per part: every row's posteriors, soft-assigned; its rows written a row group per global
   cluster (an entity in two clusters, twice).
4. ``local_task`` per global cluster: its rows in ``g`` order, the local GMM's clusters and their class documents'
   term counts (a row group per term bucket); returns each cluster's key, first member, size and term total. The
   run keeps the first of repeated clusters and orders them as ``gmm_clusters`` does.
5. ``totals_task`` per term bucket: each term's count over the kept clusters (class TF-IDF's idf couples every
   cluster of the layer).
6. ``summary_task`` per global cluster: its kept clusters' summary entities (offline: key phrases with the layer's
   idf; with an LLM: its summaries, an unusable one replaced by an offline summary whose idf is over the task's
   unusable ones) and their ``summary_of`` links, written to the work folder.

The clusters and the summaries are ``gmm_clusters``' and ``build_hierarchy``'s over the same rows up to the PCA's
rounding; the links come in the global clusters' order.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import asdict
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tasks.methods.hirag.hierarchy import (
    fit_gmm_model,
    global_candidates,
    local_clusters,
    pca_from_moments,
    project,
    sample_rows,
    soft_members,
)
from tasks.runtime.llm_client import Usage, shared_client, usage_scope
from tasks.store import workfs
from tasks.store.rows import relation_table, stamped, vector_matrix
from tasks.store.spill import SpilledTable, key_hash, plain_schema, read_split, write_parts, write_whole

COLUMNS = ["id", "name", "type", "description", "vector"]
#: a cluster's (``j``) class-document term counts
TERMS = pa.schema([("j", pa.int32()), ("term", pa.string()), ("count", pa.float64())])


class LayerOne:
    """The run's side: ``cluster`` and ``build`` are ``build_layers``' ``ClusterFn`` and ``BuildFn`` for layer 1
    over the parts (its ``base_entities`` are ``range(n)``: the run holds none)."""

    def __init__(self, ctx: Any, layer0: SpilledTable, work: str, per_cluster: int):
        self.ctx, self.cfg, self.work = ctx, ctx.cfg.hierarchy, work
        self.files = layer0.files
        self.per_cluster = per_cluster
        self.failures: list[dict[str, str]] = []
        self.links: list[str] = []
        self.n_links = 0
        self.globals: list[int] = []  # the non-empty global components, in order (``gi`` numbers them)
        self.largest = 0
        self.assigned: list[str] = []  # each part's rows by global component (``assign_task``)
        self.schema = assigned_schema(layer0.schema)  # the columns of the ``assigned`` files
        self.buckets = len(self.files)  # term buckets of the idf round
        self.order: list[tuple[int, int, int, int, int]] = []  # (first, size, gi, j, terms) of each cluster kept

    def _out(self, name: str) -> str:
        return workfs.join(self.work, name)

    def cluster(self, _features: Any, seed: int) -> list[range]:
        """``gmm_clusters`` over the parts (steps 1-4): the clusters as ranges of their sizes."""

        cfg, mapper = self.cfg, self.ctx.mapper
        counts = [workfs.parquet_file(f).metadata.num_rows for f in self.files]
        n = sum(counts)
        offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        rows = sample_rows(n, cfg.fit_sample, seed)  # the global GMM's sample, as fit_gmm_bic draws it
        rows = np.arange(n) if rows is None else rows
        at = np.searchsorted(rows, np.concatenate([offsets, [n]]))
        samples = [self._out(f"layer1-sample-{p:05d}.npy") for p in range(len(self.files))]
        parts = [
            (f, (rows[a:b] - o).tolist(), out) for f, a, b, o, out in zip(self.files, at[:-1], at[1:], offsets, samples)
        ]
        moments = mapper(moments_task, parts)
        d = moments[0][1].shape[0]
        model = self._out("layer1-model.pkl")
        if n <= 2:
            model = ""  # every entity in one cluster, as gmm_clusters
        else:
            dim, reducer = min(cfg.reduced_dim, d, max(n - 2, 1)), cast(Any, None)  # as reduce_dims
            if cfg.reduction == "umap" and n > dim + 2 and dim < d:
                reducer = "umap"
            elif cfg.reduction != "none" and dim < d:
                reducer = pca_from_moments(n, sum(m[1] for m in moments), sum(m[2] for m in moments), dim)
            [_] = mapper(fit_task, [model], samples=[s for s, (_, r, _) in zip(samples, parts) if r], reducer=reducer,
                         candidates=global_candidates(n, cfg), cfg=cfg, seed=seed, dim=dim)  # fmt: skip
        self.assigned = [self._out(f"layer1-assigned-{p:05d}.parquet") for p in range(len(self.files))]
        sizes = np.sum(
            mapper(assign_task, list(zip(self.files, self.assigned, offsets.tolist())), model=model,
                   threshold=cfg.posterior_threshold),
            axis=0,
        )  # fmt: skip
        self.globals = [int(k) for k in np.flatnonzero(sizes)]  # soft_assign drops empty components
        self.largest = int(sizes.max())  # what one local task holds, in entities
        jobs = [(gi, k, self._out(f"layer1-local-{gi:03d}")) for gi, k in enumerate(self.globals)]
        found = mapper(
            local_task, jobs, assigned=self.assigned, schema=self.schema, cfg=cfg, seed=seed, buckets=self.buckets
        )
        unique: dict[str, tuple[int, int, int, int, int]] = {}
        for gi, clusters in enumerate(found):
            for j, (key, first, size, terms) in enumerate(clusters):
                unique.setdefault(key, (first, size, gi, j, terms))
        self.order = sorted(unique.values(), key=lambda c: (c[0], c[1]))
        return [range(c[1]) for c in self.order]

    def build(self, layer: int, _below: Any, _features: Any, _clusters: Any) -> tuple[list[dict[str, Any]], Any]:
        """The summary entities of the clusters (steps 5-6), in the clusters' order; their links written."""

        ctx, cfg = self.ctx, self.cfg
        kept: list[list[int]] = [[] for _ in self.globals]
        for _, _, gi, j, _ in self.order:
            kept[gi].append(j)
        totals = [self._out(f"layer1-terms-{b:05d}.parquet") for b in range(self.buckets)]
        locals_ = [self._out(f"layer1-local-{gi:03d}") for gi in range(len(self.globals))]
        ctx.mapper(totals_task, list(enumerate(totals)), local=locals_, kept=kept)
        total_terms = sum(c[4] for c in self.order)
        links = [self._out(f"layer1-links-{gi:03d}.parquet") for gi in range(len(self.globals))]
        results = ctx.mapper(
            summary_task,
            [(gi, k, links[gi]) for gi, k in enumerate(self.globals)],
            assigned=self.assigned,
            schema=self.schema,
            totals=totals,
            kept=kept,
            avg=total_terms / len(self.order),
            any_terms=total_terms > 0,
            cfg=cfg,
            layer=layer,
            llm=ctx.cfg.llm.stage("summaries"),
            min_members=ctx.cfg.llm.summaries.min_members,
            cap=ctx.cap_for("summaries"),
            cache_dir=str(ctx.catalog.cache_dir),
            per_cluster=self.per_cluster,
            max_tokens=ctx.cfg.extract.max_description_tokens,
            version=ctx.version,
            share=None,
        )
        by_cluster: dict[tuple[int, int], list[dict[str, Any]]] = {}
        for gi, (summaries, failures, usage, n_links) in enumerate(results):
            by_cluster.update(((gi, j), ents) for j, ents in summaries.items())
            self.failures.extend(failures)
            ctx.usage.add(Usage(**usage))
            self.n_links += n_links
        self.links = [f for f, (_, _, _, n) in zip(links, results) if n]
        entities = [e for _, _, gi, j, _ in self.order for e in by_cluster[(gi, j)]]
        return entities, np.zeros((len(entities), 0), np.float32)


def moments_task(job: tuple[str, list[int], str]) -> tuple[int, np.ndarray, np.ndarray]:
    """A part's rows, the sum of their vectors and their Gram matrix X^T X (a task; float64); the vectors of its
    rows ``job[1]`` in the global GMM's sample saved to ``job[2]`` (none: no file)."""
    file, rows, out = job
    x = vector_matrix(workfs.read_table(file, columns=["vector"]))
    if rows:
        workfs.save_array(x[rows], out)
    x = x.astype(np.float64)
    return len(x), x.sum(axis=0), x.T @ x


def fit_task(
    out: str, samples: list[str], reducer: Any, candidates: list[int], cfg: Any, seed: int, dim: int
) -> int:  # fmt: skip
    """The global GMM (a task): the sample the parts saved (``samples``, in part order), reduced (``reducer``: a
    PCA's (mean, components), None, or "umap": fitted here on the sample), the BIC sweep on them; (reducer, GMM)
    pickled to ``out``. Returns the GMM's size."""

    x = np.concatenate([workfs.load_array(f) for f in samples])
    if reducer == "umap":
        import umap

        neighbors = min(cfg.umap_neighbors, max(2, len(x) - 1))
        reducer = umap.UMAP(
            n_neighbors=neighbors, n_components=dim, metric="cosine", random_state=seed, n_jobs=1
        ).fit(x)  # fmt: skip
    gmm, k, _ = fit_gmm_model(project(reducer, x), candidates, cfg, seed)
    workfs.save_object((reducer, gmm), out)
    return k


def assign_task(job: tuple[str, str, int], model: str, threshold: float) -> np.ndarray:
    """A part's rows soft-assigned to the global GMM's components (a task; no ``model``: all to one): written to
    ``job[1]`` with their number ``g`` (``job[2]`` + row), a row group per component. Returns each component's
    rows here."""

    src, out, offset = job
    table = workfs.read_table(src, columns=COLUMNS)
    if model:
        reducer, gmm = workfs.load_object(model)
        member = soft_members(gmm.predict_proba(project(reducer, vector_matrix(table))), threshold)
    else:
        member = np.ones((table.num_rows, 1), bool)
    rows, comps = np.nonzero(member)  # by row, then component
    table = table.append_column("g", pa.array(np.arange(offset, offset + table.num_rows, dtype=np.int64)))
    write_parts(table.take(pa.array(rows)), comps.astype(np.int32), out)
    return member.sum(axis=0)


def assigned_schema(layer0: pa.Schema) -> pa.Schema:
    """The columns of an ``assign_task`` file (but its part's): layer 0's ``COLUMNS`` and the row's number ``g``."""
    return pa.schema([*(plain_schema(layer0).field(c) for c in COLUMNS), pa.field("g", pa.int64())])


def _component(assigned: list[str], k: int, schema: pa.Schema) -> tuple[np.ndarray, np.ndarray, list[dict[str, Any]]]:
    """Global cluster ``k``'s entities, in ``g`` order: their numbers, vectors and rows (``assigned``' ``schema``)."""
    table = read_split(assigned, k, schema)
    return table.column("g").to_numpy(), vector_matrix(table), table.drop(["vector", "g"]).to_pylist()


def local_task(
    job: tuple[int, int, str], assigned: list[str], schema: pa.Schema, cfg: Any, seed: int, buckets: int
) -> list[tuple[str, int, int, int]]:
    """Global cluster ``job[1]`` (the ``job[0]``-th non-empty one) split by its local GMM (a task): writes its
    clusters (``job[2]``.clusters) and their class documents' term counts (``job[2]``.terms, a row group per term
    bucket). Returns (key, first member, size, terms) per cluster, in the local GMM's order."""
    from tasks.methods.summarize import Cluster, class_documents, over_documents

    gi, k, out = job
    g, x, rows = _component(assigned, k, schema)
    clusters = local_clusters(x, gi, cfg, seed)
    write_whole(
        pa.table({"rows": pa.array([c.astype(np.int32) for c in clusters], pa.list_(pa.int32()))}),
        f"{out}.clusters",
    )
    docs, _ = class_documents([Cluster([rows[i] for i in c], x, c) for c in clusters])
    del x, rows
    terms = over_documents(_count_rows, docs)
    write_parts(terms, (key_hash(terms.column("term")) % np.uint64(buckets)).astype(np.int32), f"{out}.terms")
    sums = np.bincount(terms.column("j").to_numpy(), terms.column("count").to_numpy(), len(clusters))
    keys = [hashlib.blake2b(g[c].astype("<i8").tobytes(), digest_size=16).hexdigest() for c in clusters]
    return [(key, int(g[c[0]]), len(c), int(s)) for key, c, s in zip(keys, clusters, sums)]


def _count_rows(docs: list[str]) -> pa.Table:
    """The documents' term counts as rows (document ``j``, term, count)."""
    from tasks.methods.summarize import term_counts

    counted = term_counts(docs)
    if counted is None:
        return TERMS.empty_table()
    terms, counts = counted
    j = np.repeat(np.arange(counts.shape[0], dtype=np.int32), np.diff(counts.indptr))
    return pa.table({"j": j, "term": pa.array(terms[counts.indices], pa.string()), "count": counts.data}, TERMS)


def totals_task(job: tuple[int, str], local: list[str], kept: list[list[int]]) -> int:
    """Term bucket ``job[0]``'s counts over the kept clusters of every global cluster (a task), written to
    ``job[1]``. Returns its terms."""
    b, out = job
    parts = [TERMS.empty_table()]
    for base, js in zip(local, kept):
        t = read_split([f"{base}.terms"], b, TERMS)
        parts.append(t.filter(pc.is_in(t.column("j"), pa.array(js, pa.int32()))))
    table = pa.concat_tables(parts).group_by("term").aggregate([("count", "sum")])
    write_whole(table.rename_columns(["term", "total"]), out)
    return table.num_rows


def _phrases(base: str, js: list[int], totals: list[str], avg: float, firsts: list[list[str]]) -> list[list[str]]:
    """The key phrases of clusters ``js`` (``class_phrases`` with the layer's idf)."""
    from tasks.methods.summarize import TOP_PHRASES, idf_of, pick_phrases

    terms = workfs.read_table(f"{base}.terms", columns=["j", "term", "count"])
    terms = terms.filter(pc.is_in(terms.column("j"), pa.array(js, pa.int32())))
    known = pa.concat_tables(
        [t.filter(pc.is_in(t.column("term"), terms.column("term"))) for t in map(workfs.read_table, totals)]
    )  # fmt: skip
    terms = terms.join(known, "term").sort_by("j")
    at = terms.column("j").to_numpy()
    names = terms.column("term").to_numpy(zero_copy_only=False)
    counts, idf = terms.column("count").to_numpy(), idf_of(avg, terms.column("total").to_numpy())
    out = []
    for i, j in enumerate(js):
        lo, hi = np.searchsorted(at, [j, j + 1])
        if lo == hi:
            out.append(firsts[i][:1])
            continue
        c = counts[lo:hi]
        out.append(pick_phrases(names[lo:hi], (c / max(c.sum(), 1e-12)) * idf[lo:hi], TOP_PHRASES))
    return out


def summary_task(
    job: tuple[int, int, str],
    assigned: list[str],
    schema: pa.Schema,
    totals: list[str],
    kept: list[list[int]],
    avg: float,
    any_terms: bool,
    cfg: Any,
    layer: int,
    llm: Any,
    cache_dir: str,
    per_cluster: int,
    max_tokens: int,
    version: int,
    share: int = 1,
    cap: tuple[str, float] | None = None,
    min_members: int = 0,
) -> tuple[dict[int, list[dict[str, Any]]], list[dict[str, str]], dict[str, Any], int]:
    """The summary entities of global cluster ``job[1]``'s kept clusters (a task), their ``summary_of`` links
    written to ``job[2]`` stamped ``version``. Returns the entities by local cluster, the LLM summaries that fell
    back to offline ones, the LLM usage and the links written."""
    from tasks.methods.summarize import TOP_PHRASES, Cluster, LLMSummarizer, OfflineSummarizer, summary_rows

    gi, k, out = job
    js = kept[gi]
    _, x, rows = _component(assigned, k, schema)
    base = workfs.join(os.path.dirname(out), f"layer1-local-{gi:03d}")
    members = workfs.read_table(f"{base}.clusters").column("rows").to_pylist()
    clusters = [Cluster([rows[i] for i in members[j]], x, np.array(members[j], np.int64)) for j in js]
    offline, summarizer = OfflineSummarizer(cfg.meta_entities, max_tokens), cast(Any, None)
    with usage_scope() as usage:
        if llm is not None:
            client = shared_client(llm, cache_dir, share, cap)
            summarizer = LLMSummarizer(client, cfg.meta_entities, per_cluster, max_tokens, min_members=min_members)
            summaries = summarizer.summarize_layer(layer, clusters)
        else:
            summarizer, firsts = offline, [[m["name"] for m in c.members[:TOP_PHRASES]] for c in clusters]
            phrases = _phrases(base, js, totals, avg, firsts) if any_terms else firsts
            summaries = offline.summaries(clusters, phrases)
    by_cluster: dict[int, list[dict[str, Any]]] = {}
    links: list[dict[str, Any]] = []
    for j, cluster, summary in zip(js, clusters, summaries):
        ents, rels = summary_rows(layer, [cluster], [summary])
        by_cluster[j] = ents
        links.extend(rels)
    if links:
        write_whole(stamped(relation_table(links), version), out)
    return by_cluster, list(summarizer.failures), asdict(usage), len(links)
