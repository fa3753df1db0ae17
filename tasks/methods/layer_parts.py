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
4. ``local_task`` per global cluster: its rows in ``g`` order and the local GMM's clusters; returns each cluster's
   key, first member and size. The run keeps the first of repeated clusters and orders them as ``gmm_clusters``
   does.
5. ``summary_task`` per global cluster: its kept clusters' summary entities (offline, or with an LLM: an unusable
   answer replaced by the offline summary) and their ``summary_of`` links, written to the work folder.

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

from tasks.methods.hirag.hierarchy import (
    fit_gmm_model,
    global_candidates,
    local_clusters,
    pca_from_moments,
    project,
    sample_rows,
    soft_members,
)
from tasks.methods.summarize import Cluster, LLMSummarizer, OfflineSummarizer, summary_rows
from tasks.runtime.llm_client import Usage, shared_client, usage_scope
from tasks.store import workfs
from tasks.store.rows import relation_table, stamped, vector_matrix
from tasks.store.spill import SpilledTable, plain_schema, read_split, write_parts, write_whole

#: what a summary reads of its members (``degree``: how its name picks them) and the clustering of their vectors
COLUMNS = ["id", "name", "type", "description", "degree", "vector"]


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
        self.order: list[tuple[int, int, int, int]] = []  # (first, size, gi, j) of each cluster kept

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
        found = mapper(local_task, jobs, assigned=self.assigned, schema=self.schema, cfg=cfg, seed=seed)
        unique: dict[str, tuple[int, int, int, int]] = {}
        for gi, clusters in enumerate(found):
            for j, (key, first, size) in enumerate(clusters):
                unique.setdefault(key, (first, size, gi, j))
        self.order = sorted(unique.values(), key=lambda c: (c[0], c[1]))
        return [range(c[1]) for c in self.order]

    def build(self, layer: int, _below: Any, _features: Any, _clusters: Any) -> tuple[list[dict[str, Any]], Any]:
        """The summary entities of the clusters (step 5), in the clusters' order; their links written."""

        ctx, cfg = self.ctx, self.cfg
        kept: list[list[int]] = [[] for _ in self.globals]
        for _, _, gi, j in self.order:
            kept[gi].append(j)
        links = [self._out(f"layer1-links-{gi:03d}.parquet") for gi in range(len(self.globals))]
        results = ctx.mapper(
            summary_task,
            [(gi, k, links[gi]) for gi, k in enumerate(self.globals)],
            assigned=self.assigned,
            schema=self.schema,
            kept=kept,
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
        entities = [e for _, _, gi, j in self.order for e in by_cluster[(gi, j)]]
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


def _component(assigned: list[str], k: int, schema: pa.Schema) -> tuple[np.ndarray, np.ndarray, pa.Table]:
    """Global cluster ``k``'s entities, in ``g`` order: their numbers, vectors and other columns (``assigned``'
    ``schema``), left in Arrow for the task that reads them."""
    table = read_split(assigned, k, schema)
    return table.column("g").to_numpy(), vector_matrix(table), table.drop(["vector", "g"])


def local_task(
    job: tuple[int, int, str], assigned: list[str], schema: pa.Schema, cfg: Any, seed: int
) -> list[tuple[str, int, int]]:
    """Global cluster ``job[1]`` (the ``job[0]``-th non-empty one) split by its local GMM (a task): writes its
    clusters (``job[2]``.clusters). Returns (key, first member, size) per cluster, in the local GMM's order."""
    gi, k, out = job
    g, x, _ = _component(assigned, k, schema)
    clusters = local_clusters(x, gi, cfg, seed)
    write_whole(
        pa.table({"rows": pa.array([c.astype(np.int32) for c in clusters], pa.list_(pa.int32()))}),
        f"{out}.clusters",
    )
    keys = [hashlib.blake2b(g[c].astype("<i8").tobytes(), digest_size=16).hexdigest() for c in clusters]
    return [(key, int(g[c[0]]), len(c)) for key, c in zip(keys, clusters)]


def summary_task(
    job: tuple[int, int, str],
    assigned: list[str],
    schema: pa.Schema,
    kept: list[list[int]],
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
    gi, k, out = job
    js = kept[gi]
    _, x, table = _component(assigned, k, schema)
    rows = table.to_pylist()
    base = workfs.join(os.path.dirname(out), f"layer1-local-{gi:03d}")
    members = workfs.read_table(f"{base}.clusters").column("rows").to_pylist()
    clusters = [Cluster([rows[i] for i in members[j]], x, np.array(members[j], np.int64)) for j in js]
    summarizer: Any = OfflineSummarizer(cfg.meta_entities, max_tokens)
    with usage_scope() as usage:
        if llm is not None:
            client = shared_client(llm, cache_dir, share, cap)
            summarizer = LLMSummarizer(client, cfg.meta_entities, per_cluster, max_tokens, min_members=min_members)
        summaries = summarizer.summarize_layer(layer, clusters)
    by_cluster: dict[int, list[dict[str, Any]]] = {}
    links: list[dict[str, Any]] = []
    for j, cluster, summary in zip(js, clusters, summaries):
        ents, rels = summary_rows(layer, [cluster], [summary])
        by_cluster[j] = ents
        links.extend(rels)
    if links:
        write_whole(stamped(relation_table(links), version), out)
    return by_cluster, list(summarizer.failures), asdict(usage), len(links)
