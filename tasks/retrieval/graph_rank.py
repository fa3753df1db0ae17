"""Graph-ranked sources: Personalized PageRank over an entity–chunk graph (HippoRAG 2, LinearRAG).

Nodes are the chunks and the layer-0 entities of a snapshot. Edges:

* chunk–entity, weighted by the entity's share of the chunk's mentions (from the ``mentions``
  table, so a chunk's transition mass is spread over what it talks about);
* entity–entity, the extracted relations (weighted by their number of supporting sentences).

A walker on an entity node moves to one of its chunks with probability ``1 - relation_share``
and along a relation otherwise; on a chunk node it moves to one of the chunk's entities.

The walk restarts (probability ``1 - damping``) at a personalization vector built from the
question, never from file order or ids:

* the entities the question names, whatever their frequency: every word n-gram of the question is
  normalised the way entity names are resolved at merge (possessives dropped) and looked up, longest
  matches first, a one-word match only where it is a name (an entity typed other than ``concept``,
  or a concept written capitalised in the corpus and in the question: "visit" in "How many spirits
  visit Scrooge?" is not one); a capitalised
  word of the question that is one word of longer names ("Scrooge" of "Ebenezer Scrooge", "Marley"
  of "Jacob Marley"), where no full name took it, names those entities too, sharing one seed's weight; and the
  ``vector_seeds`` entities nearest to the question vector, if at least ``vector_threshold``
  similar (names written differently), weighted by that similarity;
* the entities of the best-matching sentence (BM25 over the sentences entities were extracted
  from) in each of the ``chain_chunks`` best chunks of the prior ranking that also occur in
  another chunk — the bridge to the next hop, which may share no word with the question;
* each entity seed weighted by its specificity (1 / the number of chunks it occurs in): a name in
  every chunk of a book still seeds, weakly; dates and numbers are never seeds, and entities found in
  more than ``max_df`` of the chunks are not vector or chain seeds;
* a small prior on every chunk: ``prior_weight`` × the min-max normalised prior score (dense,
  or dense fused with BM25), so the walk refines the question's own ranking of passages.

Power iteration over a scipy.sparse transition matrix: no Python loop over nodes per query.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import scipy.sparse as sp

from schemas.config import RetrievalConfig
from tasks.retrieval.lexical import BM25Index
from tasks.store.ids import normalize_name

_WORD = re.compile(r"\S+")
_NUMERIC = re.compile(r"^[\d\s.,:/\-–%$€£]+$")
NOT_SEED_TYPES = {"time"}
#: words that are never a part of a name a question gives alone (question words, articles, titles)
_NOT_NAME_PARTS = frozenset(
    "who whom whose what when where which why how is are was were did does do in on at of for to by from the a an "
    "and or not name mr mrs miss ms dr sir lord lady st saint jr sr".split()
)


_PPR = RetrievalConfig.model_fields  # the ppr_* settings: their defaults are the parameters' defaults


@dataclass(frozen=True)
class RankParams:
    """The walk's parameters: ``retrieval.ppr_*`` (``from_config``), and three that are not settings."""

    damping: float = _PPR["ppr_damping"].default
    relation_share: float = _PPR["ppr_relation_share"].default
    prior_weight: float = _PPR["ppr_prior_weight"].default
    chain_chunks: int = _PPR["ppr_chain_chunks"].default
    chain_weight: float = _PPR["ppr_chain_weight"].default
    max_df: float = _PPR["ppr_max_df"].default
    vector_seeds: int = _PPR["ppr_vector_seeds"].default
    vector_threshold: float = _PPR["ppr_vector_threshold"].default
    max_ngram: int = 6
    iterations: int = 30
    tol: float = 1e-4  # L1 change per iteration; the top ranks are settled well before (measured at 100k entities)

    @classmethod
    def from_config(cls, cfg: RetrievalConfig) -> RankParams:
        return cls(**{f.name: getattr(cfg, f"ppr_{f.name}") for f in fields(cls) if f"ppr_{f.name}" in _PPR})


@dataclass
class PassageGraph:
    n_chunks: int
    ent_view: np.ndarray  # view entity index of each entity node
    keys: dict[str, int]  # normalised entity name -> entity node
    df: np.ndarray  # chunks each entity node occurs in
    seedable: np.ndarray  # bool: may be a vector or chain seed (not a date/number, not in too many chunks)
    nameable: np.ndarray  # bool: seeds when the question names it (not a date/number; a name or several words)
    sure: np.ndarray  # bool: nameable whatever the question's case (typed other than concept, or several words)
    parts: dict[str, list[int]]  # a word of a name of several words -> the entity nodes whose name holds it
    sent_chunk: np.ndarray  # chunk of each sentence (sorted)
    sent_ent: sp.csr_matrix  # sentences x entity nodes (1 where the sentence mentions the entity)
    sent_index: BM25Index
    walk: sp.csr_matrix  # transposed row-stochastic transition matrix over chunks + entities

    @property
    def n_entities(self) -> int:
        return len(self.ent_view)


def build_passage_graph(
    chunk_index: dict[str, int],
    ent_names: list[str],
    ent_types: list[str],
    ent_layer: np.ndarray,
    mentions: Any,
    relations: list[tuple[int, int, float]],
    params: RankParams = RankParams(),
    ent_aliases: list[list[str] | None] | None = None,
) -> PassageGraph:
    """The graph of one snapshot. ``mentions``: a polars frame of entity mentions (chunk_id, key, description);
    ``relations``: (view entity index, view entity index, weight) of the extracted layer-0 relations;
    ``ent_aliases``: each entity's merged names (``entities.aliases``), which a question names it by too where no
    entity is named so itself."""
    import polars as pl

    n_chunks = len(chunk_index)
    ent_view = np.flatnonzero(ent_layer == 0)
    node_of_view = {int(v): i for i, v in enumerate(ent_view)}
    keys: dict[str, int] = {}
    for i, v in enumerate(ent_view):
        keys.setdefault(normalize_name(ent_names[v]), i)
    n_ent = len(ent_view)

    m = mentions.with_columns(
        pl.col("chunk_id").replace_strict(chunk_index, default=None, return_dtype=pl.Int64).alias("c"),
        pl.col("key").replace_strict(keys, default=None, return_dtype=pl.Int64).alias("e"),
    ).drop_nulls(["c", "e"])
    pairs = m.group_by(["c", "e"]).len().sort(["c", "e"])
    c, e, cnt = (pairs[col].to_numpy() for col in ("c", "e", "len"))
    chunk_ent = sp.csr_matrix((cnt.astype(np.float64), (c, e)), shape=(n_chunks, n_ent))
    df = np.asarray((chunk_ent > 0).sum(axis=0)).ravel()

    numeric = np.array(
        [bool(_NUMERIC.match(ent_names[v])) or ent_types[v] in NOT_SEED_TYPES for v in ent_view], dtype=bool
    )
    seedable = ~numeric & (df >= 1) & (df <= max(2, params.max_df * n_chunks))
    words = [normalize_name(ent_names[v]).split() for v in ent_view]
    # a name: typed other than ``concept``, or written capitalised; a one-word lowercase concept is a common noun
    typed = np.array([ent_types[v] != "concept" for v in ent_view], dtype=bool)
    proper = typed | np.array([ent_names[v][:1].isupper() for v in ent_view], dtype=bool)
    several = np.array([len(w) > 1 for w in words], dtype=bool)
    nameable = ~numeric & (df >= 1) & (proper | several)
    sure = nameable & (several | typed)
    parts: dict[str, list[int]] = {}
    for node in np.flatnonzero(nameable & proper & several):
        for w in sorted(set(words[node]) - _NOT_NAME_PARTS):
            if not _NUMERIC.match(w):
                parts.setdefault(w, []).append(int(node))
    holders: dict[str, set[int]] = {}  # merged names, after the mentions (whose keys are entities' own names)
    for i, v in enumerate(ent_view):
        for alias in (ent_aliases[v] if ent_aliases else None) or ():
            holders.setdefault(normalize_name(alias), set()).add(i)
    keys.update({k: min(h) for k, h in sorted(holders.items()) if len(h) == 1 and k not in keys})

    sents = m.select(["c", "description", "e"]).unique().sort(["c", "description", "e"])
    sent_keys = sents.select(["c", "description"]).unique(maintain_order=True)
    sent_id = {(int(a), b): i for i, (a, b) in enumerate(sent_keys.iter_rows())}
    rows = np.fromiter(
        (sent_id[(int(a), b)] for a, b in zip(sents["c"], sents["description"])), dtype=np.int64, count=len(sents)
    )
    sent_ent = sp.csr_matrix((np.ones(len(rows)), (rows, sents["e"].to_numpy())), shape=(len(sent_keys), n_ent))
    sent_chunk = sent_keys["c"].to_numpy().astype(np.int64)
    sent_index = BM25Index(sent_keys["description"].to_list())

    walk = _transition(chunk_ent, relations, node_of_view, n_chunks, n_ent, params.relation_share)
    return PassageGraph(
        n_chunks,
        ent_view,
        keys,
        df,
        seedable,
        nameable,
        sure,
        parts,
        sent_chunk,
        sent_ent,
        sent_index,
        (params.damping * walk.T).tocsr().astype(np.float32),
    )


def _row_normalize(m: sp.csr_matrix) -> sp.csr_matrix:
    sums = np.asarray(m.sum(axis=1)).ravel()
    return sp.diags(np.divide(1.0, sums, out=np.zeros_like(sums), where=sums > 0)) @ m


def _transition(chunk_ent, relations, node_of_view, n_chunks, n_ent, relation_share) -> sp.csr_matrix:
    """Row-stochastic transitions over [chunks, entities] (rows without edges stay zero: mass restarts)."""
    share = _row_normalize(chunk_ent)  # chunk -> its entities, by share of mentions
    ent_chunk = _row_normalize(share.T.tocsr())  # entity -> its chunks, by the entity's share of each
    a, b, w = [], [], []
    for s, t, weight in relations:
        i, j = node_of_view.get(s), node_of_view.get(t)
        if i is not None and j is not None and i != j:
            a += [i, j]
            b += [j, i]
            w += [weight, weight]
    rel = _row_normalize(sp.csr_matrix((np.asarray(w, dtype=np.float64), (a, b)), shape=(n_ent, n_ent)))
    has_rel = np.asarray(rel.sum(axis=1)).ravel() > 0
    has_chunk = np.asarray(ent_chunk.sum(axis=1)).ravel() > 0
    to_rel = np.where(has_rel, np.where(has_chunk, relation_share, 1.0), 0.0)
    ent_rows = sp.hstack([sp.diags(1.0 - to_rel) @ ent_chunk, sp.diags(to_rel) @ rel])
    chunk_rows = sp.hstack([sp.csr_matrix((n_chunks, n_chunks)), share])
    return sp.vstack([chunk_rows, ent_rows]).tocsr()


def question_entities(graph: PassageGraph, question: str, max_ngram: int = 6) -> list[int]:
    """Entity nodes the question names: word n-grams normalised like entity names, longest first, no overlaps."""
    return _full_names(graph, _WORD.findall(question), max_ngram)[0]


def _full_names(graph: PassageGraph, words: list[str], max_ngram: int) -> tuple[list[int], list[list[str]], list[str]]:
    """``question_entities`` of the question's ``words``, the words that named each ("the Beatles"), and the words
    no name took."""
    taken = np.zeros(len(words), dtype=bool)
    found: list[int] = []
    spans: list[list[str]] = []
    for n in range(min(max_ngram, len(words)), 0, -1):
        for i in range(len(words) - n + 1):
            if taken[i : i + n].any():
                continue
            node = graph.keys.get(normalize_name(" ".join(words[i : i + n])))
            if node is not None:
                taken[i : i + n] = True
                if node not in found:
                    found.append(node)
                    spans.append(words[i : i + n])
    return found, spans, [w for w, t in zip(words, taken) if not t]


def name_parts(graph: PassageGraph, words: list[str]) -> dict[int, float]:
    """Entity nodes a capitalised word of ``words`` is one word of the name of ("Scrooge" -> "Ebenezer Scrooge",
    "Marley's" -> "Jacob Marley"), each with its share of the word (1 / the names holding it)."""
    out: dict[int, float] = {}
    for word in words:
        if not word[:1].isupper():
            continue
        key = normalize_name(word)
        holders = graph.parts.get(key, []) if key not in _NOT_NAME_PARTS else []
        for e in holders:
            out[e] = out.get(e, 0.0) + 1.0 / len(holders)
    return out


def personalization(
    graph: PassageGraph, question: str, prior: np.ndarray, params: RankParams, ent_sims: np.ndarray | None = None
) -> tuple[np.ndarray, dict[str, Any]]:
    """The restart distribution over [chunks, entities] and what seeded it (for explanations)."""
    n = graph.n_chunks
    spec = 1.0 / np.maximum(graph.df, 1)
    ent = np.zeros(graph.n_entities)
    full, spans, left = _full_names(graph, _WORD.findall(question), params.max_ngram)
    # a one-word concept written capitalised in the corpus is a name where the question capitalises it too ("Bring"
    # at the head of a sentence of the book is not named by "came to bring him home")
    named = [
        e for e, span in zip(full, spans) if graph.nameable[e] and (graph.sure[e] or any(w[:1].isupper() for w in span))
    ]
    ent[named] += spec[named]
    # a word a full name took is not also a partial one ("Marley's" of "Marley's ghost"; the sweep that chose this:
    # docs/benchmarks.md, "Seeds that find what the question names")
    partial = {e: share for e, share in name_parts(graph, left).items() if e not in named}
    for e, share in partial.items():
        ent[e] += share * spec[e]
    named += sorted(partial)
    if params.vector_seeds and ent_sims is not None:
        k = min(params.vector_seeds, len(ent_sims))
        near = np.argpartition(-ent_sims, k - 1)[:k] if k else np.zeros(0, dtype=np.int64)
        near = np.sort(near[(ent_sims[near] >= params.vector_threshold) & graph.seedable[near]])
        ent[near] += ent_sims[near] * spec[near]
        similar = [int(e) for e in near if int(e) not in named]
    else:
        similar = []
    chained: list[int] = []
    if params.chain_chunks and params.chain_weight > 0 and graph.sent_ent.shape[0]:
        k = min(params.chain_chunks, n)
        top: Any = np.argpartition(-prior, k - 1)[:k] if k else []
        top = top[np.lexsort((top, -prior[top]))] if k else top  # best first, ties by index
        scores = graph.sent_index.scores(question)
        for rank, c in enumerate(top):
            lo, hi = np.searchsorted(graph.sent_chunk, [c, c + 1])  # sentences are sorted by chunk
            if hi == lo or scores[lo:hi].max() <= 0:
                continue
            best = lo + int(np.argmax(scores[lo:hi]))
            ents = graph.sent_ent[best].indices
            ents = ents[graph.seedable[ents] & (graph.df[ents] > 1)]  # only what leads elsewhere: a bridge
            ent[ents] += params.chain_weight * spec[ents] / (rank + 1)
            chained.extend(int(e) for e in ents)
    hi = float(prior.max()) if n else 0.0
    lo = float(prior[prior > 0].min()) if hi > 0 else 0.0
    # min-max over the related chunks (prior > 0); unrelated ones get no restart mass
    chunk = np.where(prior > 0, params.prior_weight * (prior - lo) / (hi - lo) if hi > lo else params.prior_weight, 0.0)
    s = np.concatenate([chunk, ent])
    total = s.sum()
    return (s / total if total > 0 else s), {"named": named, "similar": similar, "chained": sorted(set(chained))}


def ppr(
    walk: sp.csr_matrix, restart: np.ndarray, damping: float, iterations: int = 30, tol: float = 1e-7
) -> np.ndarray:
    """Personalized PageRank by power iteration: r = (1 - d) s + d Pᵀ r (``walk`` is d Pᵀ)."""
    base = ((1.0 - damping) * restart).astype(walk.dtype)
    r = restart.astype(walk.dtype)
    for _ in range(iterations):
        nxt = base + walk @ r
        if np.abs(nxt - r).sum() < tol:
            return nxt
        r = nxt
    return r


def rank_chunks(
    graph: PassageGraph, question: str, prior: np.ndarray, params: RankParams, ent_sims: np.ndarray | None = None
) -> tuple[np.ndarray, dict[str, Any]]:
    """PPR score of every chunk (higher first) and the seeds used."""
    restart, seeds = personalization(graph, question, prior, params, ent_sims)
    if restart.sum() == 0:  # no related chunk and no seed: nothing to rank
        return np.zeros(graph.n_chunks), seeds
    r = ppr(graph.walk, restart, params.damping, params.iterations, params.tol)
    return r[: graph.n_chunks], seeds
