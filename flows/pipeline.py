"""The index pipeline, composed once and run two ways.

``build_index`` chains the stages of DESIGN §1. How each stage runs is injected: the Prefect
flow wraps every stage as a Prefect task and maps extraction onto Dask; the direct runner
(benchmarks, unit tests) calls the functions in-process. The stages themselves are the pure
functions in ``tasks``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from schemas.config import StrataConfig
from schemas.tables import schema_for
from tasks.catalog import Catalog, rows_to_table
from tasks.chunk import chunk_documents
from tasks.embed import CachedEmbedder, EmbeddingCache, check_dimension, entity_text, get_embedder, report_text
from tasks.communities import detect_communities
from tasks import extract, extract_llm
from tasks.extract import extract_chunks, local_mapper
from tasks.extract_llm import extract_batch_llm
from tasks.hierarchy import build_hierarchy, stat_rows
from tasks.ids import make_id
from tasks.ingest import ingest_corpus, quarantine_row
from tasks.llm_client import LiteLLMClient, Usage
from tasks.merge import graph_from_mentions, mention_rows, title_mentions
from tasks.parallel import DaskPool
from tasks.plots import plot_layers
from tasks.progress import reporter
from tasks.reports import build_reports
from tasks.summarize import LLMSummarizer, OfflineSummarizer
from tasks.validate import ValidationFailed, validate_tables

StageRunner = Callable[..., Any]  # run(name, fn, *args, **kwargs) -> fn(*args, **kwargs)


def direct_runner(name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return fn(*args, **kwargs)


@dataclass
class StageLog:
    stages: dict[str, dict[str, float]] = field(default_factory=dict)

    def record(self, stage: str, seconds: float, **counts: float) -> None:
        self.stages[stage] = {"seconds": round(seconds, 3), **counts}


@dataclass
class BuildResult:
    run_id: str
    version: int | None
    counts: dict[str, int]
    stages: dict[str, dict[str, float]]
    status: str
    layers: list[dict[str, Any]] = field(default_factory=list)
    layers_plot: str | None = None
    llm: dict[str, Any] = field(default_factory=dict)
    input_digest: str | None = None
    n_inputs: int = 0


def digest_of(documents: list[dict[str, Any]]) -> str:
    return hashlib.sha256("\n".join(sorted(d["content_hash"] for d in documents)).encode()).hexdigest()


def deployment_name() -> str | None:
    try:
        from prefect.runtime import deployment

        return deployment.name
    except Exception:  # noqa: BLE001 - not under Prefect
        return None


def code_version() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent, timeout=5
        )
        return out.stdout.strip() or "unknown"
    except Exception:  # noqa: BLE001
        return "unknown"


def _with_vectors(rows: list[dict[str, Any]], vectors: np.ndarray) -> list[dict[str, Any]]:
    for row, vec in zip(rows, vectors):
        row["vector"] = vec
    return rows


def _to_table(name: str, rows: list[dict[str, Any]], dim: int, version: int) -> pa.Table:
    schema = schema_for(name, dim)
    for r in rows:
        r["version"] = version
        if "staleness" in schema.names and r.get("staleness") is None:
            r["staleness"] = 0.0  # text just written
    if "vector" in schema.names and rows:
        vecs = np.stack([np.asarray(r["vector"], dtype=np.float32) for r in rows])
        table = rows_to_table([{k: v for k, v in r.items() if k != "vector"} for r in rows], schema.remove(schema.get_field_index("vector")))
        flat = pa.array(vecs.reshape(-1), type=pa.float32())
        return table.append_column(schema.field("vector"), pa.FixedSizeListArray.from_arrays(flat, dim)).select(schema.names)
    return rows_to_table(rows, schema)


def build_index(
    corpus: str,
    catalog: Catalog,
    cfg: StrataConfig,
    run: StageRunner = direct_runner,
    mapper: Any = local_mapper,
    run_id: str | None = None,
    flow_name: str = "index",
) -> BuildResult:
    """Full build: ingest -> chunk -> extract -> merge -> embed -> validate -> publish (one snapshot)."""
    previous = catalog.snapshot()
    version = previous["version"] + 1 if previous else 1
    with recorded_run(catalog, run_id, flow_name, corpus, cfg, version) as (run_id, log, usage, done):
        return done(_build(corpus, catalog, cfg, run, mapper, run_id, version, log, reporter(), usage))


@contextlib.contextmanager
def recorded_run(catalog: Catalog, run_id: str | None, flow_name: str, corpus: str, cfg: StrataConfig, version: int):
    """A ``runs`` row for the whole run: 'running' at the start, then its outcome, counts, usage and lineage.

    Yields (run_id, stage log, usage, done); ``done(result)`` records the result and returns it."""
    started = datetime.now(timezone.utc)
    run_id = run_id or make_id("run", started.isoformat(), corpus)
    log, usage = StageLog(), Usage()
    catalog.log_run({"id": run_id, "flow": flow_name, "started_at": started, "status": "running",
                     "parameters": json.dumps({"corpus": str(corpus), "index": catalog.uri, "config": cfg.fingerprint()}),
                     "llm_calls": 0, "llm_tokens": 0, "llm_cost_usd": 0.0, "code_version": code_version(),
                     "deployment": deployment_name(), "version": version})

    def done(result: BuildResult) -> BuildResult:
        catalog.finish_run(run_id, {
            "status": result.status, "ended_at": datetime.now(timezone.utc), "stage_counts": json.dumps(log.stages),
            "snapshot_version": result.version if result.status == "published" else None,
            "input_digest": result.input_digest, "n_inputs": result.n_inputs, **_usage_columns(usage)})
        result.llm = asdict(usage)
        return result

    try:
        yield run_id, log, usage, done
    except BaseException as exc:
        catalog.finish_run(run_id, {"status": "failed", "ended_at": datetime.now(timezone.utc),
                                    "error": f"{type(exc).__name__}: {exc}"[:4000], "stage_counts": json.dumps(log.stages),
                                    **_usage_columns(usage)})
        raise


def _usage_columns(usage: Usage) -> dict[str, Any]:
    return {"llm_calls": usage.calls, "llm_tokens": usage.tokens, "llm_cost_usd": round(usage.cost_usd, 6)}


def extraction_method(cfg: StrataConfig) -> str:
    method = cfg.extract.method
    if method == "auto":
        method = "llm" if cfg.llm.model else "nlp"
    if method == "llm" and not cfg.llm.model:
        raise ValueError("extract.method = 'llm' needs llm.model (e.g. 'openai/gpt-4o-mini')")
    return method


def dask_pool(cfg: StrataConfig) -> DaskPool:
    """The run's Dask cluster, warmed for its extraction method: spaCy loaded, or litellm imported with
    ``dask.llm_batches_per_worker`` batches in flight per worker (LLM extraction is I/O bound)."""
    if extraction_method(cfg) == "llm":
        return DaskPool(cfg.dask, cfg.dask.llm_batches_per_worker, extract_llm.warm)
    return DaskPool(cfg.dask, 1, functools.partial(extract.warm, cfg.extract.spacy_model))


def _prestart(mapper: Any) -> None:
    """Bring a pool's cluster up in the background now: it starts while the run ingests and chunks."""
    if hasattr(mapper, "start"):
        mapper.start()


def _release(mapper: Any) -> None:
    """Shut a pool's cluster down once extraction is done (a backfill's next partition starts it again)."""
    if hasattr(mapper, "release"):
        mapper.release()


def _await_pool(mapper: Any, log: StageLog) -> None:
    """Wait for a prestarted pool outside the extraction stage's clock; the wait is its own log entry."""
    if hasattr(mapper, "ready"):
        t = time.perf_counter()
        mapper.ready()
        log.record("dask-start", time.perf_counter() - t)


def _extract(run, chunks, cfg, catalog, mapper, method, rep, usage) -> dict[str, Any]:
    """The extraction stage (offline or LLM, through ``mapper``); marks each chunk extracted or quarantined."""
    llm_kwargs = (
        {"batch_fn": extract_batch_llm, "llm": cfg.llm, "cache_dir": str(catalog.cache_dir), "share": None}
        if method == "llm" else {}
    )
    extracted = run(
        "extract", extract_chunks, chunks, cfg.extract, mapper,
        on_done=lambda _i, r: rep.advance("extract", len(r["ok"]) + len(r["quarantine"])), **llm_kwargs,
    )
    usage.add(Usage(**extracted["usage"]))
    ok = set(extracted["ok"])
    for c in chunks:
        c["status"] = "extracted" if c["id"] in ok else "quarantined"
    return extracted


def _add_usage(usage: Usage, llm: LiteLLMClient | None, embedder: CachedEmbedder) -> None:
    """The run's calls, tokens and cost: the LLM client's and, for a litellm embedding model, the embedder's."""
    for client in (llm, getattr(embedder.inner, "client", None)):
        if client is not None:
            usage.add(client.usage)


def _summarizer(cfg: StrataConfig, llm: LiteLLMClient | None, per_cluster: int):
    if llm is not None:
        return LLMSummarizer(llm, cfg.hierarchy.meta_entities, per_cluster, cfg.extract.max_description_tokens)
    return OfflineSummarizer(cfg.hierarchy.meta_entities, cfg.extract.max_description_tokens)


def _build(corpus, catalog, cfg, run, mapper, run_id, version, log, rep, usage) -> BuildResult:
    method = extraction_method(cfg)
    _prestart(mapper)
    llm = LiteLLMClient(cfg.llm, catalog.cache_dir) if cfg.llm.model else None
    # ingest
    t = time.perf_counter()
    rep.start("ingest", None)
    ingested = run("ingest", ingest_corpus, corpus, cfg.corpus)
    documents, quarantine = ingested.documents, list(ingested.quarantine)
    log.record("ingest", time.perf_counter() - t, files=ingested.files_seen, documents=len(documents), quarantined=len(quarantine))
    rep.finish("ingest", f"{len(documents)} documents, {len(quarantine)} quarantined")
    if not documents:
        raise RuntimeError(f"no readable documents under {corpus} ({len(quarantine)} quarantined): nothing to index")

    # chunk
    t = time.perf_counter()
    rep.start("chunk", len(documents))
    chunks = run("chunk", chunk_documents, documents, cfg.chunking)
    rep.advance("chunk", len(documents))
    log.record("chunk", time.perf_counter() - t, chunks=len(chunks), tokens=sum(d["n_tokens"] for d in documents))
    rep.finish("chunk", f"{len(chunks)} chunks")

    # extract (parallel)
    _await_pool(mapper, log)
    t = time.perf_counter()
    rep.start("extract", len(chunks))
    extracted = _extract(run, chunks, cfg, catalog, mapper, method, rep, usage)
    _release(mapper)
    ok = set(extracted["ok"])
    for q in extracted["quarantine"]:
        quarantine.append(quarantine_row(q["item"], q["stage"], q["error"]))
    log.record(
        "extract", time.perf_counter() - t,
        chunks=len(ok), mentions=len(extracted["entities"]), raw_relations=len(extracted["relations"]),
        quarantined=len(extracted["quarantine"]), llm_calls=extracted["usage"].get("calls", 0),
        llm_tokens=extracted["usage"].get("prompt_tokens", 0) + extracted["usage"].get("completion_tokens", 0),
    )
    rep.finish("extract", f"{len(extracted['entities'])} mentions from {len(ok)} chunks")

    # merge
    t = time.perf_counter()
    rep.start("merge", None)
    titled = title_mentions([c for c in chunks if c["id"] in ok], documents, cfg.extract.max_sentence_chars)
    mentions = mention_rows(extracted["entities"] + titled, extracted["relations"])
    entities, relations = run("merge", graph_from_mentions, mentions, cfg.extract.max_description_tokens)
    log.record("merge", time.perf_counter() - t, entities=len(entities), relations=len(relations))
    rep.finish("merge", f"{len(entities)} entities, {len(relations)} relations")

    # embed
    t = time.perf_counter()
    embedder = CachedEmbedder(get_embedder(cfg.embedding, cfg.llm), EmbeddingCache(catalog.cache_dir / "embeddings.sqlite"))
    rep.start("embed", len(entities) + len(chunks))
    advance = lambda n: rep.advance("embed", n)  # noqa: E731
    ent_vecs = run("embed-entities", embedder.embed, [entity_text(e["name"], e["type"], e["description"]) for e in entities], advance)
    chunk_vecs = run("embed-chunks", embedder.embed, [c["text"] for c in chunks], advance)
    _with_vectors(entities, ent_vecs)
    _with_vectors(chunks, chunk_vecs)
    dim = embedder.dim
    log.record("embed", time.perf_counter() - t, vectors=len(entities) + len(chunks), cache_hits=embedder.hits)
    rep.finish("embed", f"{embedder.misses} embedded, {embedder.hits} from cache")

    # hierarchy (layers >= 1), communities over G_k, reports
    t = time.perf_counter()
    rep.start("hierarchy", None)
    summarizer = _summarizer(cfg, llm, cfg.hierarchy.summaries_per_cluster)
    summary_entities, summary_relations, stats = run(
        "hierarchy", build_hierarchy, entities, ent_vecs, cfg.hierarchy, cfg.seed, summarizer,
        lambda texts: embedder.embed(texts),
        on_layer=lambda st: rep.advance("hierarchy", 1),
    )
    layer_rows = stat_rows(stats)
    for f in getattr(summarizer, "failures", []):
        quarantine.append(quarantine_row(f["item"], "hierarchy", "LLM summary unusable, offline summary used: " + f["error"]))
    all_entities = entities + summary_entities
    all_relations = relations + summary_relations
    built = [r for r in layer_rows if not r["stopped"]]
    log.record("hierarchy", time.perf_counter() - t, layers=len(built), summary_entities=len(summary_entities))
    rep.finish("hierarchy", f"{len(built)} layers, {len(summary_entities)} summary entities, stop: {layer_rows[-1]['stop_reason'] if layer_rows else 'disabled'}")

    t = time.perf_counter()
    rep.start("communities", None)
    communities = run(
        "communities", detect_communities, [e["id"] for e in all_entities], all_relations,
        cfg.communities.max_cluster_size, cfg.seed, cfg.communities.resolution,
    )
    log.record("communities", time.perf_counter() - t, communities=len(communities),
               levels=len({c["level"] for c in communities}))
    rep.finish("communities", f"{len(communities)} communities")

    t = time.perf_counter()
    rep.start("reports", len(communities))
    reports, failures = run(
        "reports", build_reports, communities, all_entities, all_relations, cfg.communities.report_max_tokens, llm
    )
    for f in failures:
        quarantine.append(quarantine_row(f["item"], "reports", "LLM report unusable, offline report used: " + f["error"]))
    report_vecs = embedder.embed([report_text(r["title"], r["summary"]) for r in reports])
    _with_vectors(reports, report_vecs)
    rep.advance("reports", len(reports))
    log.record("reports", time.perf_counter() - t, reports=len(reports))
    rep.finish("reports", f"{len(reports)} reports")

    _add_usage(usage, llm, embedder)

    # assemble, validate, publish
    t = time.perf_counter()
    rep.start("validate", None)
    tables = {
        "documents": _to_table("documents", documents, dim, version),
        "chunks": _to_table("chunks", chunks, dim, version),
        "entities": _to_table("entities", all_entities, dim, version),
        "relations": _to_table("relations", all_relations, dim, version),
        "layers": _to_table("layers", [dict(r) for r in layer_rows], dim, version),
        "communities": _to_table("communities", communities, dim, version),
        "community_reports": _to_table("community_reports", reports, dim, version),
        "mentions": _to_table("mentions", mentions, dim, version),
        "quarantine": _to_table("quarantine", _dedupe(quarantine), dim, version),
    }
    report = run("validate", validate_tables, tables, dim)
    log.record("validate", time.perf_counter() - t, expectations=sum(report.checked.values()), failures=len(report.failures))
    if not report.success:
        rep.finish("validate", "FAILED")
        raise ValidationFailed(report.failures)
    rep.finish("validate", f"{sum(report.checked.values())} expectations passed")

    t = time.perf_counter()
    rep.start("publish", None)
    published = run("publish", catalog.publish, tables, run_id, "full", dim, version)
    log.record("publish", time.perf_counter() - t, tables=len(tables))
    rep.finish("publish", f"snapshot v{published}")
    counts = {name: tbl.num_rows for name, tbl in tables.items()}
    plot = None
    if catalog.root is not None:
        plot = plot_layers(layer_rows, catalog.root / "reports" / f"layers-v{published}.png", cfg.hierarchy.epsilon)
    return BuildResult(run_id=run_id, version=published, counts=counts, stages=log.stages, status="published",
                       layers=layer_rows, layers_plot=str(plot) if plot else None,
                       input_digest=digest_of(documents), n_inputs=len(documents))


def _dedupe(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen, out = set(), []
    for r in rows:
        if r["id"] not in seen:
            seen.add(r["id"])
            out.append(r)
    return out


# ---------------------------------------------------------------------------- incremental refresh
def _rows(catalog: Catalog, name: str, snap: dict[str, Any]) -> list[dict[str, Any]]:
    return catalog.read(name, snap=snap).drop(["version"]).to_pylist()


def update_index(
    corpus: str,
    catalog: Catalog,
    cfg: StrataConfig,
    run: StageRunner = direct_runner,
    mapper: Any = local_mapper,
    run_id: str | None = None,
    flow_name: str = "refresh",
    full: bool = False,
) -> BuildResult:
    """Apply the corpus delta to the published index (a full build when the index is empty or ``full``)."""
    snap = catalog.snapshot()
    if snap is None or full:
        return build_index(corpus, catalog, cfg, run, mapper, run_id, flow_name)
    version = snap["version"] + 1
    with recorded_run(catalog, run_id, flow_name, corpus, cfg, version) as (run_id, log, usage, done):
        return done(_update(corpus, catalog, cfg, run, mapper, run_id, snap, version, log, reporter(), usage))


def _update(corpus, catalog, cfg, run, mapper, run_id, snap, version, log, rep, usage) -> BuildResult:
    from tasks.incremental import (attach, diff_documents, place_in_communities, recompute_layer0,
                                   reports_to_rewrite)
    from tasks.summarize import Cluster

    method = extraction_method(cfg)
    llm = LiteLLMClient(cfg.llm, catalog.cache_dir) if cfg.llm.model else None
    t = time.perf_counter()
    rep.start("diff", None)
    ingested = run("ingest", ingest_corpus, corpus, cfg.corpus)
    root = str(Path(corpus).expanduser().resolve())
    old_docs = _rows(catalog, "documents", snap)
    diff = diff_documents(old_docs, ingested.documents, root)
    log.record("diff", time.perf_counter() - t, **diff.counts(), quarantined=len(ingested.quarantine))
    rep.finish("diff", ", ".join(f"{k} {v}" for k, v in diff.counts().items()))
    digest = digest_of(ingested.documents)
    if diff.empty:
        return BuildResult(run_id=run_id, version=snap["version"], counts={}, stages=log.stages, status="nothing-to-do",
                           input_digest=digest, n_inputs=len(ingested.documents))

    embedder = CachedEmbedder(get_embedder(cfg.embedding, cfg.llm), EmbeddingCache(catalog.cache_dir / "embeddings.sqlite"))
    check_dimension(embedder, snap["dim"])

    # remove what the delta replaces, chunk and extract what it adds
    _prestart(mapper)
    t = time.perf_counter()
    gone_docs = {d["id"] for d in diff.deleted}
    old_chunks = _rows(catalog, "chunks", snap)
    gone_chunks = {c["id"] for c in old_chunks if c["document_id"] in gone_docs}
    incoming = diff.new + diff.changed
    new_chunks = chunk_documents(incoming, cfg.chunking)
    log.record("chunk", time.perf_counter() - t, chunks=len(new_chunks))
    _await_pool(mapper, log)
    t = time.perf_counter()
    rep.start("extract", len(new_chunks))
    extracted = _extract(run, new_chunks, cfg, catalog, mapper, method, rep, usage)
    _release(mapper)
    log.record("extract", time.perf_counter() - t, chunks=len(new_chunks), removed_chunks=len(gone_chunks),
               llm_calls=extracted["usage"].get("calls", 0))
    rep.finish("extract", f"{len(new_chunks)} new chunks, {len(gone_chunks)} removed")

    # layer 0: recompute exactly the keys the delta touched
    t = time.perf_counter()
    old_mentions = _rows(catalog, "mentions", snap)
    ok = set(extracted["ok"])
    titled = title_mentions([c for c in new_chunks if c["id"] in ok], incoming, cfg.extract.max_sentence_chars)
    new_mentions = mention_rows(extracted["entities"] + titled, extracted["relations"])
    touched = {m["key"] for m in old_mentions if m["chunk_id"] in gone_chunks} | {m["key"] for m in new_mentions}
    mentions = [m for m in old_mentions if m["chunk_id"] not in gone_chunks] + new_mentions
    old_entities = _rows(catalog, "entities", snap)
    old_relations = _rows(catalog, "relations", snap)
    layer0, rel0, added, removed, changed = run(
        "merge", recompute_layer0, [e for e in old_entities if e["layer"] == 0], old_relations, mentions, touched,
        cfg.extract.max_description_tokens,
    )
    old_vectors = {e["id"]: e["vector"] for e in old_entities if e["layer"] == 0}
    for e in layer0:
        if e["id"] not in added | changed and "vector" not in e:
            e["vector"] = old_vectors[e["id"]]  # recomputed but same text: same vector
    fresh = [e for e in layer0 if "vector" not in e]
    for e, v in zip(fresh, embedder.embed([entity_text(e["name"], e["type"], e["description"]) for e in fresh])):
        e["vector"] = v
    for c, v in zip(new_chunks, embedder.embed([c["text"] for c in new_chunks])):
        c["vector"] = v
    log.record("merge", time.perf_counter() - t, added=len(added), removed=len(removed), changed=len(changed))

    # hierarchy: attach new entities, refresh only the ancestors on touched paths
    t = time.perf_counter()
    rep.start("attach", None)
    summarizer = _summarizer(cfg, llm, 1)

    def summarize(layer, member_lists, vecs):
        return [s[0] for s in summarizer.summarize_layer(layer, [Cluster(m, v) for m, v in zip(member_lists, vecs)])]

    def embed_rows(rows):
        return embedder.embed([entity_text(r["name"], r["type"], r["description"]) for r in rows])

    summaries = [e for e in old_entities if e["layer"] > 0]
    att = run("attach", attach, layer0, summaries, [r for r in old_relations if r["kind"] == "summary_of"],
              added, removed, changed, cfg.incremental.tau, summarize, embed_rows, cfg.incremental.refresh_staleness)
    all_entities = layer0 + att.entities
    all_relations = rel0 + att.relations
    log.record("attach", time.perf_counter() - t, attached=len(att.attached), refreshed=len(att.refreshed),
               dropped=len(att.removed), summary_operations=att.operations)
    rep.finish("attach", f"{len(att.attached)} attached, {len(att.refreshed)} summaries refreshed")

    # communities and reports: local placement, touched reports only
    t = time.perf_counter()
    old_comms = _rows(catalog, "communities", snap)
    comms, grown, forced = run("communities", place_in_communities, old_comms, {e["id"] for e in all_entities},
                               all_relations, added)
    old_reports = {r["community_id"]: r for r in _rows(catalog, "community_reports", snap)}
    rewrite, staleness = reports_to_rewrite(comms, old_reports, grown, forced, cfg.incremental.refresh_staleness)
    existing = {cid: dict(r, staleness=staleness.get(cid, r.get("staleness")))
                for cid, r in old_reports.items() if cid not in rewrite}
    reports, failures = run("reports", build_reports, comms, all_entities, all_relations,
                            cfg.communities.report_max_tokens, llm, rewrite, existing)
    redo = [r for r in reports if r["community_id"] in rewrite]
    for r, v in zip(redo, embedder.embed([report_text(r["title"], r["summary"]) for r in redo])):
        r["vector"] = v
    _add_usage(usage, llm, embedder)
    log.record("communities", time.perf_counter() - t, communities=len(comms), grown=len(grown),
               reports_rewritten=len(redo))

    # assemble, validate, publish
    quarantine = [q for q in _rows(catalog, "quarantine", snap)
                  if not q["item"].startswith(root) and q["item"] not in gone_chunks]
    quarantine += list(ingested.quarantine)
    quarantine += [quarantine_row(q["item"], q["stage"], q["error"]) for q in extracted["quarantine"]]
    quarantine += [quarantine_row(f["item"], "reports", "LLM report unusable, offline report used: " + f["error"]) for f in failures]
    documents = [d for d in old_docs if d["id"] not in gone_docs] + incoming
    chunks = [c for c in old_chunks if c["id"] not in gone_chunks] + new_chunks
    dim = snap["dim"]
    prev_note = json.loads(snap.get("note") or "{}") if (snap.get("note") or "").startswith("{") else {}
    base_added = prev_note.get("added_since_full", 0) + len(added)
    drift = base_added / max(1, len(all_entities))
    tables = {
        "documents": _to_table("documents", documents, dim, version),
        "chunks": _to_table("chunks", chunks, dim, version),
        "entities": _to_table("entities", all_entities, dim, version),
        "relations": _to_table("relations", all_relations, dim, version),
        "communities": _to_table("communities", comms, dim, version),
        "community_reports": _to_table("community_reports", reports, dim, version),
        "mentions": _to_table("mentions", mentions, dim, version),
        "quarantine": _to_table("quarantine", _dedupe(quarantine), dim, version),
    }
    t = time.perf_counter()
    report = run("validate", validate_tables, {**tables, "layers": catalog.read("layers", snap=snap)}, dim)
    if not report.success:
        raise ValidationFailed(report.failures)
    note = json.dumps({"added_since_full": base_added, "drift": round(drift, 4), "diff": diff.counts()})
    published = run("publish", catalog.publish, tables, run_id, "incremental", dim, version, note)
    log.record("publish", time.perf_counter() - t, drift=round(drift, 4))
    if drift > cfg.incremental.max_drift:
        rep.finish("publish", f"snapshot v{published}; drift {drift:.0%} > {cfg.incremental.max_drift:.0%}: "
                              "consider `strata update --full`")
    else:
        rep.finish("publish", f"snapshot v{published} (drift {drift:.1%})")
    return BuildResult(run_id=run_id, version=published, counts={k: v.num_rows for k, v in tables.items()},
                       stages=log.stages, status="published", input_digest=digest, n_inputs=len(ingested.documents))
