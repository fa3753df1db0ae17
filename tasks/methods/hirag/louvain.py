"""Level 0 of the communities where the graph is too large for one Leiden task: synchronous Louvain rounds over
parts of the graph (issue 69; the probe and its figures: docs/benchmarks.md, "Communities over parts").

The graph is held as directed edges, each undirected edge once in each direction, split into parts by their source
node: a part's task sees every edge of its own nodes and nothing else. A round moves each node of a random half
(``movers``: a hash of the node, the seed, the level and the round, the same whichever part holds it) to the
neighbouring community that raises modularity most (``best_moves``), all against the community totals of the
round's start, so the parts' tasks are independent, and a round's moves do not depend on how many parts there are
or which task ran first. The half keeps two neighbours from swapping communities forever. When a round moves nothing,
the level's communities become the nodes of the next level (``contract``), whose degrees are their members' sums,
until a level merges nothing; a last run of rounds over the first level moves single nodes between the final
communities. Modularity is computed against the whole graph's weight ``m`` at every level.

Pure functions of arrays; the same edges, in the same order, give the same communities.
"""

from __future__ import annotations

import numpy as np

#: rounds of one level at most. The moves fall by about a quarter a round (MuSiQue's first level: 10,874 in the first,
#: 153 in the twentieth) and what is left moves a level up; modularity is the same within half a percent with 50 or
#: 100 rounds, or stopping at 1 % of the nodes moving (docs/benchmarks.md, "Communities over parts")
MAX_ROUNDS = 20

#: the level number the last rounds (single nodes between the final communities) draw their halves with
REFINE_LEVEL = 1_000

_MIX = np.uint64(0x9E3779B97F4A7C15)


def movers(nodes: np.ndarray, seed: int, level: int, round_: int) -> np.ndarray:
    """Whether each of ``nodes`` may move in this round: about half of them, by a hash (splitmix64's finaliser) of
    the node and (seed, level, round), so every part's task draws the same half."""
    salt = np.uint64((seed * 1_000_003 + level * 7_919 + round_ * 104_729) & 0xFFFFFFFFFFFFFFFF)
    with np.errstate(over="ignore"):
        x = nodes.astype(np.uint64) * _MIX ^ salt
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return (x & np.uint64(1)).astype(bool)


def best_moves(
    src: np.ndarray,
    dst: np.ndarray,
    w: np.ndarray,
    labels: np.ndarray,
    deg: np.ndarray,
    tot: np.ndarray,
    m: float,
    resolution: float,
    may_move: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """(nodes, their new communities) for the sources of the directed edges (``src`` -> ``dst`` of weight ``w``, no
    self-loops) that ``may_move`` (a mask over the edges' sources) and gain modularity by joining a neighbour's
    community: the gain of moving i from A to C is (k_i,C - k_i,A) / m - resolution * k_i * (tot_C - (tot_A - k_i))
    / (2 m^2), with k_i,X the weight of i's edges into X (A without i), ``tot`` the communities' degree sums at the
    round's start and ``deg`` the nodes' degrees. The best gain wins, the lower community number on a tie; no gain,
    no move."""
    keep = may_move
    src, dst, w = src[keep], dst[keep], w[keep]
    if not len(src):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    k = int(labels.max()) + 1
    key = src.astype(np.int64) * k + labels[dst]
    order = np.argsort(key, kind="stable")
    key = key[order]
    first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    into = np.add.reduceat(w[order], first)
    node, cand = key[first] // k, key[first] % k
    own = labels[node]
    at_own = cand == own
    k_own = np.zeros(len(labels))
    k_own[node[at_own]] = into[at_own]
    ki = deg[node]
    gain = (into - k_own[node]) / m - resolution * ki * (tot[cand] - (tot[own] - ki)) / (2 * m * m)
    gain[at_own] = 0.0
    best = np.lexsort((cand, -gain, node))
    best = best[np.r_[True, node[best][1:] != node[best][:-1]]]  # each node's best candidate
    moving = best[gain[best] > 1e-12 / m]
    return node[moving], cand[moving]


def numbered(labels: np.ndarray) -> np.ndarray:
    """``labels`` renumbered 0.. in the order of their values."""
    return np.unique(labels, return_inverse=True)[1].astype(np.int64)


def contract(src: np.ndarray, dst: np.ndarray, w: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, ...]:
    """The directed edges between communities (``labels`` of the edges' nodes), each pair once with its summed
    weight, in (source, target) order; edges inside a community leave (its degree keeps their weight)."""
    a, b = labels[src], labels[dst]
    cross = a != b
    a, b, w = a[cross], b[cross], w[cross]
    k = int(labels.max()) + 1 if len(labels) else 1
    key = a.astype(np.int64) * k + b
    order = np.argsort(key, kind="stable")
    key = key[order]
    if not len(key):
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
    first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    return key[first] // k, key[first] % k, np.add.reduceat(w[order], first)


def level_rounds(
    src: np.ndarray,
    dst: np.ndarray,
    w: np.ndarray,
    labels: np.ndarray,
    deg: np.ndarray,
    m: float,
    seed: int,
    level: int,
    resolution: float = 1.0,
) -> np.ndarray:
    """Rounds of ``best_moves`` over one level's edges held in one place, from ``labels``, until a round moves
    nothing (or ``MAX_ROUNDS``): the level's communities, renumbered."""
    for r in range(MAX_ROUNDS):
        tot = np.bincount(labels, deg, int(labels.max()) + 1)
        nodes, to = best_moves(src, dst, w, labels, deg, tot, m, resolution, movers(src, seed, level, r))
        if not len(nodes):
            break
        labels = labels.copy()
        labels[nodes] = to
    return numbered(labels)


def louvain(
    src: np.ndarray,
    dst: np.ndarray,
    w: np.ndarray,
    n: int,
    seed: int,
    resolution: float = 1.0,
    deg: np.ndarray | None = None,
    m: float | None = None,
    first_level: int = 0,
) -> np.ndarray:
    """Each of the ``n`` nodes' community by Louvain's levels (module docstring) over directed edges held in one
    place, then single-node moves over the first level; ``deg`` and ``m``: where these edges are a coarse level of a
    larger graph (its nodes' degrees with their inner weight, the whole graph's weight)."""
    deg = np.bincount(src, w, n) if deg is None else deg
    m = float(deg.sum()) / 2 if m is None else m
    if m <= 0:
        return np.arange(n, dtype=np.int64)
    mapping, level = np.arange(n, dtype=np.int64), first_level
    s, d, ww, dg = src, dst, w, deg
    while True:
        labels = level_rounds(s, d, ww, np.arange(len(dg), dtype=np.int64), dg, m, seed, level, resolution)
        if int(labels.max()) + 1 == len(dg):
            break
        mapping = labels[mapping]
        s, d, ww = contract(s, d, ww, labels)
        dg = np.bincount(labels, dg, int(labels.max()) + 1)
        level += 1
    return level_rounds(src, dst, w, mapping, deg, m, seed, REFINE_LEVEL, resolution)


def modularity(src: np.ndarray, dst: np.ndarray, w: np.ndarray, labels: np.ndarray, resolution: float = 1.0) -> float:
    """Newman's modularity of ``labels`` over directed edges (each undirected edge once each way)."""
    deg = np.bincount(src, w, len(labels))
    two_m = float(deg.sum())
    if two_m <= 0:
        return 0.0
    inner = np.bincount(labels[src][labels[src] == labels[dst]], w[labels[src] == labels[dst]], int(labels.max()) + 1)
    tot = np.bincount(labels, deg, int(labels.max()) + 1)
    return float((inner / two_m - resolution * (tot / two_m) ** 2).sum())
