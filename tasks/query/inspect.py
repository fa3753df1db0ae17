"""What an index holds, read from one published snapshot (``strata inspect``, the service's ``/index``)."""

from __future__ import annotations

import re
from typing import Any, cast

from schemas.llm import LLM_STAGES, LLMConfig
from tasks.methods.registry import all_methods, get_method
from tasks.store.catalog import Catalog
from tasks.store.rows import snapshot_note

#: the most used relation labels ``inspect`` lists
TOP_LABELS = 12


def inspect_data(cat: Catalog, as_of: int | None, runs: int) -> dict[str, Any]:
    """What ``strata inspect --json`` prints: the snapshot, its row counts, what cannot be read, layers, relation
    kinds, how many relations carry a label and the labels most used, nodes per layer, communities per level,
    recent runs and every published version."""
    import statistics

    snap = cat.require_snapshot(as_of)
    layers = cat.read("layers", snap=snap).to_pylist()
    rels = cat.read("relations", snap=snap, columns=["kind", "label"])  # one read of both columns
    kinds = rels.column("kind").value_counts().to_pylist()
    labels = rels.column("label").drop_null().value_counts().to_pylist()
    labels.sort(key=lambda k: (-k["counts"], k["values"]))
    comms = cat.read("communities", snap=snap, columns=["level", "size"])
    sizes: dict[int, list[int]] = {}
    for level, size in zip(comms.column("level").to_pylist(), comms.column("size").to_pylist()):
        sizes.setdefault(level, []).append(size)
    method = snapshot_note(snap).get("method", "hirag")
    own = get_method(method).relation_kinds if method in {m.name for m in all_methods()} else ()
    return {
        "index": cat.uri,
        "version": snap["version"],
        "method": method,
        "created_at": snap["created_at"].isoformat(),
        "kind": snap["kind"],
        "run_id": snap["run_id"],
        "vector_dim": snap["dim"],
        "tables": cat.counts(snap),
        "problems": cat.verify(snap),
        "layers": [
            {k: l[k] for k in ("layer", "n_entities", "n_clusters", "cluster_sparsity", "change_rate", "stop_reason")}
            for l in sorted(layers, key=lambda r: r["layer"])
        ],
        "relations_by_kind": {k["values"]: k["counts"] for k in sorted(kinds, key=lambda k: k["values"])},
        "relations_labelled": sum(k["counts"] for k in labels),
        "relation_labels": {k["values"]: k["counts"] for k in labels[:TOP_LABELS]},
        "nodes": node_counts(cat, snap, own),
        "communities": [
            {
                "level": level,
                "count": len(v),
                "min_size": min(v),
                "median_size": statistics.median(v),
                "max_size": max(v),
            }
            for level, v in sorted(sizes.items())
        ],
        "runs": [
            {
                "id": r["id"],
                "flow": r["flow"],
                "status": r["status"],
                "started_at": r["started_at"].isoformat() if r["started_at"] else None,
                "ended_at": r["ended_at"].isoformat() if r["ended_at"] else None,
                "snapshot_version": r["snapshot_version"],
                "error": r["error"],
                "llm": run_models(r["parameters"]),
                "llm_calls": r["llm_calls"],
                "llm_cost_usd": r["llm_cost_usd"],
            }
            for r in cat.runs(limit=runs)
        ],
        "versions": [
            {"version": s["version"], "created_at": s["created_at"].isoformat(), "kind": s["kind"]}
            for s in cat.snapshots()
        ],
    }


def run_models(parameters: str | None) -> dict[str, str]:
    """The model each LLM stage of a run used ("offline" where none), from the settings the run recorded; empty for a
    run recorded without them."""
    import json

    try:
        llm = LLMConfig.model_validate(
            {k: v for k, v in json.loads(parameters or "{}")["config"]["llm"].items() if k != "api_key"}
        )
    except (KeyError, TypeError, ValueError):
        return {}
    return {s: (c.model if (c := llm.stage(s)) is not None else "offline") for s in LLM_STAGES}


def node_counts(cat: Catalog, snap: dict[str, Any], kinds: tuple[str, ...]) -> list[dict[str, int]]:
    """Entities per layer and, per relation kind in ``kinds`` (the method's own, e.g. ArchRAG's C-HNSW links
    ``chnsw`` and ``chnsw_down``), how many leave a node of the layer."""
    import polars as pl

    ents = cast(pl.DataFrame, pl.from_arrow(cat.read("entities", snap=snap, columns=["id", "layer"])))
    per = ents.group_by("layer").agg(nodes=pl.len())
    if kinds:
        links = (
            cast(pl.DataFrame, pl.from_arrow(cat.read("relations", snap=snap, columns=["source_id", "kind"])))
            .filter(pl.col("kind").is_in(list(kinds)))
            .join(ents.rename({"id": "source_id"}), on="source_id")
            .group_by("layer")
            .agg(**{k: (pl.col("kind") == k).sum() for k in kinds})
        )
        per = per.join(links, on="layer", how="left").fill_null(0)
    return per.sort("layer").to_dicts()


#: quarantine rows ``index``, ``update`` and ``inspect`` list at most; the others are counted
QUARANTINE_SHOWN = 10
#: a reason longer than this is cut (the whole one: ``strata export --table quarantine``)
REASON_CHARS = 160
_CHUNK_ID = re.compile(r"^chunk-[0-9a-f]{24}$")


def quarantined(cat: Catalog, snap: dict[str, Any], limit: int = QUARANTINE_SHOWN) -> tuple[int, list[dict[str, str]]]:
    """What the snapshot quarantined: the number of rows, and the first ``limit`` (by item, then stage) as
    ``{item, place, stage, reason}``, ``place`` the item's path (a chunk by its document's path and place). The one
    reading of the quarantine that ``strata index``, ``update`` and ``inspect`` (text and ``--json``) report."""
    rows = sorted(
        cat.read("quarantine", snap=snap, columns=["item", "stage", "error"]).to_pylist(),
        key=lambda r: (r["item"], r["stage"]),
    )
    shown = rows[:limit]
    places = _chunk_places(cat, snap, [r["item"] for r in shown if _CHUNK_ID.match(r["item"])])
    return len(rows), [
        {"item": r["item"], "place": places.get(r["item"], r["item"]), "stage": r["stage"], "reason": r["error"]}
        for r in shown
    ]


def quarantine_lines(cat: Catalog, snap: dict[str, Any], limit: int = QUARANTINE_SHOWN) -> list[str]:
    """``quarantined`` as lines: a line a row (path, stage, reason on one line, clipped), at most ``limit``, then how
    many more and where to read them all. Empty when nothing is quarantined."""
    total, rows = quarantined(cat, snap, limit)
    if not total:
        return []
    lines = [f"quarantined ({total}):"]
    for r in rows:
        reason = " ".join(str(r["reason"]).split())
        reason = reason if len(reason) <= REASON_CHARS else reason[: REASON_CHARS - 1] + "…"
        lines.append(f"  {r['place']} [{r['stage']}]: {reason}")
    if total > limit:
        lines.append(f"  … and {total - limit} more: strata export --table quarantine")
    return lines


def _chunk_places(cat: Catalog, snap: dict[str, Any], ids: list[str]) -> dict[str, str]:
    """``<document path> (chunk N)`` for each chunk id of ``ids`` the snapshot holds."""
    if not ids:
        return {}
    listed = ", ".join(f"'{i}'" for i in ids)
    chunks = cat.read("chunks", snap=snap, columns=["id", "document_id", "chunk_index"], where=f"id IN ({listed})")
    docs = {r["document_id"] for r in chunks.to_pylist()}
    uris = {}
    if docs:
        where = "id IN ({})".format(", ".join(f"'{d}'" for d in sorted(docs)))
        uris = {
            r["id"]: r["uri"] for r in cat.read("documents", snap=snap, columns=["id", "uri"], where=where).to_pylist()
        }
    return {
        r["id"]: f"{uris.get(r['document_id'], r['document_id'])} (chunk {r['chunk_index']})"
        for r in chunks.to_pylist()
    }
