"""HiIndex algorithms against hand-computed cases (HiRAG eq. 17, Algorithm 1)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from schemas.config import HierarchyConfig
from tasks.methods.hirag.hierarchy import (
    STOP_CONVERGED,
    STOP_MAX_LAYERS,
    STOP_TOO_FEW,
    bic_candidates,
    build_hierarchy,
    build_layers,
    change_rate,
    cluster_sparsity,
    converged,
    gmm_clusters,
    should_stop,
    soft_assign,
)
from tasks.methods.summarize import OfflineSummarizer


# ---------------------------------------------------------------- eq. 17
def test_cs_hand_computed():
    # {a,b,c},{d},{e}: Σ|S|(|S|-1) = 6, |L|(|L|-1) = 20
    assert cluster_sparsity([3, 1, 1], 5) == pytest.approx(0.7)
    assert cluster_sparsity([1, 1, 1, 1], 4) == 1.0  # singletons: the worst case, CS = 1
    assert cluster_sparsity([4], 4) == 0.0  # one big cluster
    # soft overlap {a,b,c},{c,d}: c counts in both: (6 + 2) / 12
    assert cluster_sparsity([3, 2], 4) == pytest.approx(1 / 3)
    with pytest.raises(ValueError):
        cluster_sparsity([1], 1)


def test_change_rate_and_stop():
    assert change_rate(None, 0.5) is None
    assert change_rate(0.8, 0.9) == pytest.approx(0.125)
    assert change_rate(0.8, 0.7) == pytest.approx(0.125)  # absolute change
    assert change_rate(0.0, 0.5) == math.inf
    assert not should_stop(None, 0.05)  # the first clustering never stops
    assert should_stop(0.05, 0.05)  # "at most ε" (Algorithm 1 line 9)
    assert not should_stop(0.0501, 0.05)


# ---------------------------------------------------------------- Algorithm 1, step by step
def _scripted(sizes_per_layer):
    """A cluster function replaying clusterings of given sizes over 10 entities."""
    calls = []

    def cluster(x, seed):
        sizes = sizes_per_layer[len(calls)]
        calls.append(seed)
        out, start = [], 0
        for s in sizes:
            out.append(np.arange(start, start + s))
            start += s
        return out

    return cluster, calls


def _builder(n=10):
    built = []

    def build_layer(i, below, x, clusters):
        built.append(i)
        ents = [{"id": f"L{i}-{j}"} for j in range(n)]
        return ents, np.zeros((n, 2))

    return build_layer, built


def _layers(base, cfg, build_layer, cluster):
    return build_layers(base, np.zeros((len(base), 2)), cfg.max_layers, cfg.min_entities, 0, build_layer, cluster,
                        converged(cfg.epsilon))


def test_stop_rule_on_a_crafted_cs_sequence():
    # CS_1 = 1-40/90 = .5556; CS_2 = 1-24/90 = .7333 (rate .32); CS_3 = 1-20/90 = .7778 (rate .0606);
    # CS_4 = 1-18/90 = .8 (rate .0286 <= .05): stop, layer 4 is not built.
    cluster, calls = _scripted([[5, 5], [4, 3, 3], [4, 3, 2, 1], [4, 2, 2, 2]])
    build_layer, built = _builder()
    base = [{"id": f"e{j}"} for j in range(10)]
    cfg = HierarchyConfig(epsilon=0.05, max_layers=10, min_entities=2)
    layers, stats = _layers(base, cfg, build_layer, cluster)
    assert built == [1, 2, 3]
    assert [l.index for l in layers] == [1, 2, 3]
    assert [round(s["cluster_sparsity"], 4) for s in stats] == [0.5556, 0.7333, 0.7778, 0.8]
    assert stats[0]["change_rate"] is None
    assert [round(s["change_rate"], 4) for s in stats[1:]] == [0.32, 0.0606, 0.0286]
    assert [s["stopped"] for s in stats] == [False, False, False, True]
    assert stats[-1]["stop_reason"] == STOP_CONVERGED and stats[-1]["layer"] == 4
    assert [s["n_clusters"] for s in stats] == [2, 3, 4, 4]
    assert len(calls) == 4


def test_stop_at_layer_cap_and_when_too_few_entities():
    cluster, _ = _scripted([[5, 5], [2] * 5, [1] * 10])
    build_layer, built = _builder()
    cfg = HierarchyConfig(epsilon=0.0, max_layers=2, min_entities=2)
    _, stats = _layers([{"id": str(j)} for j in range(10)], cfg, build_layer, cluster)
    assert built == [1, 2] and stats[-1]["stop_reason"] == STOP_MAX_LAYERS and stats[-1]["cluster_sparsity"] is None

    cluster, _ = _scripted([[5, 5]])
    build_layer, built = _builder(n=3)
    cfg = HierarchyConfig(max_layers=5, min_entities=4)
    _, stats = _layers([{"id": str(j)} for j in range(10)], cfg, build_layer, cluster)
    assert built == [1] and stats[-1]["stop_reason"] == STOP_TOO_FEW and stats[-1]["n_entities"] == 3


# ---------------------------------------------------------------- soft assignment
def test_soft_assignment_hand_computed_and_covers_every_entity():
    post = np.array([[0.85, 0.15, 0.00], [0.05, 0.90, 0.05], [0.40, 0.35, 0.25], [0.02, 0.03, 0.95]])
    clusters = soft_assign(post, 0.1)
    assert [c.tolist() for c in clusters] == [[0, 2], [0, 1, 2], [2, 3]]
    strict = soft_assign(post, 0.5)  # row 2 is below 0.5 everywhere: it still joins its argmax
    assert [c.tolist() for c in strict] == [[0, 2], [1], [3]]
    spread = np.full((3, 12), 1 / 12)  # nobody above threshold anywhere
    assert sorted(np.concatenate(soft_assign(spread, 0.1)).tolist()) == [0, 1, 2]


def test_bic_sweep_is_bounded():
    ks = bic_candidates(1000, 2, 50, 8)
    assert ks[0] == 2 and ks[-1] == 50 and len(ks) <= 8 and ks == sorted(set(ks))
    assert bic_candidates(5, 2, 50, 8)[-1] == 4  # never more components than points - 1
    assert bic_candidates(100, 1, 1, 8) == [1]


def _blobs(n_per=40, k=6, d=32, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(k, d)) * 3
    x = np.concatenate([c + rng.normal(size=(n_per, d)) for c in centers]).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_gmm_clusters_cover_everything_and_are_reproducible():
    x = _blobs()
    cfg = HierarchyConfig(cluster_size_hint=10)
    a, b = gmm_clusters(x, cfg, 7), gmm_clusters(x, cfg, 7)
    assert [c.tolist() for c in a] == [c.tolist() for c in b]
    assert set(np.concatenate(a).tolist()) == set(range(len(x)))
    assert 1 < len(a) < len(x)


def test_gmm_recovers_separated_blobs():
    x = _blobs(n_per=30, k=4, d=16)
    clusters = gmm_clusters(x, HierarchyConfig(cluster_size_hint=30, max_components=8, posterior_threshold=0.5), 1)
    truth = [set(range(i * 30, (i + 1) * 30)) for i in range(4)]
    assert sorted(map(len, clusters)) == [30, 30, 30, 30]
    assert all(set(c.tolist()) in truth for c in clusters)


# ---------------------------------------------------------------- summary entities and links
def test_summaries_link_every_member_and_cs_recomputes_from_links():
    x = _blobs(n_per=20, k=5, d=24)
    words = ["river", "castle", "engine", "violin", "harvest"]
    ents = [
        {"id": f"ent-{i}", "name": f"{words[i // 20]} {i}", "type": "concept",
         "description": f"The {words[i // 20]} number {i}.", "layer": 0}
        for i in range(len(x))
    ]
    cfg = HierarchyConfig(cluster_size_hint=5, min_entities=4, max_layers=3)
    summ = OfflineSummarizer(cfg.meta_entities)
    embed = lambda texts: np.stack([x[hash(t) % len(x)] for t in texts])  # noqa: E731 - stable fake vectors
    new_ents, new_vecs, rels, stats = build_hierarchy(ents, x, cfg, 3, summ, embed)
    assert new_ents and rels and new_vecs.shape == (len(new_ents), x.shape[1])
    by_id = {e["id"]: e for e in ents + new_ents}
    members: dict[str, set[str]] = {}
    for r in rels:
        assert r["kind"] == "summary_of"
        assert by_id[r["target_id"]]["layer"] == by_id[r["source_id"]]["layer"] + 1
        members.setdefault(r["target_id"], set()).add(r["source_id"])
    assert set(members) == {e["id"] for e in new_ents}  # every summary entity has members
    for stat in [s for s in stats if not s["stopped"]]:
        below = [e["id"] for e in ents + new_ents if by_id[e["id"]]["layer"] == stat["layer"] - 1]
        linked = {m for s, ms in members.items() if by_id[s]["layer"] == stat["layer"] for m in ms}
        assert linked == set(below)  # every member links to its summaries
        sizes = [len(ms) for s, ms in members.items() if by_id[s]["layer"] == stat["layer"]]
        assert cluster_sparsity(sizes, len(below)) == pytest.approx(stat["cluster_sparsity"])
    # the summary of the "river" entities is named after rivers
    river_summary = next(s for s, ms in members.items() if {"ent-0", "ent-1"} <= ms and by_id[s]["layer"] == 1)
    assert "river" in by_id[river_summary]["name"].lower()


def test_restate_layers_recomputes_built_layers_from_the_published_membership():
    from tasks.methods.hirag.hierarchy import restate_layers

    layer_of = {**dict.fromkeys("abcde", 0), "S1": 1, "S2": 1, "S3": 1, "T": 2}
    links = [("a", "S1"), ("b", "S1"), ("c", "S1"), ("d", "S2"), ("S1", "T"), ("S2", "T")]  # S3 lost its members
    recorded = [
        {"layer": 1, "n_entities": 4, "n_clusters": 3, "cluster_sparsity": 0.5, "change_rate": None, "stopped": False,
         "stop_reason": None, "seconds": 1.0},
        {"layer": 2, "n_entities": 3, "n_clusters": 1, "cluster_sparsity": 0.9, "change_rate": 0.8, "stopped": False,
         "stop_reason": None, "seconds": 0.5},
        {"layer": 3, "n_entities": 1, "n_clusters": 0, "cluster_sparsity": None, "change_rate": None, "stopped": True,
         "stop_reason": "single_cluster", "seconds": 0.0},
    ]
    rows = restate_layers(recorded, layer_of, links)
    # layer 1: 5 nodes below, clusters of 3 and 1: CS = 1 - (3*2 + 0) / (5*4) = 0.7
    assert rows[0] == {**recorded[0], "n_entities": 5, "n_clusters": 2, "cluster_sparsity": pytest.approx(0.7)}
    # layer 2: 3 nodes below (S3 counts as a node), one cluster of 2: CS = 1 - 2 / 6; rate |2/3 - 0.7| / 0.7
    assert rows[1]["n_entities"] == 3 and rows[1]["n_clusters"] == 1
    assert rows[1]["cluster_sparsity"] == pytest.approx(2 / 3)
    assert rows[1]["change_rate"] == pytest.approx((0.7 - 2 / 3) / 0.7)
    assert rows[2] == recorded[2]  # a clustering tried and not built keeps its figures


def test_an_offline_summary_is_named_by_its_leading_members_and_described_in_whole_distinct_sentences():
    """Names that read as names come first (a common noun of higher degree does not name the summary), then
    degree; a layer-2 summary takes its member summaries' lead names; the description is whole sentences of the
    members it is named by and of the central ones, none twice, and no list of names."""
    from tasks.methods.summarize import Cluster
    from tasks.runtime.text import split_sentences

    members = [
        {"id": "a", "name": "hand", "type": "concept", "description": "A hand moved. A hand moved.", "degree": 90},
        {"id": "b", "name": "Bob Cratchit", "type": "person", "description": "Bob Cratchit, clerk to Scrooge.", "degree": 12},
        {"id": "c", "name": "Ebenezer Scrooge", "type": "person", "description": "Ebenezer Scrooge, a miser. He kept a counting-house.", "degree": 40},
    ] + [
        {"id": f"m{i}", "name": f"Person {i}", "type": "person", "description": f"Person {i} walked home.", "degree": 1}
        for i in range(6)
    ]
    x = np.eye(len(members), 12, dtype=np.float32)
    x[:3] += 1.0  # the first three are the cluster's centre
    [[s]] = OfflineSummarizer(["person", "concept"]).summarize_layer(1, [Cluster(members, x)])
    assert s["name"] == "Ebenezer Scrooge / Bob Cratchit" and s["type"] == "person"
    sentences = split_sentences(s["description"])
    # the named members' first sentences, then the central common noun's, then each one's second
    assert sentences == ["Ebenezer Scrooge, a miser.", "Bob Cratchit, clerk to Scrooge.", "A hand moved.",
                         "He kept a counting-house."]
    assert "\n" not in s["description"] and "more" not in s["description"]

    upper = [
        {"id": "s1", "name": s["name"], "type": "person", "description": s["description"], "degree": 9, "layer": 1},
        {"id": "s2", "name": "Fred / Topper", "type": "person", "description": "Fred and 2 more.\nFred laughed.",
         "degree": 3, "layer": 1},
    ]
    [[t]] = OfflineSummarizer(["person", "concept"]).summarize_layer(2, [Cluster(upper, np.eye(2, 12, dtype=np.float32))])
    assert t["name"] == "Ebenezer Scrooge / Fred"
    assert t["description"].startswith("Ebenezer Scrooge, a miser.") and "Fred laughed." in t["description"]
    assert "more" not in t["description"]  # a member's head (a summary by earlier code) is not quoted


def test_a_date_names_a_summary_only_after_the_named_things_of_its_cluster():
    """A date of the highest degree ("January 1980") does not name a cluster of albums: named things first."""
    from tasks.methods.summarize import Cluster

    def member(i, name, etype, degree):
        return {"id": f"e{i}", "name": name, "type": etype, "description": f"{name} is here.", "degree": degree}

    members = [member(0, "January 1980", "time", 50), member(1, "Iron Maiden", "organization", 10),
               member(2, "Kingsway Studios", "location", 5), member(3, "heavy metal", "concept", 40)]
    [[s]] = OfflineSummarizer(["organization", "concept"]).summarize_layer(1, [Cluster(members, np.eye(4, 8, dtype=np.float32))])
    assert s["name"] == "Iron Maiden / Kingsway Studios"
