"""HiIndex clustering: GMM layers and the cluster-sparsity stop rule (HiRAG §4.1, §5.4, Algorithm 1).

For layer i >= 1 the embeddings of layer i-1 are reduced (seeded PCA or UMAP) and clustered
with Gaussian Mixture Models, RAPTOR style: a global mixture, then a local mixture inside
every global cluster, each with its number of components chosen by BIC and with soft
assignment (an entity joins every cluster whose posterior exceeds the threshold, and at
least its most likely one). Cost stays bounded at any N: diagonal covariance with
``reg_covar``, a log-spaced BIC sweep of a few sizes, and fits on a bounded seeded sample
with the rest predicted (docs/design.md, "The hierarchy").

The stop rule is exactly Algorithm 1: CS_i = 1 - Σ|S|(|S|-1) / (|L|(|L|-1)) over the
clustering of layer i-1; stop when |CS_i - CS_{i-1}| / CS_{i-1} <= ε — the layer that
triggers the stop is not built — or at the layer cap, or when too few entities remain.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from schemas.config import HierarchyConfig
from schemas.tables import LayerRow
from tasks.index.embed import entity_text
from tasks.methods.summarize import Cluster, summary_rows

if TYPE_CHECKING:
    from sklearn.mixture import GaussianMixture

STOP_CONVERGED = "cs_change_rate<=epsilon"
STOP_MAX_LAYERS = "max_layers"
STOP_TOO_FEW = "too_few_entities"
STOP_ONE_CLUSTER = "single_cluster"


# ---------------------------------------------------------------------------- eq. 17 and the stop rule
def cluster_sparsity(cluster_sizes: Sequence[int], n_entities: int) -> float:
    """CS = 1 - Σ_S |S|(|S|-1) / (|L|(|L|-1)) (HiRAG eq. 17). Soft clusters count every member."""
    if n_entities < 2:
        raise ValueError("cluster sparsity needs a layer of at least 2 entities")
    pairs = sum(s * (s - 1) for s in cluster_sizes)
    return 1.0 - pairs / (n_entities * (n_entities - 1))


def change_rate(previous_cs: float | None, cs: float) -> float | None:
    """|CS_i - CS_{i-1}| / CS_{i-1}; None for the first clustering (nothing to compare with)."""
    if previous_cs is None:
        return None
    if previous_cs == 0:
        return math.inf if cs != 0 else 0.0
    return abs(cs - previous_cs) / abs(previous_cs)


def should_stop(rate: float | None, epsilon: float) -> bool:
    """Algorithm 1 line 9: stop when the change rate of CS_i is at most ε (never on the first clustering)."""
    return rate is not None and rate <= epsilon


def restate_layers(
    recorded: list[dict[str, Any]], layer_of: dict[str, int], links: Iterable[tuple[str, str]]
) -> list[LayerRow]:
    """Layer statistics after an update moved entities in and out of clusters. For every built layer,
    ``n_entities`` (nodes of the layer below), ``n_clusters`` (summary nodes with members), CS (eq. 17 over
    the member counts of ``links``, ``(member id, summary id)`` pairs) and the change rate are recomputed
    from the published membership; a clustering that was tried and not built keeps its recorded figures."""
    from collections import Counter

    per_layer = Counter(layer_of.values())
    sizes: dict[int, list[int]] = {}
    for summary, n in sorted(Counter(target for _source, target in links).items()):
        sizes.setdefault(layer_of[summary], []).append(n)
    rows, previous_cs = [], None
    for row in recorded:
        row = dict(row)
        if not row["stopped"]:
            n, clusters = per_layer.get(row["layer"] - 1, 0), sizes.get(row["layer"], [])
            cs = cluster_sparsity(clusters, n) if n >= 2 else None
            rate = change_rate(previous_cs, cs) if cs is not None else None
            row.update(
                n_entities=n,
                n_clusters=len(clusters),
                cluster_sparsity=cs,
                change_rate=None if rate is None or math.isinf(rate) else rate,
            )
            previous_cs = cs
        rows.append(row)
    return cast("list[LayerRow]", rows)  # the recorded layer rows, restated


# ---------------------------------------------------------------------------- soft GMM clustering
def soft_assign(posteriors: np.ndarray, threshold: float) -> list[np.ndarray]:
    """Members of each component: every row whose posterior exceeds ``threshold``, plus each row's argmax.

    Every entity joins at least one cluster; empty components are dropped."""
    member = soft_members(posteriors, threshold)
    clusters = [np.flatnonzero(member[:, k]) for k in range(posteriors.shape[1])]
    return [c for c in clusters if len(c)]


def soft_members(posteriors: np.ndarray, threshold: float) -> np.ndarray:
    """Row i is in component k: its posterior exceeds ``threshold``, or k is its most likely component."""
    member = posteriors > threshold
    member[np.arange(len(posteriors)), posteriors.argmax(axis=1)] = True
    return member


def pca_from_moments(n: int, total: np.ndarray, gram: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """The PCA of ``n`` rows from their sum and Gram matrix (X^T X), summed over parts: (mean, components), the
    top ``dim`` eigenvectors of the covariance, each signed so its largest entry is positive (scikit-learn's
    convention; for a tall matrix its PCA takes the same eigenvectors of the same covariance)."""
    mean = total / n
    cov = (gram - n * np.outer(mean, mean)) / max(n - 1, 1)
    values, vectors = np.linalg.eigh(cov)
    components = vectors[:, np.argsort(-values, kind="stable")[:dim]].T
    signs = np.sign(components[np.arange(len(components)), np.abs(components).argmax(axis=1)])
    return mean, components * signs[:, None]


def project(reducer: Any, x: np.ndarray) -> np.ndarray:
    """Rows of ``x`` in the reduced space: ``reducer`` None (none: as they are), (mean, components) of a PCA, or
    a fitted UMAP."""
    if reducer is None:
        return x.astype(np.float64)
    if isinstance(reducer, tuple):
        mean, components = reducer
        return (x.astype(np.float64) - mean) @ components.T
    return reducer.transform(x).astype(np.float64)


def reduce_dims(x: np.ndarray, cfg: HierarchyConfig, seed: int) -> np.ndarray:
    """Seeded PCA (default) or UMAP to ``reduced_dim`` dimensions; small inputs pass through PCA only."""
    n, d = x.shape
    dim = min(cfg.reduced_dim, d, max(n - 2, 1))
    if cfg.reduction == "none" or dim >= d:
        return x.astype(np.float64)
    if cfg.reduction == "umap" and n > dim + 2:
        import umap

        neighbors = min(cfg.umap_neighbors, max(2, n - 1))
        return (
            umap.UMAP(n_neighbors=neighbors, n_components=dim, metric="cosine", random_state=seed, n_jobs=1)
            .fit_transform(x)
            .astype(np.float64)
        )
    from sklearn.decomposition import PCA  # here: an update that attaches (no fit) never pays scikit-learn's import

    return PCA(n_components=dim, random_state=seed, svd_solver="auto").fit_transform(x).astype(np.float64)


def bic_candidates(n: int, lo: int, hi: int, steps: int) -> list[int]:
    """A bounded, log-spaced set of component counts in [lo, hi] (at most ``steps`` values)."""
    hi = max(1, min(hi, n - 1)) if n > 1 else 1
    lo = max(1, min(lo, hi))
    if hi == lo:
        return [lo]
    grid = np.unique(np.round(np.geomspace(lo, hi, num=steps)).astype(int))
    return [int(k) for k in grid]


@dataclass
class GMMFit:
    posteriors: np.ndarray
    n_components: int
    bics: dict[int, float] = field(default_factory=dict)


def fit_gmm_bic(
    z: np.ndarray, candidates: list[int], cfg: HierarchyConfig, seed: int, max_sample: int | None = None
) -> GMMFit:
    """Fit one GMM per candidate size on a seeded sample of at most ``max_sample`` points; keep the lowest BIC.

    The chosen model predicts posteriors for every point."""
    rows = sample_rows(len(z), max_sample or cfg.fit_sample, seed)
    gmm, k, bics = fit_gmm_model(z if rows is None else z[rows], candidates, cfg, seed)
    return GMMFit(posteriors=gmm.predict_proba(z), n_components=k, bics=bics)


def sample_rows(n: int, max_sample: int, seed: int) -> np.ndarray | None:
    """The seeded sample a GMM is fitted on: sorted row numbers, or None for every row."""
    if n <= max_sample:
        return None
    return np.sort(np.random.default_rng(seed).choice(n, max_sample, replace=False))


def fit_gmm_model(
    sample: np.ndarray, candidates: list[int], cfg: HierarchyConfig, seed: int
) -> tuple[GaussianMixture, int, dict[int, float]]:
    """One GMM per candidate size fitted on ``sample``: the lowest BIC's, its size, and every size's BIC."""
    from sklearn.mixture import GaussianMixture  # here, as ``reduce_dims``'s PCA

    best: tuple[float, int, GaussianMixture] | None = None
    bics: dict[int, float] = {}
    for k in candidates:
        if k > len(sample):
            continue
        gmm = GaussianMixture(
            n_components=k,
            covariance_type=cfg.covariance_type,
            reg_covar=cfg.reg_covar,
            n_init=cfg.n_init,
            max_iter=cfg.max_iter,
            init_params="k-means++",
            random_state=seed,
        ).fit(sample)
        bic = float(gmm.bic(sample))
        bics[k] = bic
        if best is None or bic < best[0]:
            best = (bic, k, gmm)
    assert best is not None
    return best[2], best[1], bics


def gmm_clusters(x: np.ndarray, cfg: HierarchyConfig, seed: int) -> list[np.ndarray]:
    """RAPTOR-style two-level soft GMM clustering of the rows of ``x``; clusters as sorted index arrays."""
    n = len(x)
    if n <= 2:
        return [np.arange(n)]
    fit = fit_gmm_bic(reduce_dims(x, cfg, seed), global_candidates(n, cfg), cfg, seed)
    clusters: list[np.ndarray] = []
    for gi, members in enumerate(soft_assign(fit.posteriors, cfg.posterior_threshold)):
        clusters.extend(members[c] for c in local_clusters(x[members], gi, cfg, seed))
    unique: dict[bytes, np.ndarray] = {}
    for c in clusters:
        c = np.sort(c)
        unique.setdefault(c.tobytes(), c)
    return sorted(unique.values(), key=lambda c: (int(c[0]), len(c)))


def global_candidates(n: int, cfg: HierarchyConfig) -> list[int]:
    """The global GMM's sizes tried over ``n`` entities: up to one component per ``cluster_size_hint``."""
    return bic_candidates(
        n, cfg.min_components, min(cfg.max_components, max(1, n // cfg.cluster_size_hint)), cfg.bic_steps
    )


def local_clusters(x: np.ndarray, gi: int, cfg: HierarchyConfig, seed: int) -> list[np.ndarray]:
    """The local clusters of the ``gi``-th global cluster, whose members' vectors are ``x``: row numbers of ``x``
    (the whole cluster when it holds at most twice ``cluster_size_hint``)."""
    n, hint = len(x), cfg.cluster_size_hint
    if n <= hint * 2:
        return [np.arange(n)]
    zl = reduce_dims(x, cfg, seed)
    candidates = bic_candidates(n, 1, min(cfg.max_components, max(1, n // hint)), cfg.bic_steps)
    fit = fit_gmm_bic(zl, candidates, cfg, seed + gi + 1, cfg.local_fit_sample)
    return soft_assign(fit.posteriors, cfg.posterior_threshold)


# ---------------------------------------------------------------------------- the layer loop
def layer_row(
    layer: int,
    n_entities: int,
    n_clusters: int,
    cluster_sparsity: float | None,
    change_rate: float | None,
    stopped: bool,
    stop_reason: str | None,
    seconds: float,
) -> LayerRow:
    """One clustering tried: the layer it builds (or would have built), the entities of the layer below it
    clustered, and the stop rule's figures, as the ``layers`` table holds them."""
    rate = None if change_rate is None or math.isinf(change_rate) else change_rate
    return LayerRow(
        layer=layer,
        n_entities=n_entities,
        n_clusters=n_clusters,
        cluster_sparsity=cluster_sparsity,
        change_rate=rate,
        stopped=stopped,
        stop_reason=stop_reason,
        seconds=round(seconds, 3),
    )


@dataclass
class Layer:
    index: int
    entities: list[dict[str, Any]]
    vectors: np.ndarray  # the text vectors of its entities
    features: np.ndarray  # what the clustering of the next layer sees (by default the vectors)


ClusterFn = Callable[[np.ndarray, int], list[np.ndarray]]
#: (layer i-1's entities, their features, the clusters) -> layer i's entities and vectors
BuildFn = Callable[[int, list[dict[str, Any]], np.ndarray, list[np.ndarray]], tuple[list[dict[str, Any]], np.ndarray]]
#: (clusters, nodes clustered, cluster sparsity, its change rate) -> a stop reason, or None to build the layer
StopFn = Callable[[list[np.ndarray], int, float, "float | None"], "str | None"]


def converged(epsilon: float) -> StopFn:
    """HiRAG's stop rule as a ``StopFn``: the change rate of the cluster sparsity is at most ``epsilon``."""
    return lambda _clusters, _n, _cs, rate: STOP_CONVERGED if should_stop(rate, epsilon) else None


def build_layers(
    base_entities: list[dict[str, Any]],
    base_features: np.ndarray,
    max_layers: int,
    min_entities: int,
    seed: int,
    build_layer: BuildFn,
    cluster: ClusterFn,
    stop: StopFn | None = None,
    features: Callable[[np.ndarray], np.ndarray] | None = None,
    on_layer: Callable[[LayerRow], None] | None = None,
    first: int = 1,
    previous_cs: float | None = None,
    until: int | None = None,
) -> tuple[list[Layer], list[LayerRow]]:
    """The layer loop of every method (Algorithm 1's frame): layer i-1 is clustered (``cluster(its features,
    seed + i)``), ``stop`` may end the loop there (that layer is not built), else ``build_layer`` makes layer i,
    whose ``features(vectors)`` the next clustering sees. Also stops past ``max_layers``, under ``min_entities``
    and after a layer of one cluster. ``first``: the layer the loop starts at (the base is the one below it, whose
    clustering had ``previous_cs``); ``until``: the last layer this call builds (a later call goes on from it).

    Returns the layers built above the base and one statistic per clustering tried."""
    layers: list[Layer] = []
    stats: list[LayerRow] = []
    current = Layer(first - 1, base_entities, base_features, base_features)
    i = first
    while True:
        n = len(current.entities)
        t0 = time.perf_counter()
        if i > max_layers:
            stats.append(layer_row(i, n, 0, None, None, True, STOP_MAX_LAYERS, 0.0))
            break
        if n < min_entities:
            stats.append(layer_row(i, n, 0, None, None, True, STOP_TOO_FEW, 0.0))
            break
        clusters = cluster(current.features, seed + i)
        cs = cluster_sparsity([len(c) for c in clusters], n)
        rate = change_rate(previous_cs, cs)
        reason = stop(clusters, n, cs, rate) if stop else None
        if reason:
            stats.append(layer_row(i, n, len(clusters), cs, rate, True, reason, time.perf_counter() - t0))
            break
        entities, vectors = build_layer(i, current.entities, current.features, clusters)
        stat = layer_row(i, n, len(clusters), cs, rate, False, None, time.perf_counter() - t0)
        stats.append(stat)
        if on_layer:
            on_layer(stat)
        current = Layer(i, entities, vectors, features(vectors) if features else vectors)
        layers.append(current)
        previous_cs = cs
        if len(clusters) == 1:  # everything merged into one cluster: nothing above it to build
            stats.append(layer_row(i + 1, len(entities), 0, None, None, True, STOP_ONE_CLUSTER, 0.0))
            break
        if until is not None and i >= until:
            break
        i += 1
    return layers, stats


def summary_layers(
    entities: list[dict[str, Any]],
    features: np.ndarray,
    max_layers: int,
    min_entities: int,
    seed: int,
    cluster: ClusterFn,
    summarizer: Any,
    embed: Callable[[list[str]], np.ndarray] | None,
    stop: StopFn | None = None,
    next_features: Callable[[np.ndarray], np.ndarray] | None = None,
    on_layer: Callable[[LayerRow], None] | None = None,
    **loop: Any,
) -> tuple[list[dict[str, Any]], np.ndarray, list[dict[str, Any]], list[LayerRow], list[Layer]]:
    """``build_layers`` where each cluster becomes summary entities of the next layer (``summarizer``), embedded
    by their text (no ``embed``: not embedded, a layer no later clustering reads): the summary entities, their
    vectors (one matrix aligned with them), their ``summary_of`` relations, one statistic per clustering tried,
    and the layers built. ``loop``: ``build_layers``' ``first``, ``previous_cs`` and ``until``."""
    relations: list[dict[str, Any]] = []

    def build_layer(i: int, below: list[dict[str, Any]], x: np.ndarray, clusters: list[np.ndarray]):
        groups = [Cluster([below[j] for j in c], x, c) for c in clusters]
        ents, rels = summary_rows(i, groups, summarizer.summarize_layer(i, groups))
        relations.extend(rels)
        if embed is None:
            return ents, np.zeros((len(ents), 0), np.float32)
        return ents, embed([entity_text(e["name"], e["type"], e["description"]) for e in ents])

    layers, stats = build_layers(
        entities, features, max_layers, min_entities, seed, build_layer, cluster, stop, next_features, on_layer, **loop
    )
    dim = features.shape[1] if features.ndim == 2 else 0
    matrix = np.concatenate([layer.vectors for layer in layers]) if layers else np.zeros((0, dim), np.float32)
    return [e for layer in layers for e in layer.entities], matrix, relations, stats, layers


# ---------------------------------------------------------------------------- the whole stage
def build_hierarchy(
    entities: list[dict[str, Any]],
    vectors: np.ndarray,
    cfg: HierarchyConfig,
    seed: int,
    summarizer: Any,
    embed: Callable[[list[str]], np.ndarray] | None,
    on_layer: Callable[[LayerRow], None] | None = None,
    **loop: Any,
) -> tuple[list[dict[str, Any]], np.ndarray, list[dict[str, Any]], list[LayerRow]]:
    """HiIndex: GMM layers >= 1 over the layer-0 ``entities`` (``vectors`` aligned with them) until the
    cluster-sparsity rule stops them: summary entities, their vectors (a matrix aligned with them), the
    summary_of relations and one statistic per clustering tried. ``loop``: where the layer loop starts and
    ends (``build_layers``; a build over parts runs layer 1 as a task, ``tasks.methods.graph_parts``)."""
    if not cfg.enabled:
        return [], np.zeros((0, vectors.shape[1]), np.float32), [], []
    ents, matrix, rels, stats, _ = summary_layers(
        entities,
        vectors,
        cfg.max_layers,
        cfg.min_entities,
        seed,
        lambda x, s: gmm_clusters(x, cfg, s),
        summarizer,
        embed,
        stop=converged(cfg.epsilon),
        on_layer=on_layer,
        **loop,
    )
    return ents, matrix, rels, stats
