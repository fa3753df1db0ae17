"""Layer 1 of a build as tasks over layer 0's parts (``tasks.methods.layer_parts``): the PCA from moments summed
over parts, and the whole hierarchy equal to ``build_hierarchy`` over the same rows held at once."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from sklearn.decomposition import PCA

from schemas.config import load_config
from tasks.methods.graph_parts import hierarchy_on_cluster
from tasks.methods.hirag.hierarchy import build_hierarchy, pca_from_moments
from tasks.methods.summarize import OfflineSummarizer
from tasks.runtime.llm_client import Usage
from tasks.store.spill import SpilledTable

DIM = 16


def test_pca_from_moments_summed_over_parts_is_sklearns_pca():
    rng = np.random.default_rng(3)
    x = (rng.normal(size=(3000, DIM)) * np.linspace(5, 0.5, DIM)).astype(np.float32) + 2.0
    parts = np.array_split(x.astype(np.float64), 4)
    mean, comps = pca_from_moments(len(x), sum(p.sum(0) for p in parts), sum(p.T @ p for p in parts), 4)
    ref = PCA(n_components=4, random_state=0).fit(x)
    np.testing.assert_allclose(mean, ref.mean_, atol=1e-5)
    np.testing.assert_allclose(comps, ref.components_, atol=1e-5)  # same signs: largest entry positive
    assert all(c[np.abs(c).argmax()] > 0 for c in comps)


def _embed(texts: list[str]) -> np.ndarray:
    rows = [np.frombuffer(hashlib.sha256(t.encode()).digest()[:DIM], np.uint8) for t in texts]
    v = np.array(rows, np.float32).reshape(-1, DIM) - 127.5
    return v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-9)


def _layer0(tmp_path, n_parts: int) -> tuple[list[dict], np.ndarray, SpilledTable]:
    """600 entities in 12 topics (vectors around a topic centre, names and descriptions from its words), spread
    over ``n_parts`` part files."""
    rng = np.random.default_rng(11)
    words = ("river bridge ferry court judge appeal violin opera tenor wheat harvest mill comet orbit telescope "
             "harbour ship cargo glacier summit valley senate ballot treaty kiln pottery glaze falcon nest feather "
             "cipher code signal marsh reed heron").split()  # fmt: skip
    topics = [words[i : i + 3] for i in range(0, len(words), 3)]  # 12 topics
    centres = rng.normal(size=(len(topics), DIM)) * 3
    rows, vecs = [], []
    for i in range(600):
        t = int(rng.integers(len(topics)))
        words = topics[t]
        rows.append({
            "id": f"ent-{i:04d}",
            "name": f"{words[i % 3].title()} {i}",
            "type": ["person", "location", "concept"][i % 3],
            "description": f"The {words[(i + 1) % 3]} of the {words[(i + 2) % 3]}, number {i}.",
            "degree": i % 7,  # merge's: how a summary's name picks its members
        })  # fmt: skip
        vecs.append(centres[t] + rng.normal(size=DIM))
    x = np.array(vecs, np.float32)
    files = []
    for p, idx in enumerate(np.array_split(np.arange(600), n_parts)):
        table = pa.Table.from_pylist([rows[i] for i in idx]).append_column(
            "vector", pa.FixedSizeListArray.from_arrays(pa.array(x[idx].ravel()), DIM)
        )
        files.append(tmp_path / f"part-{p}.parquet")
        pq.write_table(table, files[-1])
    return rows, x, SpilledTable(files, table.schema, 600)


def test_layer_one_over_parts_is_the_hierarchy_of_the_rows_held_at_once(tmp_path):
    cfg = load_config(
        overrides={"hierarchy": {"fit_sample": 250, "local_fit_sample": 60, "posterior_threshold": 0.05, "max_components": 4}}
    )  # fmt: skip

    def mapper(fn, items, **kw):
        kw = {k: 1 if k == "share" and v is None else v for k, v in kw.items()}
        return [fn(item, **kw) for item in items]

    ctx = SimpleNamespace(cfg=cfg, llm_for=lambda stage: None, cap_for=lambda stage: None, version=3,
                          spill_dir=tmp_path / "spill", mapper=mapper,
                          catalog=SimpleNamespace(cache_dir=tmp_path), usage=Usage(), embed=_embed)  # fmt: skip
    rows, x, parts = _layer0(tmp_path, 3)
    meta = cfg.hierarchy.meta_entities
    ents, vecs, rels, stats = hierarchy_on_cluster(ctx, parts, OfflineSummarizer(meta), 1)
    ref_ents, ref_vecs, ref_rels, ref_stats = build_hierarchy(rows, x, cfg.hierarchy, cfg.seed, OfflineSummarizer(meta), _embed)
    assert stats[0]["n_clusters"] > 4 and not stats[1]["stopped"]  # local GMMs split the 4 global clusters; layer 2
    assert [{k: v for k, v in s.items() if k != "seconds"} for s in stats] == [
        {k: v for k, v in s.items() if k != "seconds"} for s in ref_stats
    ]
    assert ents == ref_ents  # ids, names, descriptions and order
    np.testing.assert_array_equal(vecs, ref_vecs)
    got = rels.read_all() if isinstance(rels, SpilledTable) else rels
    assert set(got.column("version").to_pylist()) == {3}
    assert sorted(zip(*(got.column(c).to_pylist() for c in ("id", "source_id", "target_id", "description")))) == sorted(
        (r["id"], r["source_id"], r["target_id"], r["description"]) for r in ref_rels
    )
